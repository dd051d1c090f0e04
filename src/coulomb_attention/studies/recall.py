"""The recall (MQAR) grid as a study: configs in, one result row per run out.

:func:`run_grid` runs ``(level, RecallRunConfig)`` pairs with
:func:`~coulomb_attention.train.recall.run_recall` into ``OUT/results.jsonl`` (one fsync'd line
per run, with the resolved config; a run whose config already has a line is skipped), then
writes ``OUT/summary.md`` and ``OUT/accuracy_vs_M.png`` from the result file only
(:mod:`coulomb_attention.reports.recall`). A run whose training diverges (non-finite loss) is
recorded as such (``accuracy: null``, ``diverged``: the message) and the grid goes on. The
softmax teachers of the teacher route are cached in ``OUT/teachers``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import to_dict
from ..results import append_jsonl, read_jsonl
from ..results import run_key as results_run_key

if TYPE_CHECKING:
    from ..train.recall import RecallRunConfig

__all__ = ["ROUTE_FIELDS", "run_grid", "run_key"]

ROUTE_FIELDS = ("init", "objective", "fit", "teacher_train")
# fields of the token-level phase A's config added after rows were first written, with the
# value every earlier row had (they leave its resume key unchanged)
ALIGN_LATER = {"method": "langevin", "lr": 0.02, "tau": 0.05, "w_min": 0.1,
               "normalize_drift": False}


def run_key(config: dict[str, Any]) -> str:
    """A run's resume key: its resolved config, without the teacher-route fields when the run
    does not use them, without ``tune_omega`` when it is off and without ``omega_lr_scale``
    when it is 1, without the fields ``align`` gained from the particle config (``method``,
    ``lr``, ``tau``, ``w_min``, ``normalize_drift``) at their defaults (rows written before
    those fields existed keep their key)."""
    if not config.get("tune_omega", False):
        config = {k: v for k, v in config.items() if k != "tune_omega"}
    if config.get("omega_lr_scale", 1.0) == 1.0:
        config = {k: v for k, v in config.items() if k != "omega_lr_scale"}
    if isinstance(config.get("align"), dict):
        config = {**config, "align": {k: v for k, v in config["align"].items()
                                      if not (k in ALIGN_LATER and v == ALIGN_LATER[k])}}
    if config.get("init", "warmup") == "warmup" and \
            config.get("objective", "token_pair") == "token_pair":
        config = {k: v for k, v in config.items() if k not in ROUTE_FIELDS}
    return results_run_key(config)


def run_grid(runs: Sequence[tuple[str, RecallRunConfig]], out: str | Path,
             progress: bool = False) -> Path:
    """Run every ``(level, config)`` not yet in ``OUT/results.jsonl``; write the report.

    Returns the path of the result file.
    """
    from ..reports.recall import write_report
    from ..train import recall as lib

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    done = {run_key(r["config"]) for r in read_jsonl(results, repair=True)}
    n_done = sum(run_key(to_dict(c)) in done for _, c in runs)
    print(f"recall: {len(runs)} runs, {n_done} already done", flush=True)
    for i, (level, cfg) in enumerate(runs):
        key = run_key(to_dict(cfg))
        if key in done:
            continue
        t0 = time.perf_counter()
        route = "" if cfg.init == "warmup" and cfg.objective == "token_pair" else \
            f" ({cfg.init}, fixed)" if cfg.kernel == "vanilla" else \
            f" ({cfg.init}, {cfg.objective}, {cfg.fit.method})"
        name = (f"[{i + 1}/{len(runs)}] {level} {cfg.model.attention}-{cfg.kernel}{route} "
                f"M={cfg.model.n_features} seed={cfg.seed}")
        try:
            row = {"level": level, **lib.run_recall(cfg, progress=progress,
                                                    teacher_dir=out / "teachers")}
            outcome = f"accuracy {row['accuracy']:.4f}"
        except FloatingPointError as exc:  # one diverged run is a result, not the grid's end
            row = {"level": level, "attention": cfg.model.attention, "kernel": cfg.kernel,
                   "n_features": cfg.model.n_features, "seed": cfg.seed, "accuracy": None,
                   "diverged": str(exc).splitlines()[0], "config": to_dict(cfg)}
            outcome = f"DIVERGED ({row['diverged']})"
        append_jsonl(results, row)
        done.add(key)
        print(f"{name}: {outcome} ({time.perf_counter() - t0:.0f} s)", flush=True)
    write_report(out)
    return results

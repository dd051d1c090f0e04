"""The suite: every attention x kernel variant of the run pipeline over tasks and seeds.

Each run writes ``RESULTS/<task>/<attention>-<kernel>/seed<S>/metrics.json``. The suite is
resumable: a run whose ``metrics.json`` holds the same configuration is skipped
(:func:`coulomb_attention.results.is_done`; a changed configuration is refused with the keys
that differ, or re-run with ``rerun``), a run with checkpoints continues from them. The
vanilla and learned runs of one attention share the identical warm-up (it does not depend on
the kernel), so the second one copies the first one's warm-up checkpoint.
``RESULTS/suite.json`` lists every run with its status and wall time.

Configs in (one :class:`~coulomb_attention.train.run.RunConfig` per task, variant and seed,
from ``make_config``), status rows out (:func:`run_suite`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .._validation import check_choice
from ..config import to_dict
from ..names import SUITE_VARIANTS
from ..results import atomic_write_json, is_done
from ..train.run import RESOLVED_KEYS, RunConfig, checkpoint_config
from ..train.run import run as run_pipeline

__all__ = ["VARIANTS", "parse_variants", "run_dir", "run_suite"]

# (attention, kernel): the vocabulary's (:data:`coulomb_attention.names.SUITE_VARIANTS`: the
# three particle maps with fixed and learned features, the two references without particles,
# and the no-mixing control)
VARIANTS: tuple[tuple[str, str], ...] = SUITE_VARIANTS


def run_dir(results: str | Path, task: str, attention: str, kernel: str, seed: int) -> Path:
    """``RESULTS/<task>/<attention>-<kernel>/seed<S>``."""
    return Path(results) / task / f"{attention}-{kernel}" / f"seed{seed}"


def parse_variants(names: Sequence[str] | None) -> list[tuple[str, str]]:
    """``["favor-learned", ...]`` -> ``[("favor", "learned"), ...]``; ``None``: all."""
    if not names:
        return list(VARIANTS)
    valid = {f"{a}-{k}": (a, k) for a, k in VARIANTS}
    return [valid[check_choice("variant", name.strip(), valid)] for name in names]


def run_suite(tasks: Sequence[str], seeds: Sequence[int], variants: Sequence[tuple[str, str]],
              make_config: Callable[[dict], RunConfig], results: str | Path, runtime, *,
              data_dir=None, rerun: bool = False, log=print) -> list[dict]:
    """Run (or skip) every task x variant x seed; returns the status rows.

    ``make_config({"task", "attention", "kernel", "seed"})`` gives each run's config (the
    command lays its config file and flags over these).
    """
    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for task in tasks:
        for seed in seeds:
            for attention, kernel in variants:
                out = run_dir(results, task, attention, kernel, seed)
                row = {"task": task, "attention": attention, "kernel": kernel, "seed": seed,
                       "dir": str(out.relative_to(results))}
                config = make_config({"task": task, "attention": attention, "kernel": kernel,
                                      "seed": seed})
                if is_done(out, to_dict(config), on_mismatch="rerun" if rerun else "raise",
                           ignore=RESOLVED_KEYS, normalize=checkpoint_config):
                    row["status"] = "skipped (done, same config)"
                    log(f"skip {row['dir']}: done with the same configuration")
                    rows.append(row)
                    continue
                sibling = run_dir(results, task, attention,
                                  "vanilla" if kernel == "learned" else "learned", seed)
                t0 = time.perf_counter()
                if rerun and (out / "ckpt").exists():
                    shutil.rmtree(out / "ckpt")  # checkpoints of the old configuration
                run_pipeline(config, out, runtime, data_dir=data_dir, resume="auto",
                             warmup_from=sibling if sibling.exists() else None, log=log)
                row.update(status="done", wall_s=time.perf_counter() - t0)
                rows.append(row)
                atomic_write_json(results / "suite.json", {"runs": rows})
    atomic_write_json(results / "suite.json", {"runs": rows})
    return rows

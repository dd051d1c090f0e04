"""``coulomb-attention recall``: MQAR, attention x kernel x M x seeds at two difficulties.

Flags -> one :class:`~coulomb_attention.train.recall.RecallRunConfig` per grid point ->
:func:`~coulomb_attention.train.recall.run_recall` -> ``OUT/results.jsonl`` (one fsync'd line
per run, with the resolved config; a run whose config already has a line is skipped), then
``OUT/summary.md`` and ``OUT/accuracy_vs_M.png`` from the result file only
(:mod:`coulomb_attention.reports.recall`). A run whose training diverges (non-finite loss) is
recorded as such (``accuracy: null``, ``diverged``: the message) and the grid goes on. Maps
without particles (``softmax``, ``elu``, ``none``) run once per seed and level (kernel
``vanilla``; M does not apply).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..results import append_jsonl, read_jsonl
from ..train.recall_levels import RECALL_LEVELS
from ._args import add_progress, fill, list_arg, progress_mode

if TYPE_CHECKING:
    from ..train.recall import RecallRunConfig

# torch and the library are imported in grid()/run(): --help stays fast

ATTENTIONS = ("softmax", "favor", "porf_softplus", "softmax_feat", "elu", "none")
N_FEATURES = (4, 8, 16, 32, 64, 128)

LEVELS = RECALL_LEVELS  # the two difficulties (library: train.recall_levels)
QUICK = {"n_train": 4000, "n_eval": 300, "warmup_epochs": 2, "train": {"epochs": 2},
         "align": {"steps": 40, "n_examples": 512, "holdout": 128}}
# the grid flags' defaults, and the smaller ones of --quick (a flag given wins over both)
GRID = {"levels": list(LEVELS), "attentions": list(ATTENTIONS),
        "kernels": ["vanilla", "learned"], "n_features": list(N_FEATURES), "seeds": [0, 1, 2]}
OBJECTIVES = ("token_pair", "teacher", "teacher_query", "indicator")
FIT_METHODS = ("langevin", "adam", "hedgehog")
QUICK_GRID = {"levels": ["easy"], "attentions": ["softmax", "favor", "none"],
              "kernels": ["vanilla", "learned"], "n_features": [16], "seeds": [0]}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output directory (results.jsonl, summary.md)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke grid (easy level; softmax, favor, none; M=16; seed 0; small "
                        "data): under 5 minutes; the grid flags given beside it win")
    d = {k: " ".join(map(str, v)) for k, v in GRID.items()}
    list_arg(p, "--levels", choices=LEVELS, help=f"(default: {d['levels']})")
    list_arg(p, "--attentions", choices=ATTENTIONS, help=f"(default: {d['attentions']})")
    list_arg(p, "--kernels", help=f"vanilla, learned (checked against the run config) "
                                  f"(default: {d['kernels']})")
    list_arg(p, "--n-features", type=int, help=f"(default: {d['n_features']})")
    list_arg(p, "--seeds", type=int, help=f"(default: {d['seeds']})")
    p.add_argument("--objective", choices=OBJECTIVES, default="token_pair",
                   help="phase A's target (learned kernels): token_pair (label-free alignment "
                        "after a warm-up) or the teacher route's teacher / teacher_query / "
                        "indicator (docs/recall.md)")
    p.add_argument("--init", choices=("warmup", "teacher"), default=None,
                   help="start from a fixed-feature warm-up or from the weights of a softmax "
                        "teacher (cached in OUT/teachers); default: warmup for token_pair, "
                        "else teacher")
    p.add_argument("--fit-method", choices=FIT_METHODS, default="langevin",
                   help="how omega is fitted to the teacher-route objective")
    p.add_argument("--config", type=Path, help="JSON overrides applied to every level")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    add_progress(p)


def grid(args) -> list[tuple[str, RecallRunConfig]]:
    """Every (level, config) of the requested grid, in run order (all validated before any
    run starts: an unknown kernel raises here)."""
    from ..config import deep_merge, from_dict
    from ..nn.attention import ATTENTION_FEATURES
    from ..train.recall import RecallRunConfig

    extra = json.loads(args.config.read_text()) if args.config else {}
    init = args.init or ("warmup" if args.objective == "token_pair" else "teacher")
    if init == "teacher" or args.objective != "token_pair":
        extra = deep_merge({"init": init, "objective": args.objective,
                            "fit": {"method": args.fit_method}}, extra)
    if args.quick:
        fill(args, QUICK_GRID)
        extra = deep_merge(QUICK, extra)
    fill(args, GRID)
    levels, atts, kernels, ms, seeds = (args.levels, args.attentions, args.kernels,
                                        args.n_features, args.seeds)
    runs = []
    for level in levels:
        base = deep_merge(LEVELS[level], extra)
        for seed in seeds:
            for att in atts:
                featured = ATTENTION_FEATURES[att].has_features
                for m in (ms if featured else [64]):  # M unused there
                    for kernel in (kernels if featured else ["vanilla"]):
                        over = deep_merge(base, {"model": {"attention": att, "n_features": m},
                                             "kernel": kernel, "seed": seed})
                        runs.append((level, from_dict(RecallRunConfig, over)))
    return runs


ROUTE_FIELDS = ("init", "objective", "fit", "teacher_train")


def _key(config: dict) -> str:
    """A run's resume key: its resolved config, without the teacher-route fields when the run
    does not use them (rows written before those fields existed keep their key)."""
    if config.get("init", "warmup") == "warmup" and \
            config.get("objective", "token_pair") == "token_pair":
        config = {k: v for k, v in config.items() if k not in ROUTE_FIELDS}
    return json.dumps(config, sort_keys=True)


def run(args) -> int:
    import torch

    from ..config import to_dict
    from ..train.recall import run_recall

    torch.set_num_threads(max(int(args.threads), 1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    done = {_key(r["config"]) for r in read_jsonl(results, repair=True)}
    todo = grid(args)
    progress = progress_mode(args)
    n_done = sum(_key(to_dict(c)) in done for _, c in todo)
    print(f"recall: {len(todo)} runs, {n_done} already done", flush=True)
    for i, (level, cfg) in enumerate(todo):
        key = _key(to_dict(cfg))
        if key in done:
            continue
        t0 = time.perf_counter()
        route = "" if cfg.init == "warmup" and cfg.objective == "token_pair" else \
            f" ({cfg.init}, fixed)" if cfg.kernel == "vanilla" else \
            f" ({cfg.init}, {cfg.objective}, {cfg.fit.method})"
        name = (f"[{i + 1}/{len(todo)}] {level} {cfg.model.attention}-{cfg.kernel}{route} "
                f"M={cfg.model.n_features} seed={cfg.seed}")
        try:
            row = {"level": level, **run_recall(cfg, progress=progress != "none",
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
    from ..reports.recall import write_report

    write_report(out)
    print(f"wrote {results}, {out / 'summary.md'}, {out / 'accuracy_vs_M.png'}")
    return 0

"""``coulomb-attention recall``: MQAR, attention x kernel x M x seeds at two difficulties.

Flags -> one :class:`~coulomb_attention.train.recall.RecallRunConfig` per grid point ->
:func:`coulomb_attention.studies.recall.run_grid` (``OUT/results.jsonl``, resumable, then the
report). Maps without particles (``softmax``, ``elu``, ``none``) run once per seed and level
(kernel ``vanilla``; M does not apply).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..names import RECALL_ATTENTIONS as ATTENTIONS
from ..names import RECALL_FIT_METHODS as FIT_METHODS
from ..names import RECALL_OBJECTIVES as OBJECTIVES
from ..train.recall_levels import RECALL_LEVELS
from ._args import add_progress, add_threads, apply_threads, fill, list_arg, progress_mode

if TYPE_CHECKING:
    from ..train.recall import RecallRunConfig

# torch and the library are imported in grid()/run(): --help stays fast

N_FEATURES = (4, 8, 16, 32, 64, 128)

LEVELS = RECALL_LEVELS  # the two difficulties (library: train.recall_levels)
QUICK = {"n_train": 4000, "n_eval": 300, "warmup_epochs": 2, "train": {"epochs": 2},
         "align": {"steps": 40, "n_examples": 512, "holdout": 128}}
# the grid flags' defaults, and the smaller ones of --quick (a flag given wins over both)
GRID = {"levels": list(LEVELS), "attentions": list(ATTENTIONS),
        "kernels": ["vanilla", "learned"], "n_features": list(N_FEATURES), "seeds": [0, 1, 2]}
QUICK_GRID = {"levels": ["easy"], "attentions": ["softmax", "favor", "none"],
              "kernels": ["vanilla", "learned"], "n_features": [16], "seeds": [0]}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/recall",
                   help="output directory: results.jsonl, summary.md (default: %(default)s)")
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
    p.add_argument("--objective", choices=OBJECTIVES, default="indicator",
                   help="phase A's target (learned kernels): the teacher route's indicator "
                        "(default), teacher or teacher_query rows, or token_pair (label-free "
                        "alignment after a warm-up; docs/recall.md)")
    p.add_argument("--init", choices=("warmup", "teacher"), default=None,
                   help="start from a fixed-feature warm-up or from the weights of a softmax "
                        "teacher (cached in OUT/teachers); default: warmup for token_pair, "
                        "else teacher")
    p.add_argument("--fit-method", choices=FIT_METHODS, default="adam",
                   help="how omega is fitted to the teacher-route objective (default: adam, "
                        "the route chosen on a separate seed; weighted: WFR particles with "
                        "masses, docs/recall.md)")
    p.add_argument("--config", type=Path, help="JSON overrides applied to every level")
    add_threads(p)
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


def run(args) -> int:
    from ..studies.recall import run_grid

    apply_threads(args)
    out = Path(args.out)
    results = run_grid(grid(args), out, progress=progress_mode(args) != "none")
    print(f"wrote {results}, {out / 'summary.md'}, {out / 'accuracy_vs_M.png'}")
    return 0

"""``coulomb-attention demo``: fixed versus learned random features on one synthetic task.

Flags -> :class:`~coulomb_attention.studies.demo.DemoConfig` ->
:func:`~coulomb_attention.studies.demo.run_study` (see that module for the task, the methods
and the files under ``--out``: ``results.json``, ``results.md``, ``demo.png``). torch,
scikit-learn and matplotlib are imported only when the demo runs (a fast ``--help``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ._args import add_threads, apply_threads

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    parser.add_argument("--n", type=int, default=2000, help="training (= test) points")
    parser.add_argument("--d", type=int, default=20, help="input dimension (2 informative)")
    parser.add_argument("--noise", type=float, default=0.05, help="training label-noise rate")
    parser.add_argument("--seed", type=int, default=0)
    add_threads(parser)


def run(args: argparse.Namespace) -> int:
    from ..studies.demo import DemoConfig, run_study

    cfg = DemoConfig(n=args.n, d=args.d, noise=args.noise, seed=args.seed)
    apply_threads(args)
    out = Path(args.out)
    config = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    run_study(cfg, out, config=config, log=print)
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'demo.png'}")
    return 0

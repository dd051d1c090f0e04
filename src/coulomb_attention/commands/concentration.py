"""``coulomb-attention concentration``: spread across seeds of the learned kernel vs N and beta.

Flags -> :class:`~coulomb_attention.studies.concentration.ConcentrationConfig` ->
:func:`~coulomb_attention.studies.concentration.run_study` (see that module for the measure
and the files written under ``--out``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import load_overrides, override
from ._args import add_threads, apply_threads, list_arg

__all__ = ["add_arguments", "resolve_config", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/concentration", help="output directory")
    parser.add_argument("--quick", action="store_true",
                        help="reduced sweep (< 1 min); explicit flags still win")
    parser.add_argument("--config", help="JSON file of ConcentrationConfig overrides")
    list_arg(parser, "--budgets", type=int, help="values of N")
    list_arg(parser, "--betas", type=float, help="values of beta")
    list_arg(parser, "--seeds", type=int, help="seeds of the fits per setting (>= 2 of them)")
    parser.add_argument("--n-seeds", type=int, help="seeds per setting, 0..n-1 (>= 2)")
    parser.add_argument("--particle-steps", type=int, help="override ParticleFeatures n_steps")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    add_threads(parser, per="per process")


def resolve_config(args: argparse.Namespace):
    """Defaults <- --quick <- --config file <- individual flags."""
    from ..studies.concentration import QUICK, ConcentrationConfig

    cfg = ConcentrationConfig()
    if args.quick:
        cfg = override(cfg, QUICK)
    if args.config:
        cfg = override(cfg, load_overrides(args.config))
    if args.seeds is not None and args.n_seeds is not None:
        raise ValueError("give --seeds or --n-seeds, not both")
    changes: dict = {}
    for flag, key in (("budgets", "budgets"), ("betas", "betas"), ("seeds", "seeds"),
                      ("n_seeds", "n_seeds")):
        if getattr(args, flag) is not None:
            changes[key] = getattr(args, flag)
    if args.particle_steps is not None:
        changes["particles"] = {**cfg.particles, "n_steps": args.particle_steps}
    return override(cfg, changes) if changes else cfg


def run(args: argparse.Namespace) -> int:
    from ..studies.concentration import run_study

    cfg = resolve_config(args)
    if args.jobs < 1:
        raise ValueError(f"--jobs and --threads must be >= 1, got {args.jobs}, {args.threads}")
    apply_threads(args, jobs=args.jobs)
    out = Path(args.out)
    res = run_study(cfg, out, jobs=args.jobs, threads=args.threads)
    print(res["markdown"])
    print(f"wrote {out}/concentration.json, concentration.md, concentration.png")
    return 0

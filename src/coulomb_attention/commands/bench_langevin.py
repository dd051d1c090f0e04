"""``coulomb-attention bench langevin``: wall time of one projected Langevin step.

Flags -> :class:`~coulomb_attention.bench.langevin.LangevinBenchConfig` ->
:func:`~coulomb_attention.bench.langevin.run_benchmark` (see that module for the method;
``langevin_step.csv``, ``.json`` and ``.png`` under ``--out``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ._args import add_threads, apply_threads, list_arg

__all__ = ["add_arguments", "run"]

# the benchmark module's defaults (it imports numpy; --help stays light without it)
DEFAULT_REPEATS, DEFAULT_ROUNDS, MIN_ROUND_SECONDS = 3, 5, 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/bench_langevin", help="output directory")
    parser.add_argument("--quick", action="store_true",
                        help="N <= 1024 only (unless --N is given)")
    list_arg(parser, "--N", type=int, help="numbers of particles")
    list_arg(parser, "--n", type=int, help="batch sizes (data points per step)")
    parser.add_argument("--d", type=int, default=16, help="input dimension")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help=f"timed steps per cell and round, at least (cheap cells repeat "
                        f"until {MIN_ROUND_SECONDS:g} s; default {DEFAULT_REPEATS})")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                        help=f"rounds over all cells; the median of all of a cell's timed "
                        f"steps is reported (default {DEFAULT_ROUNDS})")
    add_threads(parser)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")


def run(args: argparse.Namespace) -> int:
    from ..bench.langevin import LangevinBenchConfig, run_benchmark

    apply_threads(args)
    cfg = LangevinBenchConfig(
        N=args.N, n=args.n, d=args.d, repeats=args.repeats,
        rounds=getattr(args, "rounds", DEFAULT_ROUNDS), threads=args.threads,
        dtype=args.dtype, quick=args.quick)
    run_benchmark(cfg, Path(args.out), log=lambda m: print(m, flush=True))
    print(f"wrote {args.out}/langevin_step.{{csv,json,png}}")
    return 0

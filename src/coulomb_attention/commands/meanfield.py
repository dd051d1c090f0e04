"""``coulomb-attention meanfield``: the particle system versus its McKean-Vlasov limit.

Flags -> :class:`~coulomb_attention.studies.meanfield.MeanfieldConfig` ->
:func:`~coulomb_attention.studies.meanfield.run_study` (see that module for the problem, the
two solvers, the error checks and the files under ``--out``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ._args import add_threads, apply_threads, list_arg

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dim", type=int, default=1, help="parameter dimension: 1 or 2")
    parser.add_argument("--beta", type=float, default=4.0, help="inverse temperature")
    parser.add_argument("--lam", type=float, default=0.5, help="repulsion strength lambda")
    parser.add_argument("--potential", default="riesz", help="pair potential: riesz|coulomb|log")
    parser.add_argument("--s", type=float, default=1.0, help="Riesz exponent s")
    parser.add_argument("--eps", type=float, default=0.2, help="softening of g_s")
    parser.add_argument("--feature", default="rff", help="data feature: rff|positive")
    parser.add_argument("--half-width", type=float, default=3.0, help="box [-R, R]^dim")
    parser.add_argument("--grid", type=int, default=None,
                        help="cells per dimension (default 256 in 1-D, 64 in 2-D)")
    parser.add_argument("--t-final", type=float, default=0.5, help="final time t = eta*steps")
    parser.add_argument("--eta", type=float, default=0.01, help="Langevin step size")
    parser.add_argument("--snapshots", type=int, default=4,
                        help="comparison times, evenly spaced in [0, t_final] (>= 2)")
    list_arg(parser, "--ns", type=int, help="particle numbers (default 64 ... 4096)")
    parser.add_argument("--n-seeds", type=int, default=None,
                        help="seeds per N, 0..n-1 (default 3; 2 with --quick)")
    parser.add_argument("--init-mean", type=float, default=0.0, help="rho_0 = N(mean, std^2)")
    parser.add_argument("--init-std", type=float, default=0.8)
    parser.add_argument("--bandwidth", type=float, default=0.5, help="MMD kernel bandwidth")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="particle dtype (the PDE is float64)")
    add_threads(parser)
    parser.add_argument("--out", default="runs/meanfield", help="output directory")
    parser.add_argument("--quick", action="store_true",
                        help="N up to 1024, 2 seeds, coarser grid (about a minute); explicit "
                             "flags still win")


def config_from_args(args: argparse.Namespace):
    from ..studies.meanfield import MeanfieldConfig

    return MeanfieldConfig(
        dim=args.dim, beta=args.beta, lam=args.lam, potential=args.potential, s=args.s,
        eps=args.eps, feature=args.feature, half_width=args.half_width, grid=args.grid,
        t_final=args.t_final, eta=args.eta, snapshots=args.snapshots,
        ns=None if args.ns is None else tuple(args.ns), n_seeds=args.n_seeds,
        init_mean=args.init_mean, init_std=args.init_std, bandwidth=args.bandwidth,
        dtype=args.dtype, threads=args.threads, quick=args.quick)


def run(args: argparse.Namespace) -> int:
    from ..studies.meanfield import run_study, table_markdown

    apply_threads(args)
    cfg = config_from_args(args)
    out = Path(args.out)
    summary = run_study(cfg, out, log=lambda m: print(m, flush=True))
    print(table_markdown(summary))
    print(f"wrote {out}/runs.jsonl, table.md, summary.json, densities.png, free_energy.png, "
          f"distance_vs_n.png ({summary['wall_s']:.0f}s)")
    return 0

"""``coulomb-attention synthetic``: fixed versus learned random features on synthetic tasks.

Flags -> :class:`~coulomb_attention.studies.synthetic.SyntheticConfig` ->
:func:`~coulomb_attention.studies.synthetic.run_study` (the grid, summaries, claims, plots;
see that module for the methods and the files under ``--out``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..config import load_overrides, override
from ..names import SYNTHETIC_METHODS as METHOD_NAMES
from ..names import SYNTHETIC_TASKS as TASK_NAMES
from ._args import add_threads, apply_threads, list_arg

__all__ = ["add_arguments", "resolve_config", "run"]

# for --help: TASK_NAMES and METHOD_NAMES, the vocabulary's (the config validates them)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/synthetic", help="output directory")
    parser.add_argument("--quick", action="store_true",
                        help="reduced grid (< 3 min, 2 cores); explicit flags still win")
    parser.add_argument("--config", help="JSON file of SyntheticConfig overrides")
    list_arg(parser, "--tasks", help=f"task families ({', '.join(TASK_NAMES)})")
    list_arg(parser, "--noise", type=float, help="label-noise levels")
    list_arg(parser, "--budgets", type=int, help="numbers of features N")
    list_arg(parser, "--methods", help=f"methods ({', '.join(METHOD_NAMES)})")
    list_arg(parser, "--seeds", type=int, help="seeds (e.g. --seeds 0 1 2)")
    parser.add_argument("--n-train", type=int, help="training examples per task")
    parser.add_argument("--n-test", type=int, help="test examples per task")
    parser.add_argument("--particle-steps", type=int, help="override ParticleFeatures n_steps")
    parser.add_argument("--particle-lam", type=float,
                        help="override ParticleFeatures lam of the 'particles' method")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--resume", action="store_true", help="continue results.jsonl")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: tables, claims and plots from the rows already in "
                        "results.jsonl (e.g. of an interrupted grid)")
    add_threads(parser, per="per process")


def resolve_config(args: argparse.Namespace):
    """Defaults <- --quick <- --config file <- individual flags."""
    from ..studies.synthetic import QUICK, SyntheticConfig

    cfg = SyntheticConfig()
    if args.quick:
        cfg = override(cfg, QUICK)
    if args.config:
        cfg = override(cfg, load_overrides(args.config))
    changes: dict = {}
    for flag, key in (("tasks", "tasks"), ("noise", "noise_levels"), ("budgets", "budgets"),
                      ("methods", "methods"), ("seeds", "seeds"), ("n_train", "n_train"),
                      ("n_test", "n_test")):
        v = getattr(args, flag, None)
        if v is not None:
            changes[key] = v
    particles = dict(cfg.particles)
    if args.particle_steps is not None:
        particles["n_steps"] = args.particle_steps
    if args.particle_lam is not None:
        particles["lam"] = args.particle_lam
    if particles != cfg.particles:
        changes["particles"] = particles
    return override(cfg, changes) if changes else cfg


def run(args: argparse.Namespace) -> int:
    from ..studies.synthetic import run_study

    cfg = resolve_config(args)
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    apply_threads(args, jobs=args.jobs)
    out = Path(args.out)
    t0 = time.perf_counter()
    res = run_study(cfg, out, resume=args.resume, jobs=args.jobs, threads=args.threads,
                    report_only=args.report_only, plots=not args.no_plots,
                    log=lambda m: print(m, flush=True))
    print((out / "summary.md").read_text())
    print(res["claims_md"])
    written = [p.name for p in sorted(out.iterdir()) if p.name != "results.jsonl"]
    print(f"wrote {out}/results.jsonl ({len(res['rows'])} rows), " + ", ".join(written))
    print(f"total wall time {time.perf_counter() - t0:.1f} s")
    return 0

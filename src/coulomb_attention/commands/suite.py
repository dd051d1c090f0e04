"""``coulomb-attention suite``: every attention x kernel variant over tasks and seeds.

Flags -> one run config per task, variant and seed (``--config`` and the run flags laid over
each) -> :func:`coulomb_attention.studies.suite.run_suite` (see that module for the layout of
``--out``, resuming and the shared warm-up).
"""

from __future__ import annotations

import argparse

from .._validation import check_choice
from ..data.registry import DATASETS
from ..names import SUITE_VARIANTS
from ._args import list_arg
from .train import add_common_arguments, build_config, setup_runtime

__all__ = ["add_arguments", "run", "run_suite"]

# for --help only (the study module imports the pipeline): the vocabulary's variants
VARIANT_NAMES = tuple(f"{a}-{k}" for a, k in SUITE_VARIANTS)


def run_suite(args: argparse.Namespace, log=print) -> list[dict]:
    """The suite of the parsed flags; returns the status rows."""
    from ..studies.suite import parse_variants
    from ..studies.suite import run_suite as run_study

    tasks = [check_choice("task", t.strip(), DATASETS) for t in args.tasks]
    variants = parse_variants(args.variants)
    runtime = setup_runtime(args)
    try:
        return run_study(tasks, list(args.seeds), variants,
                         lambda base: build_config(args, base), args.out, runtime,
                         data_dir=args.data_dir, rerun=args.rerun, log=log)
    finally:
        runtime.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    list_arg(parser, "--tasks", default=["sst2", "qqp", "rotten_tomatoes"], help="tasks")
    list_arg(parser, "--seeds", type=int, default=[0, 1, 2, 3, 4], help="seeds")
    list_arg(parser, "--variants", default=None, metavar="ATTENTION-KERNEL",
             help=f"ATTENTION-KERNEL names (default: all {len(VARIANT_NAMES)}: "
                  + ", ".join(VARIANT_NAMES) + ")")
    parser.add_argument("--out", default="runs/suite", help="results directory")
    parser.add_argument("--rerun", action="store_true",
                        help="re-run finished runs whose stored configuration differs "
                             "(default: refuse with the differing keys)")
    add_common_arguments(parser)


def run(args: argparse.Namespace) -> int:
    rows = run_suite(args)
    done = sum(r["status"] == "done" for r in rows)
    print(f"suite: {done} run(s) done, {len(rows) - done} skipped -> {args.out}/suite.json")
    return 0

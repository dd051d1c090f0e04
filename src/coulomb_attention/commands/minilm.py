"""``coulomb-attention minilm``: a pretrained encoder (all-MiniLM-L6-v2) with kernel attention.

Actions (each run goes through the one pipeline, :func:`coulomb_attention.train.run.run`, with
``encoder="minilm"`` or ``--encoder DIR``; ``run`` is ``train --encoder minilm``)::

    run      one (task, attention, kernel) run -> OUT/metrics.json
    compare  every variant on every task and seed -> OUT/<task>-<variant>-s<seed>/,
             OUT/results.jsonl, OUT/table.md, then the report (finished runs are reused)
    report   OUT/results.jsonl -> OUT/report.md (per task: means with intervals, paired
             differences), OUT/report.json, OUT/<task>.png
    timing   encoder forward time versus sequence length -> OUT/timing.csv, OUT/timing.png

A variant is ``ATTENTION:KERNEL`` with KERNEL ``vanilla`` (fresh fixed features), ``teacher``
(phase A = the conversion, cached), ``teacher_pairs`` (the conversion with ``--pairs``),
``adam`` (the same conversion by plain Adam: no repulsion, no noise), ``labels`` (phase A =
label alignment) or ``hedgehog``
(``hedgehog:hedgehog``, Hedgehog's baseline); :mod:`coulomb_attention.studies.minilm`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..names import MINILM_VARIANTS
from ._args import add_threads, apply_threads, list_arg
from .train import add_arguments as add_train_arguments
from .train import add_common_arguments, build_config, setup_runtime
from .train import run as run_train

__all__ = ["add_arguments", "run"]

# for --help only (the study module imports the pipeline): the vocabulary's variants
VARIANT_NAMES = tuple(f"{a}:{k}" for a, k in MINILM_VARIANTS)


def _compare(args) -> int:
    from ..studies.minilm import VARIANTS, compare, parse_variant, table

    variants = VARIANTS
    if args.variants:
        variants = [tuple((v.split(":") + ["vanilla"])[:2]) for v in args.variants]
        for v in variants:
            parse_variant(*v)  # an unknown name: one line before anything runs
    runtime = setup_runtime(args)
    try:
        rows = compare(args.tasks, variants,
                       lambda base: build_config(args, {"encoder": args.encoder or "minilm",
                                                        **base}),
                       args.out, runtime, seeds=args.seeds, data_dir=args.data_dir,
                       convert_cache=args.convert_cache)
    finally:
        runtime.close()
    if runtime.is_main:
        print(table(rows))
        _report(args)
    return 0


def _report(args) -> int:
    from ..reports.minilm import write_report

    paths = write_report(Path(args.out))
    print("-> " + ", ".join(str(p) for p in paths))
    return 0


def _timing(args) -> int:
    from ..bench.minilm_timing import time_vs_length, write_timing

    apply_threads(args)
    rows = time_vs_length(args.encoder, args.attentions, args.lengths,
                          batch_size=args.batch_size, n_features=args.n_features,
                          repeats=args.repeats)
    out = Path(args.out)
    write_timing(rows, out, args.encoder)
    for r in rows:
        print(f"{r['attention']:>14} L={r['length']:4d}  {r['ms_per_sequence']:8.2f} ms/seq")
    print(f"-> {out / 'timing.csv'}, {out / 'timing.png'}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    one = sub.add_parser("run", help="one run: the train command with --encoder minilm")
    add_train_arguments(one)
    cmp_ = sub.add_parser("compare", help="every variant on every task + table.md")
    list_arg(cmp_, "--tasks", default=["sst2", "rotten_tomatoes"])
    list_arg(cmp_, "--variants", default=None, metavar="ATTENTION:KERNEL",
             help="default: " + " ".join(VARIANT_NAMES))
    list_arg(cmp_, "--seeds", type=int, default=[0],
             help="seeds (each: fine-tuning, fresh draws and the conversion); default: 0")
    cmp_.add_argument("--out", default="runs/minilm")
    add_common_arguments(cmp_)
    rep = sub.add_parser("report", help="OUT/results.jsonl -> report.md, report.json, plots")
    rep.add_argument("--out", default="runs/minilm")
    tim = sub.add_parser("timing", help="encoder forward time versus sequence length")
    tim.add_argument("--encoder", default="minilm")
    list_arg(tim, "--attentions", default=["softmax", "favor", "porf_softplus"])
    list_arg(tim, "--lengths", type=int, default=[64, 128, 256, 512])
    tim.add_argument("--batch-size", type=int, default=8)
    tim.add_argument("--n-features", type=int, default=64)
    tim.add_argument("--repeats", type=int, default=3)
    add_threads(tim)
    tim.add_argument("--out", default="runs/minilm")


def run(args: argparse.Namespace) -> int:
    action = getattr(args, "action", None)
    if action == "run":
        if args.encoder is None:
            args.encoder = "minilm"
        return run_train(args)
    if action == "compare":
        return _compare(args)
    if action == "report":
        return _report(args)
    if action == "timing":
        return _timing(args)
    raise ValueError("choose an action: run, compare, report or timing")

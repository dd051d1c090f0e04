"""``coulomb-attention ablation``: the ablation study over arenas, resumable, then its report.

::

    coulomb-attention ablation --arena synthetic mqar convert [--quick] [--seeds 0 1 2 3 4] \\
        [--features 8 16 32 64 128] [--variants fixed gradient ...] [--out runs/ablation]

Records go to ``OUT/records.jsonl`` (runs already there are skipped), the report to
``OUT/report.md`` and ``OUT/*.png``. ``--report-only --records A.jsonl B.jsonl`` reports
on several records files pooled by run key (a later file wins; default ``OUT/records.jsonl``);
``--references`` picks the variants the paired differences are taken against. Lists are
space-separated; commas are accepted too (``--seeds 0,1,2``; ``commands._args``).
``--quick`` picks small defaults and never overrides an explicit flag.
"""

from __future__ import annotations

import argparse

from ._args import add_threads, apply_threads, list_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    list_arg(p, "--arena", default=None, metavar="ARENA", help="synthetic, mqar and/or convert")
    p.add_argument("--quick", action="store_true",
                   help="small plans (a few minutes per arena); explicit flags still win")
    list_arg(p, "--seeds", type=int, default=None, metavar="SEED",
             help="default 0 1 2 3 4 (quick: 0 1)")
    list_arg(p, "--features", type=int, default=None, metavar="M",
             help="feature counts (default: each arena's own; full 8 16 32 64 128)")
    list_arg(p, "--variants", default=None, metavar="VARIANT",
             help="only these variants (default: all the arena plans)")
    list_arg(p, "--settings", default=None, metavar="PREFIX",
             help="only settings starting with these (e.g. easy, hard/favor, fit64)")
    p.add_argument("--out", default="runs/ablation")
    p.add_argument("--data-dir", default=None, help="datasets folder (convert arena)")
    add_threads(p, per="per job")
    p.add_argument("--jobs", type=int, default=1,
                   help="worker processes (records are the same for any number)")
    p.add_argument("--report-only", action="store_true",
                   help="write the report from OUT/records.jsonl without running")
    list_arg(p, "--records", default=None, metavar="FILE",
             help="with --report-only: report on these records files, pooled by run key "
                  "(a later file wins; default OUT/records.jsonl)")
    list_arg(p, "--references", default=None, metavar="VARIANT",
             help="paired differences against these variants (default gradient fixed "
                  "langevin hedgehog; e.g. add coulomb for weighted - coulomb)")


def run(args: argparse.Namespace) -> int:
    from ..reports.ablation import REFERENCES, write_ablation_report
    from ..studies.ablation import run_study

    if args.records is not None and not args.report_only:
        raise ValueError("--records needs --report-only (a run writes OUT/records.jsonl)")
    if not args.report_only:
        apply_threads(args, jobs=args.jobs)
        counts = run_study(args.arena or [], args.out, quick=args.quick, seeds=args.seeds,
                           features=args.features, variants=args.variants,
                           data_dir=args.data_dir, settings=args.settings,
                           jobs=args.jobs, threads=args.threads)
        print(f"ablation: {counts['ran']} run(s), {counts['skipped']} already done, "
              f"records in {counts['records']}")
    references = REFERENCES if args.references is None else tuple(args.references)
    print(f"wrote {write_ablation_report(args.out, records=args.records, references=references)}")
    return 0

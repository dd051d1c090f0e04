"""``coulomb-attention ablation``: the ablation study over arenas, resumable, then its report.

::

    coulomb-attention ablation --arena synthetic mqar convert [--quick] [--seeds 0 1 2 3 4] \\
        [--features 8 16 32 64 128] [--variants fixed gradient ...] [--out runs/ablation]

Records go to ``OUT/records.jsonl`` (runs already there are skipped), the report to
``OUT/report.md`` and ``OUT/*.png``. Lists are space-separated; commas are accepted too
(``--seeds 0,1,2``). ``--quick`` picks small defaults and never overrides an explicit flag.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arena", nargs="+", default=None, metavar="ARENA",
                   help="synthetic, mqar and/or convert")
    p.add_argument("--quick", action="store_true",
                   help="small plans (a few minutes per arena); explicit flags still win")
    p.add_argument("--seeds", nargs="+", default=None, metavar="SEED",
                   help="default 0 1 2 3 4 (quick: 0 1)")
    p.add_argument("--features", nargs="+", default=None, metavar="M",
                   help="feature counts (default: each arena's own; full 8 16 32 64 128)")
    p.add_argument("--variants", nargs="+", default=None, metavar="VARIANT",
                   help="only these variants (default: all the arena plans)")
    p.add_argument("--out", default="runs/ablation")
    p.add_argument("--data-dir", default=None, help="datasets folder (convert arena)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--report-only", action="store_true",
                   help="write the report from OUT/records.jsonl without running")


def _flat(values: list[str] | None, cast=str) -> list | None:
    """Space- and comma-separated values as one list (``None`` stays ``None``)."""
    if values is None:
        return None
    out = []
    for v in values:
        for part in v.split(","):
            if part.strip():
                try:
                    out.append(cast(part.strip()))
                except ValueError:
                    raise ValueError(f"not an integer: {part.strip()!r}") from None
    return out


def run(args: argparse.Namespace) -> int:
    from ..reports.ablation import write_ablation_report
    from ..studies.ablation import run_study

    if not args.report_only:
        import torch

        torch.set_num_threads(max(1, args.threads))
        counts = run_study(_flat(args.arena), args.out, quick=args.quick,
                           seeds=_flat(args.seeds, int), features=_flat(args.features, int),
                           variants=_flat(args.variants), data_dir=args.data_dir)
        print(f"ablation: {counts['ran']} run(s), {counts['skipped']} already done, "
              f"records in {counts['records']}")
    print(f"wrote {write_ablation_report(args.out)}")
    return 0

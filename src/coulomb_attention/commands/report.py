"""``coulomb-attention report RESULTS``: Markdown tables and plots from result files only.

Reads every ``RESULTS/<task>/<attention>-<kernel>/seed<S>/metrics.json`` and writes
``RESULTS/report.md`` and ``RESULTS/plots/``
(:func:`coulomb_attention.reports.transformer.build_report`).

``coulomb-attention report ROWS.json --conversions``: rows of conversions (``convert`` output
directories) compared by seed, ``ROWS.md`` / ``ROWS.summary.json`` beside the manifest
(:func:`coulomb_attention.reports.convert.write_rows_report`).
"""

from __future__ import annotations

import argparse

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", help="results directory written by `suite` (or by "
                                        "`train --out RESULTS/TASK/ATT-KERNEL/seedS`)")
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    parser.add_argument("--conversions", action="store_true",
                        help='RESULTS is a JSON manifest {"rows": {label: [convert output '
                             'dirs]}, "pairs": [[a, b], ...]}: a table of the rows and paired '
                             "differences by seed (ROWS.md, ROWS.summary.json beside it)")


def run(args: argparse.Namespace) -> int:
    if args.conversions:
        from ..reports.convert import write_rows_report

        print(f"report: {write_rows_report(args.results)}")
        return 0
    from ..reports.transformer import build_report  # numpy, scipy: not needed for --help

    path = build_report(args.results, plots=not args.no_plots)
    print(f"report: {path}")
    return 0

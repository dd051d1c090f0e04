"""The weighted (WFR) variant of the MQAR arena against the others, from records only.

    python experiments/ablation_mqar_weighted_summary.py RECORDS.jsonl [MORE.jsonl ...]

Records of every file are pooled by run key (a later file wins), so the weighted records can
join an earlier measurement of the other variants (the runs are deterministic: re-running a
stored record reproduces its score exactly, docs/ablation.md). Prints the weighted variant's
scores and fit statistics, and the paired differences (by seed, 95% t-intervals,
:func:`coulomb_attention.stats.paired_difference`) weighted - coulomb, weighted - gradient and
weighted - fixed per setting and M.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

import numpy as np

from coulomb_attention.results import read_jsonl
from coulomb_attention.stats import paired_difference


def label(r: dict) -> str:
    p = r["params"]
    if r["variant"] == "coulomb":
        return f"coulomb lam={p['lam']:g}"
    if r["variant"] == "weighted":
        return f"weighted tau={p['tau']:g}"
    return r["variant"]


def main(paths: list[str]) -> None:
    recs: dict = {}
    for path in paths:
        for r in read_jsonl(path):
            key = json.dumps({k: r[k] for k in ("arena", "setting", "variant", "params", "M",
                                                "seed")}, sort_keys=True)
            recs[key] = r
    cell: dict = defaultdict(dict)  # (setting, label, M) -> {seed: record}
    for r in recs.values():
        cell[(r["setting"], label(r), r["M"])][r["seed"]] = r
    weighted = sorted(k for k in cell if k[1].startswith("weighted"))
    print("| setting | variant | M | score (mean over seeds) | seeds | held-out KL before -> "
          "after | ESS / M | births | nn_min | eff. rank | time s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for k in weighted:
        rows = list(cell[k].values())

        def mean(f, rows=rows):
            return float(np.mean([f(r) for r in rows]))

        print(f"| {k[0]} | {k[1]} | {k[2]} | {mean(lambda r: r['score']):.4f} | {len(rows)} | "
              f"{mean(lambda r: r['holdout_kl_before']):.2f} -> "
              f"{mean(lambda r: r['holdout_kl_after']):.2f} | "
              f"{mean(lambda r: r.get('fit_ess', float('nan'))):.2f} | "
              f"{mean(lambda r: r.get('fit_births', float('nan'))):.1f} | "
              f"{mean(lambda r: r['diagnostics']['nn_min']):.2f} | "
              f"{mean(lambda r: r['diagnostics']['effective_rank']):.1f} | "
              f"{mean(lambda r: r['time_s']):.0f} |")
    print()
    print("| setting | M | comparison | mean [95% t] | seeds |")
    print("|---|---|---|---|---|")
    for s, lab, m in weighted:
        refs = sorted({k[1] for k in cell if k[0] == s and k[2] == m and not
                       k[1].startswith("weighted") and k[1].split(" ")[0] in
                       ("coulomb", "gradient", "fixed")})
        for ref in refs:
            a, b = cell[(s, lab, m)], cell[(s, ref, m)]
            seeds = sorted(set(a) & set(b))
            if len(seeds) < 2:
                continue
            mu, lo, hi, n = paired_difference([a[x]["score"] for x in seeds],
                                              [b[x]["score"] for x in seeds])
            star = "**" if lo > 0 or hi < 0 else ""
            print(f"| {s} | {m} | {lab} - {ref} | {star}{mu:+.4f} [{lo:+.4f}, {hi:+.4f}]{star} "
                  f"| {n} |")


if __name__ == "__main__":
    main(sys.argv[1:])

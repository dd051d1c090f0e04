"""Tables of the MQAR arena measurement (docs/recall.md, docs/ablation.md) from its records.

    python experiments/ablation_mqar_summary.py RECORDS.jsonl [TOKEN_PAIR_RESULTS.jsonl ...]

Accuracy per (setting, variant, M) (mean +- std over seeds), paired differences with 95%
t-intervals (:func:`coulomb_attention.stats.paired_difference`), fit diagnostics. Token-pair
rows (``coulomb-attention recall`` result files, kernel learned, no route) join as variant
``token_pair`` (their own warm-up route: not the teacher's weights).
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict

import numpy as np

from coulomb_attention.results import read_jsonl
from coulomb_attention.stats import paired_difference


def label(r: dict) -> str:
    p = r["params"]
    if r["variant"] == "coulomb":
        return f"coulomb lam={p['lam']:g}"
    return r["variant"]


def main(paths: list[str]) -> None:
    score: dict = defaultdict(dict)  # (setting, label, M) -> {seed: score}
    extra: dict = defaultdict(list)
    for r in read_jsonl(paths[0]):
        key = (r["setting"], label(r), r["M"])
        score[key][r["seed"]] = r["score"]
        extra[key].append(r)
    for path in paths[1:]:
        for r in read_jsonl(path):
            if r.get("level") == "easy" and r["kernel"] == "learned" and not r.get("route") \
                    and r["accuracy"] is not None:
                score[(f"easy/{r['attention']}", "token_pair", r["n_features"])][r["seed"]] = \
                    r["accuracy"]
    settings = sorted({k[0] for k in extra})
    labels = ["fixed", "gradient", "langevin"] + sorted(
        {k[1] for k in score if k[1] not in ("fixed", "gradient", "langevin", "token_pair")}) \
        + ["token_pair"]
    ms = sorted({k[2] for k in extra})
    print("| setting | variant | " + " | ".join(f"M={m}" for m in ms) + " |")
    print("|---|---|" + "---|" * len(ms))
    for s in settings:
        for lab in labels:
            cells = []
            for m in ms:
                v = np.array(list(score.get((s, lab, m), {}).values()))
                cells.append("" if v.size == 0 else f"{v.mean():.3f} +- "
                             f"{v.std(ddof=1) if v.size > 1 else math.nan:.3f} ({v.size})")
            if any(cells):
                print(f"| {s} | {lab} | " + " | ".join(cells) + " |")
    print()

    def diff(a, b, name):
        sa, sb = score.get(a, {}), score.get(b, {})
        seeds = sorted(set(sa) & set(sb))
        if len(seeds) < 2:
            return
        m, lo, hi, n = paired_difference([sa[x] for x in seeds], [sb[x] for x in seeds])
        star = "**" if lo > 0 or hi < 0 else ""
        print(f"| {name} | {star}{m:+.3f} [{lo:+.3f}, {hi:+.3f}]{star} | {n} |")

    print("| comparison | mean [95% t] | seeds |")
    print("|---|---|---|")
    for s in settings:
        for lab in labels[1:]:
            for m in ms:
                diff((s, lab, m), (s, "fixed", m), f"{s} {lab} - fixed, M={m}")
            if 16 in ms and 64 in ms:
                diff((s, lab, 16), (s, "fixed", 64), f"{s} {lab} M=16 - fixed M=64")
    print()
    print("| setting | variant | M | teacher | swap | after fit | final | held-out KL "
          "before -> after | nn_min | eff. rank | time s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (s, lab, m), rows in sorted(extra.items()):
        def mean(f, rows=rows):
            v = [f(r) for r in rows if f(r) is not None]
            return float(np.mean(v)) if v else math.nan
        print(f"| {s} | {lab} | {m} | {mean(lambda r: r['teacher_accuracy']):.3f} | "
              f"{mean(lambda r: r['swap_accuracy']):.3f} | {mean(lambda r: r['fit_accuracy']):.3f}"
              f" | {mean(lambda r: r['score']):.3f} | "
              f"{mean(lambda r: r['holdout_kl_before']):.2f} -> "
              f"{mean(lambda r: r['holdout_kl_after']):.2f} | "
              f"{mean(lambda r: r['diagnostics'].get('nn_min')):.2f} | "
              f"{mean(lambda r: r['diagnostics'].get('effective_rank')):.1f} | "
              f"{mean(lambda r: r['time_s']):.0f} |")
    print(json.dumps({"records": sum(len(v) for v in extra.values())}))


if __name__ == "__main__":
    main(sys.argv[1:])

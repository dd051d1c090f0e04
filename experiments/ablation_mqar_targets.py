"""The MQAR arena's decisive table and issue 24's MQAR targets, from records only.

    python experiments/ablation_mqar_targets.py RECORDS.jsonl > summary.md

Per setting and M: mean scores of fixed / gradient / Coulomb (lam 1, 10) / weighted / Hedgehog,
then paired differences by seed (95% t-intervals, :func:`coulomb_attention.stats.paired_difference`,
only over the seeds both variants have): best learned - fixed, Coulomb - gradient (the
repulsion), weighted - Coulomb lam 1 (the masses), learned at M - fixed at 2M and 4M
(learned = the plain-gradient variant, the reviewer's ablation; the particles are within noise
of it); where the records hold ``end2end`` runs, the same against that reference point.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import numpy as np

from coulomb_attention.results import read_jsonl
from coulomb_attention.stats import paired_difference


def label(r: dict) -> str:
    p = r["params"]
    if r["variant"] == "coulomb":
        return f"coulomb{p['lam']:g}"
    if r["variant"] == "end2end" and p.get("omega_lr_scale", 1.0) != 1.0:
        return f"end2end(omega lr x{p['omega_lr_scale']:g})"
    return r["variant"]


def main(path: str) -> None:
    cell: dict = defaultdict(dict)  # (setting, label, M) -> {seed: score}
    for r in read_jsonl(path):
        cell[(r["setting"], label(r), int(r["M"]))][int(r["seed"])] = float(r["score"])
    settings = sorted({k[0] for k in cell})
    cols = ["fixed", "gradient", "langevin", "coulomb1", "coulomb10", "weighted", "hedgehog",
            "end2end"]

    def pair(a, b):
        sa, sb = cell.get(a, {}), cell.get(b, {})
        seeds = sorted(set(sa) & set(sb))
        if len(seeds) < 2:
            return ""
        m, lo, hi, n = paired_difference([sa[s] for s in seeds], [sb[s] for s in seeds])
        star = "**" if lo > 0 or hi < 0 else ""
        return f"{star}{m:+.3f} [{lo:+.3f}, {hi:+.3f}]{star} ({n})"

    print("| setting | M | " + " | ".join(cols) + " |")
    print("|---|---:|" + "---:|" * len(cols))
    for st in settings:
        for m in sorted({k[2] for k in cell if k[0] == st}):
            vals = []
            for c in cols:
                s = cell.get((st, c, m))
                vals.append(f"{np.mean(list(s.values())):.3f} ({len(s)})" if s else "")
            print(f"| {st} | {m} | " + " | ".join(vals) + " |")
    print()
    print("Paired by seed, mean [95% t-interval] (seeds); ** = the interval excludes 0.")
    print()
    print("| setting | M | gradient - fixed | coulomb1 - gradient | coulomb10 - gradient | "
          "coulomb10 - langevin | weighted - coulomb1 | gradient(M) - fixed(2M) | "
          "gradient(M) - fixed(4M) |")
    print("|---|---:|---|---|---|---|---|---|---|")
    for st in settings:
        for m in sorted({k[2] for k in cell if k[0] == st}):
            print(f"| {st} | {m} | {pair((st, 'gradient', m), (st, 'fixed', m))} | "
                  f"{pair((st, 'coulomb1', m), (st, 'gradient', m))} | "
                  f"{pair((st, 'coulomb10', m), (st, 'gradient', m))} | "
                  f"{pair((st, 'coulomb10', m), (st, 'langevin', m))} | "
                  f"{pair((st, 'weighted', m), (st, 'coulomb1', m))} | "
                  f"{pair((st, 'gradient', m), (st, 'fixed', 2 * m))} | "
                  f"{pair((st, 'gradient', m), (st, 'fixed', 4 * m))} |")
    e2e = sorted({k[1] for k in cell if k[1].startswith("end2end")})
    if e2e:  # the reference point: omega trained in phase B (at 1x or a faster omega rate)
        print()
        print("End-to-end reference (omega also trained by the task loss in phase B):")
        print()
        print("| setting | M | variant | score | - gradient | - fixed | (M) - fixed(2M) | "
              "(M) - fixed(4M) |")
        print("|---|---:|---|---:|---|---|---|---|")
        for st in settings:
            for m in sorted({k[2] for k in cell if k[0] == st and k[1] in e2e}):
                for lab in e2e:
                    s = cell.get((st, lab, m))
                    if not s:
                        continue
                    print(f"| {st} | {m} | {lab} | {np.mean(list(s.values())):.3f} "
                          f"({len(s)}) | {pair((st, lab, m), (st, 'gradient', m))} | "
                          f"{pair((st, lab, m), (st, 'fixed', m))} | "
                          f"{pair((st, lab, m), (st, 'fixed', 2 * m))} | "
                          f"{pair((st, lab, m), (st, 'fixed', 4 * m))} |")


if __name__ == "__main__":
    main(sys.argv[1])

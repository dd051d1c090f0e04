"""Run a slice of the synthetic ablation arena into a JSONL and print paired differences.

Until the ``ablation`` command lands this loops ``plan``/``run`` of
:mod:`coulomb_attention.studies.ablation_synthetic` itself (resumable by run key):

    python experiments/ablation_synthetic_slice.py run --quick --seeds 0 1 --out /tmp/quick.jsonl
    python experiments/ablation_synthetic_slice.py run --seeds 0 1 2 3 4 --out /tmp/full.jsonl
    python experiments/ablation_synthetic_slice.py pairs /tmp/full.jsonl
    python experiments/ablation_synthetic_slice.py table /tmp/full.jsonl

``table`` prints the per-M tables of docs/ablation.md (full plan records); ``pairs`` prints,
per regime (n = 200, n = 2000) and per feature count, the mean held-out
accuracy of each variant and the paired differences (same setting, M and seed) with 95%
t-intervals from :func:`coulomb_attention.stats.paired_difference`.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

from coulomb_attention.stats import mean_interval, paired_difference
from coulomb_attention.studies import ablation_synthetic as arena

# (label, variant, params) of the rows; params as in arena.VARIANTS
ROWS = [
    ("fixed", "fixed", {}),
    ("importance", "importance", {}),
    ("gradient (Adam)", "gradient", {}),
    ("gradient (drift)", "gradient", {"optimizer": "drift"}),
    ("langevin b=1e3", "langevin", {"beta": 1e3}),
    ("langevin b=1e2", "langevin", {"beta": 1e2}),
    ("coulomb l=0.01", "coulomb", {"lam": 0.01}),
    ("coulomb l=0.1", "coulomb", {"lam": 0.1}),
    ("coulomb l=0.01 b=1e3", "coulomb", {"lam": 0.01, "beta": 1e3}),
    ("coulomb l=0.1 b=1e3", "coulomb", {"lam": 0.1, "beta": 1e3}),
    ("weighted t=0.05", "weighted", {"lam": 0.01, "tau": 0.05}),
    ("weighted t=0.2", "weighted", {"lam": 0.01, "tau": 0.2}),
    ("masses only t=0.05", "weighted", {"lam": 0.01, "tau": 0.05, "transport": False}),
    ("masses only t=0.2", "weighted", {"lam": 0.01, "tau": 0.2, "transport": False}),
]
PAIRS = [
    ("coulomb l=0.01", "gradient (Adam)"),
    ("coulomb l=0.1", "gradient (Adam)"),
    ("langevin b=1e3", "gradient (Adam)"),
    ("gradient (drift)", "gradient (Adam)"),
    ("coulomb l=0.01", "gradient (drift)"),
    ("langevin b=1e3", "gradient (drift)"),
    ("coulomb l=0.01 b=1e3", "coulomb l=0.01"),
    ("weighted t=0.05", "gradient (Adam)"),
    ("weighted t=0.2", "gradient (Adam)"),
    ("weighted t=0.05", "coulomb l=0.01"),
    ("weighted t=0.2", "coulomb l=0.01"),
    ("weighted t=0.05", "importance"),
    ("importance", "fixed"),
    ("gradient (Adam)", "fixed"),
    ("masses only t=0.05", "importance"),
    ("masses only t=0.2", "importance"),
]


def _key(s: dict) -> str:
    return json.dumps([s["arena"], s["setting"], s["variant"], sorted(s["params"].items()),
                       s["M"], s["seed"]])


def run(args) -> None:
    torch.set_num_threads(1)
    specs = arena.plan(args.quick, args.seeds, args.features)
    done = set()
    if os.path.exists(args.out):
        with open(args.out) as fh:
            done = {_key(json.loads(line)) for line in fh if line.strip()}
    t0 = time.perf_counter()
    with open(args.out, "a") as fh:
        for s in specs:
            if _key(s) not in done:
                fh.write(json.dumps(arena.run(s), allow_nan=False) + "\n")
                fh.flush()
    print(f"{len(specs)} specs, {time.perf_counter() - t0:.0f} s")


def _label(rec: dict) -> str | None:
    for label, variant, params in ROWS:
        if rec["variant"] == variant and rec["params"] == params:
            return label
    return None


def pairs(args) -> None:
    with open(args.records) as fh:
        recs = [json.loads(line) for line in fh if line.strip()]
    score = {}
    for r in recs:
        score[(_label(r), r["setting"], r["M"], r["seed"])] = r["score"]
    regimes = sorted({int(r["setting"].rsplit("-n", 1)[1]) for r in recs})
    feats = sorted({r["M"] for r in recs})
    for n in regimes:
        for M in [*feats, "all"]:
            cells = sorted({(r["setting"], r["M"], r["seed"]) for r in recs
                            if r["setting"].endswith(f"-n{n}") and (M == "all" or r["M"] == M)})
            print(f"\n### n = {n}, M = {M} ({len(cells)} (setting, M, seed) cells)")
            print("| variant | mean accuracy [95% CI] |\n|---|---|")
            for label, _, _ in ROWS:
                v = [score[(label, *c)] for c in cells if (label, *c) in score]
                if v:
                    m, lo, hi, k = mean_interval(v)
                    print(f"| {label} | {m:.3f} [{lo:.3f}, {hi:.3f}] (n={k}) |")
            print("\n| difference | mean [95% CI] | n |\n|---|---|---|")
            for a, b in PAIRS:
                both = [c for c in cells if (a, *c) in score and (b, *c) in score]
                if len(both) >= 2:
                    m, lo, hi, k = paired_difference([score[(a, *c)] for c in both],
                                                     [score[(b, *c)] for c in both])
                    print(f"| {a} - {b} | {m:+.4f} [{lo:+.4f}, {hi:+.4f}] | {k} |")


TABLE_PAIRS = [
    ("coulomb l=0.01", "gradient (Adam)"), ("coulomb l=0.01", "gradient (drift)"),
    ("coulomb l=0.1", "gradient (drift)"), ("langevin b=1e3", "gradient (drift)"),
    ("gradient (drift)", "gradient (Adam)"), ("weighted t=0.05", "gradient (Adam)"),
    ("weighted t=0.05", "coulomb l=0.01"), ("weighted t=0.2", "coulomb l=0.01"),
    ("weighted t=0.05", "importance"), ("importance", "fixed"),
    ("masses only t=0.05", "importance"), ("masses only t=0.2", "importance"),
    ("masses only t=0.2", "fixed"), ("weighted t=0.05", "masses only t=0.05"),
]


def table(args) -> None:
    with open(args.records) as fh:
        recs = [json.loads(line) for line in fh if line.strip()]
    score = {(_label(r), r["setting"], r["M"], r["seed"]): r["score"] for r in recs}
    tasks = sorted({r["setting"].split("-")[0] for r in recs})
    seeds = sorted({r["seed"] for r in recs})
    feats = sorted({r["M"] for r in recs})
    for n in sorted({int(r["setting"].rsplit("-n", 1)[1]) for r in recs}):
        def cells(ms, n=n):
            return [(f"{t}-d{arena.D}-n{n}", m, s) for t in tasks for m in ms for s in seeds]
        print(f"\n**n = {n}: mean held-out accuracy ({len(cells([0]))} runs per cell)**\n")
        print("| variant | " + " | ".join(f"M={m}" for m in feats) + " |")
        print("|---" * (len(feats) + 1) + "|")
        for label, _, _ in ROWS:
            row = [np.mean([score[(label, *c)] for c in cells([m])]) for m in feats]
            print(f"| {label} | " + " | ".join(f"{v:.3f}" for v in row) + " |")
        print(f"\n**n = {n}: paired differences, mean [95% CI]**\n")
        print("| difference | " + " | ".join(f"M={m}" for m in feats) + " | all |")
        print("|---" * (len(feats) + 2) + "|")
        for a, b in TABLE_PAIRS:
            row = []
            for ms in [[m] for m in feats] + [feats]:
                m_, lo, hi, _ = paired_difference([score[(a, *c)] for c in cells(ms)],
                                                  [score[(b, *c)] for c in cells(ms)])
                row.append(f"{m_:+.3f} [{lo:+.3f}, {hi:+.3f}]")
            print(f"| {a} - {b} | " + " | ".join(row) + " |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--quick", action="store_true")
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    r.add_argument("--features", type=int, nargs="+", default=None)
    r.add_argument("--out", required=True)
    for name in ("pairs", "table"):
        sub.add_parser(name).add_argument("records")
    args = p.parse_args(argv)
    {"run": run, "pairs": pairs, "table": table}[args.cmd](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

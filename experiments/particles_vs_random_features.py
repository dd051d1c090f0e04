"""Learned particles (64) vs fixed random features on hidden-direction synthetic tasks.

Must-show: on a standard synthetic task with noise dimensions, ParticleFeatures(64) +
LogisticRegression beats sklearn's RBFSampler(256) + LogisticRegression in test accuracy.

    python experiments/particles_vs_random_features.py            # must-show task, 5 seeds
    python experiments/particles_vs_random_features.py --family   # tuning family (defaults)
    python experiments/particles_vs_random_features.py --family --set lam=0.0 --set n_steps=300

Every estimator runs with its defaults (``--set`` overrides ParticleFeatures parameters);
inputs are standardized on the training split; the logistic regression is sklearn's default
(C=1, ``--C`` to change) with max_iter=5000. Prints a table and writes JSON lines under --out.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.kernel_approximation import RBFSampler
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from coulomb_attention.data.synthetic import make_hidden_task as make_task
from coulomb_attention.estimators import ImportanceFeatures, ParticleFeatures, RandomFeatures

# (kind, n, d, k, noise): the tuning family
FAMILY = [
    ("linear", 1000, 20, 5, 0.1),
    ("linear", 300, 50, 3, 0.0),
    ("xor", 2000, 10, 2, 0.0),
    ("xor", 1000, 30, 2, 0.1),
    ("xor", 600, 2, 2, 0.2),
    ("checker", 3000, 6, 2, 0.05),
    ("checker", 5000, 20, 2, 0.0),
    ("radial", 2000, 5, 5, 0.0),
    ("radial", 1000, 20, 3, 0.1),
    ("sine", 2000, 10, 3, 0.0),
    ("sine", 3000, 40, 5, 0.1),
    ("multiclass", 1500, 15, 2, 0.1),
]
MUST_SHOW = ("xor", 2000, 20, 2, 0.05)


def methods(seed: int, overrides: dict):
    return {
        "RandomFeatures(64)": RandomFeatures(64, random_state=seed),
        "RandomFeatures(256)": RandomFeatures(256, random_state=seed),
        "RBFSampler(256)": RBFSampler(n_components=256, random_state=seed),
        "ImportanceFeatures(64)": ImportanceFeatures(64, random_state=seed),
        "ParticleFeatures(64)": ParticleFeatures(64, random_state=seed, **overrides),
    }


def evaluate(task, seed: int, overrides: dict, only=None, C: float = 1.0) -> dict:
    kind, n, d, k, noise = task
    X, y = make_task(kind, 2 * n, d, k, noise, seed)  # n train + n test
    Xtr, ytr, Xte, yte = X[:n], y[:n], X[n:], y[n:]
    row = {"task": f"{kind} n={n} d={d} k={k} noise={noise}", "seed": seed}
    for name, est in methods(seed, overrides).items():
        if only and name not in only:
            continue
        if isinstance(est, RBFSampler):
            est.set_params(gamma=1.0 / d)  # = gamma="scale" on standardized inputs
        t0 = time.perf_counter()
        pipe = make_pipeline(StandardScaler(), est, LogisticRegression(C=C, max_iter=5000))
        pipe.fit(Xtr, ytr)
        row[name] = float(pipe.score(Xte, yte))
        row[name + " fit_s"] = time.perf_counter() - t0
    return row


def parse_value(v: str):
    if v in ("True", "False"):
        return v == "True"
    if v == "None":
        return None
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="store_true", help="run the tuning family")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--only", default=None, help="comma-separated method names")
    parser.add_argument("--out", default="runs/issue2_check")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--C", type=float, default=1.0, help="LogisticRegression C")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = {}
    for item in args.set:
        key, _, val = item.partition("=")
        overrides[key] = math.inf if val == "inf" else parse_value(val)
    only = set(args.only.split(",")) if args.only else None
    tasks = FAMILY if args.family else [MUST_SHOW]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(out / ("family.jsonl" if args.family else "must_show.jsonl"), "w") as fh:
        for task in tasks:
            for seed in range(args.seeds):
                row = evaluate(task, seed, overrides, only, args.C)
                row["overrides"] = {k: str(v) for k, v in overrides.items()}
                rows.append(row)
                fh.write(json.dumps(row) + "\n")
                fh.flush()
    names = [m for m in methods(0, overrides) if m in rows[0]]
    print("| task | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for task in dict.fromkeys(r["task"] for r in rows):
        rs = [r for r in rows if r["task"] == task]
        cells = []
        for m in names:
            v = np.array([r[m] for r in rs])
            cells.append(f"{v.mean():.3f} ± {v.std():.3f}")
        print(f"| {task} | " + " | ".join(cells) + " |")
    pf = "ParticleFeatures(64)"
    if pf in names:
        for ref in names:
            if ref == pf:
                continue
            diff = np.array([r[pf] - r[ref] for r in rs_all(rows)])
            per_task = [
                np.mean([r[pf] - r[ref] for r in rows if r["task"] == t])
                for t in dict.fromkeys(r["task"] for r in rows)
            ]
            print(
                f"{pf} - {ref}: mean {diff.mean():+.3f}, wins {sum(x > 0 for x in per_task)}"
                f"/{len(per_task)} tasks, worst task {min(per_task):+.3f}"
            )
        fit = np.array([r[pf + " fit_s"] for r in rows])
        print(f"{pf} fit time: mean {fit.mean():.2f} s, max {fit.max():.2f} s")
    return 0


def rs_all(rows):
    return rows


if __name__ == "__main__":
    raise SystemExit(main())

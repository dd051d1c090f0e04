"""``coulomb-attention demo``: fixed versus learned random features on one synthetic task.

The embedded task: XOR of two hidden informative directions in ``d = 20`` dimensions (18 pure
noise dimensions), 5% label noise, 2000 training and 2000 test points. Each method maps the
standardized inputs to N features followed by scikit-learn's ``LogisticRegression``:
RandomFeatures, ImportanceFeatures and ParticleFeatures at N = 64 and 256, and
``sklearn.kernel_approximation.RBFSampler`` at 256 (same ``gamma = 1/d``).

Writes under ``--out`` (default ``runs/demo``): ``results.json`` (accuracies, fit times,
the particle traces, the config), ``results.md`` (the table) and ``demo.png`` (accuracy per
method; in two more panels the alignment ``A`` and ``-H = A - lam W`` of the particles along
the Langevin run: ``lam W`` is small, so on one axis the two curves would coincide).

torch, scikit-learn and matplotlib are imported inside the functions that use them, so that
``coulomb-attention demo --help`` starts fast.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from ..results import atomic_write_text

__all__ = ["add_arguments", "run", "make_demo_task"]


def make_demo_task(n: int, d: int, noise: float, seed: int):
    """XOR of two hidden directions plus ``d - 2`` noise dimensions.

    Returns ``X`` (2n, d) (raw, unequal coordinate scales) and ``y`` (2n,) in {0, 1}; the first
    ``n`` rows are for training (with ``noise`` label flips), the last ``n`` for testing (clean).
    """
    if d < 2:
        raise ValueError(f"the demo task needs d >= 2, got d={d}")
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((2 * n, d))
    y = (z[:, 0] * z[:, 1] > 0).astype(np.int64)
    flip = rng.random(2 * n) < noise
    flip[n:] = False
    y = np.where(flip, 1 - y, y)
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))  # hide the informative directions
    X = (z @ q.T) * rng.uniform(0.5, 2.0, d)
    return X, y


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    parser.add_argument("--n", type=int, default=2000, help="training (= test) points")
    parser.add_argument("--d", type=int, default=20, help="input dimension (2 informative)")
    parser.add_argument("--noise", type=float, default=0.05, help="training label-noise rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")


def _methods(seed: int, d: int) -> dict:
    from sklearn.kernel_approximation import RBFSampler

    from ..estimators import ImportanceFeatures, ParticleFeatures, RandomFeatures

    out = {}
    for n_feat in (64, 256):
        out[f"RandomFeatures({n_feat})"] = RandomFeatures(n_feat, random_state=seed)
        out[f"ImportanceFeatures({n_feat})"] = ImportanceFeatures(n_feat, random_state=seed)
        out[f"ParticleFeatures({n_feat})"] = ParticleFeatures(n_feat, random_state=seed)
    out["RBFSampler(256)"] = RBFSampler(gamma=1.0 / d, n_components=256, random_state=seed)
    return out


def run(args: argparse.Namespace) -> int:
    if args.n < 10:
        raise ValueError(f"--n must be >= 10, got {args.n}")
    if not 0.0 <= args.noise < 0.5:
        raise ValueError(f"--noise must be in [0, 0.5), got {args.noise}")
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    import torch
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from ..estimators import ParticleFeatures

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    X, y = make_demo_task(args.n, args.d, args.noise, args.seed)
    Xtr, ytr, Xte, yte = X[: args.n], y[: args.n], X[args.n :], y[args.n :]
    rows, traces = [], {}
    print(f"task: XOR of 2 hidden directions in d={args.d}, n_train={args.n}, noise={args.noise}")
    print(f"{'method':<24} {'N':>4} {'test acc':>9} {'train acc':>10} {'fit s':>7}")
    for name, est in _methods(args.seed, args.d).items():
        pipe = make_pipeline(StandardScaler(), est, LogisticRegression(max_iter=2000))
        t0 = time.perf_counter()
        pipe.fit(Xtr, ytr)
        fit_s = time.perf_counter() - t0
        row = {
            "method": name,
            "n_components": int(est.n_components),
            "test_accuracy": float(pipe.score(Xte, yte)),
            "train_accuracy": float(pipe.score(Xtr, ytr)),
            "fit_seconds": fit_s,
        }
        if isinstance(est, ParticleFeatures):
            row["initial_alignment"] = est.initial_alignment_
            row["final_alignment"] = est.alignment_
            traces[name] = est.history_
        rows.append(row)
        print(
            f"{name:<24} {row['n_components']:>4} {row['test_accuracy']:>9.3f} "
            f"{row['train_accuracy']:>10.3f} {fit_s:>7.2f}"
        )
    config = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    defaults = ParticleFeatures().get_params()
    result = {
        "config": config,
        "particle_defaults": {k: str(v) for k, v in defaults.items()},
        "results": rows,
        "traces": traces,
    }
    atomic_write_text(out / "results.json", json.dumps(result, indent=1))
    md = "| method | N | test accuracy | train accuracy | fit s |\n|---|---|---|---|---|\n"
    for r in rows:
        md += (
            f"| {r['method']} | {r['n_components']} | {r['test_accuracy']:.3f} | "
            f"{r['train_accuracy']:.3f} | {r['fit_seconds']:.2f} |\n"
        )
    atomic_write_text(out / "results.md", md)
    plot(out / "results.json", out / "demo.png")
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'demo.png'}")
    return 0


def plot(results_path: Path, png_path: Path) -> None:
    """Accuracy bars and particle traces, read from ``results.json`` only.

    Three panels: test accuracy per method; the alignment ``A`` per Langevin step; ``-H = A -
    lam W`` per step. ``A`` and ``-H`` get separate panels because they differ only by the
    repulsion term ``lam W = A + H`` (0.005 against ``A`` ~ 0.4 at the end of the default
    demo), so on one axis the ``-H`` curve would hide under ``A``; the last panel's legend
    gives ``lam W`` at the last step.
    """
    from ..reports import pyplot

    plt = pyplot()

    res = json.loads(Path(results_path).read_text())
    rows = res["results"]
    fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(16, 4.2))
    colors = {
        "Random": "tab:gray",
        "Importance": "tab:orange",
        "Particle": "tab:blue",
        "RBFSampler": "tab:green",
    }
    names = [r["method"] for r in rows]
    accs = [r["test_accuracy"] for r in rows]
    cols = [next(c for k, c in colors.items() if n.startswith(k)) for n in names]
    ax0.barh(names, accs, color=cols)
    for i, a in enumerate(accs):
        ax0.text(a + 0.005, i, f"{a:.3f}", va="center", fontsize=8)
    ax0.set_xlim(0.0, 1.08)  # bars from 0 (a truncated axis makes small gaps look large)
    ax0.axvline(0.5, color="0.6", lw=0.8, ls=":")  # chance of the balanced binary task
    ax0.set_xlabel("test accuracy (logistic regression on the features)")
    ax0.invert_yaxis()
    ax0.set_title("fixed vs learned random features")
    trace_colors = ("tab:blue", "tab:purple", "tab:red", "tab:brown")
    for i, (name, trace) in enumerate(res["traces"].items()):
        color = trace_colors[i % len(trace_colors)]
        steps = np.arange(1, len(trace) + 1)
        align = np.array([t["alignment"] for t in trace])
        neg_h = -np.array([t["energy"] for t in trace])
        ax1.plot(steps, align, color=color, label=name)
        ax2.plot(steps, neg_h, ls="--", color=color,
                 label=f"{name}: lam W = {align[-1] - neg_h[-1]:.4f} at the end")
    ax1.set_xlabel("Langevin step")
    ax1.set_ylabel("mini-batch centered alignment A")
    ax1.set_title("alignment A of the particles")
    ax1.legend(fontsize=8)
    ax2.set_xlabel("Langevin step")
    ax2.set_ylabel("-H = A - lam W")
    ax2.set_title("-H = A - lam W (what the dynamics ascends)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)

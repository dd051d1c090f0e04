"""Plot of the demo study (:mod:`coulomb_attention.studies.demo`), from ``results.json`` only."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["plot"]


def plot(results_path: Path, png_path: Path) -> None:
    """Accuracy bars and particle traces, read from ``results.json`` only.

    Three panels: test accuracy per method; the alignment ``A`` per Langevin step; ``-H = A -
    lam W`` per step. ``A`` and ``-H`` get separate panels because they differ only by the
    repulsion term ``lam W = A + H`` (0.005 against ``A`` ~ 0.4 at the end of the default
    demo), so on one axis the ``-H`` curve would hide under ``A``; the last panel's legend
    gives ``lam W`` at the last step.
    """
    from . import pyplot

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
    kinds = {"Random": "fixed random features", "Importance": "importance-weighted (fixed)",
             "Particle": "learned particles", "RBFSampler": "scikit-learn RBFSampler"}
    seen = [k for k in colors if any(n.startswith(k) for n in names)]
    ax0.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colors[k], label=kinds[k])
                        for k in seen], fontsize=7, ncol=2, loc="upper center",
               bbox_to_anchor=(0.5, -0.16))  # below the axis: the bars keep their labels
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

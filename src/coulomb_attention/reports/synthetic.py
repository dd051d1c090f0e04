"""Plots of the synthetic study (:mod:`coulomb_attention.studies.synthetic`), drawn from its
summary rows, claims and particle file only."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..data.synthetic import spectral_hit_fraction

__all__ = ["COLORS", "plot_accuracy", "plot_particles", "plot_retained"]


def _plt():
    from . import pyplot

    plt = pyplot()

    return plt


COLORS = {
    "rff": "tab:blue",
    "orf": "tab:cyan",
    "importance": "tab:green",
    "particles_lam0": "tab:orange",
    "particles": "tab:red",
    "svm": "black",
}


def plot_accuracy(summary: list[dict], path: Path) -> None:
    """Accuracy vs budget with error bars, one panel per task (rows) and noise (columns)."""
    plt = _plt()
    tasks = sorted({s["task"] for s in summary})
    noises = sorted({s["noise"] for s in summary})
    fig, axes = plt.subplots(
        len(tasks), len(noises), figsize=(3.2 * len(noises), 2.6 * len(tasks)),
        squeeze=False, sharex=True,
    )
    for i, task in enumerate(tasks):
        for j, noise in enumerate(noises):
            ax = axes[i][j]
            for m in COLORS:  # the study's method order
                ss = [s for s in summary
                      if (s["task"], s["noise"], s["method"]) == (task, noise, m)]
                if not ss:
                    continue
                if m == "svm":
                    s = ss[0]
                    ax.axhline(s["acc_mean"], color="black", ls="--", lw=1, label="svm (exact)")
                    ax.axhspan(s["acc_mean"] - s["acc_std"], s["acc_mean"] + s["acc_std"],
                               color="black", alpha=0.08)
                    continue
                ss.sort(key=lambda s: s["N"])
                ax.errorbar([s["N"] for s in ss], [s["acc_mean"] for s in ss],
                            yerr=[s["acc_std"] for s in ss], marker="o", ms=3, capsize=2,
                            color=COLORS[m], label=m)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{task}, noise {noise:.0%}", fontsize=9)
            if j == 0:
                ax.set_ylabel("test accuracy")
            if i == len(tasks) - 1:
                ax.set_xlabel("budget N")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_retained(res: dict, path: Path) -> None:
    """Retained fraction acc64/acc256 per method (bars: mean over cells; dots: cells)."""
    plt = _plt()
    ret = res.get("retained", {})
    if not ret:  # needs N=64 and N=256 in the grid
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    ms = list(ret)
    ax = axes[0]
    for i, m in enumerate(ms):
        ax.bar(i, ret[m]["mean"], color=COLORS[m], alpha=0.7)
        ax.scatter(np.full(len(ret[m]["per_cell"]), i), ret[m]["per_cell"], color="k", s=8)
    ax.axhline(0.9, color="gray", ls=":", label="0.90")
    ax.set_xticks(range(len(ms)), ms, rotation=20, fontsize=8)
    lo = min(min(r["per_cell"]) for r in ret.values())
    hi = max(max(r["per_cell"]) for r in ret.values())
    ax.set_ylim(max(0.0, lo - 0.05), max(1.05, hi + 0.03))
    ax.set_ylabel("acc(N=64) / acc(N=256)")
    ax.set_title("fraction of the 256-feature accuracy retained at 64", fontsize=9)
    ax.legend(fontsize=8)
    ax = axes[1]
    for m, g in res.get("gaps", {}).items():
        ns = sorted(g)
        ax.errorbar(ns, [g[n]["mean"] for n in ns], yerr=[g[n]["std"] for n in ns],
                    marker="o", capsize=3, color=COLORS[m], label=f"particles - {m}")
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("budget N")
    ax.set_ylabel("accuracy gap (mean over cells)")
    ax.set_title("gap learned - fixed vs budget", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_particles(npz_path: Path, path: Path) -> None:
    """Particles before/after in the informative plane and the learned spectral density
    (|omega| in that plane) against the ground-truth frequencies."""
    plt = _plt()
    z = np.load(npz_path)
    f = z["frequencies"][:, :2]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    lim = 1.15 * max(np.abs(f).max(), *(np.abs(z[k][:, :2]).max() for k in (
        "particles_init", "particles_final", "particles_lam0_final")))
    panels = [
        ("particles_init", "initial particles"),
        ("particles_lam0_final", "learned, lam = 0"),
        ("particles_final", "learned, repulsion"),
    ]
    for ax, (k, title) in zip(axes[:3], panels, strict=True):
        w = z[k]
        ax.scatter(w[:, 0], w[:, 1], s=10, alpha=0.7, color="tab:blue" if "init" in k else (
            "tab:orange" if "lam0" in k else "tab:red"))
        ax.scatter(np.r_[f[:, 0], -f[:, 0]], np.r_[f[:, 1], -f[:, 1]], marker="*", s=160,
                   color="k", label="ground truth +-f_k")
        hit = spectral_hit_fraction(w, z["frequencies"])
        inf = float((w[:, :2] ** 2).sum() / (w**2).sum())
        ax.set_title(f"{title} (N={int(z['budget'])})\nnear +-f_k: {hit:.0%}; "
                     f"|omega|^2 on informative dims: {inf:.0%}", fontsize=9)
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax.set_aspect("equal")
        ax.set_xlabel("omega_0 (informative)")
        ax.set_ylabel("omega_1 (informative)")
    axes[0].legend(fontsize=7, loc="lower left")
    ax = axes[3]
    bins = np.linspace(0, lim * 1.4, 30)
    for k, c, lab in (("particles_init", "tab:blue", "initial"),
                      ("particles_lam0_final", "tab:orange", "learned lam=0"),
                      ("particles_final", "tab:red", "learned, repulsion")):
        ax.hist(np.linalg.norm(z[k][:, :2], axis=1), bins=bins, density=True, histtype="step",
                lw=1.5, color=c, label=lab)
    for r in np.linalg.norm(f, axis=1):
        ax.axvline(r, color="k", ls="--", lw=1)
    ax.set_xlabel("|omega| in the informative plane")
    ax.set_ylabel("density")
    ax.set_title("radial spectral density; dashed: |f_k|", fontsize=9)
    ax.legend(fontsize=7)
    fig.suptitle(f"spectral task: initial particles = {z['init_source']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)



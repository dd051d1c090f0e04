"""Plots of the mean-field study (:mod:`coulomb_attention.studies.meanfield`), made from its
files only (``summary.json``, ``pde_trace.jsonl``, ``snapshots.npz``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["plot"]


def plot(out: str | Path) -> None:
    """Make ``densities.png``, ``free_energy.png`` and ``distance_vs_n.png`` from the files
    in ``out`` (``summary.json``, ``pde_trace.jsonl``, ``snapshots.npz``)."""
    from . import pyplot

    plt = pyplot()

    out = Path(out)
    s = json.loads((out / "summary.json").read_text())
    cfg = s["config"]
    snap = np.load(out / "snapshots.npz")
    times = list(snap["times"])
    R = float(snap["half_width"])
    n = cfg["grid"]
    edges = np.linspace(-R, R, n + 1)
    centres = 0.5 * (edges[1:] + edges[:-1])
    n_max = int(snap["n_max"])

    # densities
    if cfg["dim"] == 1:
        fig, axes = plt.subplots(1, len(times), figsize=(3.2 * len(times), 3), sharey=True)
        for i, (ax, t) in enumerate(zip(np.atleast_1d(axes), times, strict=True)):
            ax.hist(snap[f"particles_t{i}"][:, 0], bins=min(60, n), range=(-R, R),
                    density=True, alpha=0.5, color="tab:orange", label=f"particles N={n_max}")
            ax.plot(centres, snap[f"rho_t{i}"], color="k", lw=1.5, label="PDE")
            ax.set_title(f"t = {t:.3g}")
            ax.set_xlabel("omega")
        np.atleast_1d(axes)[0].legend(fontsize=8)
        np.atleast_1d(axes)[0].set_ylabel("density")
    else:
        # one colour scale per time (column): the PDE's maximum; a colour bar under each
        # column (a histogram above that maximum is clipped: the bar then has an arrow)
        fig, axes = plt.subplots(2, len(times), figsize=(3.0 * len(times), 7.2),
                                 squeeze=False, layout="constrained")
        for i, t in enumerate(times):
            rho = snap[f"rho_t{i}"]
            vmax = rho.max()
            im = axes[0, i].imshow(rho.T, origin="lower", extent=(-R, R, -R, R), vmin=0,
                                   vmax=vmax)
            axes[0, i].set_title(f"PDE t = {t:.3g}")
            h, _, _ = np.histogram2d(*snap[f"particles_t{i}"].T, bins=min(16, n),
                                     range=[[-R, R], [-R, R]], density=True)
            axes[1, i].imshow(h.T, origin="lower", extent=(-R, R, -R, R), vmin=0, vmax=vmax)
            axes[1, i].set_title(f"particles N={n_max}")
            axes[1, i].set_xlabel("omega_0")
            fig.colorbar(im, ax=axes[:, i], location="bottom", shrink=0.9,
                         extend="max" if h.max() > vmax else "neither",
                         label=f"density at t = {t:.3g}")
        axes[0, 0].set_ylabel("omega_1")
        axes[1, 0].set_ylabel("omega_1")
    if cfg["dim"] == 1:
        fig.tight_layout()
    fig.savefig(out / "densities.png", dpi=110)
    plt.close(fig)

    # free energy
    trace = [json.loads(line) for line in (out / "pde_trace.jsonl").read_text().splitlines()]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ts = [r["t"] for r in trace]
    for key, style in (("free_energy", "k-"), ("potential", "C0--"), ("interaction", "C1--"),
                       ("entropy", "C2--")):
        ax.plot(ts, [r[key] for r in trace], style, label=key.replace("_", " "))
    ax.set_xlabel("t")
    ax.set_title("PDE free energy F(rho_t) and its terms")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "free_energy.png", dpi=110)
    plt.close(fig)

    # distance vs N
    fig, ax = plt.subplots(figsize=(5, 4))
    ns = np.array(cfg["ns"], float)
    for j, t in enumerate(times):
        key = f"{t:g}"
        mean = np.array(s["mean_distance_by_time"][key])
        std = np.array(s["std_distance_by_time"][key])
        ax.errorbar(ns, mean, yerr=std, marker="o", ms=3, capsize=2, color=f"C{j}",
                    label=f"t={t:.3g}, slope {s['slopes_by_time'][key]:.2f}")
    fit = np.exp(s["intercept"]) * ns ** s["slope"]
    ax.plot(ns, fit, "k--", lw=1, label=f"fit at t={times[-1]:.3g}: slope {s['slope']:.3f}")
    ax.plot(ns, fit[0] * (ns / ns[0]) ** -0.5, ":", color="gray", label="N^-1/2")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("N (particles)")
    ax.set_ylabel("W1" if s["metric"] == "w1" else "MMD")
    ax.set_title(f"particles vs PDE ({cfg['dim']}-D)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "distance_vs_n.png", dpi=110)
    plt.close(fig)

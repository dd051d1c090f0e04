"""Plot of the concentration study (:mod:`coulomb_attention.studies.concentration`), drawn
from its result dict only."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

__all__ = ["plot"]


def _label_log_axis(axis, lo: float, hi: float) -> None:
    """At least three labelled ticks, in plain numbers, on a log ``axis`` spanning ``[lo, hi]``.

    matplotlib labels only powers of ten, so a range inside one decade (a spread of 0.4-1)
    had one label or none. Use the sparsest of 1, 1-2-5, 1-2-3-5-7, 1-9 (times powers of ten)
    that gives three ticks spread over the range, else five rounded values evenly spaced in
    log.
    """
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    lo, hi = min(lo, hi), max(lo, hi)
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    for subs in ((1,), (1, 2, 5), (1, 2, 3, 5, 7), range(1, 10)):
        ticks = [m * 10.0**k for k in decades for m in subs if lo <= m * 10.0**k <= hi]
        if len(ticks) >= 3 and ticks[-1] / ticks[0] >= (hi / lo) ** 0.4:  # not bunched
            break
    else:  # less than a 1-2 step: rounded values, with as many digits as it takes
        for digits in range(2, 7):
            ticks = sorted({float(f"{v:.{digits}g}") for v in np.geomspace(lo, hi, 7)[1:-1]})
            if len(ticks) >= 3:
                break
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.6g}"))
    axis.set_minor_formatter(NullFormatter())


def plot(res: dict, path: Path) -> None:
    from . import pyplot

    plt = pyplot()

    s = res["slopes"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    ax = axes[0]
    for kind, color in (("particles", "tab:red"), ("fixed", "tab:blue")):
        rs = [r for r in res["rows"] if r["sweep"] == "N" and r["kind"] == kind]
        ax.loglog([r["N"] for r in rs], [r["spread"] for r in rs], "o-", color=color,
                  label=f"{kind} (slope {s[f'{kind}_vs_N']:+.2f})")
    ns = np.array(res["config"]["budgets"], float)
    rs = [r for r in res["rows"] if r["sweep"] == "N" and r["kind"] == "fixed"]
    ax.loglog(ns, rs[0]["spread"] * (ns / ns[0]) ** -0.5, "k:", label="N^-1/2")
    ax.set_xticks(ns, [str(int(v)) for v in ns])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    _label_log_axis(ax.yaxis, *ax.get_ylim())
    ax.set_xlabel("N")
    ax.set_ylabel("kernel spread across seeds")
    ax.set_title(f"vs N (beta={res['config']['beta_for_n']:g})", fontsize=9)
    ax.legend(fontsize=8)
    ax = axes[1]
    rs = [r for r in res["rows"] if r["sweep"] == "beta"]
    ax.loglog([r["beta"] for r in rs], [r["spread"] for r in rs], "o-", color="tab:red",
              label=f"particles (slope {s['particles_vs_beta']:+.2f})")
    _label_log_axis(ax.yaxis, *ax.get_ylim())
    ax.set_xlabel("beta")
    ax.set_ylabel("kernel spread across seeds")
    ax.set_title(f"vs beta (N={res['config']['n_for_beta']})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

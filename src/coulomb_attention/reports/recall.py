"""MQAR report from ``results.jsonl`` only: accuracy per variant and M, paired comparisons
over seeds, the target checks, and one plot of accuracy against M per level."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..names import NO_PARTICLES
from ..results import atomic_write_text, read_jsonl
from ..stats import paired_difference
from . import pyplot

__all__ = ["summarize", "write_report"]


def _key(r: dict) -> tuple[str, str]:
    """(attention, kernel), the kernel labelled with its route (teacher route: init, objective,
    fit method) when the row has one."""
    route = r.get("route")
    return r["attention"], r["kernel"] if not route else f"{r['kernel']} [{route}]"


def _cell(values: list[float]) -> str:
    if not values:
        return ""
    v = np.asarray(values)
    sd = f" +- {v.std(ddof=1):.3f}" if v.size > 1 else ""
    return f"{v.mean():.3f}{sd} ({v.size})"


def _by_seed(rows, att, kernel, m=None) -> dict[int, float]:
    return {r["seed"]: r["accuracy"] for r in rows if _key(r) == (att, kernel)
            and (m is None or r["n_features"] == m)}


def _paired(a: dict[int, float], b: dict[int, float]) -> str:
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return "no common seeds"
    mean, lo, hi, n = paired_difference([a[s] for s in seeds], [b[s] for s in seeds])
    ci = "" if math.isnan(lo) else f" [{lo:+.3f}, {hi:+.3f}]"
    return f"{mean:+.3f}{ci} over {n} seed(s)"


def summarize(rows: list[dict]) -> list[str]:
    """Markdown lines: per level a table (variant x M) and the target checks."""
    lines = ["# MQAR: accuracy on the queried values", "",
             "Mean +- std over seeds (number of seeds); exact match, argmax over the vocabulary.",
             "Maps without particles (softmax, elu, none) do not depend on M: one column.", ""]
    levels = sorted({r["level"] for r in rows}, key=lambda s: (s != "easy", s))
    for level in levels:
        lr = [r for r in rows if r["level"] == level]
        task = lr[0]["config"]["task"]
        ms = sorted({r["n_features"] for r in lr if r["attention"] not in NO_PARTICLES})
        lines += [f"## {level}: vocabulary {task['vocab_size']}, {task['n_pairs']} pairs, "
                  f"{task['n_queries']} queries, length {task['seq_len']} "
                  f"(chance {lr[0]['chance']:.3f})", "",
                  "| attention | kernel | " + " | ".join(f"M={m}" for m in ms) + " |",
                  "|---|---|" + "---|" * len(ms)]
        for att, kernel in sorted({_key(r) for r in lr}):
            if att in NO_PARTICLES:
                cells = [_cell(list(_by_seed(lr, att, kernel).values()))] + [""] * (len(ms) - 1)
            else:
                cells = [_cell(list(_by_seed(lr, att, kernel, m).values())) for m in ms]
            lines.append(f"| {att} | {kernel if att not in NO_PARTICLES else '-'} | "
                         + " | ".join(cells) + " |")
        lines += ["", "Checks (paired over seeds, mean [95% t-interval]):", ""]
        soft, none = _by_seed(lr, "softmax", "vanilla"), _by_seed(lr, "none", "vanilla")
        if soft:
            lines.append(f"- softmax accuracy {np.mean(list(soft.values())):.4f} "
                         f"(target >= 0.99 at the easy level: the exact reference must solve "
                         f"MQAR; docs/recall.md)")
        if none:
            lines.append(f"- none accuracy {np.mean(list(none.values())):.4f} "
                         f"(chance {lr[0]['chance']:.4f})")
        fav = {m: np.mean(list(_by_seed(lr, "favor", "vanilla", m).values())) for m in ms
               if _by_seed(lr, "favor", "vanilla", m)}
        if fav:
            lines.append("- fixed FAVOR+ by M: " + ", ".join(f"M={m}: {v:.3f}"
                                                             for m, v in fav.items()))
        for att in sorted({r["attention"] for r in lr} - set(NO_PARTICLES)):
            for m_small, m_big in ((16, 64), (4, 4), (16, 16), (64, 64)):
                a = _by_seed(lr, att, "learned", m_small)
                b = _by_seed(lr, att, "vanilla", m_big)
                if a and b:
                    lines.append(f"- {att}: learned M={m_small} minus vanilla M={m_big}: "
                                 f"{_paired(a, b)}")
        lines.append("")
    return lines


def _plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    levels = sorted({r["level"] for r in rows}, key=lambda s: (s != "easy", s))
    fig, axes = plt.subplots(1, len(levels), figsize=(6 * len(levels), 4.2), squeeze=False)
    colors = {"favor": "C0", "porf_softplus": "C1", "softmax_feat": "C2"}
    flat = {"softmax": ("k", "-"), "elu": ("C4", "-."), "none": ("C3", ":")}
    for ax, level in zip(axes[0], levels, strict=True):
        lr = [r for r in rows if r["level"] == level]
        for att, kernel in sorted({_key(r) for r in lr}):
            if att in NO_PARTICLES:
                acc = list(_by_seed(lr, att, kernel).values())
                c, ls = flat[att]
                ax.axhline(np.mean(acc), color=c, ls=ls, lw=1.2, label=att)
                continue
            ms = sorted({r["n_features"] for r in lr if _key(r) == (att, kernel)})
            acc = [list(_by_seed(lr, att, kernel, m).values()) for m in ms]
            mean = [np.mean(a) for a in acc]
            err = [np.std(a, ddof=1) if len(a) > 1 else 0.0 for a in acc]
            ax.errorbar(ms, mean, yerr=err, color=colors.get(att, "C5"), capsize=3,
                        ls="-" if kernel.startswith("learned") else "--",
                        marker="o" if kernel.startswith("learned") else "s",
                        label=f"{att} {kernel}")
        ax.axhline(lr[0]["chance"], color="grey", lw=0.8, ls=(0, (1, 3)), label="chance")
        task = lr[0]["config"]["task"]
        ax.set(xscale="log", xlabel="features per head M", ylabel="accuracy",
               ylim=(0, 1.02), title=f"MQAR {level}: {task['n_pairs']} pairs, "
               f"L={task['seq_len']}")
        ax.set_xticks(sorted({r['n_features'] for r in lr
                              if r["attention"] not in NO_PARTICLES}) or [64])
        ax.xaxis.set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(plt.matplotlib.ticker.NullFormatter())
        ax.grid(alpha=0.3)
    handles = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    axes[0][-1].legend(handles.values(), handles.keys(), fontsize=7, loc="center left",
                       bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def latest_runs(rows: list[dict]) -> tuple[list[dict], int]:
    """One row per (level, attention, kernel, M, seed): the last one written (a grid re-run
    with a changed level config appends new rows; the superseded ones are not mixed in).
    Returns (rows, number of superseded rows)."""
    last: dict[tuple, dict] = {}
    for r in rows:
        last[(r["level"], r["attention"], r["kernel"], r.get("route"), r["n_features"],
              r["seed"])] = r
    return list(last.values()), len(rows) - len(last)


def write_report(out: str | Path) -> Path:
    """``OUT/summary.md`` and ``OUT/accuracy_vs_M.png`` from ``OUT/results.jsonl`` (the latest
    row of each run, :func:`latest_runs`)."""
    out = Path(out)
    rows = read_jsonl(out / "results.jsonl")
    if not rows:
        raise ValueError(f"no results in {out / 'results.jsonl'}")
    rows, superseded = latest_runs(rows)
    diverged = [r for r in rows if r.get("accuracy") is None]
    rows = [r for r in rows if r.get("accuracy") is not None]
    if not rows:
        raise ValueError(f"no finished runs in {out / 'results.jsonl'} (all diverged)")
    lines = summarize(rows)
    if diverged:
        lines += ["## Diverged runs (non-finite training loss; not in the means above)", ""]
        lines += [f"- {r['level']} {r['attention']}-{r['kernel']} M={r['n_features']} "
                  f"seed={r['seed']}: {r.get('diverged', '')}" for r in diverged]
        lines.append("")
    if superseded:
        lines += ["", f"({superseded} earlier row(s) of re-run configurations in results.jsonl "
                  "are superseded by the latest row of the same run and not shown.)"]
    atomic_write_text(out / "summary.md", "\n".join(lines) + "\n")
    _plot(rows, out / "accuracy_vs_M.png")
    return out / "summary.md"

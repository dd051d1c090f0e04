"""Report of the ablation study, from ``records.jsonl`` only (never re-running anything).

For every arena and setting: the mean score per variant label (variant and params) and M with
its 95% t-interval over seeds; the paired differences (by seed) of every label against the
references ``gradient``, ``fixed``, ``langevin`` (coulomb - langevin: the repulsion alone) and
``hedgehog`` (those the arena has), with 95% t-intervals
(:func:`coulomb_attention.stats.paired_difference`); one verdict line per
(setting, M, Coulomb label) with at least :data:`MIN_VERDICT_SEEDS` paired seeds: "Coulomb beats
gradient at M=..: yes/no [interval]" ("yes" when the whole interval is above 0); the means of
the particle diagnostics; and the plots
``ablation_<arena>_score.png`` (score vs M per label, one panel per setting) and
``ablation_<arena>_energy.png`` (mean energy trace over seeds per label at the largest M).

Also: the capacity comparison "learned at M minus fixed at 2M and 4M" (paired by seed, every
non-fixed label, where the records hold those M: :func:`capacity_differences`) and the means
of every other numeric field of the records (run statistics such as ``fit_accuracy``,
``holdout_kl_after``, ``fit_ess``, ``fit_births``, ``weights.ess_share``:
:func:`run_statistics_table`). The records may come from several files, pooled by run key (a
later file wins: :func:`pool_records`), and the references of the paired differences are a
parameter (e.g. add ``coulomb`` for ``weighted - coulomb``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..dynamics.variants import VARIANTS as _VOCABULARY
from ..results import atomic_write_text, read_jsonl, run_key
from ..stats import mean_interval, paired_difference
from . import pyplot

__all__ = [
    "CAPACITY_FACTORS",
    "DIAGNOSTICS",
    "METRIC_RANGE",
    "MIN_VERDICT_SEEDS",
    "REFERENCES",
    "SPEC_KEYS",
    "VARIANTS",
    "capacity_differences",
    "diagnostics_table",
    "error_bars",
    "label",
    "paired_differences",
    "pool_records",
    "record_key",
    "run_statistics_table",
    "score_table",
    "verdicts",
    "write_ablation_report",
]

#: the variant names, in the order the studies plan them and the report shows them: the
#: vocabulary's (:data:`coulomb_attention.dynamics.variants.VARIANTS`, what each one fits)
VARIANTS = tuple(_VOCABULARY)

REFERENCES = ("gradient", "fixed", "langevin", "hedgehog")
#: a yes/no verdict needs this many paired seeds (below it the interval says nothing)
MIN_VERDICT_SEEDS = 3
#: the range of each score metric: error bars are clipped to it
METRIC_RANGE = {"accuracy": (0.0, 1.0), "cosine": (-1.0, 1.0)}
DIAGNOSTICS = ("nn_min", "nn_median", "collapsed_share", "effective_rank")
#: the keys of a run (:func:`record_key`; :func:`coulomb_attention.studies.ablation.run_key`)
SPEC_KEYS = ("arena", "setting", "variant", "params", "M", "seed")
#: learned at M against fixed at these multiples of M (:func:`capacity_differences`)
CAPACITY_FACTORS = (2, 4)
#: record fields that are not run statistics (:func:`run_statistics_table`)
_NOT_STATISTICS = {*SPEC_KEYS, "metric", "score", "diagnostics", "energy_trace", "config"}


def record_key(record: dict[str, Any]) -> str:
    """The run key of a record or spec: ``(arena, setting, variant, sorted params, M, seed)``
    as one JSON string (the study's resume key, one home)."""
    key = {k: record[k] for k in SPEC_KEYS}
    key["M"], key["seed"] = int(key["M"]), int(key["seed"])
    return run_key(key)


def pool_records(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """The records of every file in ``paths``, pooled by run key: a later file's (or a later
    line's) record of a key replaces the earlier one. A missing file is an error."""
    pooled: dict[str, dict[str, Any]] = {}
    for path in paths:
        if not Path(path).is_file():
            raise FileNotFoundError(f"records file {path} not found")
        for r in read_jsonl(path):
            missing = [k for k in SPEC_KEYS if k not in r]
            if missing:
                raise ValueError(f"a record in {path} lacks {', '.join(missing)}")
            key = record_key(r)
            pooled.pop(key, None)  # a replaced record takes the later position
            pooled[key] = r
    return list(pooled.values())


def label(record: dict[str, Any]) -> str:
    """``variant`` or ``variant(k=v, ...)`` with the params sorted by name."""
    params = record.get("params") or {}
    if not params:
        return str(record["variant"])
    inner = ", ".join(f"{k}={v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool)
                      else f"{k}={v}" for k, v in sorted(params.items()))
    return f"{record['variant']}({inner})"


def _fmt(x: float, fmt: str = "+.4f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _interval(mean: float, low: float, high: float, sign: str = "+") -> str:
    f = f"{sign}.4f"
    if math.isnan(low):
        return _fmt(mean, f)
    return f"{_fmt(mean, f)} [{_fmt(low, f)}, {_fmt(high, f)}]"


def _cells(records):
    """``{(arena, setting): {label: {M: {seed: record}}}}`` (a later record of a key wins)."""
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for r in records:
        out[(r["arena"], r["setting"])][label(r)][int(r["M"])][int(r["seed"])] = r
    return out


def _variant_order(lab: str) -> tuple:
    base = lab.split("(")[0]
    return (VARIANTS.index(base) if base in VARIANTS else len(VARIANTS), lab)


def score_table(records: list[dict[str, Any]]) -> str:
    """Markdown: per arena and setting, mean score +- t half-width (seeds) per label and M."""
    lines = []
    for (arena, setting), labels in sorted(_cells(records).items()):
        ms = sorted({m for per in labels.values() for m in per})
        metric = next(iter(next(iter(labels.values())).values()))
        metric = next(iter(metric.values()))["metric"]
        lines += [f"### {arena} / {setting} ({metric}, held out)", "",
                  "| variant | " + " | ".join(f"M = {m}" for m in ms) + " |",
                  "|---|" + "---|" * len(ms)]
        for lab in sorted(labels, key=_variant_order):
            cells = []
            for m in ms:
                runs = labels[lab].get(m, {})
                if not runs:
                    cells.append("")
                    continue
                mean, lo, hi, n = mean_interval([r["score"] for r in runs.values()])
                half = "" if math.isnan(lo) else f" +- {(hi - lo) / 2:.4f}"
                cells.append(f"{mean:.4f}{half} ({n})")
            lines.append(f"| {lab} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def paired_differences(records: list[dict[str, Any]],
                       references: tuple[str, ...] = REFERENCES) -> list[dict[str, Any]]:
    """Every label minus every reference label (variant in ``references``) of the same arena,
    setting and M, paired by seed over the seeds both have: rows ``arena, setting, M, label,
    reference, mean, low, high, n, seeds, ahead`` (``ahead``: seeds where the label scores
    strictly higher; the targets ask "every seed"). A pair of two references appears once
    (the later reference minus the earlier one in :data:`VARIANTS` order)."""
    rows = []
    for (arena, setting), labels in sorted(_cells(records).items()):
        refs = sorted((lab for lab in labels if lab.split("(")[0] in references),
                      key=_variant_order)
        for ref in refs:
            for lab in sorted(labels, key=_variant_order):
                if lab == ref or (lab in refs and refs.index(lab) < refs.index(ref)):
                    continue
                for m in sorted(set(labels[lab]) & set(labels[ref])):
                    pair = _pair(labels[lab][m], labels[ref][m])
                    if pair:
                        rows.append({"arena": arena, "setting": setting, "M": m, "label": lab,
                                     "reference": ref, **pair})
    return rows


def _pair(a: dict[int, dict], b: dict[int, dict]) -> dict[str, Any] | None:
    """``a - b`` of two ``{seed: record}`` cells, paired by seed over the seeds both have:
    ``mean, low, high, n, seeds, ahead`` (seeds where ``a`` scores strictly higher); None
    without a common seed."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    mean, lo, hi, n = paired_difference([a[s]["score"] for s in seeds],
                                        [b[s]["score"] for s in seeds])
    return {"mean": mean, "low": lo, "high": hi, "n": n, "seeds": seeds,
            "ahead": sum(a[s]["score"] > b[s]["score"] for s in seeds)}


def capacity_differences(records: list[dict[str, Any]],
                         factors: Sequence[int] = CAPACITY_FACTORS) -> list[dict[str, Any]]:
    """Every non-fixed label at M minus ``fixed`` at ``k M`` (``k`` in ``factors``) of the same
    arena and setting, paired by seed over the seeds both have, where the records hold both:
    rows ``arena, setting, M, label, fixed_M, mean, low, high, n, seeds, ahead`` ("is
    learning worth k times the features?")."""
    rows = []
    for (arena, setting), labels in sorted(_cells(records).items()):
        if "fixed" not in labels:
            continue
        fixed = labels["fixed"]
        for lab in sorted(labels, key=_variant_order):
            if lab.split("(")[0] == "fixed":
                continue
            for m in sorted(labels[lab]):
                for k in factors:
                    pair = _pair(labels[lab][m], fixed[k * m]) if k * m in fixed else None
                    if pair:
                        rows.append({"arena": arena, "setting": setting, "M": m, "label": lab,
                                     "fixed_M": k * m, **pair})
    return rows


def _statistics(record: dict[str, Any]) -> dict[str, float]:
    """The numeric fields of a record that are not its key, score or diagnostics (one level
    of nested dicts as ``outer.inner``; booleans and ``None`` left out)."""
    out = {}

    def numeric(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    for k, v in record.items():
        if k in _NOT_STATISTICS:
            continue
        if numeric(v):
            out[k] = float(v)
        elif isinstance(v, dict):
            out.update({f"{k}.{kk}": float(vv) for kk, vv in v.items() if numeric(vv)})
    return out


def run_statistics_table(records: list[dict[str, Any]]) -> str:
    """Markdown: per arena, one table of the means over seeds (per setting, M and label) of
    every other numeric field its records have (:func:`_statistics`: e.g. ``fit_accuracy``,
    ``holdout_kl_before``, ``holdout_kl_after``, ``fit_ess``, ``fit_births``, ``time_s``);
    a cell is empty where no seed has the field. Empty text when no record has one."""
    lines = []
    for arena in sorted({r["arena"] for r in records}):
        cells = {k: v for k, v in _cells(records).items() if k[0] == arena}
        fields = sorted({f for r in records if r["arena"] == arena for f in _statistics(r)})
        if not fields:
            continue
        lines += [f"### {arena}", "", "| setting | M | variant | " + " | ".join(fields) + " |",
                  "|---|---|---|" + "---|" * len(fields)]
        for (_, setting), labels in sorted(cells.items()):
            for lab in sorted(labels, key=_variant_order):
                for m in sorted(labels[lab]):
                    stats = [_statistics(r) for r in labels[lab][m].values()]
                    row = []
                    for f in fields:
                        vals = [s[f] for s in stats if f in s]
                        row.append(f"{sum(vals) / len(vals):.4g}" if vals else "")
                    lines.append(f"| {setting} | {m} | {lab} | " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines)


def verdicts(records: list[dict[str, Any]]) -> list[str]:
    """One line per arena, setting, M and Coulomb label with at least
    :data:`MIN_VERDICT_SEEDS` paired seeds: whether it beats ``gradient`` (the paired 95%
    interval entirely above 0). Pairs with fewer seeds get no verdict."""
    out = []
    for row in paired_differences(records, ("gradient",)):
        if row["label"].split("(")[0] != "coulomb" or row["reference"].split("(")[0] != "gradient":
            continue
        if row["n"] < MIN_VERDICT_SEEDS:
            continue
        yes = not math.isnan(row["low"]) and row["low"] > 0
        out.append(f"{row['arena']}: Coulomb beats gradient at M={row['M']}: "
                   f"{'yes' if yes else 'no'} "
                   f"{_interval(row['mean'], row['low'], row['high'])} "
                   f"({row['setting']}, {row['label']} - {row['reference']}, "
                   f"{row['n']} seeds)")
    return out


def diagnostics_table(records: list[dict[str, Any]]) -> str:
    """Markdown: per arena, setting, M and label, the mean over seeds of each diagnostic."""
    lines = ["| arena | setting | M | variant | " + " | ".join(DIAGNOSTICS) + " |",
             "|---|---|---|---|" + "---|" * len(DIAGNOSTICS)]
    for (arena, setting), labels in sorted(_cells(records).items()):
        for lab in sorted(labels, key=_variant_order):
            for m in sorted(labels[lab]):
                runs = list(labels[lab][m].values())
                cells = []
                for key in DIAGNOSTICS:
                    vals = [float(r["diagnostics"][key]) for r in runs
                            if (r.get("diagnostics") or {}).get(key) is not None]
                    cells.append(f"{sum(vals) / len(vals):.4g}" if vals else "")
                lines.append(f"| {arena} | {setting} | {m} | {lab} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def error_bars(stats: list[tuple], metric: str | None) -> list[list[float]]:
    """Matplotlib's ``yerr`` ``[below, above]`` of ``mean_interval`` tuples: the 95% interval
    clipped to the metric's range (:data:`METRIC_RANGE`; a bar never leaves [0, 1] for an
    accuracy); 0 where the interval is undefined (one seed)."""
    lo_lim, hi_lim = METRIC_RANGE.get(metric, (-math.inf, math.inf))
    return [[0.0 if math.isnan(lo) else mean - max(lo, lo_lim) for mean, lo, _, _ in stats],
            [0.0 if math.isnan(hi) else min(hi, hi_lim) - mean for mean, _, hi, _ in stats]]


def _plot_scores(records, arena: str, path: Path) -> None:
    plt = pyplot()
    cells = {k: v for k, v in _cells(records).items() if k[0] == arena}
    fig, axes = plt.subplots(1, len(cells), figsize=(4.2 * len(cells), 3.4), squeeze=False)
    # one colour per label in every panel (panels may hold different labels), one legend
    every = sorted({lab for labels in cells.values() for lab in labels}, key=_variant_order)
    cmap = plt.get_cmap("tab10" if len(every) <= 10 else "tab20")
    color = {lab: cmap(i % cmap.N) for i, lab in enumerate(every)}
    for ax, ((_, setting), labels) in zip(axes[0], sorted(cells.items()), strict=True):
        for lab in sorted(labels, key=_variant_order):
            ms = sorted(labels[lab])
            runs = [list(labels[lab][m].values()) for m in ms]
            stats = [mean_interval([r["score"] for r in rs]) for rs in runs]
            err = error_bars(stats, runs[0][0].get("metric"))
            ax.errorbar(ms, [s[0] for s in stats], yerr=err, marker="o", capsize=3, label=lab,
                        color=color[lab])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (features)")
        ax.set_title(f"{arena} / {setting}")
        ax.legend(fontsize=7)  # every panel: its own labels, the same colours everywhere
    axes[0][0].set_ylabel("held-out score")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_energy(records, arena: str, path: Path) -> bool:
    cells = {k: v for k, v in _cells(records).items() if k[0] == arena}
    plt = pyplot()
    fig, axes = plt.subplots(1, len(cells), figsize=(4.2 * len(cells), 3.4), squeeze=False)
    drawn = False
    for ax, ((_, setting), labels) in zip(axes[0], sorted(cells.items()), strict=True):
        for lab in sorted(labels, key=_variant_order):
            m = max(labels[lab])
            sums: dict[int, list[float]] = defaultdict(list)
            for r in labels[lab][m].values():
                for t in r.get("energy_trace") or []:
                    sums[int(t["step"])].append(float(t["energy"]))
            if not sums:
                continue
            steps = sorted(sums)
            ax.plot(steps, [sum(sums[s]) / len(sums[s]) for s in steps], label=f"{lab} M={m}")
            drawn = True
        ax.set_xlabel("step")
        ax.set_title(f"{arena} / {setting}")
        if ax.get_lines():
            ax.legend(fontsize=7)
    axes[0][0].set_ylabel("energy (mean over seeds)")
    if drawn:
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return drawn


def write_ablation_report(out: str | Path, plots: bool = True,
                          records: Sequence[str | Path] | None = None,
                          references: Sequence[str] = REFERENCES) -> Path:
    """Write ``out/report.md`` (and the plots) from ``out/records.jsonl``, or from the files
    ``records`` pooled by run key (:func:`pool_records`: a later file wins); the paired
    differences are taken against the variants ``references``. Returns the report's path."""
    out = Path(out)
    for ref in references:
        if ref not in VARIANTS:
            raise ValueError(f"unknown reference variant {ref!r}; valid: {', '.join(VARIANTS)}")
    if records is None:
        paths, source = [out / "records.jsonl"], "`records.jsonl`"
        rows = read_jsonl(paths[0])
    else:
        paths = [Path(p) for p in records]
        source = ", ".join(f"`{p}`" for p in paths) + " (pooled by run key, a later file wins)"
        rows = pool_records(paths)
    if not rows:
        raise ValueError(f"{', '.join(map(str, paths))} holds no records")
    records = rows
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Ablation study", "",
             f"{len(records)} runs from {source}; scores on held-out data, higher is "
             "better; intervals are 95% t-intervals over seeds.", "", "## Verdicts", ""]
    lines += [f"- {v}" for v in verdicts(records)] or [
        f"- (none: no coulomb/gradient pair with {MIN_VERDICT_SEEDS} or more seeds)"]
    lines += ["", "## Scores", "", score_table(records), "## Paired differences", "",
              "Each label minus the reference, paired by seed: mean [95% t-interval] (seeds).",
              "", "| arena | setting | M | variant | reference | difference | n | seeds ahead |",
              "|---|---|---|---|---|---|---|---|"]
    for r in paired_differences(records, tuple(references)):
        lines.append(f"| {r['arena']} | {r['setting']} | {r['M']} | {r['label']} | "
                     f"{r['reference']} | {_interval(r['mean'], r['low'], r['high'])} | "
                     f"{r['n']} | {r['ahead']}/{r['n']} |")
    capacity = capacity_differences(records)
    if capacity:
        lines += ["", "## Learned at M against fixed at 2M and 4M", "",
                  "Each non-fixed label at M minus `fixed` at 2M or 4M (same setting), paired "
                  "by seed: mean [95% t-interval] (seeds).", "",
                  "| arena | setting | M | variant | fixed at | difference | n | seeds ahead |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in capacity:
            lines.append(f"| {r['arena']} | {r['setting']} | {r['M']} | {r['label']} | "
                         f"M = {r['fixed_M']} | {_interval(r['mean'], r['low'], r['high'])} | "
                         f"{r['n']} | {r['ahead']}/{r['n']} |")
    lines += ["", "## Diagnostics (means over seeds)", "", diagnostics_table(records)]
    statistics = run_statistics_table(records)
    if statistics:
        lines += ["## Run statistics (means over seeds)", "", statistics]
    if plots:
        lines += ["## Plots", ""]
        for arena in sorted({r["arena"] for r in records}):
            _plot_scores(records, arena, out / f"ablation_{arena}_score.png")
            lines.append(f"![{arena} scores](ablation_{arena}_score.png)")
            if _plot_energy(records, arena, out / f"ablation_{arena}_energy.png"):
                lines.append(f"![{arena} energy](ablation_{arena}_energy.png)")
        lines.append("")
    path = out / "report.md"
    atomic_write_text(path, "\n".join(lines))
    return path

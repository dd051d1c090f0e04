"""Report of the pretrained-encoder comparison (``coulomb-attention minilm compare / report``).

Reads ``OUT/results.jsonl`` only (rows of :func:`coulomb_attention.studies.minilm.row_of`)
and writes ``OUT/report.md`` (per task: the mean of every metric over seeds with its 95%
t-interval, paired differences on common seeds, the issue's target checks, wall times),
``OUT/report.json`` (the same numbers) and ``OUT/<task>.png`` (accuracy, ECE and Brier per
variant: seeds as dots, mean and interval as a bar, clipped to [0, 1]).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..results import atomic_write_json, atomic_write_text
from ..stats import mean_interval, paired_difference

__all__ = ["COMPARISONS", "METRICS", "load_rows", "summarise", "targets", "wall_time",
           "write_report"]

#: metrics of the table: (key, label, higher is better)
METRICS: tuple[tuple[str, str, bool], ...] = (
    ("accuracy", "accuracy", True), ("mcc", "MCC", True), ("f1", "F1", True),
    ("ece", "ECE", False), ("log_loss", "log-loss", False), ("brier", "Brier", False),
    ("advglue_accuracy", "AdvGLUE acc", True), ("corrupted_accuracy", "corrupted acc", True),
)
#: paired differences (a - b) of the report, when both variants ran on common seeds
COMPARISONS: tuple[tuple[str, str], ...] = (
    ("favor:teacher", "favor:vanilla"),
    ("favor:teacher", "softmax:vanilla"),
    ("favor:teacher", "hedgehog:hedgehog"),
    ("favor:teacher", "favor:adam"),  # the particles vs plain Adam on the same conversion
    ("favor:adam", "favor:vanilla"),
    ("favor:teacher_pairs", "favor:teacher"),  # a conversion that sees pairs whole
    ("favor:teacher_pairs", "softmax:vanilla"),
    ("favor:teacher_pairs", "hedgehog:hedgehog"),
    ("hedgehog:hedgehog", "softmax:vanilla"),
    ("hedgehog:teacher", "hedgehog:hedgehog"),
    ("hedgehog:teacher", "softmax:vanilla"),
    ("favor:teacher", "hedgehog:teacher"),
    ("favor:vanilla", "softmax:vanilla"),
    ("softmax:vanilla", "none:vanilla"),  # does attention matter here (no-mixing control)?
    ("favor:teacher", "none:vanilla"),
    ("favor:labels", "favor:vanilla"),
    ("favor:teacher", "favor:labels"),
    ("porf_softplus:teacher", "porf_softplus:vanilla"),
    ("softmax_feat:teacher", "softmax_feat:vanilla"),
    ("softmax_feat:teacher", "softmax_feat:adam"),  # the particles vs plain Adam, this map
    ("softmax_feat:adam", "softmax_feat:vanilla"),
    ("porf_softplus:teacher", "favor:teacher"),  # which of the paper's maps converts best
    ("softmax_feat:teacher", "favor:teacher"),
    ("softmax_feat:teacher", "softmax:vanilla"),
    ("softmax_feat:teacher", "hedgehog:hedgehog"),
)
#: fewer seeds than this: intervals are shown, no verdict is drawn
MIN_SEEDS_FOR_VERDICT = 3


def load_rows(out: str | Path) -> list[dict[str, Any]]:
    """Rows of ``out/results.jsonl`` (the last row of each (task, variant, seed) wins)."""
    path = Path(out) / "results.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: run `coulomb-attention minilm "
                                "compare` first")
    rows: dict[tuple, dict] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            rows[(r["task"], r["variant"], r.get("seed", 0))] = r
    return list(rows.values())


def _num(x) -> float:
    return float("nan") if x is None else float(x)


def _by(rows, task, variant) -> dict[int, dict]:
    return {r.get("seed", 0): r for r in rows if r["task"] == task and r["variant"] == variant}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per task: ``variants`` (metric -> (mean, low, high, n)) and ``differences``
    ((a, b) -> metric -> (mean, low, high, n, seeds where a is better))."""
    out: dict[str, Any] = {}
    for task in sorted({r["task"] for r in rows}):
        variants = list(dict.fromkeys(r["variant"] for r in rows if r["task"] == task))
        summary = {}
        for v in variants:
            runs = list(_by(rows, task, v).values())
            summary[v] = {key: mean_interval([_num(r.get(key)) for r in runs])
                          for key, _, _ in METRICS}
            summary[v]["seeds"] = sorted(r.get("seed", 0) for r in runs)
            for t in ("phase_a_s", "phase_b_s", "total_s", "ms_per_example"):
                summary[v][t] = sum(_num(r.get(t)) for r in runs) / max(len(runs), 1)
        diffs = {}
        for a, b in COMPARISONS:
            ra, rb = _by(rows, task, a), _by(rows, task, b)
            common = sorted(set(ra) & set(rb))
            if not common:
                continue
            d = {}
            for key, _, higher in METRICS:
                xa = [_num(ra[s].get(key)) for s in common]
                xb = [_num(rb[s].get(key)) for s in common]
                if any(math.isnan(x) for x in xa + xb):
                    continue
                mean, low, high, n = paired_difference(xa, xb)
                ahead = sum((p > q) if higher else (p < q) for p, q in zip(xa, xb, strict=True))
                d[key] = (mean, low, high, n, ahead)
            diffs[f"{a} - {b}"] = d
        first = next(iter(_by(rows, task, variants[0]).values()))
        out[task] = {"variants": summary, "differences": diffs,
                     "eval": f"{first.get('eval_split')} ({first.get('n_eval')})",
                     "n_train": first.get("n_train"),
                     "wall": wall_time([r for r in rows if r["task"] == task])}
    return out


def wall_time(rows: list[dict[str, Any]]) -> dict[str, float]:
    """What ``rows`` cost: ``runs``, ``run_s`` (the sum of every run's probe + phase B +
    evaluation, ``total_s``), ``conversions`` and ``conversion_s`` (each cached conversion
    counted once, by its directory: the tasks and variants that reuse it do not pay again),
    ``total_s`` (both)."""
    conv: dict[str, float] = {}
    for r in rows:
        if r.get("conversion_dir"):
            conv[r["conversion_dir"]] = _num(r.get("phase_a_s"))
    run_s = sum(_num(r.get("total_s")) for r in rows)
    return {"runs": len(rows), "run_s": run_s, "conversions": len(conv),
            "conversion_s": sum(conv.values()), "total_s": run_s + sum(conv.values())}


def _verdict(d, key, want_positive: bool) -> bool | None:
    """Beyond noise in the wanted direction (interval excludes 0), None with too few seeds."""
    if key not in d or d[key][3] < MIN_SEEDS_FOR_VERDICT:
        return None
    mean, low, high = d[key][:3]
    return low > 0 if want_positive else high < 0


#: where the targets of :func:`targets` come from (named in the report)
TARGET_SOURCE = "issue 31's targets for the pretrained encoder; docs/minilm.md"


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets per task (None: not measurable yet: a variant or seeds missing)."""
    out = []
    for task, s in summary.items():
        v, d = s["variants"], s["differences"]
        tv = d.get("favor:teacher - favor:vanilla", {})
        ts = d.get("favor:teacher - softmax:vanilla", {})
        th = d.get("favor:teacher - hedgehog:hedgehog", {})
        enough = ("accuracy" in ts and ts["accuracy"][3] >= MIN_SEEDS_FOR_VERDICT)
        ll = _verdict(tv, "log_loss", False)
        br = _verdict(tv, "brier", False)
        rows = {
            "teacher within 0.5 pts of softmax (mean)":
                (ts["accuracy"][0] >= -0.005) if enough else None,
            "teacher ahead of vanilla beyond noise: accuracy": _verdict(tv, "accuracy", True),
            "teacher ahead of vanilla beyond noise: log-loss or Brier":
                None if ll is None and br is None else bool(ll or br),
            "teacher ECE <= softmax ECE + 0.01 (means)":
                (v["favor:teacher"]["ece"][0] <= v["softmax:vanilla"]["ece"][0] + 0.01)
                if "favor:teacher" in v and "softmax:vanilla" in v else None,
            "teacher AdvGLUE accuracy >= vanilla (mean)":
                (tv["advglue_accuracy"][0] >= 0) if "advglue_accuracy" in tv else None,
            "teacher level with or ahead of Hedgehog (accuracy interval reaches >= 0)":
                (th["accuracy"][2] >= 0) if th.get("accuracy", (0, 0, 0, 0))[3]
                >= MIN_SEEDS_FOR_VERDICT else None,
        }
        for name, ok in rows.items():
            out.append({"task": task, "target": name, "met": ok})
    return out


def _cell(t, fmt=".4f") -> str:
    mean, low, high, n = t
    if math.isnan(mean):
        return "-"
    if n < 2 or math.isnan(low):
        return f"{mean:{fmt}}"
    return f"{mean:{fmt}} [{low:{fmt}}, {high:{fmt}}]"


def _wall_line(head: str, w: dict[str, float]) -> str:
    return (f"{head}: {w['runs']} runs, {w['run_s'] / 3600:.2f} h (probe, phase B and "
            f"evaluation); {w['conversions']} conversions they use, {w['conversion_s'] / 3600:.2f}"
            f" h (each counted once); {w['total_s'] / 3600:.2f} h in all.")


def _markdown(summary, checks, wall: dict[str, float]) -> str:
    lines = ["# Pretrained encoder with learned linear attention: the comparison", "",
             "Means over seeds with 95% t-intervals; paired differences on common seeds "
             f"(verdicts only from {MIN_SEEDS_FOR_VERDICT} seeds). Made from results.jsonl by "
             "`coulomb-attention minilm report`.", ""]
    for task, s in summary.items():
        lines += [f"## {task} (eval: {s['eval']}, train {s['n_train']})", "",
                  "| variant | seeds | " + " | ".join(lab for _, lab, _ in METRICS)
                  + " | phase A s | phase B s | run s | eval ms/ex |",
                  "|---|---|" + "---:|" * (len(METRICS) + 4)]
        for v, m in s["variants"].items():
            lines.append(f"| {v} | {len(m['seeds'])} | "
                         + " | ".join(_cell(m[k]) for k, _, _ in METRICS)
                         + f" | {m['phase_a_s']:.0f} | {m['phase_b_s']:.0f} | "
                           f"{m['total_s']:.0f} | {m['ms_per_example']:.2f} |")
        lines += ["", "Paired differences (a - b; 'better' counts the seeds where a is better):",
                  "", "| a - b | metric | mean [95% CI] | seeds | a better |",
                  "|---|---|---|---:|---:|"]
        for pair, d in s["differences"].items():
            for key, lab, _ in METRICS:
                if key in d:
                    mean, low, high, n, ahead = d[key]
                    ci = (f"{mean:+.4f} [{low:+.4f}, {high:+.4f}]" if n >= 2
                          else f"{mean:+.4f}")
                    lines.append(f"| {pair} | {lab} | {ci} | {n} | {ahead}/{n} |")
        w = s["wall"]
        lines += [_wall_line("Wall time", w), ""]
    if len(summary) > 1:
        lines += [_wall_line("All tasks", wall), ""]
    lines += ["## Targets", "", f"The targets: {TARGET_SOURCE}.", "",
              "| task | target | met |", "|---|---|---|"]
    for c in checks:
        met = {True: "yes", False: "no", None: "not measured"}[c["met"]]
        lines.append(f"| {c['task']} | {c['target']} | {met} |")
    return "\n".join(lines) + "\n"


def _plot(task, s, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = (("accuracy", "accuracy"), ("ece", "ECE (lower is better)"),
            ("brier", "Brier (lower is better)"))
    variants = list(s["variants"])
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6 + 0.12 * len(variants)))
    colors = plt.get_cmap("tab20").colors  # one colour per variant (up to 20)
    # the seed count goes in the tick label: a legend would cover points
    ticks = [f"{v} (n={s['variants'][v]['accuracy'][3]})" for v in variants]
    for ax, (key, title) in zip(axes, keys, strict=True):
        for i, v in enumerate(variants):
            mean, low, high, n = s["variants"][v][key]
            c = colors[i % len(colors)]
            if not math.isnan(mean):
                lo = mean - max(low, 0.0) if n >= 2 and not math.isnan(low) else 0.0
                hi = min(high, 1.0) - mean if n >= 2 and not math.isnan(high) else 0.0
                ax.errorbar([i], [mean], yerr=[[lo], [hi]], fmt="s", color=c, capsize=4)
        ax.set_xticks(range(len(variants)))
        ax.set_xticklabels(ticks, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"{task}: {title}", fontsize=9)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _nan_to_none(obj):
    """JSON has no NaN: an interval that does not exist (one seed) is written as null."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nan_to_none(v) for v in obj]
    return obj


def write_report(out: str | Path) -> list[Path]:
    """``out/report.md``, ``out/report.json`` and one plot per task from ``out/results.jsonl``."""
    out = Path(out)
    rows = load_rows(out)
    summary = summarise(rows)
    checks = targets(summary)
    wall = wall_time(rows)
    atomic_write_text(out / "report.md", _markdown(summary, checks, wall))
    atomic_write_json(out / "report.json", {"summary": _nan_to_none(json.loads(json.dumps(
        summary, default=list))), "targets": checks, "wall": wall})
    paths = [out / "report.md", out / "report.json"]
    for task, s in summary.items():
        _plot(task, s, out / f"{task}.png")
        paths.append(out / f"{task}.png")
    return paths

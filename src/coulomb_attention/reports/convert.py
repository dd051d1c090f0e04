"""Report of a conversion (``coulomb-attention convert``): report.md and plots, from files only.

Reads ``result.json`` / ``records.jsonl`` of one conversion directory, and optionally a grid's
``grid.jsonl`` (one result per line) and ``speed.json``; writes ``report.md``, ``kl.png``
(row KL per layer and head, before/after), ``mse.png`` (output MSE) and, for a grid,
``grid.md`` and ``grid.png``; from a manifest of rows (label -> conversion directories),
``STEM.md`` / ``STEM.summary.json`` with paired differences by seed (:func:`write_rows_report`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import data_note, pyplot

__all__ = ["grid_table", "read_jsonl", "result_lines", "write_convert_report", "write_grid_report",
           "write_rows_report"]


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def _f(x, fmt=".4f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _plot_records(records, key: str, title: str, path: Path) -> None:
    plt = pyplot()
    layers = sorted({r["layer"] for r in records})
    fig, axes = plt.subplots(1, len(layers), figsize=(2.6 * len(layers), 2.8), sharey=True,
                             squeeze=False)
    for ax, li in zip(axes[0], layers, strict=True):
        rs = [r for r in records if r["layer"] == li]
        heads = [r["heads"][0] for r in rs]
        before = [r[f"holdout_{key}_before"] or r[f"{key}_before"] for r in rs]
        after = [r[f"holdout_{key}_after"] or r[f"{key}_after"] for r in rs]
        ax.bar([h - 0.2 for h in heads], before, width=0.4, label="fresh", color="0.6")
        ax.bar([h + 0.2 for h in heads], after, width=0.4, label="distilled", color="C0")
        ax.set_yscale("log")
        ax.set_title(f"layer {li}")
        ax.set_xlabel("head")
    axes[0][0].set_ylabel(title)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_convert_report(directory: str | Path) -> Path:
    """``report.md`` (+ ``kl.png``, ``mse.png``) of one conversion directory."""
    from ..convert.artifact import Artifact

    art = Artifact(directory)
    d = art.root
    res = art.read_result()
    records = art.read_records()
    cfg = res["config"]
    docs = res.get("fit_documents")  # fitted on documents: the sequences are documents
    unit = f"documents of {docs['length']} tokens" if docs else "sentences"
    fitted = (f", joined into {docs['n']} documents of {docs['length']} tokens "
              f"({docs['texts_per_document']:.1f} texts each)" if docs else "")
    lines = [f"# Conversion of `{cfg['encoder']}` to {cfg['feature_map']} "
             f"(M={cfg['n_features']} per head, variant {cfg['variant']}, seed {cfg['seed']})",
             "", f"{res['n_sentences']} training sentences loaded{fitted}; conversion "
             f"(layer-wise distillation + joint refinement) {res['distill_s']:.0f} s, total "
             f"{res['total_s']:.0f} s.", ""]
    if "data" in res:  # result files from before the field: no line
        lines += [data_note(res["data"]) + ".", ""]
    if records:
        lines += [f"## Row KL / output MSE per layer (mean over heads; held-out {unit})", "",
                  "| layer | KL before | KL after | MSE before | MSE after | time s |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for li in sorted({r["layer"] for r in records}):
            rs = [r for r in records if r["layer"] == li]

            def mean(k, rs=rs):
                vals = [r[k] for r in rs if r.get(k) is not None]
                return sum(vals) / len(vals) if vals else None

            pre = "holdout_" if rs[0].get("holdout_kl_before") is not None else ""
            lines.append(f"| {li} | {_f(mean(pre + 'kl_before'))} | {_f(mean(pre + 'kl_after'))}"
                         f" | {_f(mean(pre + 'mse_before'), '.3g')} | "
                         f"{_f(mean(pre + 'mse_after'), '.3g')} | {rs[0]['time_s']:.0f} |")
        lines += ["", "![row KL](kl.png)", "", "![output MSE](mse.png)", ""]
        _plot_records(records, "kl", "row KL to softmax", d / "kl.png")
        if all(r.get("mse_before") is not None for r in records):
            _plot_records(records, "mse", "output MSE", d / "mse.png")
    ref = res.get("refine")
    if ref:
        lines += ["## Joint refinement (all layers' particles, sentence-embedding cosine)", "",
                  f"{ref['steps']} steps on {ref['n_refine']} {unit}, {ref['time_s']:.0f} s: "
                  f"embedding cosine to the teacher {_f(ref['cos_before'])} -> "
                  f"{_f(ref['cos_after'])} on the {ref['n_fit']} layer-wise fit {unit}"
                  + (f", {_f(ref['holdout_cos_before'])} -> {_f(ref['holdout_cos_after'])} on "
                     f"the {ref['n_holdout']} held-out ones" if ref.get("n_holdout") else "")
                  + f"; particles moved by {ref['omega_shift']:.3f} (relative).", ""]
    if "fidelity" in res:
        fid = res["fidelity"]
        lines += ["## Fidelity (no labels)", "",
                  f"{fid['n']} held-out sentences: embedding cosine to the teacher mean "
                  f"{fid['cos_mean']:.4f}, 5th percentile {fid['cos_p5']:.4f}, min "
                  f"{fid['cos_min']:.4f}; Spearman of pairwise cosines {fid['spearman']:.4f}.",
                  ""]
    docs = res.get("documents")
    if docs:
        lines += [f"## Fidelity on held-out pseudo-documents ({docs['n']} per length, "
                  f"{docs['task']} evaluation texts concatenated)", "",
                  "| tokens | texts per document | cos mean | cos p5 | Spearman | teacher "
                  "attention inside the window |", "|---:|---:|---:|---:|---:|---:|"]
        for n, row in docs["lengths"].items():
            mass = row.get("window_mass")
            lines.append(f"| {n} | {row['texts_per_document']:.1f} | {row['cos_mean']:.4f} | "
                         f"{row['cos_p5']:.4f} | {row['spearman']:.4f} | "
                         f"{_f(mass['mean'], '.3f') if mass else ''} |")
        lines.append("")
    if "probe" in res:
        lines += _probe_lines(res)
    lines += _lowrank_lines(res)
    out = d / "report.md"
    out.write_text("\n".join(lines), encoding="utf-8")
    return out


def _probe_lines(res: dict[str, Any]) -> list[str]:
    """The probe table; with the teacher's probe in ``result.json`` (``teacher_probe``, same
    examples) its accuracy and the converted model's share of it beside each task."""
    teacher = res.get("teacher_probe") or {}
    cols = " teacher accuracy | share |" if teacher else ""
    lines = ["## Logistic-regression probe on frozen embeddings", "",
             "| task | n train | n eval | accuracy |" + cols + " ECE | log-loss |",
             "|---|---:|---:|---:|" + "---:|---:|" * bool(teacher) + "---:|---:|"]
    for task, m in res["probe"].items():
        t = teacher.get(task, {}).get("accuracy")
        beside = (f" {_f(t)} | {_f(m['accuracy'] / t if t else None, '.1%')} |"
                  if teacher else "")
        lines.append(f"| {task} | {m['n_train']} | {m['n_eval']} | {m['accuracy']:.4f} |"
                     f"{beside} {m['ece']:.4f} | {m['log_loss']:.4f} |")
    return lines + [""]


def result_lines(res: dict[str, Any]) -> list[str]:
    """The console summary of one conversion's ``result.json``: fidelity on the held-out
    sentences and pseudo-documents, and the low-rank finished row when there is one."""
    lines = [data_note(res["data"])] if "data" in res else []  # absent in older results
    fid = res.get("fidelity")
    if fid:
        lines.append(f"embedding cosine mean {fid['cos_mean']:.4f}, p5 {fid['cos_p5']:.4f}; "
                     f"Spearman {fid['spearman']:.4f}; distillation {res['distill_s']:.0f} s")
    for n, row in res.get("documents", {}).get("lengths", {}).items():
        mass = row.get("window_mass")
        lines.append(f"{n}-token pseudo-documents: cosine mean {row['cos_mean']:.4f}, p5 "
                     f"{row['cos_p5']:.4f}" + (f"; teacher attention inside the window "
                                               f"{mass['mean']:.3f}" if mass else ""))
    teacher = res.get("teacher_probe") or {}
    for task, m in (res.get("probe") or {}).items():
        t = teacher.get(task, {}).get("accuracy")
        lines.append(f"{task} probe accuracy {m['accuracy']:.4f}"
                     + (f" (teacher {t:.4f})" if t is not None else ""))
    low = res.get("lowrank")
    if low and "fidelity" in low:
        fid, fin = low["fidelity"], low["finish"]
        lines.append(f"low-rank finished (rank {fin['rank']}, {fin['trained_params']} trained "
                     f"parameters): embedding cosine mean {fid['cos_mean']:.4f}, p5 "
                     f"{fid['cos_p5']:.4f}; Spearman {fid['spearman']:.4f}; conversion "
                     f"{low['conversion_s']:.0f} s")
    return lines


def _lowrank_lines(res: dict[str, Any]) -> list[str]:
    """The low-rank finishing section: its own row beside the pure-linear one, never mixed."""
    low = res.get("lowrank")
    if not low:
        return []
    fin = low["finish"]
    how = "with the particles" if fin["with_particles"] else "after the particles"
    objective = fin.get("objective", "embedding")  # records from before the objectives
    if objective != "embedding":
        how += f", objective {objective} (hidden-state weight {fin['aux_weight']:g})"
    lines = ["## Low-rank finishing (learns more than the kernel: its own row)", "",
             f"LoRA rank {fin['rank']} (alpha {fin['alpha']:g}) on "
             f"{', '.join(fin['targets'])} of every layer, {how}; {fin['steps']} steps on "
             f"{fin['n_train']} sentences, {fin['time_s']:.0f} s; embedding cosine "
             f"{_f(fin['cos_before'])} -> {_f(fin['cos_after'])} on the {fin['n_fit']} "
             "layer-wise fit sentences"
             + (f", {_f(fin['holdout_cos_before'])} -> {_f(fin['holdout_cos_after'])} on the "
                f"{fin['n_holdout']} held-out ones" if fin.get("n_holdout") else "")
             + f"; {fin['trained_params']:,} trained parameters; merged into "
             f"`{low['checkpoint']}/`.", ""]
    if "fidelity" not in low:
        return lines
    tasks = list(res.get("probe", {}))
    lines += ["| row | trained | conversion s | cos mean | cos p5 | Spearman | "
              + " | ".join(f"{t} acc" for t in tasks) + " |",
              "|---|---:|---:|---:|---:|---:|" + "---:|" * len(tasks)]
    refine = "layer-wise only" if fin["with_particles"] else "layer-wise + refinement"
    for name, trained, secs, fid, probe in (
            (f"pure linear ({refine})", "particles", res["distill_s"], res["fidelity"],
             res.get("probe", {})),
            (f"low-rank finished (rank {fin['rank']})", f"{fin['trained_params']:,}",
             low["conversion_s"], low["fidelity"], low.get("probe", {}))):
        lines.append(f"| {name} | {trained} | {secs:.0f} | {fid['cos_mean']:.4f} | "
                     f"{fid['cos_p5']:.4f} | {fid['spearman']:.4f} | "
                     + " | ".join(_f(probe.get(t, {}).get("accuracy")) for t in tasks) + " |")
    teacher = res.get("teacher_probe")
    if teacher:  # the accuracies both rows are measured against
        lines.append("| teacher (softmax) | | | | | | "
                     + " | ".join(_f(teacher.get(t, {}).get("accuracy")) for t in tasks) + " |")
    return lines + [""]


def _mean_sd(values) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value) over seeds."""
    import numpy as np

    v = np.array(values, dtype=float)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def grid_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Aggregate grid results (mean and spread over seeds) per (variant label, M)."""
    teacher = next((r for r in rows if r["config"]["variant"] == "softmax"), None)
    groups: dict[tuple, list] = {}
    for r in rows:
        c = r["config"]
        label = c["variant"]
        if c["variant"] == "particles":
            label = f"particles lam={c['distill']['lam']:g}"
        m = 0 if c["variant"] == "softmax" else c["n_features"]
        groups.setdefault((label, m), []).append(r)
    out = []
    for (label, m), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        def stat(get, rs=rs):
            return _mean_sd([get(r) for r in rs])

        row = {"variant": label, "M": m, "seeds": len(rs),
               "cos_mean": stat(lambda r: r["fidelity"]["cos_mean"]),
               "cos_p5": stat(lambda r: r["fidelity"]["cos_p5"]),
               "spearman": stat(lambda r: r["fidelity"]["spearman"]),
               "time_s": stat(lambda r: r["distill_s"])}
        for task in rs[0].get("probe", {}):
            row[f"{task}_acc"] = stat(lambda r, t=task: r["probe"][t]["accuracy"])
            row[f"{task}_ece"] = stat(lambda r, t=task: r["probe"][t]["ece"])
            if teacher is not None and task in teacher.get("probe", {}):
                row[f"{task}_share"] = row[f"{task}_acc"][0] / teacher["probe"][task]["accuracy"]
        out.append(row)
    return out


def write_grid_report(directory: str | Path) -> Path:
    """``grid.md`` and ``grid.png`` from ``grid.jsonl`` (and ``speed.json`` if present)."""
    d = Path(directory)
    rows = read_jsonl(d / "grid.jsonl")
    if not rows:
        raise ValueError(f"{d}: no grid.jsonl results")
    table = grid_table(rows)
    tasks = [k[:-4] for k in table[0] if k.endswith("_acc")]

    def pm(v, fmt=".4f"):
        return f"{v[0]:{fmt}}" + (f" ± {v[1]:{fmt}}" if v[1] else "")

    head = "| variant | M | seeds | cos mean | cos p5 | Spearman | " + " | ".join(
        f"{t} acc (share) | {t} ECE" for t in tasks) + " | distil s |"
    lines = ["# Conversion grid", "", "Mean ± standard deviation over seeds.", "", head,
             "|" + "---|" * (6 + 2 * len(tasks) + 1)]
    for r in table:
        cells = [r["variant"], str(r["M"] or "-"), str(r["seeds"]), pm(r["cos_mean"]),
                 pm(r["cos_p5"]), pm(r["spearman"])]
        for t in tasks:
            share = r.get(f"{t}_share")
            cells.append(pm(r[f"{t}_acc"]) + (f" ({share:.3f})" if share is not None else ""))
            cells.append(pm(r[f"{t}_ece"]))
        cells.append(f"{r['time_s'][0]:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    speed = d / "speed.json"
    if speed.is_file():
        rows_s = json.loads(speed.read_text())
        lines += ["", "## Forward time (ms per sequence, batch 1, 1 thread)", "",
                  "| what | L | converted ms | softmax ms | ratio |", "|---|---:|---:|---:|---:|"]
        for s in rows_s:
            lines.append(f"| {s['what']} | {s['length']} | {s['converted_ms']:.1f} | "
                         f"{s['softmax_ms']:.1f} | {s['converted_ms'] / s['softmax_ms']:.2f} |")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for label in sorted({r["variant"] for r in table if r["M"]}):
        rs = sorted((r for r in table if r["variant"] == label), key=lambda r: r["M"])
        ax.errorbar([r["M"] for r in rs], [r["cos_mean"][0] for r in rs],
                    yerr=[r["cos_mean"][1] for r in rs], marker="o", label=label, capsize=3)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("features per head M")
    ax.set_ylabel("mean embedding cosine to teacher")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(d / "grid.png", dpi=110)
    plt.close(fig)
    lines += ["", "![cosine vs M](grid.png)", ""]
    out = d / "grid.md"
    out.write_text("\n".join(lines), encoding="utf-8")
    return out


def _row_metrics(res: dict[str, Any]) -> dict[str, float]:
    """The numbers of one conversion's result.json that rows are compared on."""
    out: dict[str, float] = {}
    if "fidelity" in res:
        out.update({"sentences cos": res["fidelity"]["cos_mean"],
                    "sentences cos p5": res["fidelity"]["cos_p5"],
                    "sentences Spearman": res["fidelity"]["spearman"]})
    for n, row in (res.get("documents") or {}).get("lengths", {}).items():
        out[f"{n}-token docs cos"] = row["cos_mean"]
        out[f"{n}-token docs cos p5"] = row["cos_p5"]
        if row.get("window_mass"):
            out[f"{n}-token teacher mass in window"] = row["window_mass"]["mean"]
    for task, m in (res.get("probe") or {}).items():
        out[f"{task} probe acc"] = m["accuracy"]
    for task, m in (res.get("teacher_probe") or {}).items():  # never paired: not the row's
        out[f"{task} teacher probe acc"] = m["accuracy"]
    out["conversion s"] = res.get("distill_s", 0.0)
    return out


def write_rows_report(manifest: str | Path) -> Path:
    """Rows of conversions compared by seed, from a JSON manifest ``{"rows": {label: [dir,
    ...]}, "pairs": [[label_a, label_b], ...]}`` (directories relative to the manifest's
    folder or absolute): ``STEM.md`` and ``STEM.summary.json`` beside ``STEM.json`` with
    every metric's mean, sd and seeds per row, and per pair the paired difference ``a - b``
    over their common seeds with its 95% t-interval and the seeds where ``a`` is ahead."""
    from ..convert.artifact import Artifact
    from ..stats import paired_difference

    path = Path(manifest)
    spec = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(spec, dict) or not isinstance(spec.get("rows"), dict) or not spec["rows"]:
        raise ValueError(f"{path}: a manifest needs a non-empty 'rows' object {{label: [dirs]}}")
    rows: dict[str, dict[int, dict[str, float]]] = {}
    for label, dirs in spec["rows"].items():
        rows[label] = {}
        for d in dirs:
            art = Artifact(path.parent / d)
            if not art.has_result():
                raise FileNotFoundError(f"row {label!r}: {art.result_path} does not exist")
            res = art.read_result()
            seed = int(res["config"]["seed"])
            if seed in rows[label]:
                raise ValueError(f"row {label!r} has seed {seed} twice")
            rows[label][seed] = _row_metrics(res)
    for a, b in spec.get("pairs", []):
        for lab in (a, b):
            if lab not in rows:
                raise ValueError(f"pair ({a}, {b}): no row {lab!r}; rows: {', '.join(rows)}")
    keys = list(dict.fromkeys(k for r in rows.values() for m in r.values() for k in m))
    summary: dict[str, Any] = {"rows": {}, "pairs": []}
    lines = [f"# {spec.get('title', 'Conversion rows')}", "",
             "Mean (sd) over seeds; a blank cell: not measured for that row.", "",
             "| row | seeds | " + " | ".join(keys) + " |", "|---|---|" + "---:|" * len(keys)]
    for label, by_seed in rows.items():
        cells, stats = [], {}
        for k in keys:
            vals = [m[k] for m in by_seed.values() if k in m]
            if not vals:
                cells.append("")
                continue
            mean, sd = _mean_sd(vals)
            stats[k] = {"mean": mean, "sd": sd, "n": len(vals)}
            fmt = ".0f" if k == "conversion s" else ".4f"
            cells.append(f"{mean:{fmt}}" + (f" ({sd:{fmt}})" if len(vals) > 1 else ""))
        summary["rows"][label] = {"seeds": sorted(by_seed), "metrics": stats}
        lines.append(f"| {label} | {' '.join(map(str, sorted(by_seed)))} | "
                     + " | ".join(cells) + " |")
    if spec.get("pairs"):
        lines += ["", "## Paired differences (a - b, same seeds, 95% t-interval)", "",
                  "| a | b | metric | seeds | a - b | interval | a ahead |",
                  "|---|---|---|---|---:|---|---:|"]
    for a, b in spec.get("pairs", []):
        seeds = sorted(set(rows[a]) & set(rows[b]))
        for k in keys:
            common = [s for s in seeds if k in rows[a][s] and k in rows[b][s]]
            if not common or k == "conversion s" or "teacher" in k:  # not the row's property
                continue
            va, vb = [rows[a][s][k] for s in common], [rows[b][s][k] for s in common]
            mean, lo, hi, n = paired_difference(va, vb)
            ahead = sum(x > y for x, y in zip(va, vb, strict=True))
            summary["pairs"].append({"a": a, "b": b, "metric": k, "seeds": common,
                                     "diff": mean, "low": lo if n > 1 else None,
                                     "high": hi if n > 1 else None, "a_ahead": ahead})
            ci = f"[{lo:+.4f}, {hi:+.4f}]" if n > 1 else "(one seed)"
            lines.append(f"| {a} | {b} | {k} | {' '.join(map(str, common))} | {mean:+.4f} | "
                         f"{ci} | {ahead}/{n} |")
    out = path.with_name(path.stem + ".md")
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    path.with_name(path.stem + ".summary.json").write_text(json.dumps(summary, indent=2) + "\n",
                                                           encoding="utf-8")
    return out

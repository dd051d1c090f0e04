"""Report of the causal-LM evaluation (``coulomb-attention lm-eval``), from its result file only.

Reads ``OUT/results.jsonl`` (rows of :func:`coulomb_attention.studies.lm_eval.run_study`: one
per row x task x length x document or trial) and writes

* ``OUT/report.md``: perplexity per row and length (the exp of the mean per-document loss,
  with the exp of its 95% t-interval), the loss by position bucket, passkey accuracy per length
  (and per depth), the repeated-text losses, the paired differences over documents
  (learned - fixed, hybrid - StreamingLLM, each row - teacher: the mean difference of the
  per-document loss with its 95% interval and as a perplexity ratio), and the skipped units;
* ``OUT/report.json``: the same numbers;
* ``OUT/loss_vs_position.png`` (one panel per length, one line per row, log-x: the plot to look
  at first) and ``OUT/passkey.png`` (accuracy against length).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..results import atomic_write_json, atomic_write_text, read_jsonl, run_key
from ..stats import mean_interval, paired_difference
from . import pyplot

__all__ = ["COARSE_EDGES", "KEY_FIELDS", "load_rows", "pairs", "summarise", "unit_key",
           "write_report"]

#: the fields of a result row that identify its unit (the study's resume key)
KEY_FIELDS: tuple[str, ...] = ("row", "task", "length", "doc", "depth", "seed", "n_features",
                               "source")
#: the position buckets of the report's table (target positions ``[lo, hi)``)
COARSE_EDGES: tuple[int, ...] = (0, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


def unit_key(record: dict[str, Any]) -> str:
    """The resume key of a result row (its :data:`KEY_FIELDS`, :func:`results.run_key`)."""
    return run_key({k: record.get(k) for k in KEY_FIELDS})


def load_rows(out: str | Path) -> list[dict[str, Any]]:
    """Rows of ``out/results.jsonl`` (the last row of each unit wins)."""
    path = Path(out) / "results.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: run `coulomb-attention lm-eval` first")
    rows: dict[str, dict] = {}
    for r in read_jsonl(path):
        rows[unit_key(r)] = r
    return list(rows.values())


def _same_attention(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("kind", "feature_map", "n_features", "window",
                                              "sinks"))


def pairs(attention: dict[str, dict]) -> list[tuple[str, str, str]]:
    """``(a, b, what)``: every comparison present among rows with these attentions
    (``{row: attention}``, as stored with each result row): a learned (directory) row minus
    the fixed row of the same attention, a learned row minus every learned row of the same
    attention given before it (two conversions of one architecture: fitted longer, finished or
    not), a hybrid minus every StreamingLLM row with its sinks, and every other row minus the
    teacher."""
    out = []
    order = {name: i for i, name in enumerate(attention)}
    for a, A in attention.items():
        for b, B in attention.items():
            if a == b:
                continue
            if A.get("source") == "directory" and B.get("source") == "fixed" and \
                    A.get("kind") != "teacher" and _same_attention(A, B):
                out.append((a, b, "learned - fixed"))
            elif A.get("source") == B.get("source") == "directory" and \
                    A.get("kind") != "teacher" and _same_attention(A, B):
                if order[a] > order[b]:
                    out.append((a, b, "learned - learned"))
            elif A.get("kind") == "hybrid" and B.get("kind") == "streaming" and \
                    A.get("sinks") == B.get("sinks"):
                out.append((a, b, "hybrid - StreamingLLM"))
            elif B.get("kind") == "teacher" and B.get("source") == "pretrained" and \
                    A.get("kind") != "teacher":
                out.append((a, b, "row - teacher"))
    return out


def _paired(xa: dict, xb: dict, lower_better: bool = True) -> dict[str, Any] | None:
    """Paired difference over the common keys of ``{unit: value}``; None without one."""
    common = sorted(set(xa) & set(xb), key=str)
    if not common:
        return None
    a = [float(xa[k]) for k in common]
    b = [float(xb[k]) for k in common]
    mean, low, high, n = paired_difference(a, b)
    ahead = sum((p < q) if lower_better else (p > q) for p, q in zip(a, b, strict=True))
    return {"mean": mean, "low": low, "high": high, "n": n, "a_better": ahead}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Every table of the report as numbers (tuples are ``(mean, low, high, n)``)."""
    done = [r for r in rows if not r.get("skipped")]
    order = list(dict.fromkeys(r["row"] for r in rows))
    attention = {r["row"]: r.get("attention", {}) for r in rows}
    by = defaultdict(list)
    for r in done:
        by[(r["task"], r["row"], r["length"])].append(r)
    ppl: dict = defaultdict(dict)
    fine: dict = defaultdict(dict)
    coarse: dict = defaultdict(dict)
    passkey: dict = defaultdict(dict)
    depth: dict = defaultdict(dict)
    repeat: dict = defaultdict(dict)
    for (task, row, length), rs in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][2])):
        if task == "ppl":
            mi = mean_interval([r["nll"] for r in rs])
            ppl[row][length] = {"nll": mi, "ppl": tuple(math.exp(x) if i < 3 and
                                                        not math.isnan(x) else x
                                                        for i, x in enumerate(mi)),
                                "state_bytes": max(r.get("state_bytes", 0) for r in rs)}
            edges = rs[0]["edges"]
            sums = [sum(r["bucket_sum"][j] for r in rs) for j in range(len(edges) - 1)]
            cnts = [sum(r["bucket_n"][j] for r in rs) for j in range(len(edges) - 1)]
            fine[row][length] = {"edges": edges, "nll": [s / n if n else math.nan
                                                         for s, n in zip(sums, cnts,
                                                                         strict=True)]}
            cs, cn = [0.0] * (len(COARSE_EDGES) - 1), [0] * (len(COARSE_EDGES) - 1)
            for lo, s, n in zip(edges[:-1], sums, cnts, strict=True):
                for j in range(len(COARSE_EDGES) - 1):
                    if COARSE_EDGES[j] <= lo < COARSE_EDGES[j + 1]:
                        cs[j] += s
                        cn[j] += n
            coarse[row][length] = [s / n if n else math.nan for s, n in zip(cs, cn, strict=True)]
        elif task == "passkey":
            passkey[row][length] = mean_interval([float(r["success"]) for r in rs])
            for d in sorted({r["depth"] for r in rs}):
                depth[row][(length, d)] = mean_interval(
                    [float(r["success"]) for r in rs if r["depth"] == d])
        elif task == "repeat":
            repeat[row][length] = {
                "first": mean_interval([r["nll_first"] for r in rs]),
                "second": mean_interval([r["nll_second"] for r in rs]),
                "second_minus_first": paired_difference([r["nll_second"] for r in rs],
                                                        [r["nll_first"] for r in rs])}
    diffs = []
    for a, b, what in pairs({k: attention[k] for k in order}):
        for task, value, lower in (("ppl", "nll", True), ("repeat", "nll_second", True),
                                   ("passkey", "success", False)):
            lengths = sorted({r["length"] for r in done if r["task"] == task})
            for length in lengths:
                xa = {r["doc"]: float(r[value]) for r in by.get((task, a, length), [])}
                xb = {r["doc"]: float(r[value]) for r in by.get((task, b, length), [])}
                d = _paired(xa, xb, lower)
                if d is not None:
                    diffs.append({"a": a, "b": b, "what": what, "task": task, "metric": value,
                                  "length": length, **d})
    skipped = [{"row": r["row"], "task": r["task"], "length": r["length"],
                "why": r["skipped"]} for r in rows if r.get("skipped")]
    return {"rows": order, "attention": attention, "ppl": ppl, "fine": fine, "coarse": coarse,
            "passkey": passkey, "depth": depth, "repeat": repeat, "differences": diffs,
            "skipped": skipped}


def _ci(t, fmt=".3f") -> str:
    mean, low, high, n = t
    if math.isnan(mean):
        return "-"
    if n < 2 or math.isnan(low):
        return f"{mean:{fmt}}"
    return f"{mean:{fmt}} [{low:{fmt}}, {high:{fmt}}]"


def _markdown(s: dict[str, Any]) -> str:
    rows = s["rows"]
    lines = ["# Causal LM evaluation", "",
             "Made from results.jsonl by `coulomb-attention lm-eval` (`--report-only` remakes "
             "it). Means over documents (trials) with 95% t-intervals; perplexity is the exp of "
             "the mean per-document loss (nats per token) and of its interval.", ""]
    lengths = sorted({L for r in s["ppl"].values() for L in r})
    if lengths:
        lines += ["## Perplexity (test works)", "",
                  "| row | " + " | ".join(f"ppl @ {L}" for L in lengths)
                  + " | docs | state bytes @ " + str(lengths[-1]) + " |",
                  "|---|" + "---:|" * (len(lengths) + 2)]
        for row in rows:
            if row not in s["ppl"]:
                continue
            p = s["ppl"][row]
            docs = "/".join(str(p[L]["nll"][3]) if L in p else "-" for L in lengths)
            sb = p.get(lengths[-1], {}).get("state_bytes")
            lines.append(f"| {row} | " + " | ".join(_ci(p[L]["ppl"], ".2f") if L in p else "-"
                                                   for L in lengths)
                         + f" | {docs} | {sb if sb is not None else '-'} |")
        lines += ["", "Loss (nats) by target position, pooled over documents:", ""]
        for L in lengths:
            buckets = [(COARSE_EDGES[j], COARSE_EDGES[j + 1]) for j in range(len(COARSE_EDGES) - 1)
                       if COARSE_EDGES[j] < L]
            lines += [f"length {L}:", "", "| row | " + " | ".join(
                f"[{lo}, {min(hi, L)})" for lo, hi in buckets) + " |",
                "|---|" + "---:|" * len(buckets)]
            for row in rows:
                if L in s["coarse"].get(row, {}):
                    c = s["coarse"][row][L]
                    lines.append(f"| {row} | " + " | ".join(
                        "-" if math.isnan(c[j]) else f"{c[j]:.3f}" for j in range(len(buckets)))
                        + " |")
            lines.append("")
    pk = sorted({L for r in s["passkey"].values() for L in r})
    if pk:
        lines += ["## Passkey retrieval", "",
                  "| row | " + " | ".join(f"acc @ {L}" for L in pk) + " |",
                  "|---|" + "---:|" * len(pk)]
        for row in rows:
            if row in s["passkey"]:
                p = s["passkey"][row]
                lines.append(f"| {row} | " + " | ".join(
                    f"{_ci(p[L], '.2f')} (n={p[L][3]})" if L in p else "-" for L in pk) + " |")
        lines += ["", "By depth (accuracy, trials):", "",
                  "| row | length | " + " | ".join(
                      f"{d:g}" for d in sorted({d for r in s["depth"].values() for _, d in r}))
                  + " |"]
        depths = sorted({d for r in s["depth"].values() for _, d in r})
        lines.append("|---|---:|" + "---:|" * len(depths))
        for row in rows:
            for L in pk:
                cells = [s["depth"].get(row, {}).get((L, d)) for d in depths]
                if any(c is not None for c in cells):
                    lines.append(f"| {row} | {L} | " + " | ".join(
                        "-" if c is None else f"{c[0]:.2f} ({c[3]})" for c in cells) + " |")
        lines.append("")
    if s["repeat"]:
        lines += ["## Repeated text", "",
                  "| row | P | loss, first copy | loss, second copy | second - first |",
                  "|---|---:|---:|---:|---:|"]
        for row in rows:
            for P, r in sorted(s["repeat"].get(row, {}).items()):
                lines.append(f"| {row} | {P} | {_ci(r['first'])} | {_ci(r['second'])} | "
                             f"{_ci(r['second_minus_first'], '+.3f')} |")
        lines.append("")
    if s["differences"]:
        lines += ["## Paired differences (a - b, over common documents / trials)", "",
                  "Loss: mean difference of the per-document loss (nats) with its 95% interval "
                  "and as a perplexity ratio exp(d); passkey: difference in success rate. "
                  "'a better' counts the units where a is better.", "",
                  "| a - b | comparison | task | length | mean [95% CI] | ppl ratio | n | "
                  "a better |", "|---|---|---|---:|---|---|---:|---:|"]
        for d in s["differences"]:
            t = (d["mean"], d["low"], d["high"], d["n"])
            ratio = "-" if d["task"] == "passkey" else _ci(
                tuple(math.exp(x) if i < 3 and not math.isnan(x) else x
                      for i, x in enumerate(t)), ".3f")
            lines.append(f"| {d['a']} - {d['b']} | {d['what']} | {d['task']} | {d['length']} | "
                         f"{_ci(t, '+.4f')} | {ratio} | {d['n']} | {d['a_better']}/{d['n']} |")
        lines.append("")
    if s["skipped"]:
        lines += ["## Skipped", ""] + [f"- {k['row']} {k['task']} at {k['length']}: {k['why']}"
                                       for k in s["skipped"]] + [""]
    return "\n".join(lines) + "\n"


def _row_styles(plt, rows: list[str]) -> dict[str, dict[str, Any]]:
    """A distinct (colour, line style, marker) per row, however many rows (tab10 up to ten,
    then tab20 with line styles and markers cycling too)."""
    cmap = plt.get_cmap("tab10" if len(rows) <= 10 else "tab20").colors
    dashes, markers = ("-", "--", ":", "-."), ("o", "s", "^", "D", "v")
    return {row: {"color": cmap[i % len(cmap)], "linestyle": dashes[i % len(dashes)],
                  "marker": markers[i % len(markers)]} for i, row in enumerate(rows)}


def _legend_below(fig, axes, n_rows: int) -> None:
    """One legend for the figure, below the panels (it covers no curve)."""
    handles = {}  # label -> the first handle drawn with it
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    ncol = 2 if n_rows > 4 else 1
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol,
               fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.04 * math.ceil(n_rows / ncol), 1, 1))  # room for its lines


def _plot_positions(s: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    lengths = sorted({L for r in s["fine"].values() for L in r})
    n = len(s["rows"])
    fig, axes = plt.subplots(1, len(lengths), figsize=(5.0 * len(lengths), 3.4 + 0.17 * n),
                             squeeze=False)
    styles = _row_styles(plt, s["rows"])
    for ax, L in zip(axes[0], lengths, strict=True):
        for row in s["rows"]:
            f = s["fine"].get(row, {}).get(L)
            if f is None:
                continue
            e = f["edges"]
            x = [math.sqrt(lo * max(hi - 1, lo)) for lo, hi in zip(e[:-1], e[1:], strict=True)]
            ax.plot(x, f["nll"], ms=3, lw=1.2, label=row, **styles[row])
        ax.set_xscale("log")
        ax.set_xlabel("target position")
        ax.set_ylabel("loss (nats / token)")
        ax.set_title(f"loss vs position, documents of {L}", fontsize=9)
        ax.grid(alpha=0.3)
    _legend_below(fig, axes[0], n)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_passkey(s: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    rows = [row for row in s["rows"] if s["passkey"].get(row)]
    fig, ax = plt.subplots(figsize=(5.2, 3.4 + 0.17 * len(rows)))
    styles = _row_styles(plt, rows)
    for row in rows:
        p = s["passkey"][row]
        L = sorted(p)
        mean = [p[x][0] for x in L]
        lo = [m - (p[x][1] if not math.isnan(p[x][1]) else m) for x, m in zip(L, mean,
                                                                              strict=True)]
        hi = [(p[x][2] if not math.isnan(p[x][2]) else m) - m for x, m in zip(L, mean,
                                                                              strict=True)]
        ax.errorbar(L, mean, yerr=[lo, hi], capsize=3, label=row, **styles[row])
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("total length (tokens)")
    ax.set_ylabel("passkey accuracy")
    ax.grid(alpha=0.3)
    _legend_below(fig, [ax], len(rows))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _jsonable(obj):
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {(k if isinstance(k, str) else json.dumps(k) if isinstance(k, tuple)
                 else str(k)): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def write_report(out: str | Path, plots: bool = True) -> list[Path]:
    """``out/report.md``, ``out/report.json`` and (with ``plots``) the PNG plots, from
    ``out/results.jsonl``; returns the paths written."""
    out = Path(out)
    s = summarise(load_rows(out))
    atomic_write_text(out / "report.md", _markdown(s))
    atomic_write_json(out / "report.json", _jsonable(s))
    paths = [out / "report.md", out / "report.json"]
    if plots and s["fine"]:
        _plot_positions(s, out / "loss_vs_position.png")
        paths.append(out / "loss_vs_position.png")
    if plots and s["passkey"]:
        _plot_passkey(s, out / "passkey.png")
        paths.append(out / "passkey.png")
    return paths

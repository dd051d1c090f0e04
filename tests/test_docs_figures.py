"""Every number the README and docs/results.md quote is read back from a committed result file.

Each :data:`QUOTES` entry names a document, the exact text it quotes and where the value lives
(a cell of a Markdown table line, or a JSON key path); the test formats the file's value the
way the document does and compares. A second test fails on any decimal number or percentage
in those documents (outside code blocks) that no entry checks, so a new measurement cannot be
added unchecked and an old one cannot drift. Parameters (a lambda, a noise level) are listed
in :data:`PARAMETERS`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
DOCS = ("README.md", "docs/results.md")
NUMBER = re.compile(r"(?<![\w.\-+])[-+]?\d+\.\d+%?(?![\w.]*\d)|(?<![\w.])\d+%")
CELL_NUMBER = re.compile(r"[-+]?\d+\.\d+")
INTEGER = re.compile(r"[-+]?\d+(?:\.\d+)?")


@cache
def _lines(path: str) -> list[str]:
    return (RESULTS / path).read_text().splitlines()


def md(path: str, *needles: str, after: str | None = None, cell: int | None = None,
       k: int = 0, integers: bool = False) -> Callable[[], float]:
    """The ``k``-th number of the first line of ``docs/results/path`` (after the first line
    holding ``after``) that holds every needle; of its ``|``-cell ``cell`` when given (1 = the
    first column of a Markdown table)."""
    def read() -> float:
        lines = _lines(path)
        if after is not None:
            lines = lines[next(i for i, line in enumerate(lines) if after in line):]
        line = next((x for x in lines if all(n in x for n in needles)), None)
        assert line is not None, f"no line of {path} holds {needles}"
        text = line.split("|")[cell] if cell is not None else line
        return float((INTEGER if integers else CELL_NUMBER).findall(text)[k])
    return read


def js(path: str, *keys: str | int) -> Callable[[], float]:
    """The value at ``keys`` in the JSON file ``docs/results/path``."""
    def read() -> float:
        value = json.loads((RESULTS / path).read_text())
        for key in keys:
            value = value[key]
        return float(value)
    return read


def jl_mean(path: str, key: str) -> Callable[[], float]:
    """The mean of ``key`` over the rows of the JSON-lines file ``docs/results/path``."""
    def read() -> float:
        rows = [json.loads(x) for x in (RESULTS / path).read_text().splitlines() if x.strip()]
        assert rows, f"{path} has no rows"
        return sum(float(r[key]) for r in rows) / len(rows)
    return read


def interval(read_line: Callable[[int], Callable[[], float]]) -> list[Callable[[], float]]:
    return [read_line(0), read_line(1), read_line(2)]


R = "docs/results.md"
ME = "README.md"
SYN = "ablation_synthetic/summary.md"
DEV = "ablation_mqar_device/summary.md"
HARD = "ablation_mqar_hard_local/summary.md"
REC = "recall/summary.md"
ROWS = "convert/long_inputs/rows.summary.json"
M_GRID = "convert/m_grid/rows.summary.json"
MINI = "minilm_finetune/report.json"
MINI_MD = "minilm_finetune/report.md"
SUITE = "transformer_suite/report.md"
NONE = "control_none/summary.md"
BENCH = "bench_attention/summary.json"
BENCH_MD = "bench_attention/table.md"
ABL = "ablation_mqar/summary.md"
GRID_FULL = "convert/grid_full/grid.md"
EST = "estimators/must_show.jsonl"
EST_MD = "estimators/summary.md"
LM = "lm/eval_report.md"
FIT2048 = "runs/lm/hybrid_hh_langevin_fit2048/lowrank/checkpoint"
LINEAR = "runs/lm/linear_hh_langevin/lowrank/checkpoint"
FIN2048 = "runs/lm/hybrid_hh_langevin_fit2048_fin2048/lowrank/checkpoint"
COS = "runs/lm/hybrid_hh_langevin_fit2048_fin2048cos/lowrank/checkpoint"
COS64 = "runs/lm/hybrid_hh_langevin_fit2048_fin2048cos64/lowrank/checkpoint"
INTER = "lm/bench_interleaved/results.md"  # the rewritten step, rows' steps interleaved
HH8K = "| hybrid_hedgehog | 1 | 8192 |"
MF1 = "meanfield_1d/summary.json"
MF2 = "meanfield_2d/summary.json"
MF_ETA = "meanfield_eta/eta{}/summary.json"
DEFAULT = "pure linear, particles on Hedgehog's map"

F3, S3, F4, S4, PCT = "{:.3f}", "{:+.3f}", "{:.4f}", "{:+.4f}", "{:.0f}%"


def _paired(doc: str, path: str, text: str, *needles: str, fmt: str = S3,
            after: str | None = None, cell: int | None = None) -> list[tuple]:
    """Three quotes for ``mean [lo, hi]`` written as ``text``."""
    parts = CELL_NUMBER.findall(text)
    return [(doc, p, md(path, *needles, after=after, cell=cell, k=i), fmt)
            for i, p in enumerate(parts)]


def _rows(label: str, metric: str) -> Callable[[], float]:
    """The mean of ``metric`` over the seeds of conversion row ``label``."""
    return js(ROWS, "rows", label, "metrics", metric, "mean")


def _rows_pair(doc: str, text: str, a: str, b: str, metric: str,
               summary: str = ROWS) -> list[tuple]:
    """Three quotes for the paired difference ``a - b`` of ``metric`` written as ``text``
    (pairs of the conversion-rows summary ``summary``)."""
    def read(key: str) -> Callable[[], float]:
        def value() -> float:
            pairs = json.loads((RESULTS / summary).read_text())["pairs"]
            return float(next(p for p in pairs if (p["a"], p["b"], p["metric"]) == (a, b, metric))
                         [key])
        return value
    return [(doc, part, read(key), S4)
            for part, key in zip(CELL_NUMBER.findall(text), ("diff", "low", "high"), strict=True)]


_CONVERT_ROWS = [(label, metric, text) for label, values in {
    "pure linear, particles on Hedgehog's map": ("0.9724", "0.7356"),
    "pure linear, Hedgehog (tied, Adam)": ("0.9691", "0.7640"),
    "pure linear, FAVOR+ particles": ("0.9634", "0.7614"),
    "pure linear, softmax-feature particles": ("0.9731", "0.7518"),
    "pure linear, PORF-softplus particles": ("0.9479", "0.5467"),
    "hybrid W=16": ("0.9921", "0.9188"),
    "window alone W=16": ("0.8462", "0.4605")}.items()
    for metric, text in zip(("sentences cos", "512-token docs cos"), values, strict=True)]


def _minilm(variant: str, metric: str, task: str = "sst2") -> Callable[[], float]:
    return js(MINI, "summary", task, "variants", variant, metric, 0)


def _bench_ratio(pick: Callable[[list[float]], float]) -> Callable[[], float]:
    def read() -> float:
        return pick([t["ratio"] for t in json.loads((RESULTS / BENCH).read_text())
                     ["targets"]["linear"]])
    return read


QUOTES: list[tuple[str, str, Callable[[], float], str]] = [
    # synthetic ablation, n = 200, M = 64 (column 5 of the accuracy table)
    (R, "0.581", md(SYN, "| fixed |", cell=5), F3),
    (R, "0.622", md(SYN, "| importance |", cell=5), F3),
    (R, "0.684", md(SYN, "| gradient (Adam) |", cell=5), F3),
    (R, "0.687", md(SYN, "| coulomb l=0.01 |", cell=5), F3),
    *_paired(R, SYN, "-0.000 [-0.002, +0.001]", "| coulomb l=0.01 - gradient (drift) |", cell=7),
    *_paired(R, SYN, "-0.008 [-0.012, -0.003]", "| coulomb l=0.1 - gradient (drift) |", cell=7),
    *_paired(R, SYN, "+0.001 [-0.004, +0.006]", "| langevin b=1e3 - gradient (drift) |", cell=7),
    # scikit-learn estimators: the must-show task (mean over its 5 seeds) and the family
    *[(R, text, jl_mean(EST, name), F3) for name, text in (
        ("RandomFeatures(64)", "0.557"), ("RBFSampler(256)", "0.613"),
        ("ImportanceFeatures(64)", "0.622"), ("ParticleFeatures(64)", "0.850"))],
    (R, "+0.237", md(EST_MD, "ParticleFeatures(64) - RBFSampler(256)"), S3),
    (R, "+0.110", md(EST_MD, "ParticleFeatures(64) - RBFSampler(256)", after="## Tuning"), S3),
    (R, "-0.017", md(EST_MD, "ParticleFeatures(64) - RBFSampler(256)", after="## Tuning",
                     k=1), S3),
    # MQAR teacher route (device table): columns fixed=3, gradient=4; paired table after "Paired"
    (R, "0.926", md(DEV, "| easy/favor | 64 |", cell=3), F3),
    (R, "0.975", md(DEV, "| easy/favor | 64 |", cell=4), F3),
    (R, "0.717", md(DEV, "| hard/favor | 64 |", cell=3), F3),
    (R, "0.892", md(DEV, "| hard/favor | 64 |", cell=4), F3),
    *_paired(R, DEV, "+0.049 [+0.039, +0.058]", "| easy/favor | 64 |", after="Paired", cell=3),
    *_paired(R, DEV, "-0.001 [-0.008, +0.006]", "| easy/favor | 64 |", after="Paired", cell=4),
    *_paired(R, DEV, "+0.008 [+0.002, +0.014]", "| easy/favor | 64 |", after="Paired", cell=8),
    *_paired(R, DEV, "-0.145 [-0.160, -0.131]", "| easy/favor | 16 |", after="Paired", cell=9),
    *_paired(R, DEV, "+0.005 [-0.010, +0.019]", "| hard/favor | 64 |", after="Paired", cell=5),
    *_paired(R, DEV, "-0.005 [-0.017, +0.007]", "| easy/porf_softplus | 8 |", after="Paired",
             cell=3),
    *_paired(R, DEV, "+0.010 [+0.002, +0.018]", "| easy/porf_softplus | 64 |", after="Paired",
             cell=3),
    *_paired(R, HARD, "+0.008 [+0.003, +0.013]", "| hard/favor | 16 |", after="Paired", cell=5),
    *_paired(R, HARD, "+0.011 [+0.005, +0.017]", "| hard/favor | 32 |", after="Paired", cell=5),
    *_paired(R, HARD, "+0.004 [+0.001, +0.007]", "| hard/favor | 128 |", after="Paired", cell=5),
    # MQAR token-pair route
    (R, "0.998", md(REC, "| softmax | - |", cell=3), F3),
    *_paired(R, REC, "+0.329 [+0.126, +0.532]", "favor: learned M=64 minus vanilla M=64"),
    *_paired(R, REC, "+0.229 [-0.272, +0.730]", "softmax_feat: learned M=64 minus vanilla M=64"),
    *_paired(R, REC, "-0.033 [-0.046, -0.019]", "porf_softplus: learned M=64 minus vanilla M=64"),
    (R, "0.462", md(ABL, "| easy/favor | token_pair |", cell=4), F3),
    (R, "0.974", md(ABL, "| easy/favor | gradient |", cell=4), F3),
    *_paired(R, ABL, "-0.468 [-0.687, -0.250]", "| easy/favor token_pair - fixed, M=64 |",
             cell=2),
    # conversion rows (held-out cosine, mean over seeds) and their paired differences
    *[(R, text, _rows(label, metric), F4) for label, metric, text in _CONVERT_ROWS],
    *_rows_pair(R, "+0.0033 [+0.0031, +0.0036]", "pure linear, particles on Hedgehog's map",
                "pure linear, Hedgehog (tied, Adam)", "sentences cos"),
    *[q for m, text in (("16", "+0.0069 [+0.0042, +0.0095]"), ("32", "+0.0054 [+0.0030, +0.0078]"))
      for q in _rows_pair(R, text, f"M = {m}: particles on Hedgehog's map",
                          f"M = {m}: Hedgehog (tied, Adam)", "sentences cos", summary=M_GRID)],
    *_rows_pair(R, "+0.4583 [+0.4488, +0.4678]", "hybrid W=16", "window alone W=16",
                "512-token docs cos"),
    *_rows_pair(R, "+0.0007 [+0.0001, +0.0013]", "pure linear, softmax-feature particles",
                "pure linear, particles on Hedgehog's map", "sentences cos"),
    (R, "0.76", md("convert/long_inputs/speed_w16.md", "| 512 | 32 |", cell=6), "{:.2f}"),
    *_rows_pair(R, "+0.0090 [+0.0084, +0.0095]", DEFAULT, "pure linear, FAVOR+ particles",
                "sentences cos"),
    *_rows_pair(R, "-0.0284 [-0.0684, +0.0115]", DEFAULT, "pure linear, Hedgehog (tied, Adam)",
                "512-token docs cos"),
    *_rows_pair(R, "-0.0258 [-0.0640, +0.0123]", DEFAULT, "pure linear, FAVOR+ particles",
                "512-token docs cos"),
    (R, "0.6280", md(GRID_FULL, "| vanilla | 64 |", cell=4), F4),
    (R, "0.9635", md(GRID_FULL, "| particles lam=0 | 64 |", cell=4), F4),
    # from-scratch classifiers
    *_paired(R, NONE, "+0.0119 [-0.0039, +0.0277]", "- SST-2", fmt=S4),
    *_paired(R, NONE, "+0.0158 [+0.0052, +0.0263]", "- Rotten Tomatoes", fmt=S4),
    *_paired(R, NONE, "+0.0000 [-0.0054, +0.0055]", "- QQP", fmt=S4),
    *_paired(R, SUITE, "+0.0010 [-0.0015, +0.0036]", "| favor | 5 |", after="## qqp", cell=3,
             fmt=S4),
    *_paired(R, SUITE, "+0.0023 [-0.0069, +0.0115]", "| favor | 5 |", after="## sst2", cell=3,
             fmt=S4),
    *_paired(R, SUITE, "-0.0056 [-0.0176, +0.0064]", "| favor | 5 |",
             after="## rotten_tomatoes", cell=3, fmt=S4),
    # attention speed
    (R, "49%", md(BENCH_MD, "| 16384 | favor_fused | 64 |", cell=9, integers=True), PCT),
    (R, "64%", md(BENCH_MD, "| 16384 | favor_fused | 128 |", cell=9, integers=True), PCT),
    (R, "69%", md(BENCH_MD, "| 16384 | favor_fused | 256 |", cell=9, integers=True), PCT),
    (R, "5.15", _bench_ratio(min), "{:.2f}"),
    (R, "8.17", _bench_ratio(max), "{:.2f}"),
    *[(R, text, md(BENCH_MD, f"| {n} | {method} |", cell=4), "{:.2f}")
      for n, method, text in ((512, "favor_fused | 64", "2.23"), (512, "sdpa", "2.05"),
                              (1024, "favor_fused | 64", "3.83"), (1024, "sdpa", "7.89"))],
    # the converted causal LM: perplexity at 2,048 tokens, paired differences in nats
    *[(R, text, md(LM, f"| {row} |", cell=3), "{:.2f}") for row, text in (
        ("teacher", "34.03"), ("streaming:64:4", "49.17"), ("streaming:97:4", "43.87"),
        ("fixed:hedgehog:64:4", "94.24"), ("runs/lm/hybrid_hh_langevin/checkpoint", "48.88"),
        ("runs/lm/hybrid_hh_langevin/lowrank/checkpoint", "44.43"))],
    *[q for pair, text in (
        ("checkpoint - fixed:hedgehog:64:4", "-0.6565 [-0.7074, -0.6055]"),
        ("checkpoint - streaming:64:4", "-0.0059 [-0.0410, +0.0291]"),
        ("lowrank/checkpoint - streaming:64:4", "-0.1015 [-0.1240, -0.0790]"),
        ("lowrank/checkpoint - streaming:97:4", "+0.0127 [-0.0188, +0.0442]"))
      for q in _paired(R, LM, text, f"| runs/lm/hybrid_hh_langevin/{pair} |", "| ppl | 2048 |",
                       cell=5, fmt=S4)],
    # ... and at 8,192 tokens (cells: row, 512, 2048, 8192)
    *[(R, text, md(LM, f"| {row} |", cell=4), "{:.2f}") for row, text in (
        ("teacher", "33.95"), ("streaming:64:4", "70.11"), ("streaming:97:4", "56.29"),
        ("fixed:hedgehog:64:4", "167.43"), ("runs/lm/hybrid_hh_langevin/checkpoint", "105.13"),
        ("runs/lm/hybrid_hh_langevin/lowrank/checkpoint", "89.39"))],
    *_paired(R, LM, "+0.2429 [+0.0885, +0.3973]",
             "| runs/lm/hybrid_hh_langevin/lowrank/checkpoint - streaming:64:4 |", "| ppl | 8192 |",
             cell=5, fmt=S4),
    # fitted on 2,048-token documents, and pure linear
    *[(R, text, md(LM, f"| {row} |", cell=cell), "{:.2f}") for row, cell, text in (
        (FIT2048, 3, "40.50"), (FIT2048, 4, "74.54"), (LINEAR, 3, "196.83"),
        (LINEAR, 4, "537.61"))],
    *[q for pair, length, text in (
        (f"{FIT2048} - runs/lm/hybrid_hh_langevin/lowrank/checkpoint", 2048,
         "-0.0924 [-0.1187, -0.0662]"),
        (f"{FIT2048} - runs/lm/hybrid_hh_langevin/lowrank/checkpoint", 8192,
         "-0.1817 [-0.1985, -0.1649]"),
        (f"{FIT2048} - streaming:97:4", 2048, "-0.0798 [-0.1005, -0.0591]"),
        (f"{FIT2048} - streaming:64:4", 8192, "+0.0612 [-0.0993, +0.2217]"))
      for q in _paired(R, LM, text, f"| {pair} |", f"| ppl | {length} |", cell=5, fmt=S4)],
    (R, "5.78", md(LM, f"| {LINEAR} - teacher |", "| ppl | 2048 |", cell=6), "{:.2f}"),
    # finished on 2,048-token documents
    *[(R, text, md(LM, f"| {FIN2048} |", cell=cell), "{:.2f}") for cell, text in (
        (3, "38.07"), (4, "65.10"))],
    *[q for pair, length, text in (
        (f"{FIN2048} - {FIT2048}", 2048, "-0.0620 [-0.0795, -0.0445]"),
        (f"{FIN2048} - {FIT2048}", 8192, "-0.1354 [-0.1429, -0.1279]"),
        (f"{FIN2048} - streaming:97:4", 2048, "-0.1418 [-0.1669, -0.1167]"),
        (f"{FIN2048} - streaming:64:4", 8192, "-0.0742 [-0.2385, +0.0901]"),
        (f"{FIN2048} - streaming:97:4", 8192, "+0.1454 [+0.0042, +0.2865]"))
      for q in _paired(R, LM, text, f"| {pair} |", f"| ppl | {length} |", cell=5, fmt=S4)],
    (R, "1.12", md(LM, f"| {FIN2048} - teacher |", "| ppl | 2048 |", cell=6), "{:.2f}"),
    # decoding at 8,192 tokens: decode x teacher (the old step's quiet run, the new step's
    # quiet run and its alternated runs), state / KV and prefill / teacher of the new step
    (R, "1.31", md("lm/bench_quiet/results.md", HH8K, cell=10), "{:.2f}"),
    (R, "1.86", md(INTER, HH8K, cell=10), "{:.2f}"),
    (R, "0.65", md(INTER, HH8K, cell=11), "{:.2f}"),
    (R, "1.82", md("lm/bench_interleaved/run3.md", HH8K, cell=10), "{:.2f}"),
    *[(R, text, md(f"lm/bench_lean/ab/{run}.md", HH8K, cell=10), "{:.2f}")
      for run, text in (("new_2", "1.78"), ("new_3", "2.47"))],
    (R, "17.05", md("lm/bench_b8_8k/results.md", "| hybrid_hedgehog | 8 | 8192 |", cell=10),
     "{:.2f}"),
    # the finishing's recipe: a cosine rate (COS), and documents spread over the works (COS64)
    *[q for pair, length, text in (
        (f"{COS} - {FIN2048}", 2048, "+0.0006 [-0.0060, +0.0072]"),
        (f"{COS64} - {FIN2048}", 2048, "-0.0046 [-0.0190, +0.0098]"),
        (f"{COS} - {FIN2048}", 8192, "+0.0133 [+0.0096, +0.0170]"),
        (f"{COS64} - {FIN2048}", 8192, "+0.0459 [+0.0374, +0.0544]"))
      for q in _paired(R, LM, text, f"| {pair} |", f"| ppl | {length} |", cell=5, fmt=S4)],
    # the mean-field study: particles against the PDE at the end time (1-D W1, 2-D MMD)
    *[(R, text, js(path, *keys), fmt) for path, keys, text, fmt in (
        (MF1, ("mean_distance_by_time", "0.5", 0), "0.1434", F4),
        (MF1, ("mean_distance_by_time", "0.5", -1), "0.0156", F4),
        (MF2, ("mean_distance_by_time", "0.5", 0), "0.0957", F4),
        (MF2, ("mean_distance_by_time", "0.5", -1), "0.0129", F4),
        (MF1, ("slope",), "-0.559", F3), (MF2, ("slope",), "-0.500", F3),
        (MF1, ("pooled_distance_largest_n",), "0.0102", F4),
        (MF1, ("pooled_mc_level",), "0.0090", F4),
        (MF2, ("pooled_distance_largest_n",), "0.0056", F4),
        (MF2, ("pooled_mc_level",), "0.0075", F4),
        (MF1, ("distance_final_particles_to_rho0",), "0.4017", F4),
        (MF2, ("distance_final_particles_to_rho0",), "0.1670", F4))],
    *[(R, text, js(MF_ETA.format(eta), key), F4) for eta, key, text in (
        ("0.02", "pooled_distance_largest_n", "0.0134"),
        ("0.01", "pooled_distance_largest_n", "0.0121"),
        ("0.005", "pooled_distance_largest_n", "0.0140"),
        ("0.02", "pooled_mc_level", "0.0116"), ("0.01", "pooled_mc_level", "0.0119"),
        ("0.005", "pooled_mc_level", "0.0113"))],
]

# the fine-tuned MiniLM tables (one per task, after its heading in docs/results.md; "-" where
# the task has no such evaluation) and their paired differences (docs/results.md, README)
_MINILM_ROWS = {"softmax:vanilla": "softmax MiniLM", "favor:vanilla": "FAVOR+ fixed",
                "favor:teacher": "FAVOR+ learned (teacher)", "hedgehog:hedgehog": "Hedgehog's map"}
_MINILM_COLS = ("accuracy", "ece", "log_loss", "brier", "corrupted_accuracy", "advglue_accuracy")
_MINILM_TASKS = {"sst2": "### SST-2", "rotten_tomatoes": "### Rotten Tomatoes", "qqp": "### QQP"}


#: rows only some tasks' tables have: variant -> (label, tasks)
_SST2_RT = ("sst2", "rotten_tomatoes")
_MINILM_EXTRA = {"hedgehog:teacher": ("particles on Hedgehog's map (teacher)", ("sst2",)),
                 "favor:adam": ("FAVOR+ learned by plain Adam (ablation)", _SST2_RT),
                 "favor:teacher_pairs": ("FAVOR+ learned, conversion on whole pairs", ("qqp",)),
                 "porf_softplus:vanilla": ("PORF-softplus fixed", ("sst2",)),
                 "porf_softplus:teacher": ("PORF-softplus learned (teacher)", ("sst2",)),
                 "softmax_feat:vanilla": ("softmax features fixed", (*_SST2_RT, "qqp")),
                 "softmax_feat:teacher": ("softmax features learned (teacher)",
                                          (*_SST2_RT, "qqp")),
                 "softmax_feat:adam": ("softmax features learned by plain Adam (ablation)",
                                       ("sst2",)),
                 "favor:labels": ("FAVOR+ learned by label alignment", ("sst2",))}


def _minilm_quotes() -> list[tuple]:
    lines = (REPO / R).read_text().splitlines()
    out = []
    for task, heading in _MINILM_TASKS.items():
        assert heading in lines, f"docs/results.md has no MiniLM table {heading!r}"
        rest = lines[lines.index(heading):]
        rows = {**_MINILM_ROWS, **{v: label for v, (label, tasks) in _MINILM_EXTRA.items()
                                   if task in tasks}}
        for variant, label in rows.items():
            line = next((x for x in rest if x.startswith(f"| {label} |")), None)
            assert line is not None, f"docs/results.md has no MiniLM row {label!r} ({task})"
            cells = [c.strip() for c in line.split("|")[3:3 + len(_MINILM_COLS)]]
            out += [(R, cell, _minilm(variant, metric, task), F3)
                    for cell, metric in zip(cells, _MINILM_COLS, strict=True) if cell != "-"]
    return out


def _minilm_pair(doc: str, text: str, pair: str, task: str,
                 metric: str = "accuracy") -> list[tuple]:
    """``mean [lo, hi]`` of a paired difference (``metric``, its report label) of the MiniLM
    report, task ``task``."""
    return _paired(doc, MINI_MD, text, f"| {pair} | {metric}", after=f"## {task} (", fmt=S4)


_MINILM_PAIRS = [  # (documents, text, pair, task)
    ((R, ME), "+0.0484 [+0.0345, +0.0623]", "favor:teacher - favor:vanilla", "sst2"),
    ((R,), "-0.0158 [-0.0323, +0.0007]", "favor:teacher - softmax:vanilla", "sst2"),
    ((R, ME), "+0.0358 [+0.0220, +0.0496]", "favor:teacher - favor:vanilla", "rotten_tomatoes"),
    ((R,), "-0.0120 [-0.0156, -0.0084]", "favor:teacher - softmax:vanilla", "rotten_tomatoes"),
    ((R,), "-0.0099 [-0.0231, +0.0034]", "favor:teacher - hedgehog:hedgehog", "sst2"),
    ((R,), "-0.0056 [-0.0110, -0.0002]", "favor:teacher - hedgehog:hedgehog", "rotten_tomatoes"),
    ((R,), "-0.0004 [-0.0206, +0.0198]", "hedgehog:teacher - hedgehog:hedgehog", "sst2"),
    ((R,), "-0.0134 [-0.0280, +0.0012]", "hedgehog:teacher - softmax:vanilla", "sst2"),
    ((R,), "+0.0642 [+0.0552, +0.0732]", "softmax:vanilla - none:vanilla", "sst2"),
    ((R,), "+0.0484 [+0.0342, +0.0626]", "favor:teacher - none:vanilla", "sst2"),
    ((R,), "+0.0638 [+0.0546, +0.0730]", "softmax:vanilla - none:vanilla", "rotten_tomatoes"),
    ((R,), "+0.0518 [+0.0422, +0.0613]", "favor:teacher - none:vanilla", "rotten_tomatoes"),
    ((R, ME), "+0.0184 [+0.0155, +0.0213]", "favor:teacher - favor:vanilla", "qqp"),
    ((R, ME), "-0.0727 [-0.0760, -0.0695]", "favor:teacher - softmax:vanilla", "qqp"),
    ((R,), "-0.0115 [-0.0149, -0.0081]", "favor:teacher - hedgehog:hedgehog", "qqp"),
    ((R, ME), "-0.0028 [-0.0199, +0.0144]", "favor:teacher - favor:adam", "sst2"),
    ((R,), "+0.0511 [+0.0333, +0.0690]", "favor:adam - favor:vanilla", "sst2"),
    ((R,), "+0.0078 [+0.0025, +0.0131]", "favor:teacher_pairs - favor:teacher", "qqp"),
    ((R,), "-0.0036 [-0.0076, +0.0005]", "favor:teacher - favor:adam", "rotten_tomatoes"),
    ((R,), "+0.0394 [+0.0261, +0.0527]", "favor:adam - favor:vanilla", "rotten_tomatoes"),
    ((R,), "-0.0637 [-0.0722, -0.0551]", "favor:teacher_pairs - softmax:vanilla", "qqp"),
    ((R,), "-0.0055 [-0.0152, +0.0042]", "favor:teacher_pairs - hedgehog:hedgehog", "qqp"),
    ((R,), "+0.0378 [+0.0132, +0.0625]", "porf_softplus:teacher - porf_softplus:vanilla", "sst2"),
    ((R,), "+0.0459 [+0.0356, +0.0561]", "softmax_feat:teacher - softmax_feat:vanilla", "sst2"),
    ((R,), "-0.0080 [-0.0209, +0.0049]", "softmax_feat:teacher - softmax:vanilla", "sst2"),
    ((R,), "-0.0021 [-0.0117, +0.0076]", "softmax_feat:teacher - hedgehog:hedgehog", "sst2"),
    ((R,), "+0.0078 [-0.0026, +0.0182]", "softmax_feat:teacher - favor:teacher", "sst2"),
    ((R,), "-0.0080 [-0.0109, -0.0052]", "porf_softplus:teacher - favor:teacher", "sst2"),
    ((R,), "+0.0061 [-0.0220, +0.0342]", "favor:labels - favor:vanilla", "sst2"),
    ((R,), "+0.0440 [+0.0057, +0.0822]", "favor:teacher - favor:labels", "sst2"),
    ((R,), "-0.0046 [-0.0149, +0.0057]", "softmax_feat:teacher - softmax_feat:adam", "sst2"),
    ((R,), "+0.0505 [+0.0362, +0.0647]", "softmax_feat:adam - softmax_feat:vanilla", "sst2"),
    ((R,), "+0.0241 [+0.0086, +0.0396]", "softmax_feat:teacher - softmax_feat:vanilla",
     "rotten_tomatoes"),
    ((R,), "-0.0109 [-0.0158, -0.0061]", "softmax_feat:teacher - softmax:vanilla",
     "rotten_tomatoes"),
    ((R,), "+0.0016 [-0.0125, +0.0156]", "softmax_feat:teacher - favor:teacher",
     "rotten_tomatoes"),
    ((R,), "-0.0019 [-0.0187, +0.0149]", "softmax_feat:teacher - hedgehog:hedgehog",
     "rotten_tomatoes"),
]
for _docs, _text, _pair, _task in _MINILM_PAIRS:
    for _doc in _docs:
        QUOTES += _minilm_pair(_doc, _text, _pair, _task)
QUOTES.append((R, "0.876", js("minilm_finetune/sst2_full_softmax.json", "accuracy"), F3))

# the README's list: each figure also in its docs/results.md section (the quotes above hold
# the MiniLM intervals for both documents)
QUOTES += [
    (ME, "0.684", md(SYN, "| gradient (Adam) |", cell=5), F3),
    (ME, "0.581", md(SYN, "| fixed |", cell=5), F3),
    *_paired(ME, DEV, "+0.049 [+0.039, +0.058]", "| easy/favor | 64 |", after="Paired", cell=3),
    *_paired(ME, SUITE, "+0.0010 [-0.0015, +0.0036]", "| favor | 5 |", after="## qqp", cell=3,
             fmt=S4),
    (ME, "+0.011", md(HARD, "| hard/favor | 32 |", after="Paired", cell=5), S3),
    (ME, "+0.004", md(HARD, "| hard/favor | 128 |", after="Paired", cell=5), S3),
    (ME, "0.850", jl_mean(EST, "ParticleFeatures(64)"), F3),
    (ME, "0.613", jl_mean(EST, "RBFSampler(256)"), F3),
    (ME, "0.9724", _rows(DEFAULT, "sentences cos"), F4),
    (ME, "0.7356", _rows(DEFAULT, "512-token docs cos"), F4),
    (ME, "0.9188", _rows("hybrid W=16", "512-token docs cos"), F4),
    *_rows_pair(ME, "+0.0033 [+0.0031, +0.0036]", DEFAULT, "pure linear, Hedgehog (tied, Adam)",
                "sentences cos"),
    (ME, "0.426", _minilm("favor:vanilla", "advglue_accuracy"), F3),
    (ME, "0.364", _minilm("favor:teacher", "advglue_accuracy"), F3),
    (ME, "0.974", md(ABL, "| easy/favor | gradient |", cell=4), F3),
    (ME, "0.462", md(ABL, "| easy/favor | token_pair |", cell=4), F3),
    (ME, "3.83", md(BENCH_MD, "| 1024 | favor_fused | 64 |", cell=4), "{:.2f}"),
    (ME, "7.89", md(BENCH_MD, "| 1024 | sdpa |", cell=4), "{:.2f}"),
    (ME, "38.07", md(LM, f"| {FIN2048} |", cell=3), "{:.2f}"),
    (ME, "65.10", md(LM, f"| {FIN2048} |", cell=4), "{:.2f}"),
    (ME, "49.17", md(LM, "| streaming:64:4 |", cell=3), "{:.2f}"),
    (ME, "43.87", md(LM, "| streaming:97:4 |", cell=3), "{:.2f}"),
    (ME, "70.11", md(LM, "| streaming:64:4 |", cell=4), "{:.2f}"),
    (ME, "1.86", md(INTER, HH8K, cell=10), "{:.2f}"),
    (ME, "17.05", md("lm/bench_b8_8k/results.md", "| hybrid_hedgehog | 8 | 8192 |", cell=10),
     "{:.2f}"),
    (ME, "-0.559", js(MF1, "slope"), F3),
    (ME, "-0.500", js(MF2, "slope"), F3),
]
QUOTES.append((R, "0.798", _minilm("none:vanilla", "accuracy"), F3))
QUOTES.append((R, "0.773", _minilm("none:vanilla", "accuracy", "rotten_tomatoes"), F3))
_MINILM_METRIC_PAIRS = [  # (text, pair, task, metric): docs/results.md, a metric not accuracy
    ("+0.0066 [+0.0016, +0.0116]", "favor:teacher - favor:adam", "rotten_tomatoes", "Brier"),
    ("-0.0070 [-0.0134, -0.0006]", "favor:teacher - favor:adam", "rotten_tomatoes",
     "corrupted acc"),
    ("-0.0377 [-0.0643, -0.0111]", "porf_softplus:teacher - porf_softplus:vanilla", "sst2",
     "Brier"),
    ("-0.0661 [-0.0895, -0.0427]", "softmax_feat:teacher - softmax_feat:vanilla", "sst2",
     "log-loss"),
    ("-0.0103 [-0.0167, -0.0038]", "softmax_feat:teacher - favor:teacher", "sst2", "Brier"),
    ("-0.0311 [-0.0607, -0.0015]", "softmax_feat:teacher - softmax_feat:vanilla",
     "rotten_tomatoes", "Brier"),
    ("+0.0159 [+0.0031, +0.0288]", "softmax_feat:teacher - softmax_feat:vanilla",
     "rotten_tomatoes", "ECE"),
    ("+0.0185 [+0.0037, +0.0332]", "favor:teacher - favor:vanilla", "rotten_tomatoes", "ECE"),
    ("+0.0111 [+0.0020, +0.0202]", "favor:teacher - favor:vanilla", "qqp", "ECE"),
    ("-0.0622 [-0.1055, -0.0188]", "favor:teacher - favor:vanilla", "sst2", "AdvGLUE acc"),
    ("+0.0128 [-0.0847, +0.1103]", "favor:teacher - favor:vanilla", "qqp", "AdvGLUE acc"),
]
_SF = "softmax_feat:teacher - "
_MINILM_METRIC_PAIRS += [  # QQP's softmax features (the paper's QQP claim): docs/results.md
    ("+0.0249 [+0.0183, +0.0314]", _SF + "softmax_feat:vanilla", "qqp", "accuracy"),
    ("-0.0395 [-0.0517, -0.0274]", _SF + "softmax_feat:vanilla", "qqp", "log-loss"),
    ("-0.0285 [-0.0370, -0.0200]", _SF + "softmax_feat:vanilla", "qqp", "Brier"),
    ("+0.0001 [-0.0083, +0.0084]", _SF + "softmax_feat:vanilla", "qqp", "ECE"),
    ("+0.0117 [+0.0034, +0.0199]", _SF + "softmax_feat:vanilla", "qqp", "corrupted acc"),
    ("-0.1026 [-0.2711, +0.0660]", _SF + "softmax_feat:vanilla", "qqp", "AdvGLUE acc"),
    ("-0.0536 [-0.0557, -0.0514]", _SF + "softmax:vanilla", "qqp", "accuracy"),
    ("+0.0179 [+0.0163, +0.0196]", _SF + "favor:teacher", "qqp", "accuracy"),
    ("+0.0047 [+0.0012, +0.0081]", _SF + "hedgehog:hedgehog", "qqp", "accuracy"),
]
for _text, _pair, _task, _metric in _MINILM_METRIC_PAIRS:
    QUOTES += _minilm_pair(R, _text, _pair, _task, _metric)

# docs/convert.md's fit-on-documents tables: the rows fitted on 512-token documents against the
# same seeds fitted on sentences (long_inputs/fit_documents512/rows.summary.json)
CV = "docs/convert.md"
FD_ROWS = "convert/long_inputs/fit_documents512/rows.summary.json"
_FD_CELLS = {
    'hybrid W=16, fitted on documents': ('0.9872', '0.9511', '0.9727', '0.9576'),
    'hybrid W=16, fitted on sentences': ('0.9921', '0.9052', '0.9188', '0.8944'),
    'pure linear, fitted on documents': ('0.8996', '0.8597', '0.9232', '0.8936'),
    'pure linear, fitted on sentences': ('0.9724', '0.7254', '0.7356', '0.6779'),
}
for _label, _cells in _FD_CELLS.items():
    QUOTES += [(CV, text, js(FD_ROWS, "rows", _label, "metrics", metric, "mean"), F4)
               for text, metric in zip(_cells, ("sentences cos", "256-token docs cos",
                                                "512-token docs cos", "512-token docs cos p5"),
                                       strict=True)]
for _row, _metric, _text in (
        ('hybrid W=16', 'sentences cos', "-0.0049 [-0.0057, -0.0042]"),
        ('hybrid W=16', '256-token docs cos', "+0.0459 [+0.0413, +0.0506]"),
        ('hybrid W=16', '512-token docs cos', "+0.0540 [+0.0506, +0.0573]"),
        ('pure linear', 'sentences cos', "-0.0728 [-0.0757, -0.0698]"),
        ('pure linear', '256-token docs cos', "+0.1344 [+0.1076, +0.1612]"),
        ('pure linear', '512-token docs cos', "+0.1876 [+0.1575, +0.2178]"),
):
    QUOTES += _rows_pair(CV, _text, f"{_row}, fitted on documents",
                         f"{_row}, fitted on sentences", _metric, summary=FD_ROWS)

for _doc, _row, _metric in ((ME, "hybrid W=16", "512-token docs cos"),
                             (ME, "pure linear", "512-token docs cos"),
                             (R, "hybrid W=16", "512-token docs cos"),
                             (R, "pure linear", "512-token docs cos"),
                             (R, "hybrid W=16", "sentences cos"),
                             (R, "pure linear", "sentences cos")):
    _label = f"{_row}, fitted on documents"
    QUOTES.append((_doc, _FD_CELLS[_label][("sentences cos", "256-token docs cos",
                                           "512-token docs cos").index(_metric)],
                   js(FD_ROWS, "rows", _label, "metrics", _metric, "mean"), F4))

# numbers that are settings, not measurements
PARAMETERS = {R: {"0.01", "0.1", "95%", "10%", "0.02", "0.005", "-0.5"},  # lambdas and time
              ME: {"3.10"}}  # steps, a CI level, a corruption rate, the Monte-Carlo slope, Python


def _prose(doc: str) -> str:
    """The document without its fenced code blocks and link targets."""
    text = re.sub(r"```.*?```", "", (REPO / doc).read_text(), flags=re.S)
    return re.sub(r"\]\([^)]*\)", "]", text)


def _all_quotes() -> list[tuple]:
    return QUOTES + _minilm_quotes()


def _ids() -> list[str]:
    return [f"{d}:{t}" for d, t, _, _ in QUOTES]


@pytest.mark.parametrize(("doc", "text", "read", "fmt"), QUOTES, ids=_ids())
def test_quote_matches_its_result_file(doc, text, read, fmt):
    value = read()
    assert fmt.format(value) == text, f"{doc} quotes {text}, the file has {value}"
    assert text in NUMBER.findall(_prose(doc)), f"{doc} no longer quotes {text}"


def test_minilm_table_matches_the_report():
    for doc, text, read, fmt in _minilm_quotes():
        assert fmt.format(read()) == text, f"{doc}: MiniLM cell {text} vs file {read()}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_quoted_number_is_checked(doc):
    checked = {t for d, t, _, _ in _all_quotes() if d == doc} | PARAMETERS.get(doc, set())
    unchecked = sorted(set(NUMBER.findall(_prose(doc))) - checked)
    assert not unchecked, (f"{doc} quotes numbers no test reads from a result file: {unchecked} "
                           f"(add them to tests/test_docs_figures.py QUOTES)")


def _ahead(task: str, pair: str, metric: str) -> str:
    """The seeds-ahead count (``k/n``) of a paired difference in the MiniLM report."""
    lines = _lines(MINI_MD)
    rest = lines[next(i for i, x in enumerate(lines) if x.startswith(f"## {task} (")):]
    line = next(x for x in rest if x.startswith(f"| {pair} | {metric} |"))
    return line.split("|")[5].strip()


_LEARNED_FIXED = "favor:teacher - favor:vanilla"
#: seed counts the documents state: (document, the phrase, task, metric, count)
SEED_COUNTS = [
    (ME, "0.364, 0/5 seeds", "sst2", "AdvGLUE acc", "0/5"),
    (R, "-0.0622 [-0.1055, -0.0188] (0/5 seeds ahead)", "sst2", "AdvGLUE acc", "0/5"),
    (R, "ECE worse: +0.0185 [+0.0037, +0.0332] (0/5)", "rotten_tomatoes", "ECE", "0/5"),
    (R, "ECE worse: +0.0111 [+0.0020, +0.0202] (0/5)", "qqp", "ECE", "0/5"),
    *[(doc, phrase, task, metric, "5/5")
      for doc, phrase in ((ME, "accuracy, log-loss and Brier on every seed"),
                          (R, "log-loss and Brier better on every seed"))
      for task in ("sst2", "rotten_tomatoes", "qqp") for metric in ("log-loss", "Brier")
      if doc == ME or task != "sst2"],
    *[(ME, "accuracy, log-loss and Brier on every seed", task, "accuracy", "5/5")
      for task in ("sst2", "rotten_tomatoes", "qqp")],
]


@pytest.mark.parametrize(("doc", "phrase", "task", "metric", "count"), SEED_COUNTS)
def test_seed_counts_match_the_report(doc, phrase, task, metric, count):
    """"0/5 seeds", "on every seed": the report's count of seeds where learned FAVOR+ is ahead
    of fixed FAVOR+, and the document still says it."""
    assert _ahead(task, _LEARNED_FIXED, metric) == count, (task, metric)
    assert phrase in " ".join(_prose(doc).split()), f"{doc} no longer says {phrase!r}"


def test_estimator_counts_match_their_files():
    """ParticleFeatures(64) ahead of RBFSampler(256) on every must-show seed, and on 10 of the
    12 tasks of the family (mean over its seeds), as both documents say."""
    def rows(path):
        return [json.loads(x) for x in (RESULTS / path).read_text().splitlines() if x.strip()]

    pf, rbf = "ParticleFeatures(64)", "RBFSampler(256)"
    assert all(r[pf] > r[rbf] for r in rows(EST))
    by_task: dict[str, list[float]] = {}
    for r in rows("estimators/family.jsonl"):
        by_task.setdefault(r["task"], []).append(r[pf] - r[rbf])
    ahead = sum(sum(d) > 0 for d in by_task.values())
    assert (ahead, len(by_task)) == (10, 12)
    assert "ahead on every seed" in " ".join(_prose(R).split())
    assert "ahead on 10 of 12 tasks" in " ".join(_prose(R).split())
    assert "on 10 of 12 tasks" in " ".join(_prose(ME).split())


def test_the_checker_catches_drift():
    """A quote whose file value differs, and a number nobody checks, both fail."""
    read = md(SYN, "| fixed |", cell=5)
    assert F3.format(read()) != "0.580"
    assert set(NUMBER.findall("accuracy 0.812 and 7% with M = 64")) == {"0.812", "7%"}


def test_readme_is_short():
    """A newcomer reads it in five minutes: at most 130 lines, the measurements live in
    docs/results.md."""
    assert len((REPO / "README.md").read_text().splitlines()) <= 130


def test_passkey_counts_match_their_file():
    """"passkey 0/60" (README) and "finds every key ... none" (results): the 20-trial passkey
    run at 1,024 / 2,048 / 4,096 tokens."""
    rows = [json.loads(x) for x in
            (RESULTS / "lm/passkey20/results.jsonl").read_text().splitlines() if x.strip()]
    found: dict[str, list[bool]] = {}
    for r in rows:
        found.setdefault(r["row"], []).append(bool(r["success"]))
    assert {k: (sum(v), len(v)) for k, v in found.items()} == {
        "teacher": (60, 60), "streaming:64:4": (0, 60), FIT2048: (0, 60), FIN2048: (0, 60)}
    assert "passkey 0/60" in " ".join(_prose(ME).split())
    assert "StreamingLLM and both hybrids fitted on 2,048 tokens (finished on 512 or 2,048) none" \
        in \
        " ".join(_prose(R).split())

"""The ablation report (reports.ablation): tables, paired differences and verdicts from records
only, checked against a hand computation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from coulomb_attention.reports.ablation import (
    diagnostics_table,
    label,
    paired_differences,
    score_table,
    verdicts,
    write_ablation_report,
)

SCORES = {  # (variant, params) -> {seed: score} at M = 16; gradient lacks seed 3
    ("fixed", ()): {0: 0.50, 1: 0.52, 2: 0.47, 3: 0.51},
    ("gradient", ()): {0: 0.70, 1: 0.69, 2: 0.74},
    ("coulomb", (("beta", 1e6), ("lam", 0.1))): {2: 0.76, 0: 0.73, 1: 0.71, 3: 0.72},
    ("hedgehog", ()): {0: 0.69, 1: 0.70, 2: 0.71, 3: 0.68},
}


def _records(m=16, shift=0.0):
    out = []
    for (variant, params), by_seed in SCORES.items():
        for seed, score in by_seed.items():
            out.append({"arena": "convert", "setting": "fit64", "variant": variant,
                        "params": dict(params), "M": m, "seed": seed, "metric": "cosine",
                        "score": score + shift,
                        "diagnostics": {"nn_min": 0.1 * seed, "nn_median": 1.0,
                                        "collapsed_share": 0.0, "effective_rank": 10.0 + seed},
                        "energy_trace": [] if variant == "fixed" else
                        [{"step": 0, "energy": 1.0, "data": 1.0, "repulsion": 0.0},
                         {"step": 9, "energy": 0.5, "data": 0.5, "repulsion": 0.0}],
                        "time_s": 1.0})
    return out


def _by_hand(a: list[float], b: list[float]):
    d = np.asarray(a) - np.asarray(b)
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return d.mean(), d.mean() - half, d.mean() + half


def test_label():
    assert label({"variant": "fixed", "params": {}}) == "fixed"
    assert label({"variant": "coulomb", "params": {"lam": 0.1, "beta": 1e6}}) == \
        "coulomb(beta=1e+06, lam=0.1)"


def test_paired_differences_equal_a_hand_computation():
    rows = paired_differences(_records())
    row = next(r for r in rows if r["label"] == "coulomb(beta=1e+06, lam=0.1)"
               and r["reference"] == "gradient")
    # paired by seed over the seeds both have (gradient lacks seed 3), whatever the order
    mean, lo, hi = _by_hand([0.73, 0.71, 0.76], [0.70, 0.69, 0.74])
    assert row["seeds"] == [0, 1, 2] and row["n"] == 3
    assert (row["mean"], row["low"], row["high"]) == pytest.approx((mean, lo, hi), abs=1e-12)
    row = next(r for r in rows if r["label"] == "coulomb(beta=1e+06, lam=0.1)"
               and r["reference"] == "fixed")
    mean, lo, hi = _by_hand([0.73, 0.71, 0.76, 0.72], [0.50, 0.52, 0.47, 0.51])
    assert (row["mean"], row["low"], row["high"], row["n"]) == pytest.approx((mean, lo, hi, 4))
    # against hedgehog too, and never a label against itself
    row = next(r for r in rows if r["reference"] == "hedgehog" and r["label"] == "coulomb"
               "(beta=1e+06, lam=0.1)")
    assert row["ahead"] == 4 and row["n"] == 4
    # two references differ once (the later one minus the earlier in VARIANTS order)
    row = next(r for r in rows if r["reference"] == "gradient" and r["label"] == "hedgehog")
    assert row["ahead"] == 1 and row["n"] == 3  # seed 1 ahead, seeds 0 and 2 behind
    pairs = [frozenset((r["label"], r["reference"])) for r in rows]
    assert len(pairs) == len(set(pairs))
    assert not any(r["label"] == "gradient" and r["reference"] == "hedgehog" for r in rows)
    assert not any(r["label"] == r["reference"] for r in rows)


def test_verdict_is_yes_only_when_the_interval_is_above_zero():
    (line,) = verdicts(_records())
    mean, lo, hi = _by_hand([0.73, 0.71, 0.76], [0.70, 0.69, 0.74])
    assert lo > 0
    assert line.startswith(f"convert: Coulomb beats gradient at M=16: yes {mean:+.4f} "
                           f"[{lo:+.4f}, {hi:+.4f}]")
    worse = [dict(r, score=r["score"] - (0.05 if r["variant"] == "coulomb" else 0))
             for r in _records()]
    assert ": no " in verdicts(worse)[0]


def test_no_verdict_below_three_seeds(tmp_path):
    two = [r for r in _records() if r["seed"] in (0, 1)]
    assert verdicts(two) == []
    with open(tmp_path / "records.jsonl", "w") as f:
        for r in two:
            f.write(json.dumps(r) + "\n")
    text = write_ablation_report(tmp_path, plots=False).read_text()
    assert "Coulomb beats gradient" not in text and "3 or more seeds" in text


def test_error_bars_stay_in_the_metric_range():
    from coulomb_attention.reports.ablation import error_bars

    stats_ = [(0.98, 0.93, 1.03, 2), (0.5, 0.4, 0.6, 3), (0.7, math.nan, math.nan, 1)]
    below, above = error_bars(stats_, "accuracy")
    assert below == pytest.approx([0.05, 0.1, 0.0])
    assert above == pytest.approx([0.02, 0.1, 0.0])  # 0.98 + 0.02 = 1: clipped at 1
    below, above = error_bars(stats_, "unknown")
    assert above[0] == pytest.approx(0.05)


def test_tables_and_report_files(tmp_path):
    recs = _records(16) + _records(64, shift=0.1)
    table = score_table(recs)
    assert "### convert / fit64 (cosine, held out)" in table
    assert f"| fixed | {np.mean([0.50, 0.52, 0.47, 0.51]):.4f} +- " in table
    diag = diagnostics_table(recs)
    assert "| convert | fit64 | 16 | fixed | 0.15 | 1 | 0 | 11.5 |" in diag
    with open(tmp_path / "records.jsonl", "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    path = write_ablation_report(tmp_path)
    text = path.read_text()
    assert "Coulomb beats gradient at M=16" in text and "Coulomb beats gradient at M=64" in text
    assert "## Paired differences" in text and "## Diagnostics" in text
    assert (tmp_path / "ablation_convert_score.png").stat().st_size > 0
    assert (tmp_path / "ablation_convert_energy.png").stat().st_size > 0


def test_empty_records_raise(tmp_path):
    with pytest.raises(ValueError, match="no records"):
        write_ablation_report(tmp_path)

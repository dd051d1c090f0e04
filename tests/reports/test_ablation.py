"""The ablation report (reports.ablation): tables, paired differences and verdicts from records
only, checked against a hand computation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from coulomb_attention.reports.ablation import (
    capacity_differences,
    diagnostics_table,
    label,
    paired_differences,
    pool_records,
    record_key,
    run_statistics_table,
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


def _write(path, recs):
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    return path


def test_record_key_is_the_studys_run_key():
    from coulomb_attention.studies.ablation import run_key

    r = _records()[5]
    assert record_key(r) == run_key(r) == record_key(dict(r, M=16.0, score=0.0))


def test_pooled_records_a_later_file_wins(tmp_path):
    recs = _records()
    a = _write(tmp_path / "a.jsonl", recs)
    later = [dict(recs[0], score=0.99), dict(recs[0], setting="fit256")]
    b = _write(tmp_path / "b.jsonl", later)
    pooled = pool_records([a, b])
    assert len(pooled) == len(recs) + 1  # one key replaced, one new
    assert [r["score"] for r in pooled if record_key(r) == record_key(recs[0])] == [0.99]
    assert pool_records([b, a])[-len(recs)]["score"] == recs[0]["score"]  # order decides
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        pool_records([a, tmp_path / "missing.jsonl"])
    # the report of the pooled files: the fixed score of seed 0 is the later file's
    out = tmp_path / "out"
    text = write_ablation_report(out, plots=False, records=[a, b]).read_text()
    assert f"{len(recs) + 1} runs from `{a}`, `{b}` (pooled" in text
    fixed = [0.99, 0.52, 0.47, 0.51]
    assert f"| fixed | {np.mean(fixed):.4f} +- " in text
    assert "### convert / fit256" in text
    assert not (out / "records.jsonl").exists()


def test_references_are_a_parameter(tmp_path):
    path = _write(tmp_path / "records.jsonl", _records())
    text = write_ablation_report(tmp_path, plots=False).read_text()
    assert "| coulomb(beta=1e+06, lam=0.1) | gradient |" in text
    assert "| hedgehog | coulomb(beta=1e+06, lam=0.1) |" not in text
    text = write_ablation_report(tmp_path, plots=False, records=[path],
                                 references=("coulomb",)).read_text()
    mean, lo, hi = _by_hand([0.69, 0.70, 0.71, 0.68], [0.73, 0.71, 0.76, 0.72])
    assert (f"| convert | fit64 | 16 | hedgehog | coulomb(beta=1e+06, lam=0.1) | "
            f"{mean:+.4f} [{lo:+.4f}, {hi:+.4f}] | 4 | 0/4 |") in text
    assert "| coulomb(beta=1e+06, lam=0.1) | gradient |" not in text  # not a reference now
    with pytest.raises(ValueError, match="unknown reference variant 'coulmb'"):
        write_ablation_report(tmp_path, plots=False, references=("coulmb",))


def test_capacity_differences_equal_a_hand_computation(tmp_path):
    # learned at 16 against fixed at 32 and 64: fixed at 2M scores 0.1 higher, at 4M 0.2
    recs = _records(16) + [r for r in _records(32, 0.1) + _records(64, 0.2)
                           if r["variant"] == "fixed"]
    rows = capacity_differences(recs)
    assert {(r["label"], r["M"], r["fixed_M"]) for r in rows} == {
        (lab, 16, k) for lab in ("gradient", "coulomb(beta=1e+06, lam=0.1)", "hedgehog")
        for k in (32, 64)}  # every non-fixed label; no row for M whose 2M/4M is missing
    row = next(r for r in rows if r["label"] == "gradient" and r["fixed_M"] == 64)
    mean, lo, hi = _by_hand([0.70, 0.69, 0.74], [0.70, 0.72, 0.67])
    assert row["seeds"] == [0, 1, 2] and row["ahead"] == 1
    assert (row["mean"], row["low"], row["high"]) == pytest.approx((mean, lo, hi), abs=1e-12)
    row = next(r for r in rows if r["label"] == "hedgehog" and r["fixed_M"] == 32)
    mean, lo, hi = _by_hand([0.69, 0.70, 0.71, 0.68], [0.60, 0.62, 0.57, 0.61])
    assert (row["mean"], row["low"], row["high"], row["n"]) == pytest.approx((mean, lo, hi, 4))
    # 64 = 4 x 16 only (no fixed at 32, nothing at 128 or 256)
    assert {(r["M"], r["fixed_M"]) for r in capacity_differences(_records(16) + _records(64))} \
        == {(16, 64)}
    _write(tmp_path / "records.jsonl", recs)
    text = write_ablation_report(tmp_path, plots=False).read_text()
    assert "## Learned at M against fixed at 2M and 4M" in text
    mean, lo, hi = _by_hand([0.70, 0.69, 0.74], [0.70, 0.72, 0.67])
    assert (f"| convert | fit64 | 16 | gradient | M = 64 | {mean:+.4f} [{lo:+.4f}, {hi:+.4f}] "
            f"| 3 | 1/3 |") in text
    _write(tmp_path / "records.jsonl", _records(16))
    assert "## Learned at M" not in write_ablation_report(tmp_path, plots=False).read_text()


def test_run_statistics_are_the_means_of_the_other_numeric_fields(tmp_path):
    recs = _records()
    for r in recs:
        if r["variant"] == "coulomb":  # fit statistics on some seeds, a nested dict, a flag
            r.update(fit_ess=0.1 * (r["seed"] + 1), cached=True, note="x",
                     weights={"births": r["seed"], "kind": "wfr"})
            if r["seed"] == 3:
                del r["fit_ess"]
                r["holdout_kl"] = None
    table = run_statistics_table(recs)
    header = "| setting | M | variant | fit_ess | time_s | weights.births |"
    assert header in table  # sorted fields; no score, key, diagnostics, flag, text or None
    ess = np.mean([0.1, 0.2, 0.3])  # seeds 0-2 have it
    assert f"| fit64 | 16 | coulomb(beta=1e+06, lam=0.1) | {ess:.4g} | 1 | 1.5 |" in table
    assert "| fit64 | 16 | fixed |  | 1 |  |" in table
    _write(tmp_path / "records.jsonl", recs)
    text = write_ablation_report(tmp_path, plots=False).read_text()
    assert "## Run statistics (means over seeds)" in text and header in text


def test_the_command_reports_pooled_files_and_refuses_records_without_report_only(
        tmp_path, capsys):
    from coulomb_attention.cli import main

    a = _write(tmp_path / "a.jsonl", _records())
    b = _write(tmp_path / "b.jsonl", _records(64))
    out = tmp_path / "out"
    assert main(["ablation", "--report-only", "--records", str(a), str(b), "--references",
                 "fixed", "coulomb", "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "| convert | fit64 | 64 | hedgehog | coulomb(beta=1e+06, lam=0.1) |" in text
    assert main(["ablation", "--arena", "convert", "--records", str(a), "--out",
                 str(out)]) == 2
    assert "--records needs --report-only" in capsys.readouterr().err

"""The MiniLM comparison's report (coulomb_attention.reports.minilm): intervals, paired
differences, the issue's target checks and their refusal to judge with too few seeds."""

from __future__ import annotations

import json

import pytest

from coulomb_attention.reports.minilm import load_rows, summarise, targets, write_report


def _row(variant, seed, acc, ece=0.05, log_loss=0.40, brier=0.10, adv=0.5):
    return {"task": "sst2", "variant": variant, "seed": seed, "accuracy": acc, "mcc": acc - 0.1,
            "f1": acc, "ece": ece, "log_loss": log_loss, "brier": brier,
            "advglue_accuracy": adv, "corrupted_accuracy": acc - 0.05, "phase_a_s": 10.0,
            "phase_b_s": 100.0, "total_s": 120.0, "ms_per_example": 2.0,
            "eval_split": "validation", "n_eval": 872, "n_train": 8000}


def _rows(n_seeds, teacher_gain=0.02):
    rows = []
    for s in range(n_seeds):
        jitter = 0.001 * s
        rows += [_row("softmax:vanilla", s, 0.90 + jitter),
                 _row("favor:vanilla", s, 0.86 + jitter, log_loss=0.45, brier=0.12),
                 _row("favor:teacher", s, 0.86 + teacher_gain + jitter + 0.0005 * (s % 2),
                      log_loss=0.41, brier=0.105, ece=0.058, adv=0.52)]
    return rows


def test_paired_differences_and_targets():
    summary = summarise(_rows(5))
    d = summary["sst2"]["differences"]["favor:teacher - favor:vanilla"]
    mean, low, high, n, ahead = d["accuracy"]
    assert n == 5 and ahead == 5 and low > 0 and mean == pytest.approx(0.0202, abs=1e-3)
    checks = {c["target"]: c["met"] for c in targets(summary)}
    assert checks["teacher ahead of vanilla beyond noise: accuracy"] is True
    assert checks["teacher ahead of vanilla beyond noise: log-loss or Brier"] is True
    assert checks["teacher within 0.5 pts of softmax (mean)"] is False  # 2 points behind
    assert checks["teacher ECE <= softmax ECE + 0.01 (means)"] is True
    assert checks["teacher AdvGLUE accuracy >= vanilla (mean)"] is True
    assert checks["teacher level with or ahead of Hedgehog (accuracy interval reaches >= 0)"] \
        is None  # no Hedgehog rows


def test_no_verdict_below_three_seeds():
    checks = {c["target"]: c["met"] for c in targets(summarise(_rows(2)))}
    assert checks["teacher ahead of vanilla beyond noise: accuracy"] is None
    assert checks["teacher within 0.5 pts of softmax (mean)"] is None


def test_write_report_files_and_missing_results(tmp_path):
    with pytest.raises(FileNotFoundError, match="minilm compare"):
        load_rows(tmp_path)
    rows = _rows(3)
    stale = {**rows[0], "accuracy": 0.1}  # an earlier row of the same run: the last one wins
    (tmp_path / "results.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in [stale, *rows]))
    assert len(load_rows(tmp_path)) == len(rows)
    paths = write_report(tmp_path)
    assert {p.name for p in paths} == {"report.md", "report.json", "sst2.png"}
    text = (tmp_path / "report.md").read_text()
    assert "favor:teacher - favor:vanilla" in text and "sst2" in text
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["targets"] and "sst2" in saved["summary"]


def test_one_seed_writes_null_intervals(tmp_path):
    """One seed has no interval: report.json holds null there (it used to refuse NaN and the
    whole `minilm compare` of a single new seed ended in an error after its runs)."""
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(1)))
    write_report(tmp_path)
    acc = json.loads((tmp_path / "report.json").read_text())["summary"]["sst2"]["variants"][
        "softmax:vanilla"]["accuracy"]
    assert acc[0] == pytest.approx(0.90) and acc[1] is None and acc[2] is None and acc[3] == 1



def test_wall_time_counts_each_cached_conversion_once(tmp_path):
    from coulomb_attention.reports.minilm import wall_time

    rows = [{**_row("favor:teacher", s, 0.8), "conversion_dir": f"cache/favor-s{s}",
             "phase_a_s": 300.0} for s in range(2)]
    rows += [{**_row("favor:teacher", 0, 0.8), "task": "rotten_tomatoes",
              "conversion_dir": "cache/favor-s0", "phase_a_s": 300.0},
             _row("softmax:vanilla", 0, 0.9)]
    w = wall_time(rows)
    assert w == {"runs": 4, "run_s": 480.0, "conversions": 2, "conversion_s": 600.0,
                 "total_s": 1080.0}
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_report(tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "Wall time: 3 runs, 0.10 h" in text  # sst2: two teacher runs and softmax
    assert "All tasks: 4 runs, 0.13 h (probe, phase B and evaluation); 2 conversions they " \
        "use, 0.17 h (each counted once); 0.30 h in all." in text
    assert json.loads((tmp_path / "report.json").read_text())["wall"] == w

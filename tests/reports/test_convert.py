import json

import pytest

from coulomb_attention.reports.convert import grid_table, write_convert_report


def _result(variant="particles", m=16, seed=0, cos=0.9, lam=0.0, acc=0.8):
    return {"config": {"encoder": "tiny", "feature_map": "favor", "n_features": m,
                       "variant": variant, "seed": seed, "distill": {"lam": lam}},
            "fidelity": {"n": 10, "cos_mean": cos, "cos_p5": cos - 0.1, "cos_min": cos - 0.2,
                         "spearman": cos},
            "probe": {"sst2": {"n_train": 50, "n_eval": 20, "accuracy": acc, "ece": 0.05,
                               "log_loss": 0.5}},
            "distill_s": 12.0, "total_s": 20.0, "n_sentences": 100}


def test_report_states_the_result_files_numbers(tmp_path):
    res = _result(cos=0.9123)
    res["refine"] = {"steps": 5, "n_refine": 40, "time_s": 3.0, "cos_before": 0.85,
                     "cos_after": 0.9, "n_fit": 30, "n_holdout": 10, "holdout_cos_before": 0.84,
                     "holdout_cos_after": 0.88, "omega_shift": 0.1}
    (tmp_path / "result.json").write_text(json.dumps(res))
    recs = [{"layer": li, "heads": [h, h + 1], "kl_before": 1.0 + li, "kl_after": 0.5,
             "holdout_kl_before": 2.0, "holdout_kl_after": 0.25 * (li + 1), "time_s": 4.0}
            for li in range(2) for h in range(2)]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    text = write_convert_report(tmp_path).read_text()
    assert "M=16 per head" in text and "0.9123" in text
    assert "| 1 | 2.0000 | 0.5000 |" in text  # held-out KL of layer 1: mean over its heads
    assert "0.8500 -> 0.9000" in text and "0.8400 -> 0.8800" in text
    assert "| sst2 | 50 | 20 | 0.8000 |" in text
    assert (tmp_path / "kl.png").is_file()


def test_report_puts_the_teachers_probe_beside_when_the_result_holds_it(tmp_path):
    """With ``teacher_probe`` in result.json: the teacher's accuracy and the share beside each
    task, in report.md and on the console; without it (committed results) the old table."""
    from coulomb_attention.reports.convert import result_lines

    res = _result(acc=0.8)
    (tmp_path / "result.json").write_text(json.dumps(res))
    old = write_convert_report(tmp_path).read_text()
    assert "| task | n train | n eval | accuracy | ECE | log-loss |" in old
    assert "| sst2 | 50 | 20 | 0.8000 | 0.0500 | 0.5000 |" in old and "teacher acc" not in old
    assert "sst2 probe accuracy 0.8000" in result_lines(res)
    res["teacher_probe"] = {"sst2": {"n_train": 50, "n_eval": 20, "accuracy": 0.85,
                                     "ece": 0.04, "log_loss": 0.4}}
    (tmp_path / "result.json").write_text(json.dumps(res))
    text = write_convert_report(tmp_path).read_text()
    assert "| accuracy | teacher accuracy | share | ECE |" in text
    assert "| sst2 | 50 | 20 | 0.8000 | 0.8500 | 94.1% | 0.0500 | 0.5000 |" in text
    assert "sst2 probe accuracy 0.8000 (teacher 0.8500)" in result_lines(res)


def test_grid_table_means_spreads_and_teacher_shares():
    rows = [_result("softmax", acc=0.8),
            _result(m=16, seed=0, cos=0.90, acc=0.72), _result(m=16, seed=1, cos=0.94, acc=0.76),
            _result(m=16, seed=0, cos=0.80, lam=0.1, acc=0.7),
            _result("vanilla", m=16, seed=0, cos=0.5, acc=0.6)]
    table = {(r["variant"], r["M"]): r for r in grid_table(rows)}
    p = table[("particles lam=0", 16)]
    assert p["seeds"] == 2 and p["cos_mean"][0] == pytest.approx(0.92)
    assert p["cos_mean"][1] == pytest.approx(0.0282842712, rel=1e-6)  # sample std
    assert p["sst2_share"] == pytest.approx(0.74 / 0.8)
    assert table[("particles lam=0.1", 16)]["cos_mean"] == (pytest.approx(0.8), 0.0)
    assert ("softmax", 0) in table and table[("vanilla", 16)]["seeds"] == 1


def test_rows_report_pairs_by_seed_with_intervals(tmp_path, capsys):
    """ROWS.md / ROWS.summary.json: means over seeds, and a - b paired by seed over the common seeds
    (hand-computed: differences 0.02, 0.04, 0.03 -> mean 0.03, t-interval 0.03 -/+ 4.303 *
    0.01 / sqrt 3); documents and window mass carried; unknown rows and missing dirs refused."""
    import math

    from coulomb_attention.cli import main

    def put(name, seed, cos, doc=None):
        res = _result(seed=seed, cos=cos)
        if doc is not None:
            res["documents"] = {"task": "rt", "n": 3, "lengths": {"512": {
                "cos_mean": doc, "cos_p5": doc - 0.1, "window_mass": {"mean": 0.2}}}}
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.json").write_text(json.dumps(res))
        return name

    a = [put(f"a{s}", s, c, d) for s, c, d in [(0, 0.92, 0.9), (1, 0.94, 0.8), (2, 0.93, 0.7)]]
    b = [put(f"b{s}", s, c) for s, c in [(0, 0.90, ), (1, 0.90), (2, 0.90), (3, 0.99)]]
    man = tmp_path / "rows.json"
    man.write_text(json.dumps({"title": "t", "rows": {"A": a, "B": b}, "pairs": [["A", "B"]]}))
    assert main(["report", str(man), "--conversions"]) == 0
    assert "rows.md" in capsys.readouterr().out
    summary = json.loads((tmp_path / "rows.summary.json").read_text())
    pair = next(p for p in summary["pairs"] if p["metric"] == "sentences cos")
    half = 4.302652729911275 * 0.01 / math.sqrt(3)
    assert pair["seeds"] == [0, 1, 2] and pair["a_ahead"] == 3
    assert pair["diff"] == pytest.approx(0.03) and pair["low"] == pytest.approx(0.03 - half)
    assert summary["rows"]["B"]["metrics"]["sentences cos"]["n"] == 4
    assert summary["rows"]["A"]["metrics"]["512-token docs cos"]["mean"] == pytest.approx(0.8)
    assert "512-token teacher mass in window" in summary["rows"]["A"]["metrics"]
    text = (tmp_path / "rows.md").read_text()
    assert "| A | 0 1 2 |" in text and "+0.0300" in text and "3/3" in text
    man.write_text(json.dumps({"rows": {"A": a}, "pairs": [["A", "C"]]}))
    assert main(["report", str(man), "--conversions"]) == 2
    assert "no row 'C'" in capsys.readouterr().err
    man.write_text(json.dumps({"rows": {"A": ["missing"]}}))
    assert main(["report", str(man), "--conversions"]) == 2
    assert "does not exist" in capsys.readouterr().err

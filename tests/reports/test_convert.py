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

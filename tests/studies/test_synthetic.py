"""The synthetic study (coulomb_attention.studies.synthetic) and its command."""

from __future__ import annotations

import json

import numpy as np
import pytest

from coulomb_attention.cli import main
from coulomb_attention.config import override
from coulomb_attention.results import read_jsonl
from coulomb_attention.studies import synthetic as syn

# ----------------------------------------------------------------------------- runner

TINY = {
    "tasks": ["xor"],
    "noise_levels": [0.0],
    "budgets": [8, 16],
    "methods": ["rff", "svm"],
    "seeds": [0, 1],
    "n_train": 80,
    "n_test": 60,
    "d": 8,
    "logreg_max_iter": 100,
}


def test_runner_writes_json_lines_and_resumes_without_repeating(tmp_path):
    cfg = override(syn.SyntheticConfig(), TINY)
    rows = syn.run_grid(cfg, tmp_path, log=None)
    path = tmp_path / "results.jsonl"
    lines = path.read_text().splitlines()
    assert len(lines) == len(rows) == len(syn.grid(cfg)) == 2 * (2 + 1)
    parsed = [json.loads(line) for line in lines]
    for r in parsed:
        assert r["config"]["n_train"] == 80 and r["seed"] in (0, 1)
        assert 0.0 <= r["metrics"]["test_accuracy"] <= 1.0
        assert r["timings"]["total_s"] >= 0 and "cpu_s" in r["timings"]
    assert {r["n_components"] for r in parsed if r["method"] == "svm"} == {None}
    with pytest.raises(ValueError, match="--resume"):
        syn.run_grid(cfg, tmp_path, log=None)
    # resume: nothing is repeated
    syn.run_grid(cfg, tmp_path, resume=True, log=None)
    assert path.read_text().splitlines() == lines
    # an interrupted write (half line) is cut, then the grid grows by exactly the new runs
    with open(path, "a") as fh:
        fh.write('{"key": "xor|0|rff|32|0", "trunc')
    cfg2 = override(cfg, {"budgets": [8, 16, 32]})
    rows2 = syn.run_grid(cfg2, tmp_path, resume=True, log=None)
    lines2 = path.read_text().splitlines()
    assert lines2[: len(lines)] == lines
    assert len(lines2) == len(rows2) == len(lines) + 2
    keys = [json.loads(line)["key"] for line in lines2]
    assert len(keys) == len(set(keys))


def _rows(acc: dict) -> list[dict]:
    """Fake result rows: acc[(method, N)] = list of per-seed accuracies (two cells)."""
    rows = []
    for (method, n), vals in acc.items():
        for cell in ("a", "b"):
            for seed, v in enumerate(vals):
                rows.append({"task": cell, "noise": 0.0, "method": method, "n_components": n,
                             "seed": seed, "metrics": {"test_accuracy": v},
                             "timings": {"total_s": 0.0}})
    return rows


def test_claims_pass_and_fail_on_constructed_results():
    good = {("particles", 16): [0.86, 0.88], ("particles", 32): [0.88, 0.90],
            ("particles", 64): [0.90, 0.90], ("particles", 256): [0.92, 0.92],
            ("particles_lam0", 16): [0.84, 0.85], ("particles_lam0", 32): [0.86, 0.88],
            ("rff", 16): [0.60, 0.62], ("rff", 32): [0.66, 0.68], ("rff", 64): [0.72, 0.72],
            ("rff", 256): [0.88, 0.90]}
    res = syn.evaluate_claims(_rows(good))
    verdict = {c["id"]: c["pass"] for c in res["claims"]}
    assert verdict == {"C1": True, "C2": True, "C3": True, "C4": True}
    assert res["retained"]["particles"]["mean"] == pytest.approx(0.90 / 0.92)
    assert res["gaps"]["rff"][16]["mean"] == pytest.approx(0.87 - 0.61)
    bad = dict(good)
    bad[("particles", 64)] = [0.70, 0.70]  # retains 0.76 < 0.9
    bad[("particles_lam0", 16)] = [0.90, 0.90]  # lam=0 better at 16
    bad[("rff", 16)] = [0.86, 0.88]  # no gap at small N
    res = syn.evaluate_claims(_rows(bad))
    verdict = {c["id"]: c["pass"] for c in res["claims"]}
    assert verdict == {"C1": False, "C2": False, "C3": False, "C4": False}
    md = syn.claims_markdown(res)
    assert md.count("FAIL") == 4
    partial = syn.evaluate_claims(_rows({("rff", 16): [0.6, 0.7]}))
    assert all(c["pass"] is None for c in partial["claims"])


def test_cli_tiny_grid_end_to_end(tmp_path, capsys):
    out = tmp_path / "syn"
    cfg = _write(tmp_path, {"diagnostic_budget": 16, "logreg_max_iter": 100})
    args = ["synthetic", "--out", str(out), "--tasks", "spectral", "--noise", "0.1",
            "--budgets", "16", "64", "256", "--seeds", "0,1", "--n-train", "80", "--n-test", "60",
            "--particle-steps", "3", "--config", cfg]
    assert main(args) == 0
    for name in ("results.jsonl", "summary.csv", "summary.md", "claims.md", "claims.json",
                 "acc_vs_budget.png", "retained.png", "particles_spectral.png",
                 "particles_spectral.npz"):
        assert (out / name).is_file(), name
    rows = read_jsonl(out / "results.jsonl")
    assert len(rows) == 2 * (5 * 3 + 1)
    p = [r for r in rows if r["method"] == "particles"]
    assert all(r["estimator_params"]["n_steps"] == 3 and r["metrics"]["n_steps"] == 3 for r in p)
    assert all(r["estimator_params"]["lam"] == 0.0 for r in rows
               if r["method"] == "particles_lam0")
    assert all(r["estimator_params"]["sampler"] == "orthogonal" for r in rows
               if r["method"] == "orf")
    z = np.load(out / "particles_spectral.npz")
    assert z["particles_final"].shape == z["particles_init"].shape == (16, 10)
    assert not np.allclose(z["particles_final"], z["particles_init"])
    text = capsys.readouterr().out
    assert "| C1 |" in text and "| C4 | N/A |" in text  # no N=32 in this grid
    claims = json.loads((out / "claims.json").read_text())
    assert {c["id"] for c in claims["claims"] if c["pass"] is not None} == {"C1", "C2", "C3"}
    # resume reruns nothing; --report-only rebuilds the tables from the file
    assert main(args + ["--resume", "--no-plots"]) == 0
    assert len(read_jsonl(out / "results.jsonl")) == len(rows)
    assert main(args + ["--report-only", "--no-plots"]) == 0


def test_cli_bad_input_exits_2(tmp_path, capsys):
    assert main(["synthetic", "--out", str(tmp_path), "--methods", "magic"]) == 2
    assert "valid: rff" in capsys.readouterr().err
    assert main(["synthetic", "--out", str(tmp_path), "--config", str(tmp_path / "no.json")]) == 2
    assert main(["concentration", "--out", str(tmp_path), "--n-seeds", "1"]) == 2
    assert main(["concentration", "--out", str(tmp_path), "--seeds", "4"]) == 2


def _write(tmp_path, obj) -> str:
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(obj))
    return str(p)


def test_train_alignment_is_the_energys_centered_alignment():
    """The study's alignment metric against its numpy formula (the copy it replaced)."""
    rng = np.random.default_rng(0)
    Z, y = rng.normal(size=(200, 16)), (rng.random(200) > 0.4).astype(int)
    Zc = Z - Z.mean(0)
    yc = np.where(y > 0, 1.0, -1.0)
    yc = yc - yc.mean()
    want = float(((Zc.T @ yc) ** 2).sum()) / float(np.linalg.norm(Zc.T @ Zc) * (yc @ yc))
    assert syn._centered_alignment(Z, y) == pytest.approx(want, rel=1e-12)
    aligned = np.c_[np.where(y > 0, 1.0, -1.0), np.zeros((200, 3))]
    assert syn._centered_alignment(aligned, y) == pytest.approx(1.0)

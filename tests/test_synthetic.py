"""Synthetic tasks, the synthetic benchmark runner and the concentration study."""

from __future__ import annotations

import json

import numpy as np
import pytest

from coulomb_attention.cli import main
from coulomb_attention.commands import concentration as conc
from coulomb_attention.commands import synthetic as syn
from coulomb_attention.commands.synthetic_tasks import (
    SPECTRAL_FREQUENCIES,
    TASKS,
    flip_labels,
    make_spectral,
    make_task,
)
from coulomb_attention.results import read_jsonl

# ----------------------------------------------------------------------------- generators


@pytest.mark.parametrize("name", sorted(TASKS))
def test_generator_shapes_standardized_and_binary(name):
    t = make_task(name, n_train=300, n_test=200, d=9, noise=0.0, random_state=1)
    assert t.X_train.shape == (300, 9) and t.X_test.shape == (200, 9)
    assert t.y_train.shape == (300,) and t.y_test.shape == (200,)
    assert t.X_train.dtype == np.float64 and t.y_train.dtype == np.int64
    assert set(np.unique(t.y_train)) == {0, 1} and set(np.unique(t.y_test)) == {0, 1}
    np.testing.assert_allclose(t.X_train.mean(0), 0.0, atol=1e-10)
    np.testing.assert_allclose(t.X_train.std(0), 1.0, atol=1e-10)
    assert t.metadata["d"] == 9 and t.metadata["n_informative"] == 2
    # not degenerate: both classes reasonably frequent
    assert 0.2 < t.y_test.mean() < 0.8


@pytest.mark.parametrize("noise", [0.0, 0.1, 0.2, 0.3])
def test_label_noise_flips_exactly_that_fraction_of_training_labels(noise):
    t = make_task("xor", n_train=500, n_test=300, d=8, noise=noise, random_state=3)
    clean = t.metadata["y_train_clean"]
    flipped = t.y_train != clean
    assert flipped.sum() == round(noise * 500) == t.metadata["n_flipped"]
    np.testing.assert_array_equal(np.flatnonzero(flipped), t.metadata["flipped"])
    # test labels are clean: the rule applied to the raw inputs
    raw = t.X_test * t.metadata["scale"] + t.metadata["mean"]
    np.testing.assert_array_equal(t.y_test, (raw[:, 0] * raw[:, 1] > 0).astype(int))


def test_flip_labels_rounding_and_validation():
    y = np.zeros(7, dtype=int)
    y2, idx = flip_labels(y, 0.3, np.random.default_rng(0))
    assert y2.sum() == 2 and len(idx) == 2  # round(2.1)
    with pytest.raises(ValueError, match="noise"):
        make_task("xor", 10, 10, 8, noise=0.5)
    with pytest.raises(ValueError, match="valid: anisotropic"):
        make_task("spiral", 10, 10, 8)
    with pytest.raises(ValueError, match="n_informative"):
        make_task("xor", 10, 10, d=1)


def test_generators_are_deterministic_in_random_state():
    a = make_task("radial", 100, 50, 8, 0.2, random_state=7)
    b = make_task("radial", 100, 50, 8, 0.2, random_state=7)
    c = make_task("radial", 100, 50, 8, 0.2, random_state=8)
    for x, y in zip(a.astuple()[:4], b.astuple()[:4], strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.X_train, c.X_train)
    assert not np.array_equal(a.metadata["flipped"], c.metadata["flipped"])


def test_spectral_task_frequencies_reproduce_the_labels():
    t = make_spectral(400, 300, d=10, noise=0.2, random_state=5)
    f, ph = t.metadata["frequencies"], t.metadata["phases"]
    assert f.shape == (len(SPECTRAL_FREQUENCIES), 10)
    assert np.all(f[:, 2:] == 0)  # zero on the noise dims
    # standardized frequencies = raw frequencies times the raw scale of the informative dims
    np.testing.assert_allclose(f[:, :2], SPECTRAL_FREQUENCIES * t.metadata["scale"][:2])
    rule = lambda X: (np.cos(X @ f.T + ph).sum(1) > 0).astype(int)  # noqa: E731
    np.testing.assert_array_equal(rule(t.X_test), t.y_test)
    np.testing.assert_array_equal(rule(t.X_train), t.metadata["y_train_clean"])
    # particles at +-f_k are hits, a Gaussian cloud at the kernel's scale mostly is not
    assert syn.spectral_hit_fraction(np.concatenate([f, -f]), f) == 1.0
    cloud = np.random.default_rng(0).normal(0, np.sqrt(2 / 10), size=(500, 10))
    assert syn.spectral_hit_fraction(cloud, f) < 0.05


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
    cfg = syn.override(syn.SyntheticConfig(), TINY)
    rows = syn.run_grid(cfg, tmp_path, progress=False)
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
        syn.run_grid(cfg, tmp_path, progress=False)
    # resume: nothing is repeated
    syn.run_grid(cfg, tmp_path, resume=True, progress=False)
    assert path.read_text().splitlines() == lines
    # an interrupted write (half line) is cut, then the grid grows by exactly the new runs
    with open(path, "a") as fh:
        fh.write('{"key": "xor|0|rff|32|0", "trunc')
    cfg2 = syn.override(cfg, {"budgets": [8, 16, 32]})
    rows2 = syn.run_grid(cfg2, tmp_path, resume=True, progress=False)
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
            "--budgets", "16", "64", "256", "--seeds", "2", "--n-train", "80", "--n-test", "60",
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
    assert main(["concentration", "--out", str(tmp_path), "--seeds", "1"]) == 2


# ----------------------------------------------------------------------------- concentration


def test_kernel_spread_definition():
    k = np.random.default_rng(0).normal(size=(5, 5))
    k = k @ k.T
    assert conc.kernel_spread(np.stack([k, k, k]))[0] == 0.0
    spread, norm = conc.kernel_spread(np.stack([k, 2 * k]))
    assert norm == pytest.approx(1.5 * np.linalg.norm(k))
    assert spread == pytest.approx(np.linalg.norm(k) / norm)
    with pytest.raises(ValueError):
        conc.kernel_spread(k[None])
    assert conc.loglog_slope([1, 2, 4], [1, 0.5, 0.25]) == pytest.approx(-1.0)


def test_concentration_tiny_setting_gives_finite_spreads(tmp_path):
    cfg = conc.ConcentrationConfig(n_train=60, n_probe=20, budgets=(8, 16), betas=(10.0, 1e3),
                                   n_for_beta=8, n_seeds=2, particles={"n_steps": 3})
    res = conc.run_concentration(cfg)
    assert len(res["rows"]) == 2 * 2 + 2
    for r in res["rows"]:
        assert np.isfinite(r["spread"]) and r["spread"] > 0 and r["mean_norm"] > 0
    assert all(np.isfinite(v) for v in res["slopes"].values())
    out = tmp_path / "c"
    assert main(["concentration", "--out", str(out), "--budgets", "8", "16", "--betas", "10",
                 "100", "--seeds", "2", "--particle-steps", "2",
                 "--config", str(_write(tmp_path, {"n_train": 60, "n_probe": 20,
                                                   "n_for_beta": 8}))]) == 0
    data = json.loads((out / "concentration.json").read_text())
    assert data["config"]["n_probe"] == 20 and (out / "concentration.png").is_file()


def _write(tmp_path, obj) -> str:
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(obj))
    return str(p)

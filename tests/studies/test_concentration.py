"""The concentration study (coulomb_attention.studies.concentration) and its command."""

from __future__ import annotations

import json

import numpy as np
import pytest

from coulomb_attention.cli import main
from coulomb_attention.stats import loglog_slope
from coulomb_attention.studies import concentration as conc

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
    assert loglog_slope([1, 2, 4], [1, 0.5, 0.25]) == pytest.approx(-1.0)


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
                 "100", "--seeds", "3", "5", "--particle-steps", "2",
                 "--config", str(_write(tmp_path, {"n_train": 60, "n_probe": 20,
                                                   "n_for_beta": 8}))]) == 0
    data = json.loads((out / "concentration.json").read_text())
    assert data["config"]["n_probe"] == 20 and (out / "concentration.png").is_file()
    assert data["config"]["seeds"] == [3, 5] and data["config"]["n_seeds"] == 2


def _write(tmp_path, obj) -> str:
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(obj))
    return str(p)

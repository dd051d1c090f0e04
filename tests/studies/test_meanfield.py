"""The mean-field study (coulomb_attention.studies.meanfield) and its command."""

from __future__ import annotations

import json
import math

import pytest

from coulomb_attention.studies.meanfield import MeanfieldConfig


def test_cli_meanfield_writes_results(tmp_path):
    from coulomb_attention.cli import main

    out = tmp_path / "mf"
    rc = main(["meanfield", "--dim", "1", "--grid", "48", "--t-final", "0.1", "--eta", "0.02",
               "--ns", "32", "64", "128", "--n-seeds", "2", "--out", str(out)])
    assert rc == 0
    rows = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert {r["n"] for r in rows if r["kind"] == "particles"} == {32, 64, 128}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mass_error"] < 1e-12 and summary["free_energy_increase_max"] <= 1e-12
    assert math.isfinite(summary["slope"])
    assert (out / "table.md").read_text().count("|") > 10
    for name in ("densities.png", "free_energy.png", "distance_vs_n.png"):
        assert (out / name).stat().st_size > 1000
    assert main(["meanfield", "--dim", "3", "--out", str(out)]) == 2


def test_config_resolves_quick_defaults_and_explicit_values_win():
    quick = MeanfieldConfig(quick=True).resolved()
    assert quick["ns"] == [64, 128, 256, 512, 1024] and quick["seeds"] == 2
    assert quick["grid"] == 128 and MeanfieldConfig(dim=2, quick=True).resolved()["grid"] == 32
    mine = MeanfieldConfig(quick=True, ns=(16, 8, 16), n_seeds=5, grid=40).resolved()
    assert mine["ns"] == [8, 16] and mine["seeds"] == 5 and mine["grid"] == 40
    assert mine["n_steps"] == 50 and mine["t_final"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="--ns needs at least two values"):
        MeanfieldConfig(ns=(8,))
    with pytest.raises(ValueError, match="--dtype"):
        MeanfieldConfig(dtype="float16")

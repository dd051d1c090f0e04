"""Plots and start-up of the demo, concentration, meanfield, bench langevin and synthetic
commands (issue #18): each plot shows what its labels say, and ``--help`` stays light."""

from __future__ import annotations

import json
import subprocess
import sys

import matplotlib.figure
import numpy as np
import pytest


@pytest.fixture
def figures(monkeypatch):
    """Every figure a plot function saves (the functions close them, the objects survive)."""
    saved = []
    original = matplotlib.figure.Figure.savefig

    def savefig(self, *args, **kwargs):
        saved.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    return saved


@pytest.mark.parametrize("module", ["demo", "concentration", "meanfield", "bench_langevin"])
def test_command_module_import_is_light(module):
    code = (f"import sys, coulomb_attention.commands.{module} as m, argparse; "
            "m.add_arguments(argparse.ArgumentParser()); "
            "print(sorted(k for k in ('torch', 'matplotlib', 'sklearn') if k in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]", f"importing {module} (and add_arguments) loaded {out}"


def test_demo_plot_puts_alignment_and_neg_h_on_separate_axes(tmp_path, figures):
    from coulomb_attention.reports import demo

    trace = [{"alignment": 0.1 * k, "energy": -0.1 * k + 0.005} for k in range(1, 6)]
    res = {"results": [{"method": "ParticleFeatures(64)", "test_accuracy": 0.9}],
           "traces": {"ParticleFeatures(64)": trace}}
    (tmp_path / "results.json").write_text(json.dumps(res))
    demo.plot(tmp_path / "results.json", tmp_path / "demo.png")
    assert (tmp_path / "demo.png").stat().st_size > 0
    _, ax_a, ax_h = figures[-1].axes
    (line_a,), (line_h,) = ax_a.get_lines(), ax_h.get_lines()
    np.testing.assert_allclose(line_a.get_ydata(), [t["alignment"] for t in trace])
    np.testing.assert_allclose(line_h.get_ydata(), [-t["energy"] for t in trace])
    assert "lam W = 0.0050" in ax_h.get_legend().get_texts()[0].get_text()


def test_every_demo_panel_has_a_legend(tmp_path, figures):
    from coulomb_attention.reports import demo

    trace = [{"alignment": 0.1, "energy": -0.1}]
    res = {"results": [{"method": "RandomFourierFeatures(64)", "test_accuracy": 0.7},
                       {"method": "ParticleFeatures(64)", "test_accuracy": 0.9}],
           "traces": {"ParticleFeatures(64)": trace}}
    (tmp_path / "results.json").write_text(json.dumps(res))
    demo.plot(tmp_path / "results.json", tmp_path / "demo.png")
    for ax in figures[-1].axes:
        assert ax.get_legend() is not None, ax.get_title()
    bars = [t.get_text() for t in figures[-1].axes[0].get_legend().get_texts()]
    assert bars == ["fixed random features", "learned particles"]


@pytest.mark.parametrize("spreads", [(0.44, 0.98), (0.16, 0.19), (1e-4, 1.0)],
                         ids=["one decade", "narrow", "four decades"])
def test_concentration_plot_labels_at_least_three_log_ticks(tmp_path, figures, spreads):
    from coulomb_attention.reports import concentration as conc

    lo, hi = spreads
    vals = iter(np.geomspace(hi, lo, 8))
    rows = [{"sweep": "N", "kind": k, "N": n, "beta": 1e3, "spread": float(next(vals))}
            for n in (16, 32, 64) for k in ("particles", "fixed")]
    rows += [{"sweep": "beta", "kind": "particles", "N": 32, "beta": b,
              "spread": float(np.geomspace(hi, lo, 2)[i % 2])} for i, b in enumerate((10, 100))]
    res = {"config": {"budgets": [16, 32, 64], "beta_for_n": 1e3, "n_for_beta": 32},
           "rows": rows, "slopes": {"particles_vs_N": -0.3, "fixed_vs_N": -0.5,
                                    "particles_vs_beta": -0.2}}
    conc.plot(res, tmp_path / "c.png")
    for ax in figures[-1].axes:
        y0, y1 = ax.get_ylim()
        ticks = [t for t in ax.get_yticks() if y0 <= t <= y1]
        labels = [lab.get_text() for lab in ax.get_yticklabels() if lab.get_text()]
        assert len(ticks) >= 3 and len(labels) >= 3, (ticks, labels)
        assert all(float(lab) == pytest.approx(t, rel=1e-6) for lab, t in
                   zip(labels, ax.get_yticks(), strict=False))  # plain numbers, no 10^k


@pytest.mark.parametrize("dim", [1, 2])
def test_meanfield_density_plot_has_colour_bars_in_2d(tmp_path, figures, dim):
    from coulomb_attention.cli import main

    argv = ["meanfield", "--dim", str(dim), "--quick", "--ns", "8,16", "--n-seeds", "2",
            "--grid", "8", "--t-final", "0.02", "--eta", "0.01", "--snapshots", "3",
            "--threads", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    dens = figures[0]  # densities.png is drawn first
    labels = [ax.get_xlabel() for ax in dens.axes]
    bars = [lab for lab in labels if lab.startswith("density at t")]
    assert len(bars) == (3 if dim == 2 else 0)
    assert len(dens.axes) == (3 * 3 if dim == 2 else 3)


def test_bench_langevin_plot_labels_both_slopes(tmp_path, figures, monkeypatch):
    import torch

    from coulomb_attention.bench import langevin as bl

    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    cfg = bl.LangevinBenchConfig(N=(4, 8), n=(8, 16, 32), d=2, repeats=3, threads=1,
                                 dtype="float64")
    bl.run_benchmark(cfg, tmp_path, log=lambda m: None)
    res = json.loads((tmp_path / "langevin_step.json").read_text())
    assert res["meta"]["statistic"] == "median" and res["slope_in_n_top_range"] == [16, 32]
    texts = [t.get_text() for t in figures[-1].axes[0].get_legend().get_texts()]
    for N in ("4", "8"):
        text = next(t for t in texts if t.startswith(f"N={N}:"))
        assert f"{res['slope_in_n'][N]:.2f} over all n" in text
        assert f"{res['slope_in_n_top'][N]:.2f} from 16 to 32" in text
    assert not any("large n" in t for t in texts)


def test_synthetic_particle_diagnostic_says_the_initial_particles_are_the_fits_own(tmp_path):
    from coulomb_attention.studies import synthetic as syn

    cfg = syn.SyntheticConfig(tasks=["spectral"], n_train=120, n_test=40, diagnostic_budget=8,
                              particles={"n_steps": 3})
    z = np.load(syn.particle_diagnostic(cfg, tmp_path))
    assert str(z["init_source"]).startswith("the fit's own draw")
    assert not np.allclose(z["particles_init"], z["particles_final"])

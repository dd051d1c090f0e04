"""Numerical faults: large-norm inputs stay finite; non-finite energies and losses stop runs.

(Reliability, issue 7, issue 7; see docs/reliability.md.)
"""


from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from coulomb_attention import dynamics
from coulomb_attention.estimators import RandomFeatures
from coulomb_attention.nn.attention import KernelAttention
from coulomb_attention.train import checkpoint as ckpt
from coulomb_attention.train.loop import TrainConfig, fit
from coulomb_attention.train.phases import AlignConfig, align_features, collect_queries
from reliability_helpers import X, Y, _describe, _pf, _record, _tiny_dataset, _tiny_model

# ----------------------------------------------------------------------------- overflow

MODES = ("float32", "float64", "bf16-autocast", "fp16-autocast", "float16", "bfloat16")
PARTICLE_MAPS = ("favor", "porf_softplus", "softmax_feat", "elu")


def _run_mode(ka, q, k, v, mask, mode):
    """``ka.attend`` in one precision mode; returns the output as float64."""
    with torch.no_grad():
        if mode in ("float16", "bfloat16", "float64"):
            dt = getattr(torch, mode)
            ka = ka.to(dt)
            return ka.attend(q.to(dt), k.to(dt), v.to(dt), mask).double(), dt
        if mode.endswith("autocast"):
            dt = torch.bfloat16 if mode.startswith("bf16") else torch.float16
            with torch.autocast("cpu", dtype=dt):
                # the layer's projections run under autocast: inputs arrive in low precision
                out = ka.attend(q.to(dt), k.to(dt), v.to(dt), mask)
            return out.double(), dt
        return ka.attend(q, k, v, mask).double(), torch.float32


OVERFLOW_CASES = [
    pytest.param(name, mode, id=f"{name}-{mode}") for name in PARTICLE_MAPS for mode in MODES
]


@pytest.mark.parametrize("name,mode", OVERFLOW_CASES)
def test_attention_large_norm_inputs_stay_finite_and_convex(name, mode):
    """Queries/keys of norm up to ~1e4 (exp(|q|^2/2) far beyond every float range) give finite
    outputs that are convex combinations of the real keys' values (all maps here have
    non-negative features), also for a fully padded sequence."""
    g = torch.Generator().manual_seed(0)
    ka = KernelAttention(32, 2, feature_map=name, n_features=16, generator=0)
    B, H, T, dh = 3, 2, 9, 16
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 6:] = False
    mask[2, :] = False  # no real key at all: output must be finite (zero)
    v = torch.randn(B, H, T, dh, generator=g)
    worst = 0.0
    for scale in (1.0, 1e2, 1e4):
        q = torch.randn(B, H, T, dh, generator=g) * scale
        k = torch.randn(B, H, T, dh, generator=g) * scale
        out, dt = _run_mode(ka, q, k, v, mask, mode)
        assert out.shape == (B, H, T, dh)
        if not torch.isfinite(out).all():
            _record("overflow", f"{name} / {mode}", f"NON-FINITE output "
                    f"({int((~torch.isfinite(out)).sum())} of {out.numel()}) at scale {scale:g}")
            pytest.fail(f"{name}/{mode}: non-finite output at scale {scale}")
        vv = v.to(dt).double()
        m = mask[:2, None, :, None]
        hi = torch.where(m, vv[:2], -math.inf).amax(2, keepdim=True)
        lo = torch.where(m, vv[:2], math.inf).amin(2, keepdim=True)
        tol = 1e-4 if dt in (torch.float32, torch.float64) else 3e-2
        excess = float(torch.maximum(out[:2] - hi, lo - out[:2]).max())
        worst = max(worst, excess)
        assert excess <= tol * (1 + float(vv.abs().max())), (
            f"{name}/{mode}/scale {scale}: output leaves the convex hull of the values by {excess}"
        )
    _record("overflow", f"{name} / {mode}", f"finite, inside the value hull (worst excess "
            f"{worst:.2e}) at |q|,|k| scales 1, 1e2, 1e4")


@pytest.mark.parametrize("mode", ("float32", "bf16-autocast", "float16"))
def test_transformer_forward_finite_under_large_embeddings(mode):
    """A whole classifier with embeddings scaled by 1e3 gives finite logits (LayerNorm +
    shifted features) in float32, bf16 autocast and float16."""
    model = _tiny_model("favor")
    with torch.no_grad():
        model.embeddings.word_embeddings.weight.mul_(1e3)
    ds = _tiny_dataset(8)
    with torch.no_grad():
        if mode == "float16":
            logits = model.half()(ds.input_ids, ds.attention_mask)
        elif mode == "bf16-autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(ds.input_ids, ds.attention_mask)
        else:
            logits = model(ds.input_ids, ds.attention_mask)
    assert torch.isfinite(logits).all()
    _record("overflow", f"TransformerClassifier(favor) embeddings x1e3 / {mode}", "finite logits")


def test_phase_a_large_norm_queries_never_writes_nan():
    """Phase A on queries of norm > 30 (exp(-|q|^2/2) underflows float32): the particles end
    finite and the alignments are finite (or a clear FloatingPointError is raised and the
    particles are untouched)."""
    model = _tiny_model("favor")
    layer = model.attention_layers[0]
    with torch.no_grad():
        layer.q_proj.weight.mul_(400.0)
        layer.q_proj.bias.mul_(400.0)
    ds = _tiny_dataset()
    (q, _, _), _ = collect_queries(model, 0, ds, 16)[0]  # what phase A sees
    assert float(q.norm(dim=-1).median()) > 30  # the regime under test is reached
    before = layer.omega.clone()
    try:
        records = align_features(model, ds, AlignConfig(n_examples=48, holdout=16,
                                                        batch_size=16, steps=3),
                                 generator=torch.Generator().manual_seed(1))
    except FloatingPointError as exc:
        assert "non-finite" in str(exc)
        assert torch.equal(layer.omega, before)
        _record("overflow", "phase A, |q| > 30", _describe(exc))
        return
    assert torch.isfinite(layer.omega).all()
    for r in records:
        assert math.isfinite(r["train_before"]) and math.isfinite(r["train_after"])
    _record("overflow", "phase A, |q| > 30", f"finite: alignment {records[0]['train_before']:.4f}"
            f" -> {records[0]['train_after']:.4f}")


@pytest.mark.parametrize("name", ("positive", "softplus", "softmax", "rff"))
def test_estimators_large_scale_inputs_finite(name):
    """Inputs scaled by 1e6 with a fixed gamma=1 (exp-features far out of range) still give
    finite features; ParticleFeatures either learns finite particles or stops clearly."""
    Xl = X * 1e6
    phi = RandomFeatures(8, feature_map=name, gamma=1.0, random_state=0).fit(Xl).transform(Xl)
    assert np.isfinite(phi).all()
    try:
        pf = _pf(feature_map=name, gamma=1.0, random_state=0).fit(Xl, Y)
    except FloatingPointError as exc:
        _record("overflow", f"ParticleFeatures({name}) X*1e6", _describe(exc))
        assert "non-finite" in str(exc)
        return
    assert np.isfinite(pf.omega_).all() and np.isfinite(pf.transform(Xl)).all()
    _record("overflow", f"ParticleFeatures({name}) X*1e6, gamma=1", "finite features/particles")


# ----------------------------------------------------------------------------- non-finite stops


def test_langevin_stops_on_non_finite_energy():
    calls = {"n": 0}

    def energy_grad(omega, batch):
        calls["n"] += 1
        e = torch.tensor(float("nan") if calls["n"] == 3 else 1.0, dtype=omega.dtype)
        return e, torch.zeros_like(omega), {}

    class Energy:  # the driver's Hamiltonian protocol
        def value_and_grad(self, omega, batches, comm=None):
            return energy_grad(omega, batches)

    seen = []
    with pytest.raises(dynamics.NonFiniteEnergyError, match="non-finite energy.*step 2") as ei:
        dynamics.learn_particles(
            Energy(), torch.randn(4, 2, generator=torch.Generator().manual_seed(0)),
            dynamics.LangevinSchedule(steps=10, eta=0.1), projection=dynamics.Ball(5.0),
            generator=torch.Generator().manual_seed(1),
            callbacks=[lambda s, info: seen.append(s.omega.clone())])
    assert len(seen) == 2 and all(torch.isfinite(o).all() for o in seen)
    _record("non-finite", "Langevin energy NaN at step 2 (run of 10 steps)",
            f"{_describe(ei.value)}; the 2 finite states before it were kept")


def test_langevin_stops_on_infinite_gradient():
    def energy_grad(omega, batch):
        g = torch.zeros_like(omega)
        g[0, 0] = math.inf
        return torch.tensor(0.0), g, {}

    init_fn, step_fn = dynamics.projected_langevin(energy_grad, dynamics.Ball(5.0), eta=0.1)
    with pytest.raises(FloatingPointError, match="non-finite"):
        step_fn(init_fn(torch.zeros(3, 2), torch.Generator()))


class _NaNAfter(torch.nn.Module):
    """Logits become NaN from the ``after``-th forward call on."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(1, 2)
        self.after, self.calls = after, 0

    def forward(self, ids, mask):
        self.calls += 1
        out = self.lin(ids[:, :1].float())
        return out * float("nan") if self.calls > self.after else out


def test_training_stops_on_nan_loss_and_writes_nothing_for_that_epoch(tmp_path):
    ds = _tiny_dataset()  # 64 examples, batch 16: 4 steps per epoch
    with pytest.raises(FloatingPointError, match="non-finite training loss.*epoch 2") as ei:
        fit(_NaNAfter(6), ds, TrainConfig(epochs=3, batch_size=16), seed=0,
            checkpoint_dir=tmp_path)
    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == "epoch-001"  # epoch 2 was never written
    meta, _ = ckpt.load_checkpoint(latest)
    assert all(math.isfinite(h["train_loss"]) for h in meta["history"])
    _record("non-finite", "training loss NaN in epoch 2 (fit, 3 epochs, checkpoints on)",
            f"{_describe(ei.value)}; latest checkpoint stays epoch-001, nothing written for "
            "epoch 2")


def test_atomic_json_refuses_nan_and_keeps_previous(tmp_path):
    path = tmp_path / "metrics.json"
    ckpt.atomic_write_json(path, {"accuracy": 0.5})
    with pytest.raises(FloatingPointError, match="non-finite value at accuracy"):
        ckpt.atomic_write_json(path, {"accuracy": float("nan")})
    assert json.loads(path.read_text()) == {"accuracy": 0.5}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]



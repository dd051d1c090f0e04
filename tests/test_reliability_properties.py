"""Hypothesis properties of the estimators and of KernelAttention.

(Reliability, issue 7, issue 7; see docs/reliability.md.)
"""


from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coulomb_attention.estimators import ParticleFeatures, RandomFeatures
from coulomb_attention.nn.attention import ATTENTION_FEATURES, KernelAttention

# ----------------------------------------------------------------------------- hypothesis

FAST = settings(max_examples=12, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FAST
@given(
    n=st.integers(4, 30),
    d=st.integers(1, 5),
    n_comp=st.integers(1, 12),
    log_scale=st.floats(-3, 3),
    label_kind=st.sampled_from(["int", "str", "bool", "float", "multiclass"]),
    feature_map=st.sampled_from(["rff", "positive", "softplus", "softmax"]),
    particles=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_estimators_finite_and_shaped(n, d, n_comp, log_scale, label_kind,
                                               feature_map, particles, seed):
    rng = np.random.default_rng(seed)
    Xh = rng.standard_normal((n, d)) * 10.0**log_scale
    base = np.arange(n) % (3 if label_kind == "multiclass" else 2)
    if label_kind == "str":
        y = np.array(["neg", "pos"])[base]
    elif label_kind == "bool":
        y = base.astype(bool)
    elif label_kind == "float":
        y = base * 2.5 - 1.0
    else:
        y = base
    if particles:
        est = ParticleFeatures(n_comp, feature_map=feature_map, n_steps=3, batch_size=8,
                               random_state=seed)
    else:
        est = RandomFeatures(n_comp, feature_map=feature_map, random_state=seed)
    phi = est.fit(Xh, y).transform(Xh)
    assert phi.shape == (n, n_comp) and phi.dtype == np.float64
    assert np.isfinite(phi).all()
    assert np.isfinite(est.omega_).all() and est.omega_.shape == (n_comp, d)
    if particles:
        assert all(math.isfinite(h["energy"]) for h in est.history_)


@FAST
@given(
    name=st.sampled_from(sorted(ATTENTION_FEATURES)),
    log_scale=st.floats(-2, 3),
    dtype=st.sampled_from(["float32", "float64", "bf16-autocast", "float16"]),
    lengths=st.lists(st.integers(1, 7), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_property_attention_finite_and_mask_invariant(name, log_scale, dtype, lengths, seed):
    """Finite outputs at every scale/precision; the outputs at real positions do not depend
    on what the padded positions hold, and equal each sequence run alone (float64)."""
    g = torch.Generator().manual_seed(seed)
    ka = KernelAttention(16, 2, feature_map=name, n_features=8, generator=seed).eval()
    T = max(lengths)
    x = torch.randn(len(lengths), T, 16, generator=g) * 10.0**log_scale
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    with torch.no_grad():
        if dtype == "bf16-autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = ka(x, mask)
        else:
            dt = getattr(torch, dtype)
            out = ka.to(dt)(x.to(dt), mask)
    assert out.shape == x.shape and torch.isfinite(out).all()
    # mask invariance in float64 (exact up to rounding)
    ka = ka.double()
    x = x.double()
    garbage = torch.where(mask[..., None], x, torch.randn(x.shape, generator=g,
                                                          dtype=torch.float64) * 1e3)
    with torch.no_grad():
        a = ka(x, mask)
        b = ka(garbage, mask)
        for i, L in enumerate(lengths):
            alone = ka(x[i:i + 1, :L], None)[0]
            scale = float(alone.abs().max()) + 1e-12
            assert float((a[i, :L] - b[i, :L]).abs().max()) <= 1e-9 * scale + 1e-9
            assert float((a[i, :L] - alone).abs().max()) <= 1e-7 * scale + 1e-9


"""Property-based tests (hypothesis): feature maps and energies over shapes, dtypes, scales."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coulomb_attention import energy as E
from coulomb_attention import features as F

SETTINGS = settings(max_examples=25, deadline=None)

dims = st.integers(1, 6)
counts = st.integers(1, 9)
scales = st.sampled_from([1e-3, 1.0, 10.0, 100.0])
dtypes = st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16])


def _draw(seed, n, d, scale, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(n, d, generator=g, dtype=torch.float64)).to(dtype)


@SETTINGS
@given(seed=st.integers(0, 10_000), n=counts, m=counts, d=dims, scale=scales, dtype=dtypes)
def test_feature_maps_shapes_and_finite(seed, n, m, d, scale, dtype):
    x = _draw(seed, n, d, scale, dtype)
    om = _draw(seed + 1, m, d, 1.0, dtype)
    bias = F.draw_bias(m, generator=torch.Generator().manual_seed(seed)).to(dtype)
    for name in F.FEATURE_MAPS:
        phi = F.feature_fn(name, bias)(x, om)
        assert phi.shape == (n, m)
        if name == "positive":
            # exp features overflow for large norms unless shifted; with the row-max shift
            # they are finite, in [0, 1/sqrt(m)] and the largest is exactly 1/sqrt(m).
            wide = torch.promote_types(x.dtype, torch.float32)
            logits = F.log_positive(x.to(wide), om.to(wide))  # the precision positive() uses
            phi = F.positive(x, om, shift=logits.amax(-1, keepdim=True))
            assert phi.dtype in (torch.float32, torch.float64)
            assert torch.isfinite(phi).all()
            peak = torch.full((n,), 1 / math.sqrt(m), dtype=phi.dtype)
            assert torch.allclose(phi.amax(-1), peak, rtol=1e-3)
        elif name in ("softplus", "softmax"):
            assert torch.isfinite(phi).all() and (phi >= 0).all()
        else:
            assert torch.isfinite(phi).all()
            assert phi.abs().max() <= math.sqrt(2.0 / m) * (1 + 1e-2)


@SETTINGS
@given(seed=st.integers(0, 10_000), n=st.integers(4, 30), m=counts, d=dims, scale=scales,
       center=st.booleans())
def test_alignment_in_unit_interval_and_scale_invariant(seed, n, m, d, scale, center):
    x = _draw(seed, n, d, 1.0)
    y = torch.arange(n) % 2
    Y, _ = E.encode_labels(y.numpy())
    om = _draw(seed + 2, m, d, 1.0)
    phi = F.rff(x, om, F.draw_bias(m, generator=torch.Generator().manual_seed(seed)).double())
    a = E.alignment(phi, Y, center=center)
    if phi.abs().sum() > 0:
        assert -1e-9 <= float(a) <= 1 + 1e-9
        assert abs(float(E.alignment(scale * phi, Y, center=center)) - float(a)) < 1e-7


@SETTINGS
@given(seed=st.integers(0, 10_000), n=st.integers(2, 12), d=dims,
       s=st.sampled_from([0.0, 0.5, 1.0, 3.0]), eps=st.sampled_from([1e-3, 0.1, 1.0]),
       shift=st.floats(-5, 5))
def test_riesz_energy_matches_naive_and_is_translation_invariant(seed, n, d, s, eps, shift):
    om = _draw(seed, n, d, 1.0)
    pot = E.make_potential("log", eps=eps) if s == 0 else E.make_potential("riesz", s=s, eps=eps)
    w = E.riesz_energy(om, pot)
    assert torch.isfinite(w)
    assert abs(float(w) - float(E.riesz_energy_naive(om, pot))) <= 1e-9 * max(1.0, abs(float(w)))
    assert abs(float(E.riesz_energy(om + shift, pot)) - float(w)) <= 1e-7 * max(1.0, abs(float(w)))
    g = E.riesz_grad(om, pot)
    # Pair forces are equal and opposite: they sum to zero.
    assert g.sum(0).abs().max() <= 1e-9 * max(1.0, float(g.abs().max()))

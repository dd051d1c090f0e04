import math

import pytest
import torch

from coulomb_attention import features as F
from helpers import rel_err


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_rff_unbiased_for_gaussian_kernel():
    g = _gen(1)
    gamma, d = 0.3, 5
    x = torch.randn(12, d, generator=g, dtype=torch.float64)
    exact = F.gaussian_kernel(x, x, gamma)
    scale = math.sqrt(2 * gamma)
    # Average of many independent small-N estimates: unbiased => the mean error shrinks ~ 1/sqrt(R).
    est = torch.zeros_like(exact)
    reps = 400
    for _ in range(reps):
        om = F.sample("gaussian", 32, d, scale=scale, generator=g, dtype=torch.float64)
        b = F.draw_bias(32, generator=g, dtype=torch.float64)
        phi = F.rff(x, om, b)
        est += phi @ phi.T
    est /= reps
    assert (est - exact).abs().max() < 0.03
    # A single large-N draw converges too.
    om = F.sample("gaussian", 40000, d, scale=scale, generator=g, dtype=torch.float64)
    phi = F.rff(x, om, F.draw_bias(40000, generator=g, dtype=torch.float64))
    assert (phi @ phi.T - exact).abs().max() < 0.03


def test_positive_features_unbiased_for_softmax_kernel():
    g = _gen(2)
    d = 4
    x = 0.4 * torch.randn(10, d, generator=g, dtype=torch.float64)
    exact = F.softmax_kernel(x, x)
    om = F.sample("gaussian", 200000, d, generator=g, dtype=torch.float64)
    phi = F.positive(x, om)
    assert (phi > 0).all()
    assert rel_err(phi @ phi.T, exact) < 0.01


def test_orthogonal_sampler_rows_orthogonal_and_chi_norms():
    g = _gen(3)
    d = 8
    om = F.orthogonal(64, d, generator=g, dtype=torch.float64)
    assert om.shape == (64, d)
    block = om[:d]
    dirs = block / block.norm(dim=1, keepdim=True)
    assert torch.allclose(dirs @ dirs.T, torch.eye(d, dtype=torch.float64), atol=1e-10)
    big = F.orthogonal(8000, d, generator=g, dtype=torch.float64)
    # chi(d) norms: E|w|^2 = d, and each coordinate ~ N(0, 1)
    assert abs(big.pow(2).sum(1).mean().item() - d) < 0.2
    assert abs(big.var().item() - 1.0) < 0.05


def test_orthogonal_features_lower_kernel_error():
    g = _gen(4)
    d, n_feat, reps = 16, 16, 200
    x = torch.randn(20, d, generator=g, dtype=torch.float64) / math.sqrt(d)
    exact = F.gaussian_kernel(x, x, 0.5)
    mse = {}
    for name in ("gaussian", "orthogonal"):
        errs = []
        for _ in range(reps):
            om = F.sample(name, n_feat, d, generator=g, dtype=torch.float64)
            phi = F.rff(x, om, F.draw_bias(n_feat, generator=g, dtype=torch.float64))
            errs.append(((phi @ phi.T - exact) ** 2).mean())
        mse[name] = torch.stack(errs).mean().item()
    assert mse["orthogonal"] < 0.9 * mse["gaussian"]


def test_softmax_and_softplus_maps():
    g = _gen(5)
    x = torch.randn(7, 3, generator=g)
    om = torch.randn(11, 3, generator=g)
    s = F.softmax(x, om)
    assert torch.allclose(s.sum(-1), torch.ones(7), atol=1e-6)
    sp = F.softplus(x, om)
    assert (sp > 0).all() and sp.shape == (7, 11)
    assert torch.allclose(sp, torch.nn.functional.softplus(x @ om.T) / math.sqrt(11))


def test_positive_low_precision_and_shift():
    g = _gen(6)
    x = 30.0 * torch.randn(5, 8, generator=g)
    om = torch.randn(16, 8, generator=g)
    logits = F.log_positive(x, om)
    shift = logits.amax(-1, keepdim=True)
    for dtype in (torch.float16, torch.bfloat16):
        phi = F.positive(x.to(dtype), om.to(dtype), shift=shift)
        assert phi.dtype == torch.float32
        assert torch.isfinite(phi).all()
        assert (phi.amax(-1) > 0).all()
    # The shift scales the features of a row by exp(-shift): ratios are exact.
    x_small = 0.3 * torch.randn(4, 8, generator=g, dtype=torch.float64)
    om64 = om.double()
    a = F.positive(x_small, om64)
    b = F.positive(x_small, om64, shift=2.0)
    assert torch.allclose(a * math.exp(-2.0), b)


def test_feature_maps_gradients_flow_to_omega():
    g = _gen(7)
    x = torch.randn(6, 3, generator=g, dtype=torch.float64)
    for name in F.FEATURE_MAPS:
        om = torch.randn(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
        fn = F.feature_fn(name, bias=F.draw_bias(5, generator=g, dtype=torch.float64))
        assert torch.autograd.gradcheck(lambda w, fn=fn: fn(x, w), (om,))


def test_registry_errors():
    with pytest.raises(ValueError, match="valid: positive, rff, softmax, softplus"):
        F.get_feature_map("cosine")
    with pytest.raises(ValueError, match="valid: gaussian, orthogonal"):
        F.get_sampler("sobol")
    with pytest.raises(ValueError, match="n_features"):
        F.gaussian(0, 3)
    with pytest.raises(ValueError, match="omega has d=3"):
        F.positive(torch.zeros(2, 4), torch.zeros(5, 3))
    with pytest.raises(ValueError, match="bias"):
        F.rff(torch.zeros(2, 3), torch.zeros(5, 3))


def test_one_registry_names_every_map_once():
    """MAPS is the one registry: the attention layers, the estimators' core view and the
    export all read it; Hedgehog's map and elu are ordinary entries."""
    from coulomb_attention.export import EXPORTABLE_MAPS
    from coulomb_attention.features import FEATURE_MAPS, MAPS, get_map
    from coulomb_attention.nn.attention import ATTENTION_FEATURES

    assert set(MAPS) == {"rff", "favor", "porf_softplus", "softmax_feat", "hedgehog", "elu"}
    assert set(FEATURE_MAPS) == {"rff", "positive", "softplus", "softmax"}
    for m in MAPS.values():
        if m.core is not None:
            assert FEATURE_MAPS[m.core] is m.phi
        if m.attention:
            assert ATTENTION_FEATURES[m.name] is m
    assert not MAPS["rff"].attention and "rff" not in ATTENTION_FEATURES
    assert set(ATTENTION_FEATURES) - set(MAPS) == {"softmax", "none"}
    # the export offers the attention maps its remote code implements (tests/test_names.py)
    assert set(EXPORTABLE_MAPS) <= {n for n, m in MAPS.items() if m.attention}
    with pytest.raises(ValueError, match="hedgehog"):
        get_map("hedgehogg")


def test_hedgehog_entry_ties_a_fresh_draw_like_the_switch():
    """attention='hedgehog' draws [W; -W] from the first half of the sampler's draw: the same
    omega as a FAVOR+ layer of the same generator switched by use_hedgehog_map_; odd M is
    refused."""
    from coulomb_attention.nn.attention import KernelAttention, use_hedgehog_map_

    hh = KernelAttention(16, 2, "hedgehog", n_features=8, share_features=False, generator=4)
    fv = KernelAttention(16, 2, "favor", n_features=8, share_features=False, generator=4)
    use_hedgehog_map_(fv)
    assert fv.feature_map == "hedgehog" and torch.equal(hh.omega, fv.omega)
    assert torch.equal(hh.omega[:, 4:], -hh.omega[:, :4])
    u = torch.randn(3, 8, dtype=torch.float64)
    phi = hh.feature(u, hh.omega[0])  # two softmax halves, each summing to 1
    assert torch.allclose(phi[:, :4].sum(-1), torch.ones(3, dtype=phi.dtype))
    assert torch.allclose(phi[:, 4:].sum(-1), torch.ones(3, dtype=phi.dtype))
    with pytest.raises(ValueError, match="even"):
        KernelAttention(16, 2, "hedgehog", n_features=7)


def test_batched_maps_equal_one_call_per_particle_set():
    """A map marked ``batched`` takes ``omega`` (G, M, d) with rows (..., G, R, d) and gives
    set g's features of rows g, as G separate calls do; the attention layer's one call
    equals the vmapped map over its query heads (head h reads set h // (H / G))."""
    from coulomb_attention.nn import KernelAttention

    batched = [m for m in F.MAPS.values() if m.batched]
    assert [m.name for m in batched] == ["hedgehog"]
    g = torch.Generator().manual_seed(3)
    u = torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64)
    om = torch.randn(3, 6, 8, generator=g, dtype=torch.float64)
    for m in batched:
        one = m.phi(u, om)
        assert one.shape == (2, 3, 5, 6)
        for i in range(3):
            assert torch.allclose(one[:, i], m.phi(u[:, i], om[i]), rtol=0, atol=1e-14)
    att = KernelAttention(48, 6, "hedgehog", 6, share_features=False, causal=True, kv_heads=3,
                          generator=0).double()
    q = torch.randn(2, 6, 4, 8, generator=g, dtype=torch.float64)
    looped = torch.vmap(att.feature, in_dims=(1, 0), out_dims=1)(q, att._omega_for(6))
    assert torch.allclose(att._phi(q), looped, rtol=0, atol=1e-14)

"""Particle masses in KernelAttention (weighted / WFR particles): the weighted layer against a
naive twin built from explicitly scaled features, uniform masses against the unweighted layer,
and the masses through state dicts and safetensors checkpoints."""

from __future__ import annotations

import pytest
import torch

from coulomb_attention.nn import KernelAttention
from coulomb_attention.nn import functional as AF
from coulomb_attention.train.checkpoint import load_model_file, save_model_file
from helpers import rel_err

RANDOM_MAPS = ("favor", "porf_softplus", "softmax_feat")


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _layer(name, share, causal=False, M=16):
    torch.manual_seed(0)  # projections only; omega comes from the generator
    return KernelAttention(24, 3, name, n_features=M, share_features=share, causal=causal,
                           generator=7).double()


def _naive_weighted(m: KernelAttention, x, mask, mass):
    """Explicit features ``phi_i * sqrt(M mass_i)`` (core maps, unshifted), quadratic op."""
    q, k = m.queries(x), m.keys(x)
    v = m._split(m.v_proj(x))
    M = m.n_features
    pq, pk = [], []
    for h in range(m.heads):
        g = 0 if m.omega.shape[0] == 1 else h
        scale = (M * mass[g]).sqrt()
        pq.append(m.feature(q[:, h], m.omega[g]) * scale)
        pk.append(m.feature(k[:, h], m.omega[g]) * scale)
    o = AF.naive_linear_attention(torch.stack(pq, 1), torch.stack(pk, 1), v, mask,
                                  causal=m.causal)
    B, T, D = x.shape
    return m.out_proj(o.transpose(1, 2).reshape(B, T, D))


def _x_mask():
    x = torch.randn(2, 9, 24, generator=_gen(3), dtype=torch.float64)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 5:] = False
    return x, mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("name", RANDOM_MAPS)
def test_weighted_layer_matches_explicitly_scaled_features(name, share, causal):
    m = _layer(name, share, causal)
    x, mask = _x_mask()
    mass = torch.rand(m.omega.shape[:2], generator=_gen(5), dtype=torch.float64) ** 3
    mass[:, 0] = 0.0  # a dead particle contributes exactly nothing
    unweighted = m(x, mask)
    m.load_masses_(mass)
    assert m.weighted and torch.allclose(m.mass.sum(-1), torch.ones(m.mass.shape[0],
                                                                   dtype=m.mass.dtype))
    fast = m(x, mask)
    slow = _naive_weighted(m, x, mask, m.mass)
    assert rel_err(fast[mask], slow[mask]) < 1e-10
    assert rel_err(fast[mask], unweighted[mask]) > 1e-3  # the masses change the layer


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", RANDOM_MAPS)
def test_uniform_masses_reproduce_the_unweighted_layer(name, causal):
    m = _layer(name, share=False, causal=causal)
    x, mask = _x_mask()
    plain = m(x, mask)
    m.load_masses_(torch.full((m.n_features,), 0.3))  # any constant: normalised to 1/M
    assert torch.equal(m.mass, torch.full_like(m.mass, 1 / m.n_features))
    uniform = m(x, mask)
    assert rel_err(uniform[mask], plain[mask]) < 1e-13
    m.load_masses_(None)  # no masses: the unweighted code path, bit for bit
    assert torch.equal(m(x, mask), plain)


def test_unweighted_state_dict_has_no_mass_and_old_checkpoints_load(tmp_path):
    m = _layer("favor", share=True)
    assert m.mass is None and not any(k.endswith("mass") for k in m.state_dict())
    save_model_file(tmp_path / "old.safetensors", m)
    fresh = _layer("favor", share=True)
    fresh.redraw_(11)
    load_model_file(tmp_path / "old.safetensors", fresh)
    assert fresh.mass is None and torch.equal(fresh.omega, m.omega)


@pytest.mark.parametrize("name", ["favor", "porf_softplus"])
def test_masses_round_trip_through_a_checkpoint(tmp_path, name):
    m = _layer(name, share=False)
    m.load_masses_(torch.rand(m.omega.shape[:2], generator=_gen(2), dtype=torch.float64))
    x, mask = _x_mask()
    before = m(x, mask)
    save_model_file(tmp_path / "w.safetensors", m)
    fresh = _layer(name, share=False)
    fresh.redraw_(3)
    assert fresh.mass is None
    load_model_file(tmp_path / "w.safetensors", fresh)
    assert torch.equal(fresh.mass, m.mass) and torch.equal(fresh.omega, m.omega)
    assert torch.equal(fresh(x, mask), before)


def test_bad_masses_raise_one_line_errors(tmp_path):
    m = _layer("favor", share=True)
    M = m.n_features
    for bad, msg in [(torch.ones(M + 1), "shape"), (torch.full((M,), float("nan")), "NaN"),
                     (-torch.ones(M), "non-negative"), (torch.zeros(M), "positive sum")]:
        with pytest.raises(ValueError, match=msg) as info:
            m.load_masses_(bad)
        assert "\n" not in str(info.value)
    with pytest.raises(TypeError, match="floating"):
        m.load_masses_(torch.ones(M, dtype=torch.long))
    with pytest.raises(ValueError, match="no particles"):
        KernelAttention(24, 3, "elu").load_masses_(torch.ones(4))
    # a tampered checkpoint: negative masses are refused on load, with the key named
    m.load_masses_(torch.ones(M))
    state = {k: v.clone() for k, v in m.state_dict().items()}
    state["mass"] = -state["mass"]
    with pytest.raises(ValueError, match="masses in the checkpoint.*mass must be non-negative"):
        _layer("favor", share=True).load_state_dict(state)
    state["mass"] = torch.ones(1, M + 2)
    with pytest.raises(ValueError, match="shape"):
        _layer("favor", share=True).load_state_dict(state)


def test_redraw_and_hedgehog_drop_the_masses():
    from coulomb_attention.nn.attention import use_hedgehog_map_

    m = _layer("favor", share=True)
    m.load_masses_(torch.rand(m.n_features, generator=_gen(1)).double())
    m.redraw_(4)
    assert m.mass is None
    m.load_masses_(torch.rand(m.n_features, generator=_gen(1)).double())
    use_hedgehog_map_(m)
    assert m.mass is None

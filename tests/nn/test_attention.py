"""Tests of coulomb_attention.nn attention: fast paths against naive twins, masks, numerics."""

from __future__ import annotations

import math

import pytest
import torch

from coulomb_attention import features
from coulomb_attention.nn import ATTENTION_FEATURES, KernelAttention
from coulomb_attention.nn import functional as AF
from coulomb_attention.nn.ops import fused as FU
from coulomb_attention.nn.ops import workspace as WS
from helpers import rel_err

MAPS = tuple(ATTENTION_FEATURES)
RANDOM_MAPS = ("favor", "porf_softplus", "softmax_feat")
LIN = "chunked"  # the fused, chunked linear order (the default picks by cost)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _qkv(B=2, H=3, T=11, S=13, d=8, e=5, seed=0, dtype=torch.float64, scale=1.0):
    g = _gen(seed)
    q = (scale * torch.randn(B, H, T, d, generator=g, dtype=dtype)).requires_grad_()
    k = (scale * torch.randn(B, H, S, d, generator=g, dtype=dtype)).requires_grad_()
    v = torch.randn(B, H, S, e, generator=g, dtype=dtype).requires_grad_()
    return q, k, v


def _mask(B, S, lengths):
    m = torch.zeros(B, S, dtype=torch.bool)
    for i, n in enumerate(lengths):
        m[i, :n] = True
    return m


def _grads(out, inputs, seed=1):
    w = torch.randn(out.shape, generator=_gen(seed), dtype=out.dtype)
    return torch.autograd.grad((out * w).sum(), inputs, retain_graph=True, allow_unused=True,
                               materialize_grads=True)  # 'none' leaves q_proj, k_proj unused


def _reference_forward(m: KernelAttention, x, mask):
    """The module's forward rebuilt from naive quadratic ops and the core feature maps."""
    q, k = m.queries(x), m.keys(x)
    v = m._split(m.v_proj(x))
    if m.feature_map == "none":  # no token mixing: each position keeps its own value
        o = v
    elif m.feature_map == "softmax":
        o = AF.softmax_attention(q, k, v, mask)
    elif m.feature_map == "favor":
        o = AF.naive_favor_attention(q, k, v, m.omega, mask)
    else:  # unshifted core maps: the shift is only needed for exp features
        om = m.omega
        if om.shape[0] == 1 or m.feature_map == "elu":
            pq, pk = m.feature(q, om[0]), m.feature(k, om[0])
        else:
            pq = torch.stack([m.feature(q[:, h], om[h]) for h in range(m.heads)], 1)
            pk = torch.stack([m.feature(k[:, h], om[h]) for h in range(m.heads)], 1)
        o = AF.naive_linear_attention(pq, pk, v, mask)
    B, T, D = x.shape
    return m.out_proj(o.transpose(1, 2).reshape(B, T, D))


# ----------------------------------------------------------------------------- functional


def test_linear_attention_matches_naive_outputs_and_grads():
    q, k, v = _qkv()
    mask = _mask(2, 13, [13, 6])
    pq, pk = q.exp(), (k - 1).exp()  # positive features with M = d = 8
    fast = AF.linear_attention(pq, pk, v, mask)
    slow = AF.naive_linear_attention(pq, pk, v, mask)
    assert fast.shape == (2, 3, 11, 5)
    assert rel_err(fast, slow) < 1e-12
    for a, b in zip(_grads(fast, (q, k, v)), _grads(slow, (q, k, v)), strict=True):
        assert rel_err(a, b) < 1e-10
    # The mask matters: without it the second sequence sees its padded keys.
    assert rel_err(AF.linear_attention(pq, pk, v), fast) > 1e-3


@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_fused_favor_matches_naive(groups, chunk):
    q, k, v = _qkv(seed=groups + chunk)
    omega = torch.randn(groups, 16, 8, generator=_gen(5), dtype=torch.float64)
    omega.requires_grad_()
    mask = _mask(2, 13, [13, 5])
    fast = AF.favor_attention(q, k, v, omega, mask, chunk_size=chunk, order=LIN)
    slow = AF.naive_favor_attention(q, k, v, omega, mask)
    assert rel_err(fast, slow) < 1e-12
    ga, gb = _grads(fast, (q, k, v, omega)), _grads(slow, (q, k, v, omega))
    for a, b in zip(ga, gb, strict=True):
        assert rel_err(a, b) < 1e-10


def test_fused_favor_workspace_reuse_across_calls_sizes_modes_and_threads():
    """Scratch buffers are kept between calls (per thread): results must not depend on what
    ran before (larger or smaller shapes, other dtypes, inference mode), two FAVOR+ layers in
    one graph must back-propagate correctly, and concurrent threads must not share buffers."""
    import threading

    AF.clear_workspace()
    omega = torch.randn(1, 16, 8, generator=_gen(5), dtype=torch.float64)

    def check(T, B=2, seed=0):
        q, k, v = _qkv(seed=seed, B=B, T=T, S=T)
        fast = AF.favor_attention(q, k, v, omega, chunk_size=4, order=LIN)
        slow = AF.naive_favor_attention(q, k, v, omega)
        assert rel_err(fast, slow) < 1e-12
        for a, b in zip(_grads(fast, (q, k, v)), _grads(slow, (q, k, v)), strict=True):
            assert rel_err(a, b) < 1e-10

    check(13)
    check(3, B=1)  # smaller after larger: views into the same buffers
    check(21, B=3)  # larger: buffers grow
    with torch.inference_mode():  # inference tensors get their own buffers
        q, k, v = _qkv(seed=9)
        out_inf = AF.favor_attention(q, k, v, omega, chunk_size=4, order=LIN)
    check(13)
    assert rel_err(out_inf, AF.naive_favor_attention(q, k, v, omega)) < 1e-12
    # float32 after float64 (separate buffers), compared with the float64 result
    q, k, v = _qkv(seed=3)
    o32 = AF.favor_attention(q.float(), k.float(), v.float(), omega.float(), chunk_size=4)
    assert rel_err(o32.double(), AF.naive_favor_attention(q, k, v, omega)) < 1e-5
    # Two layers in one graph: the second forward reuses the first's scratch before either
    # backward runs.
    q, k, v = _qkv(seed=4, e=8)
    fast = AF.favor_attention(AF.favor_attention(q, k, v, omega, chunk_size=4), k, v, omega,
                              chunk_size=4, order=LIN)
    slow = AF.naive_favor_attention(AF.naive_favor_attention(q, k, v, omega), k, v, omega)
    assert rel_err(fast, slow) < 1e-12
    for a, b in zip(_grads(fast, (q, k, v)), _grads(slow, (q, k, v)), strict=True):
        assert rel_err(a, b) < 1e-10
    # Concurrent threads
    errors = []

    def worker(seed):
        try:
            for i in range(5):
                check(9 + 2 * i, seed=seed)
        except AssertionError as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in (11, 12, 13)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    # Buffers over the limit are never cached; clear_workspace frees the cached ones.
    like = torch.empty(0)
    big = WS._WORKSPACE_MAX_BYTES // like.element_size() + 1
    a = WS._scratch(like, "t", big)
    assert a.data_ptr() != WS._scratch(like, "t", big).data_ptr()  # both alive: distinct
    small = WS._scratch(like, "t", 100)
    assert small.data_ptr() == WS._scratch(like, "t", 50).data_ptr()  # cached, reused
    AF.clear_workspace()
    assert not WS._WORKSPACE.__dict__.get("bufs")


def _forbid(monkeypatch, *names):
    def fail(*args, **kwargs):
        raise AssertionError("the exact path ran where the fast path should")

    for name in names:
        monkeypatch.setattr(FU, name, fail)


def test_fused_favor_takes_the_fast_path_at_ordinary_norms(monkeypatch):
    """Attention-scale inputs (|q|, |k| ~ d^1/4) never need the exact fallback."""
    _forbid(monkeypatch, "_key_pass_exact", "_query_features_exact")
    d = 16
    q, k, v = _qkv(B=2, H=2, T=300, S=300, d=d, e=4, dtype=torch.float32)
    omega = features.orthogonal(64, d, generator=_gen(3))[None]
    mask = _mask(2, 300, [300, 77])
    out = AF.favor_attention(q, k, v, omega, mask, chunk_size=64, order=LIN)
    ref = AF.naive_favor_attention(q, k, v, omega, mask)
    assert rel_err(out, ref) < 1e-5
    for a, b in zip(_grads(out, (q, k, v)), _grads(ref, (q, k, v)), strict=True):
        assert rel_err(a, b) < 1e-4


@pytest.mark.parametrize("groups", [1, 3])
def test_fused_favor_exact_path_matches_naive(monkeypatch, groups):
    """With the underflow threshold at infinity every chunk takes the exact path."""
    monkeypatch.setattr(FU, "_UNDERFLOW", math.inf)
    calls = []
    for name in ("_key_pass_exact", "_query_features_exact"):
        fn = getattr(FU, name)
        monkeypatch.setattr(FU, name, lambda *a, fn=fn, name=name: calls.append(name) or fn(*a))
    q, k, v = _qkv(seed=7)
    omega = torch.randn(groups, 16, 8, generator=_gen(5), dtype=torch.float64)
    omega.requires_grad_()
    mask = _mask(2, 13, [13, 5])
    fast = AF.favor_attention(q, k, v, omega, mask, chunk_size=4, order=LIN)
    slow = AF.naive_favor_attention(q, k, v, omega, mask)
    assert {"_key_pass_exact", "_query_features_exact"} <= set(calls)
    assert rel_err(fast, slow) < 1e-12
    for a, b in zip(_grads(fast, (q, k, v, omega)), _grads(slow, (q, k, v, omega)), strict=True):
        assert rel_err(a, b) < 1e-10


def test_fused_favor_mixes_fast_and_exact_chunks():
    """Some query rows far from every particle take the exact row shift, the others not."""
    q, k, v = _qkv(B=1, H=2, T=40, S=30, d=8, e=3, seed=11)
    with torch.no_grad():
        q[:, :, 20:] *= 40.0  # rows 20..39: every fast-path feature underflows
    omega = torch.randn(1, 16, 8, generator=_gen(6), dtype=torch.float64)
    fast = AF.favor_attention(q, k, v, omega, chunk_size=8, order=LIN)
    slow = AF.naive_favor_attention(q, k, v, omega)
    assert torch.isfinite(fast).all()
    assert rel_err(fast, slow) < 1e-10
    for a, b in zip(_grads(fast, (q, k, v)), _grads(slow, (q, k, v)), strict=True):
        assert rel_err(a, b) < 1e-8


@pytest.mark.parametrize("order", [LIN, "linear"])
@pytest.mark.parametrize("groups", [1, 2])
def test_fused_favor_gradcheck(groups, order):
    """Both linear-order paths (chunked, unchunked); shared omega and one omega per head."""
    q, k, v = _qkv(B=2, H=2, T=4, S=5, d=3, e=2)
    omega = torch.randn(groups, 4, 3, generator=_gen(2), dtype=torch.float64,
                        requires_grad=True)
    mask = _mask(2, 5, [4, 5])
    assert torch.autograd.gradcheck(
        lambda *t: AF.favor_attention(*t, mask, chunk_size=2, order=order), (q, k, v, omega)
    )


def test_softmax_attention_reference_matches_sdpa():
    q, k, v = _qkv()
    mask = _mask(2, 13, [13, 7])
    ref = AF.softmax_attention(q, k, v, mask, scale=0.5)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask[:, None, None, :], scale=0.5
    )
    assert rel_err(ref, sdpa) < 1e-12


def test_favor_approximates_softmax_better_with_more_features():
    """Monte-Carlo error of FAVOR+ decays with M (~ M^-1/2; 16 -> 1024 features is 8x).

    Moderate norms (|q|, |k| ~ 1): the estimator's variance grows like exp(|q + k|^2).
    """
    d = 16
    q, k, v = _qkv(B=1, H=2, T=32, S=32, d=d, e=8, seed=3, scale=d**-0.5)
    exact = AF.softmax_attention(q, k, v)
    sizes = (16, 64, 256, 1024)
    errs = []
    for M in sizes:
        e = [
            rel_err(AF.favor_attention(q, k, v, features.orthogonal(
                M, d, generator=_gen(100 + s), dtype=torch.float64)[None]), exact)
            for s in range(4)
        ]
        errs.append(sum(e) / len(e))
    assert all(a > b for a, b in zip(errs[:-1], errs[1:], strict=True)), errs
    assert errs[-1] < errs[0] / 3, errs
    assert errs[-1] < 0.1, errs


def _favor_log_domain(q, k, v, omega, mask):
    """FAVOR+ attention with weights exp(logsumexp_m(a_tm + a_sm)) in float64: any norm."""
    q, k, v, om = (t.detach().double() for t in (q, k, v, omega))
    aq = features.log_positive(q, om[0])  # (B, H, T, M)
    ak = features.log_positive(k, om[0])  # (B, H, S, M)
    logw = torch.logsumexp(aq[..., :, None, :] + ak[..., None, :, :], dim=-1)  # (B, H, T, S)
    logw = logw.masked_fill(~mask[:, None, None, :], -math.inf)
    return torch.softmax(logw, dim=-1) @ v


def test_large_norms_do_not_overflow():
    q, k, v = _qkv(scale=30.0, dtype=torch.float32)
    omega = features.orthogonal(64, 8, generator=_gen(1))[None]
    mask = _mask(2, 13, [13, 4])
    # Without a shift whole rows of features underflow to 0 (attention 0/0); with the
    # shifts the attention is finite.
    assert (features.positive(q.detach(), omega[0]) == 0).all(-1).any()
    out = AF.favor_attention(q, k, v, omega, mask)
    assert torch.isfinite(out).all()
    grads = _grads(out, (q, k, v))
    assert all(torch.isfinite(gr).all() for gr in grads)
    # Exact at any norm: per-feature logsumexp over keys (float32 vs a float64 log-domain oracle).
    assert rel_err(out, _favor_log_domain(q, k, v, omega, mask)) < 1e-4
    for dt in (torch.bfloat16, torch.float16):
        o = AF.favor_attention(q.to(dt), k.to(dt), v.to(dt), omega, mask)
        assert o.dtype == dt and torch.isfinite(o).all()


def test_keys_without_any_real_token_give_zero_not_nan():
    q, k, v = _qkv(dtype=torch.float32)
    omega = torch.randn(1, 8, 8, generator=_gen(1))
    mask = _mask(2, 13, [13, 0])
    for out in (AF.favor_attention(q, k, v, omega, mask),
                AF.softmax_attention(q, k, v, mask),
                AF.linear_attention(q.exp(), k.exp(), v, mask)):
        assert torch.isfinite(out).all()
        assert out[1].abs().max() == 0
        assert out[0].abs().max() > 0


def test_functional_bad_inputs():
    q, k, v = _qkv(dtype=torch.float32)
    omega = torch.randn(1, 8, 8)
    with pytest.raises(ValueError, match="shape"):
        AF.favor_attention(q[0], k, v, omega)
    with pytest.raises(ValueError, match="omega"):
        AF.favor_attention(q, k, v, torch.randn(2, 8, 8))
    with pytest.raises(ValueError, match="mask"):
        AF.favor_attention(q, k, v, omega, torch.ones(2, 12, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool"):
        AF.linear_attention(q.exp(), k.exp(), v, torch.ones(2, 13))
    with pytest.raises(ValueError, match="chunk_size"):
        AF.favor_attention(q, k, v, omega, chunk_size=0, order=LIN)


# ----------------------------------------------------------------------------- module


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("name", MAPS)
def test_module_matches_naive_reference(name, share):
    torch.manual_seed(0)  # projection init only; omega comes from the generator
    m = KernelAttention(24, 3, name, n_features=16, share_features=share, generator=7).double()
    x = torch.randn(2, 9, 24, generator=_gen(3), dtype=torch.float64, requires_grad=True)
    mask = _mask(2, 9, [9, 5])
    fast = m(x, mask)
    slow = _reference_forward(m, x, mask)
    assert fast.shape == (2, 9, 24)
    assert rel_err(fast[mask], slow[mask]) < 1e-10
    params = [x] + [p for p in m.parameters()]
    gf = _grads(fast * mask[..., None], params)
    gs = _grads(slow * mask[..., None], params)
    # (absolute floor: softmax's key-bias gradient is exactly 0)
    for a, b in zip(gf, gs, strict=True):
        assert (a - b).norm() <= 1e-9 * (b.norm() + 1e-6)


@pytest.mark.parametrize("name", MAPS)
def test_padded_batch_equals_each_sequence_alone(name):
    m = KernelAttention(16, 2, name, n_features=32, generator=1)
    lengths = [7, 3, 1]
    x = torch.randn(3, 7, 16, generator=_gen(2))
    mask = _mask(3, 7, lengths)
    x = torch.where(mask[..., None], x, torch.full_like(x, 50.0))  # loud padding
    out = m(x, mask)
    for i, n in enumerate(lengths):
        alone = m(x[i : i + 1, :n])
        assert rel_err(out[i, :n], alone[0]) < 1e-5, (name, i)


def test_module_feature_is_the_core_map_and_queries_are_scaled():
    m = KernelAttention(32, 4, "favor", n_features=8, generator=0)
    x = torch.randn(2, 5, 32, generator=_gen(1))
    q = m.queries(x)
    assert q.shape == (2, 4, 5, 8)
    expected = m.q_proj(x).view(2, 5, 4, 8).transpose(1, 2) * 8**-0.25
    assert torch.allclose(q, expected)
    u = torch.randn(3, 8, generator=_gen(2))
    assert torch.equal(m.feature(u, m.omega[0]), features.positive(u, m.omega[0]))
    assert m.has_features
    assert not KernelAttention(32, 4, "elu").has_features
    with pytest.raises(ValueError, match="no feature map"):
        KernelAttention(32, 4, "softmax").feature(u, m.omega[0])


def test_tie_qk_shares_the_projection():
    m = KernelAttention(16, 2, "softmax_feat", tie_qk=True, generator=0)
    assert m.k_proj is m.q_proj
    n_tied = sum(p.numel() for p in m.parameters())
    n_free = sum(p.numel() for p in KernelAttention(16, 2, "softmax_feat").parameters())
    assert n_free - n_tied == 16 * 16 + 16
    x = torch.randn(1, 6, 16, generator=_gen(1))
    phi = m.feature(m.queries(x), m.omega[0])[0, 0]
    kernel = phi @ phi.T  # symmetric PSD token kernel
    assert torch.allclose(kernel, kernel.T)
    assert torch.linalg.eigvalsh(kernel.double()).min() > -1e-6


def test_omega_is_a_saved_buffer_changed_only_explicitly():
    m = KernelAttention(16, 2, "favor", n_features=8, generator=0)
    assert "omega" in m.state_dict() and "omega" not in dict(m.named_parameters())
    before = m.omega.clone()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(2, 5, 16, generator=_gen(1))
    for mode in (m.train, m.eval):
        mode()
        m(x).square().sum().backward()
        opt.step()
    assert torch.equal(m.omega, before)
    # Same seed -> same omega; redraw changes it; load_features_ sets it.
    assert torch.equal(KernelAttention(16, 2, "favor", n_features=8, generator=0).omega, before)
    m.redraw_(torch.Generator().manual_seed(9))
    assert not torch.equal(m.omega, before)
    new = torch.randn(8, 8, generator=_gen(4))
    m.load_features_(new)
    assert torch.equal(m.omega[0], new)
    # state_dict round trip reproduces the outputs exactly.
    m2 = KernelAttention(16, 2, "favor", n_features=8, generator=123)
    m2.load_state_dict(m.state_dict())
    m.eval()
    m2.eval()
    assert torch.equal(m(x), m2(x))
    with pytest.raises(ValueError, match="shape"):
        m.load_features_(torch.randn(7, 8))
    with pytest.raises(ValueError, match="no particles"):
        KernelAttention(16, 2, "elu").redraw_(0)


def test_per_head_omega_draws_are_independent():
    m = KernelAttention(16, 4, "porf_softplus", n_features=8, share_features=False, generator=0)
    assert m.omega.shape == (4, 8, 4)
    assert not torch.equal(m.omega[0], m.omega[1])
    assert KernelAttention(16, 4, "elu").omega.shape == (1, 0, 4)


@pytest.mark.parametrize("name", MAPS)
def test_autocast_bf16_is_close_to_float32_and_finite(name):
    m = KernelAttention(32, 4, name, n_features=32, generator=0)
    x = torch.randn(2, 12, 32, generator=_gen(1))
    mask = _mask(2, 12, [12, 8])
    ref = m(x, mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = m(x, mask)
        big = m(40.0 * x, mask)  # large norms: logits of hundreds
    assert low.dtype == torch.bfloat16
    assert rel_err(low.float()[mask], ref[mask]) < 0.05
    assert torch.isfinite(big.float()).all()


def test_module_large_norm_inputs_stay_finite_fp16_and_fp32():
    m = KernelAttention(32, 4, "favor", n_features=64, generator=0)
    x = (40.0 * torch.randn(2, 12, 32, generator=_gen(1))).requires_grad_()
    out = m(x)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    mh = KernelAttention(32, 4, "favor", n_features=64, generator=0).half()
    assert torch.isfinite(mh(x.detach().half())).all()


def test_module_bad_inputs():
    with pytest.raises(ValueError, match="divisible"):
        KernelAttention(10, 3)
    with pytest.raises(ValueError, match="valid: .*favor.*softmax"):
        KernelAttention(16, 2, "performer")
    with pytest.raises(ValueError, match="n_features"):
        KernelAttention(16, 2, n_features=0)
    with pytest.raises(ValueError, match="n_features"):
        KernelAttention(16, 2, n_features=-3)
    with pytest.raises(TypeError, match="n_features"):
        KernelAttention(16, 2, n_features="64")
    with pytest.raises(ValueError, match="dropout"):
        KernelAttention(16, 2, dropout=1.5)
    m = KernelAttention(16, 2, generator=0)
    with pytest.raises(ValueError, match=r"\(B, T, 16\)"):
        m(torch.randn(2, 5, 15))
    with pytest.raises(ValueError, match=r"\(B, T, 16\)"):
        m(torch.randn(5, 16))
    with pytest.raises(ValueError, match="mask"):
        m(torch.randn(2, 5, 16), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool"):
        m(torch.randn(2, 5, 16), torch.ones(2, 5))


@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_causal_linear_attention_matches_naive(chunk):
    q, k, v = _qkv(T=13, S=13, seed=21)
    pq, pk = (torch.nn.functional.softplus(t).detach().requires_grad_() for t in (q, k))
    mask = _mask(2, 13, [13, 9])
    mask[1, :3] = False  # leading padding: rows 0..2 of sequence 1 have no key (output 0)
    fast = AF.causal_linear_attention(pq, pk, v, mask, chunk_size=chunk)
    slow = AF.naive_linear_attention(pq, pk, v, mask, causal=True)
    assert rel_err(fast, slow) < 1e-12
    assert torch.equal(fast[1, :, :3], torch.zeros_like(fast[1, :, :3]))
    for a, b in zip(_grads(fast, (pq, pk, v)), _grads(slow, (pq, pk, v)), strict=True):
        assert rel_err(a, b) < 1e-10
    # The last position sees every key: the causal output there is the non-causal one.
    full = AF.linear_attention(pq, pk, v, mask)
    assert rel_err(fast[0, :, -1], full[0, :, -1]) < 1e-12


@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_causal_favor_matches_naive(groups, chunk):
    q, k, v = _qkv(T=13, S=13, seed=22)
    omega = torch.randn(groups, 16, 8, generator=_gen(5), dtype=torch.float64)
    omega.requires_grad_()
    mask = _mask(2, 13, [13, 6])
    fast = AF.causal_favor_attention(q, k, v, omega, mask, chunk_size=chunk, order=LIN)
    slow = AF.naive_favor_attention(q, k, v, omega, mask, causal=True)
    assert rel_err(fast, slow) < 1e-12
    ga, gb = _grads(fast, (q, k, v, omega)), _grads(slow, (q, k, v, omega))
    for a, b in zip(ga, gb, strict=True):
        assert rel_err(a, b) < 1e-10


def test_causal_favor_online_shift_survives_large_norms():
    """Keys whose norms shrink along the sequence (early logits ~ -100 below the late ones):
    with one global key shift (the naive twin) the early prefixes underflow to 0 in float32;
    the online per-block shift matches the exact FAVOR+ estimate, computed in log space."""
    d, L = 8, 24
    q, k, v = _qkv(B=1, H=1, T=L, S=L, d=d, seed=23, dtype=torch.float32)
    growth = torch.linspace(6.0, 0.5, L)[None, None, :, None]
    q, k, v = (q * growth).detach(), (k * growth).detach(), v.detach()
    omega = torch.randn(1, 32, d, generator=_gen(7))
    fast = AF.causal_favor_attention(q, k, v, omega, chunk_size=4, order=LIN)
    b = features.log_positive(q.double(), omega[0].double())  # (1, 1, L, M)
    a = features.log_positive(k.double(), omega[0].double())
    log_k = torch.logsumexp(b[..., :, None, :] + a[..., None, :, :], -1)  # (1, 1, L, L)
    future = torch.ones(L, L, dtype=torch.bool).triu(1)
    exact = torch.softmax(log_k.masked_fill(future, -math.inf), -1) @ v.double()
    assert torch.isfinite(fast).all()
    assert rel_err(fast.double(), exact) < 1e-4
    naive32 = AF.naive_favor_attention(q, k, v, omega, causal=True)
    assert rel_err(naive32.double(), exact) > 0.1  # what the online shift avoids


def test_causal_softmax_reference_and_sdpa_agree():
    q, k, v = _qkv(T=9, S=9, seed=24)
    mask = _mask(2, 9, [9, 5])
    ref = AF.softmax_attention(q, k, v, mask, causal=True)
    m = KernelAttention(8 * 3, 3, "softmax", causal=True)
    assert rel_err(m.attend(q, k, v, mask), ref) < 1e-12
    # the first position attends only to itself
    assert rel_err(ref[:, :, 0], v[:, :, 0]) < 1e-12
    lead = mask.clone()
    lead[1, :2] = False  # rows before the first real key: output 0, not NaN
    out = m.attend(q, k, v, lead)
    assert torch.isfinite(out).all() and torch.equal(out[1, :, :2], torch.zeros_like(out[1, :, :2]))


@pytest.mark.parametrize("name", MAPS)
def test_causal_module_never_sees_the_future(name):
    m = KernelAttention(16, 2, name, n_features=32, generator=1, causal=True, chunk_size=3)
    x = torch.randn(2, 10, 16, generator=_gen(3))
    out = m(x)
    x2 = x.clone()
    x2[:, 6:] = torch.randn(2, 4, 16, generator=_gen(4)) * 5.0
    out2 = m(x2)
    assert rel_err(out2[:, :6], out[:, :6]) < 1e-5
    assert rel_err(out2[:, 6:], out[:, 6:]) > 1e-2
    # right padding changes nothing; each prefix equals the sequence cut there
    mask = _mask(2, 10, [10, 4])
    padded = m(x, mask)
    assert rel_err(padded[1, :4], m(x[1:2, :4])[0]) < 1e-5
    assert rel_err(padded[0], out[0]) < 1e-5
    assert "causal=True" in repr(m)


def test_causal_favor_approximates_causal_softmax_better_with_more_features():
    d = 16
    q, k, v = _qkv(B=1, H=2, T=32, S=32, d=d, e=8, seed=25, scale=d**-0.5)
    exact = AF.softmax_attention(q, k, v, causal=True)
    errs = []
    for M in (16, 1024):
        e = [rel_err(AF.causal_favor_attention(q, k, v, features.orthogonal(
            M, d, generator=_gen(100 + s), dtype=torch.float64)[None]), exact)
            for s in range(4)]
        errs.append(sum(e) / len(e))
    assert errs[1] < errs[0] / 3 and errs[1] < 0.1, errs


def test_causal_bad_inputs():
    q, k, v = _qkv(T=5, S=6)
    omega = torch.randn(1, 4, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="as many queries as keys"):
        AF.causal_favor_attention(q, k, v, omega)
    with pytest.raises(ValueError, match="as many queries as keys"):
        AF.softmax_attention(q, k, v, causal=True)
    with pytest.raises(ValueError, match="chunk_size"):
        AF.causal_linear_attention(v, v, v, chunk_size=0)
    with pytest.raises(TypeError, match="causal"):
        KernelAttention(8, 2, causal="yes")


# ----------------------------------------------------------------------------- association order


ORDERS = ("quadratic", "linear", "chunked")


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_both_orders_match_naive_outputs_and_grads(order, groups, dtype):
    """Quadratic ``(phi(Q) phi(K)^T) V`` and linear ``phi(Q) (phi(K)^T V)`` both equal the
    naive twin (outputs and gradients of q, k, v, omega), with a padding mask."""
    tol_out, tol_grad = (1e-12, 1e-10) if dtype == torch.float64 else (2e-6, 2e-5)
    q, k, v = _qkv(seed=31 + groups, dtype=dtype)
    omega = torch.randn(groups, 16, 8, generator=_gen(5), dtype=dtype).requires_grad_()
    mask = _mask(2, 13, [13, 5])
    fast = AF.favor_attention(q, k, v, omega, mask, order=order)
    slow = AF.naive_favor_attention(*(t.double() for t in (q, k, v, omega)), mask)
    assert fast.dtype == dtype
    assert rel_err(fast, slow) < tol_out
    ref = AF.naive_favor_attention(q, k, v, omega, mask)
    for a, b in zip(_grads(fast, (q, k, v, omega)), _grads(ref, (q, k, v, omega)), strict=True):
        assert rel_err(a, b) < tol_grad
    # The padded keys are ignored: changing them changes nothing.
    k2 = k.detach().clone()
    k2[1, :, 5:] = 7.0
    out2 = AF.favor_attention(q, k2, v, omega, mask, order=order)
    assert rel_err(out2, fast) < tol_out


@pytest.mark.parametrize("groups", [1, 3])
def test_quadratic_causal_matches_naive_with_leading_padding(groups):
    q, k, v = _qkv(T=13, S=13, seed=41)
    omega = torch.randn(groups, 16, 8, generator=_gen(5), dtype=torch.float64)
    omega.requires_grad_()
    mask = _mask(2, 13, [13, 9])
    mask[1, :3] = False  # rows 0..2 of sequence 1 see no key: output 0
    fast = AF.causal_favor_attention(q, k, v, omega, mask, order="quadratic")
    slow = AF.naive_favor_attention(q, k, v, omega, mask, causal=True)
    assert rel_err(fast, slow) < 1e-12
    assert torch.equal(fast[1, :, :3], torch.zeros_like(fast[1, :, :3]))
    ga, gb = _grads(fast, (q, k, v, omega)), _grads(slow, (q, k, v, omega))
    for a, b in zip(ga, gb, strict=True):
        assert torch.isfinite(a).all()
        assert rel_err(a, b) < 1e-10


@pytest.mark.parametrize("causal", [False, True])
def test_quadratic_order_gradcheck(causal):
    q, k, v = _qkv(B=1, H=2, T=4, S=4, d=3, e=2)
    omega = torch.randn(2, 5, 3, generator=_gen(2), dtype=torch.float64, requires_grad=True)
    mask = _mask(1, 4, [3])
    fn = AF.causal_favor_attention if causal else AF.favor_attention
    assert torch.autograd.gradcheck(lambda *t: fn(*t, mask, order="quadratic"),
                                    (q, k, v, omega))


def test_quadratic_causal_falls_back_where_a_prefix_underflows(monkeypatch):
    """Norms shrinking along the sequence: the per-feature key max is set by the late keys and
    the early prefixes underflow in the quadratic order; it must hand over to the blocks with
    the online shift and still match the exact estimate."""
    from coulomb_attention.nn.ops import quadratic as QU

    results = []
    real = QU._FavorQuadFn.apply

    def spy(*a):
        out, ok = real(*a)
        results.append(bool(ok))
        return out, ok

    monkeypatch.setattr(QU._FavorQuadFn, "apply", spy)
    d, L = 8, 24
    q, k, v = _qkv(B=1, H=1, T=L, S=L, d=d, seed=23, dtype=torch.float32)
    growth = torch.linspace(6.0, 0.5, L)[None, None, :, None]
    q, k, v = (q * growth).detach(), (k * growth).detach(), v.detach()
    omega = torch.randn(1, 32, d, generator=_gen(7))
    out = AF.causal_favor_attention(q, k, v, omega, chunk_size=4, order="quadratic")
    assert results == [False]  # tried, underflowed, fell back to blocks of 4
    ref = AF.causal_favor_attention(q, k, v, omega, chunk_size=4, order="linear")
    assert rel_err(out, ref) < 1e-5
    # At ordinary norms the quadratic order is used as is.
    AF.causal_favor_attention(q / growth, k / growth, v, omega, order="quadratic")
    assert results == [False, True]


@pytest.mark.parametrize("order", ORDERS)
def test_both_orders_exact_at_large_norms_and_empty_rows(order):
    q, k, v = _qkv(scale=30.0, dtype=torch.float32)
    omega = features.orthogonal(64, 8, generator=_gen(1))[None]
    mask = _mask(2, 13, [13, 4])
    out = AF.favor_attention(q, k, v, omega, mask, order=order)
    assert rel_err(out, _favor_log_domain(q, k, v, omega, mask)) < 1e-4
    assert all(torch.isfinite(g).all() for g in _grads(out, (q, k, v)))
    empty = _mask(2, 13, [13, 0])
    out = AF.favor_attention(q / 30, k / 30, v, omega, empty, order=order)
    assert out[1].abs().max() == 0 and out[0].abs().max() > 0
    assert all(torch.isfinite(g).all() for g in _grads(out, (q, k, v)))


def test_order_is_picked_by_cost_and_overridable(monkeypatch):
    from coulomb_attention.nn.ops import favor as FV

    calls = []
    real_quad, real_lin = FV.favor_attention_quadratic, FV._FavorFn.apply
    real_short = FV.favor_attention_linear_short
    monkeypatch.setattr(FV, "favor_attention_quadratic",
                        lambda *a, **kw: calls.append("quadratic") or real_quad(*a, **kw))
    monkeypatch.setattr(FV, "favor_attention_linear_short",
                        lambda *a, **kw: calls.append("unchunked") or real_short(*a, **kw))
    monkeypatch.setattr(FV._FavorFn, "apply", lambda *a: calls.append("chunked") or real_lin(*a))
    omega = torch.randn(1, 16, 8, generator=_gen(5), dtype=torch.float64)

    def run(T, **kw):
        calls.clear()
        q, k, v = _qkv(B=1, H=1, T=T, S=T, e=8)
        out = AF.favor_attention(q, k, v, omega, **kw)
        assert rel_err(out, AF.naive_favor_attention(q, k, v, omega)) < 1e-12
        return calls[-1]

    M, e = 16, 8
    # unchunked linear order (small features): T S (M + e) <= (T + S) M (e + 1), no overhead
    L_cross = 2 * AF.UNCHUNKED_COST_RATIO * M * (e + 1) / (M + e)
    short, long = int(L_cross) // 2, int(L_cross) * 2
    assert AF.linear_is_unchunked(long, long, M)
    assert AF.quadratic_is_cheaper(short, short, M, e)
    assert not AF.quadratic_is_cheaper(long, long, M, e)
    assert run(short) == "quadratic" and run(long) == "unchunked"
    assert run(short, order="linear") == "unchunked"
    assert run(short, order="chunked") == "chunked"
    assert run(long, order="quadratic") == "quadratic"
    # the features too large to keep: the chunked path, with its own measured constants
    monkeypatch.setattr(FV, "UNCHUNKED_MAX_FEATURES", 0)
    assert not AF.linear_is_unchunked(short, short, M)
    assert run(long, order="linear") == "chunked"
    monkeypatch.setattr(FV, "LINEAR_OVERHEAD", 0.0)
    r = AF.QUADRATIC_COST_RATIO
    L_cross = 2 * r * M * (e + 1) / (M + e)  # T = S: quadratic up to this length
    short, long = int(L_cross) // 2, int(L_cross) * 2
    assert AF.quadratic_is_cheaper(short, short, M, e)
    assert not AF.quadratic_is_cheaper(long, long, M, e)
    assert run(short) == "quadratic" and run(long) == "chunked"
    monkeypatch.setattr(FV, "QUADRATIC_COST_RATIO", 1e-9)  # the measured constant moves it
    assert run(short) == "chunked"
    assert AF.quadratic_is_cheaper(long, long, M, e, ratio=1e9)
    assert AF.quadratic_is_cheaper(long, long, M, e, overhead=1e12)
    # more groups: the fixed overhead of the chunked order weighs less
    assert not FV.quadratic_is_cheaper(64, 64, M, e, groups=1000, ratio=1.0, overhead=1e7)
    assert FV.quadratic_is_cheaper(64, 64, M, e, groups=1, ratio=1.0, overhead=1e7)
    # causal: the linear order is always chunked
    assert not AF.linear_is_unchunked(4, 4, M, causal=True)
    with pytest.raises(ValueError, match="order must be one of auto, quadratic, linear, chunked"):
        AF.favor_attention(*_qkv(), omega, order="fast")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("share", [True, False])
def test_module_order_option_gives_the_same_layer(causal, share):
    m = KernelAttention(24, 3, "favor", n_features=16, share_features=share, generator=7,
                        causal=causal, chunk_size=4).double()
    x = torch.randn(2, 9, 24, generator=_gen(3), dtype=torch.float64, requires_grad=True)
    mask = _mask(2, 9, [9, 5])
    outs, grads = [], []
    for order in ("quadratic", "linear", "chunked", "auto"):
        m.order = order
        out = m(x, mask)
        outs.append(out)
        grads.append(_grads(out * mask[..., None], [x, *m.parameters()]))
    for o, g in zip(outs[1:], grads[1:], strict=True):
        assert rel_err(o[mask], outs[0][mask]) < 1e-12
        for a, b in zip(g, grads[0], strict=True):
            assert (a - b).norm() <= 1e-10 * (b.norm() + 1e-6)
    m.order = "fast"
    with pytest.raises(ValueError, match="order"):
        m(x, mask)


def test_causal_favor_gradients_stay_finite_where_a_row_normaliser_is_denormal(monkeypatch):
    """A sequence captured from MQAR training (FAVOR+, M = 8, d_head = 64, L = 80) where a key
    feature's block max came from a key after the row: with the query shift by the block max
    alone (``_ROW_CAP = 0``, the old rule) a row's normaliser was denormal and the backward
    gave NaN gradients; the prefix-max shift keeps them finite and, for k and v, equal to the
    float64 twin (row 0's only key lies > 87 below its features' block max: float32 loses that
    row, the documented limit of the block shift, so dq, ~1e-9 here, is only checked
    absolutely)."""
    from pathlib import Path

    from safetensors.torch import load_file

    from coulomb_attention.nn.ops import causal as CA

    t = load_file(str(Path(__file__).parents[1] / "data" / "causal_favor_denormal_row.safetensors"))

    def grads():
        q, k, v = (t[x].clone().requires_grad_() for x in "qkv")
        AF.causal_favor_attention(q, k, v, t["omega"], order="linear").backward(t["g"])
        return q.grad, k.grad, v.grad

    monkeypatch.setattr(CA, "_ROW_CAP", 0.0)
    assert not all(bool(torch.isfinite(g).all()) for g in grads())  # the old rule: NaN
    monkeypatch.undo()
    fast = grads()
    q, k, v = (t[x].double().requires_grad_() for x in "qkv")
    AF.naive_favor_attention(q, k, v, t["omega"].double(), causal=True).backward(
        t["g"].double())
    assert all(bool(torch.isfinite(g).all()) for g in fast)
    assert rel_err(fast[1].double(), k.grad) < 1e-4 and rel_err(fast[2].double(), v.grad) < 1e-4
    assert float((fast[0].double() - q.grad).abs().max()) < 1e-5 * float(k.grad.abs().max())


@pytest.mark.parametrize("groups", [1, 3])
def test_blocked_inference_favor_matches_naive(monkeypatch, groups):
    """The blocked CPU inference path (one head and a few sequences per block, views of
    token-major inputs) equals the naive twin, padding and a sequence without keys included,
    and ``favor_attention`` takes it only without autograd and above one block of features."""
    from coulomb_attention.nn.ops import favor as FV

    B, H, T, d = 5, 3, 7, 8
    g = _gen(3)
    x = [torch.randn(B, T, H * d, generator=g, dtype=torch.float64) for _ in range(3)]
    q, k, v = (t.view(B, T, H, d).transpose(1, 2) for t in x)  # token-major, as from a Linear
    omega = torch.randn(groups, 6, d, generator=g, dtype=torch.float64)
    mask = _mask(B, T, [7, 4, 1, 0, 6])  # the fourth sequence has no real key
    ref = AF.naive_favor_attention(q, k, v, omega, mask)
    assert float(ref[3].abs().max()) == 0.0
    for block in (1, 2 * T * 6, 3 * T * 6 + 5, 1 << 30):  # one sequence, 2, 3 (uneven), all
        monkeypatch.setattr(FV, "BLOCK_ELEMENTS", block)
        out = FV.favor_attention_blocked(q, k, v, omega, mask)
        assert rel_err(out, ref) < 1e-12, block
        assert out.transpose(1, 2).is_contiguous()  # token-major: the module's reshape is free
    monkeypatch.setattr(FV, "BLOCK_ELEMENTS", 2 * T * 6)
    assert FV.use_blocked_inference(q, k, v, omega)
    with torch.no_grad():
        assert rel_err(AF.favor_attention(q, k, v, omega, mask, order="linear"), ref) < 1e-12
    qg = q.detach().requires_grad_()
    assert not FV.use_blocked_inference(qg, k, v, omega)  # autograd: the batched pass
    assert FV.use_blocked_inference(qg.detach(), k, v, omega)
    monkeypatch.setattr(FV, "BLOCK_ELEMENTS", B * H * 2 * T * 6)  # everything fits one block
    assert not FV.use_blocked_inference(q, k, v, omega)


def test_trainable_omega_makes_omega_a_parameter_inside_and_a_buffer_after():
    from coulomb_attention.nn import trainable_omega

    torch.manual_seed(0)
    net = torch.nn.Sequential(KernelAttention(8, 2, "favor", 6),
                              KernelAttention(8, 2, "elu", 6))  # elu: no particles
    names = set(net.state_dict())
    x = torch.randn(2, 5, 8)
    w0 = net[0].omega.clone()
    with trainable_omega(net) as layers:
        assert layers == [net[0]]
        assert isinstance(net[0].omega, torch.nn.Parameter)
        assert "0.omega" in dict(net.named_parameters())
        net(x).pow(2).sum().backward()
        g = net[0].omega.grad
        assert g is not None and g.abs().sum() > 0  # the task gradient reaches omega
        with torch.no_grad():
            net[0].omega -= 0.1 * g
        with pytest.raises(RuntimeError, match="already trainable"):
            with trainable_omega(net):
                pass
    assert "0.omega" not in dict(net.named_parameters())
    assert "0.omega" in dict(net.named_buffers()) and not net[0].omega.requires_grad
    assert not torch.equal(net[0].omega, w0) and set(net.state_dict()) == names
    with pytest.raises(TypeError, match="nn.Module"):
        with trainable_omega("net"):
            pass

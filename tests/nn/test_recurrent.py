"""The recurrent interface of causal attention (nn/ops/causal.py, nn/ops/streaming.py,
KernelAttention's state): the chunked parallel form equals token-by-token steps and a prefill
followed by steps, against the naive recurrent and quadratic twins, for every map attention
supports, with grouped key/value heads and a position hook."""

from __future__ import annotations

import math

import pytest
import torch

from coulomb_attention import features
from coulomb_attention.nn import ATTENTION_FEATURES, KernelAttention
from coulomb_attention.nn import functional as AF
from helpers import rel_err

MAPS = sorted(ATTENTION_FEATURES)  # every kind the layer supports, softmax and none included


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _rotary(u: torch.Tensor, start: int) -> torch.Tensor:
    """A rotary position hook (rotate-half convention, theta 1e4) for the tests."""
    d, L = u.shape[-1], u.shape[-2]
    inv = 1e4 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(start, start + L, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(u), torch.cat([ang.sin()] * 2, -1).to(u)
    x1, x2 = u[..., : d // 2], u[..., d // 2:]
    return u * cos + torch.cat([-x2, x1], -1) * sin


def _layer(name, kv_heads=2, window=None, sinks=0, share=False, dtype=torch.float64):
    torch.manual_seed(0)
    layer = KernelAttention(32, 4, name, n_features=16, causal=True, kv_heads=kv_heads,
                            share_features=share, generator=3, position=_rotary,
                            chunk_size=5).to(dtype)
    if window is not None:
        layer.set_window_(window, sinks=sinks)
        layer.window_logit.uniform_(-1.0, 1.0)
    return layer.eval()


def _steps(layer, x, prefill=0):
    """The layer run as a prefill of ``prefill`` tokens then one token at a time."""
    outs, state = [], None
    if prefill:
        out, state = layer(x[:, :prefill], output_state=True)
        outs.append(out)
    for t in range(prefill, x.shape[1]):
        out, state = layer.step(x[:, t:t + 1], state)
        outs.append(out)
    return torch.cat(outs, 1), state


@pytest.mark.parametrize("name", MAPS)
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_steps_equal_the_parallel_forward(name, kv_heads):
    """Every map: forward over 23 tokens == 23 steps == prefill 9 + 14 steps (float64)."""
    layer = _layer(name, kv_heads=kv_heads)
    x = torch.randn(2, 23, 32, generator=_gen(1), dtype=torch.float64)
    ref = layer(x)
    for prefill in (0, 9):
        out, state = _steps(layer, x, prefill)
        assert rel_err(out, ref) < 1e-10, (name, prefill)
        assert state.position == 23


@pytest.mark.parametrize("name", ["favor", "hedgehog", "softmax_feat", "porf_softplus"])
@pytest.mark.parametrize("sinks", [0, 3])
def test_hybrid_steps_equal_the_parallel_forward(name, sinks):
    """Window + sinks + linear rest: chunked prefill, steps and prefill+steps agree with the
    naive twin (L x L masks, unshifted features)."""
    layer = _layer(name, kv_heads=2, window=4, sinks=sinks)
    x = torch.randn(2, 19, 32, generator=_gen(2), dtype=torch.float64)
    ref = layer(x)
    for prefill in (0, 1, 6):
        out, _ = _steps(layer, x, prefill)
        assert rel_err(out, ref) < 1e-10, (name, sinks, prefill)
    q, k, v = layer.queries(x), layer.keys(x), layer.values(x)
    gamma = torch.sigmoid(layer.window_logit)
    kw = {"omega": layer.omega} if name == "favor" else {"phi": layer._phi}
    naive = AF.naive_streaming_attention(q, k, v, gamma, 4, sinks, **kw)
    attn = layer.attend(q, k, v)
    assert rel_err(attn, naive) < 1e-10


def test_streaming_without_sinks_is_the_window_hybrid():
    """With S = 0 the streaming op is the causal hybrid of nn/ops/window.py (same heads)."""
    layer = _layer("favor", kv_heads=4, window=6)
    x = torch.randn(2, 21, 32, generator=_gen(4), dtype=torch.float64)
    q, k, v = layer.queries(x), layer.keys(x), layer.values(x)
    window = layer.attend(q, k, v)  # nn/ops/window.py (no sinks, no groups)
    streaming, _ = layer._attend_state(q, k, v, None)
    assert rel_err(streaming, window) < 1e-10


def test_streamingllm_row_is_window_and_sinks_alone():
    """linear=False: exact softmax over the sinks and the window, nothing else."""
    layer = _layer("favor", kv_heads=2, window=5)
    layer.set_window_(5, linear=False, sinks=2)
    x = torch.randn(1, 17, 32, generator=_gen(5), dtype=torch.float64)
    q, k, v = layer.queries(x), layer.keys(x), layer.values(x)
    L = 17
    t, s = torch.arange(L)[:, None], torch.arange(L)[None]
    allowed = (s <= t) & ((s < 2) | (s > t - 5))
    logits = q @ k.repeat_interleave(2, 1).transpose(-1, -2)
    ref = torch.softmax(logits.masked_fill(~allowed, -math.inf), -1) @ v.repeat_interleave(2, 1)
    assert rel_err(layer.attend(q, k, v), ref) < 1e-12
    out, _ = _steps(layer, x, 7)
    assert rel_err(out, layer(x)) < 1e-12


@pytest.mark.parametrize("name", ["favor", "hedgehog", "elu"])
def test_ops_state_matches_naive_recurrence(name):
    """causal ops with an initial state == the naive token loop continuing the same state
    (grouped heads: H = 4 queries, Hk = 2)."""
    layer = _layer(name, kv_heads=2)
    x = torch.randn(2, 15, 32, generator=_gen(6), dtype=torch.float64)
    q, k, v = layer.queries(x), layer.keys(x), layer.values(x)
    if name == "favor":
        om_q = layer.omega.repeat_interleave(2, 0)
        pq = torch.stack([features.positive(q[:, h], om_q[h]) for h in range(4)], 1)
        pk = torch.stack([features.positive(k[:, h], layer.omega[h]) for h in range(2)], 1)
        o1, st = AF.causal_favor_attention(q[:, :, :6], k[:, :, :6], v[:, :, :6],
                                           layer.omega, output_final_state=True, chunk_size=4)
        o2, st = AF.causal_favor_attention(q[:, :, 6:], k[:, :, 6:], v[:, :, 6:],
                                           layer.omega, initial_state=st,
                                           output_final_state=True, chunk_size=4)
    else:
        pq, pk = layer._phi(q), layer._phi(k)
        o1, st = AF.causal_linear_attention(pq[:, :, :6], pk[:, :, :6], v[:, :, :6],
                                            output_final_state=True, chunk_size=4)
        o2, st = AF.causal_linear_attention(pq[:, :, 6:], pk[:, :, 6:], v[:, :, 6:],
                                            initial_state=st, output_final_state=True)
    ref, (S, z) = AF.naive_recurrent_attention(pq, pk, v)
    assert rel_err(torch.cat([o1, o2], 2), ref) < 1e-10
    # the state itself: FAVOR+'s is kept scaled by exp(-shift) (and the features' 1/sqrt(M)
    # each, the 1/M of the products, is left to the queries' side): undo both
    kv = st.kv if st.shift is None else st.kv * st.shift.exp()[..., None] / math.sqrt(16)
    assert rel_err(kv[..., :-1], S) < 1e-10 and rel_err(kv[..., -1], z) < 1e-10


def test_favor_running_max_grows_exactly_in_float32():
    """Keys whose norms grow along the sequence: the running key max is raised at almost
    every step; float32 steps after a prefill equal the chunked form and the exact FAVOR+
    estimate (log space, float64) to 1e-5."""
    d, L = 8, 40
    g = _gen(7)
    q = torch.randn(1, 2, L, d, generator=g)
    # keys along one direction with a growing norm: feature m's logit s (w_m . u) - s^2 / 2
    # rises while s < w_m . u, so the running max keeps being raised
    u = torch.randn(d, generator=g)
    u = u / u.norm()
    growth = torch.linspace(0.1, 3.0, L)[None, None, :, None]
    k = growth * u + 0.05 * torch.randn(1, 1, L, d, generator=g)
    v = torch.randn(1, 1, L, 4, generator=g)
    omega = torch.randn(1, 32, d, generator=g)
    chunked = AF.causal_favor_attention(q, k, v, omega, chunk_size=8, order="chunked")
    out, st = AF.causal_favor_attention(q[:, :, :10], k[:, :, :10], v[:, :, :10], omega,
                                        output_final_state=True)
    outs = [out]
    shifts = [st.shift.clone()]
    for t in range(10, L):
        o, st = AF.causal_favor_step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1],
                                     omega, st)
        outs.append(o)
        shifts.append(st.shift.clone())
    steps = torch.cat(outs, 2)
    b = features.log_positive(q.double(), omega[0].double())
    a = features.log_positive(k.double(), omega[0].double())
    log_k = torch.logsumexp(b[..., :, None, :] + a[..., None, :, :], -1)  # (1, 2, L, L)
    future = torch.ones(L, L, dtype=torch.bool).triu(1)
    exact = torch.softmax(log_k.masked_fill(future, -math.inf), -1) @ v.double()
    assert torch.isfinite(steps).all()
    assert rel_err(steps, chunked) < 1e-5
    assert rel_err(steps, exact) < 1e-5
    raised = sum(bool((s1 > s0).any()) for s0, s1 in zip(shifts, shifts[1:], strict=False))
    assert raised >= 5  # the shift really moved during decoding (11 of 30 steps here)
    assert torch.allclose(shifts[-1].double(), a.amax(-2), atol=1e-5)


@pytest.mark.parametrize("name,window", [("favor", None), ("hedgehog", None), ("favor", 4),
                                         ("softmax", None)])
def test_state_size_does_not_grow_with_context(name, window):
    """The linear rows' state has the same bytes after 12 and after 60 tokens; exact softmax's
    KV cache grows by 5x."""
    layer = _layer(name, kv_heads=2, window=window, sinks=2 if window else 0)
    x = torch.randn(1, 60, 32, generator=_gen(8), dtype=torch.float64)
    _, short = layer(x[:, :12], output_state=True)
    _, long = layer(x, output_state=True)
    if name == "softmax":
        assert long.nbytes() == 5 * short.nbytes()
    else:
        assert long.nbytes() == short.nbytes() > 0


def test_recurrent_interface_rejects_bad_use():
    layer = _layer("favor")
    x = torch.randn(1, 3, 32, dtype=torch.float64)
    with pytest.raises(ValueError, match="one token"):
        layer.step(x)
    with pytest.raises(ValueError, match="padding mask"):
        layer(x, torch.ones(1, 3, dtype=torch.bool), output_state=True)
    with pytest.raises(TypeError, match="DecodeState"):
        layer(x, state=(1, 2))
    enc = KernelAttention(32, 4, "favor", n_features=8)
    with pytest.raises(ValueError, match="causal"):
        enc(x.float(), output_state=True)
    with pytest.raises(ValueError, match="kv_heads"):
        KernelAttention(32, 4, "favor", kv_heads=3)
    with pytest.raises(ValueError, match="tie_qk"):
        KernelAttention(32, 4, "favor", kv_heads=2, tie_qk=True)
    with pytest.raises(ValueError, match="sinks"):
        _layer("favor").set_window_(4, sinks=-1)
    with pytest.raises(ValueError, match="causal"):
        KernelAttention(32, 4, "favor").set_window_(4, sinks=2)
    _, st = layer(x, output_state=True)
    with pytest.raises(ValueError, match="initial_state.kv"):
        AF.causal_favor_attention(*(torch.randn(2, 4, 1, 8) for _ in range(3)),
                                  layer.omega[:1].float(), initial_state=st.inner,
                                  output_final_state=True)


def test_grouped_heads_equal_repeated_heads():
    """kv_heads = 2 with share_features=False equals the 4-head layer whose key/value weights
    and particles are the groups' repeated (encoder and causal)."""
    for causal in (False, True):
        torch.manual_seed(0)
        g = KernelAttention(32, 4, "favor", n_features=8, kv_heads=2, share_features=False,
                            causal=causal, generator=1).double()
        full = KernelAttention(32, 4, "favor", n_features=8, share_features=False,
                               causal=causal, generator=1).double()
        with torch.no_grad():
            full.q_proj.load_state_dict(g.q_proj.state_dict())
            full.out_proj.load_state_dict(g.out_proj.state_dict())
            for a, b in ((full.k_proj, g.k_proj), (full.v_proj, g.v_proj)):
                a.weight.copy_(b.weight.view(2, 8, 32).repeat_interleave(2, 0).reshape(32, 32))
                a.bias.copy_(b.bias.view(2, 8).repeat_interleave(2, 0).reshape(32))
            full.load_features_(g.omega.repeat_interleave(2, 0))
        x = torch.randn(2, 9, 32, generator=_gen(9), dtype=torch.float64)
        assert rel_err(g(x), full(x)) < 1e-12


@pytest.mark.parametrize("name", ["favor", "hedgehog"])
@pytest.mark.parametrize("cuts", [(1, 3), (2, 9), (5, 6), (9, 16)])
def test_hybrid_blocks_after_a_state_equal_the_parallel_forward(name, cuts):
    """A prefill, then blocks (chunked, not token by token), then steps: the window of a
    block's first rows reaches into the ring buffer and the sinks (also before all sinks are
    seen), its delayed keys come from the ring buffer or the block."""
    layer = _layer(name, kv_heads=2, window=4, sinks=3)
    layer.chunk_size = 3  # blocks longer than a chunk
    x = torch.randn(2, 23, 32, generator=_gen(12), dtype=torch.float64)
    ref = layer(x)
    a, b = cuts
    out1, st = layer(x[:, :a], output_state=True)
    out2, st = layer(x[:, a:b], state=st, output_state=True)
    out3, st = layer(x[:, b:20], state=st, output_state=True)
    rest, st = _steps_from(layer, x, 20, st)
    assert rel_err(torch.cat([out1, out2, out3, rest], 1), ref) < 1e-10


def _steps_from(layer, x, start, state):
    outs = []
    for t in range(start, x.shape[1]):
        out, state = layer.step(x[:, t:t + 1], state)
        outs.append(out)
    return torch.cat(outs, 1), state


@pytest.mark.parametrize("favor", [True, False])
def test_one_position_scan_equals_the_block_scan(favor):
    """The decoding step's scan (:func:`_scan_one`, taken without a graph) equals the block
    scan at L = 1 (taken when an input needs a gradient), also for a padded key and the
    ``-inf`` running max of a state that has seen no key yet (FAVOR+)."""
    from coulomb_attention.nn.ops.causal import _scan

    g = _gen(11)
    B, hk, G, M, e = 2, 3, 2, 8, 5
    pq = torch.randn(B, hk, G, 1, M, generator=g, dtype=torch.float64)
    pk = torch.randn(B, hk, 1, 1, M, generator=g, dtype=torch.float64)
    v1 = torch.randn(B, hk, 1, 1, e + 1, generator=g, dtype=torch.float64)
    v1[..., -1] = 1.0  # [v, 1]
    kv = torch.randn(B, hk, 1, M, e + 1, generator=g, dtype=torch.float64).abs()
    c = None
    if favor:
        c = torch.randn(B, hk, 1, 1, M, generator=g, dtype=torch.float64)
        c[0] = -math.inf  # batch row 0: no key seen yet
        kv[0] = 0.0
        pk[1, 0] = -math.inf  # a padded key in batch row 1, head 0
        v1[1, 0] = 0.0
    else:
        pq, pk = pq.exp(), pk.exp()
    fast = _scan(pq, pk, v1, 128, kv, c)
    slow = _scan(pq.clone().requires_grad_(), pk, v1, 128, kv, c)
    for a, b in zip(fast, slow, strict=True):
        if a is None:
            assert b is None
            continue
        assert torch.equal(torch.isfinite(a), torch.isfinite(b))
        fin = torch.isfinite(a)
        assert torch.allclose(a[fin], b.detach()[fin], rtol=1e-12, atol=1e-12)
    assert torch.isfinite(fast[0]).all() and (fast[0][..., -1] >= 0).all()


@pytest.mark.parametrize("favor", [True, False])
def test_one_token_step_takes_non_contiguous_inputs(favor):
    """The plain decoding step (one position after a state, no gradient) on strided
    (non-contiguous) queries and keys gives the contiguous inputs' output and state."""
    g = _gen(13)
    B, H, hk, d, e, M = 2, 4, 2, 6, 5, 8

    def strided(*shape):  # every other element of the last axis: not contiguous
        return torch.randn(*shape[:-1], 2 * shape[-1], generator=g, dtype=torch.float64)[..., ::2]

    v = torch.randn(B, hk, 3, e, generator=g, dtype=torch.float64)
    if favor:
        q, k = strided(B, H, 3, d), strided(B, hk, 3, d)
        om = torch.randn(hk, M, d, generator=g, dtype=torch.float64)
        _, st = AF.causal_favor_attention(q[:, :, :2], k[:, :, :2], v[:, :, :2], om,
                                          output_final_state=True)
        step = lambda a, b: AF.causal_favor_step(a, b, v[:, :, 2:], om, st)  # noqa: E731
    else:
        q, k = strided(B, H, 3, M).abs(), strided(B, hk, 3, M).abs()
        _, st = AF.causal_linear_attention(q[:, :, :2], k[:, :, :2], v[:, :, :2],
                                           output_final_state=True)
        step = lambda a, b: AF.causal_linear_step(a, b, v[:, :, 2:], st)  # noqa: E731
    a, b = q[:, :, 2:], k[:, :, 2:]
    assert not (a.is_contiguous() or b.is_contiguous())
    (out, state), (ref, ref_state) = step(a, b), step(a.contiguous(), b.contiguous())
    assert torch.allclose(out, ref, rtol=1e-12, atol=1e-12)
    assert torch.allclose(state.kv, ref_state.kv, rtol=1e-12, atol=1e-12)
    full = (AF.causal_favor_attention(q, k, v, om) if favor
            else AF.causal_linear_attention(q, k, v))
    assert rel_err(out, full[:, :, 2:]) < 1e-10

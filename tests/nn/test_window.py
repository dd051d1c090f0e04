"""The sliding-window hybrid (nn.ops.window, KernelAttention(window=W)): the blocked fast path
against its naive quadratic twin (values and gradients, masks, padding, causal), the
mathematics of the form, and the layer's window weights."""

from __future__ import annotations

import math

import pytest
import torch

from coulomb_attention import features
from coulomb_attention.nn import functional as AF
from coulomb_attention.nn.attention import KernelAttention
from helpers import rel_err


def _inputs(B=2, H=3, L=21, d=4, M=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, d, generator=g, dtype=torch.float64).requires_grad_()
    k = torch.randn(B, H, L, d, generator=g, dtype=torch.float64).requires_grad_()
    v = torch.randn(B, H, L, 5, generator=g, dtype=torch.float64).requires_grad_()
    omega = torch.randn(M, d, generator=g, dtype=torch.float64).requires_grad_()
    gamma = torch.rand(H, generator=g, dtype=torch.float64).requires_grad_()
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[1, 13:] = False
    return q, k, v, omega, gamma, mask


def test_window_masks_count_the_neighbours():
    inside, rest = AF.window_masks(10, 4)
    assert int(inside[5].sum()) == 5 and bool(inside[5, 3:8].all())  # 2 each side + itself
    assert torch.equal(rest, ~inside)
    inside, rest = AF.window_masks(10, 4, causal=True)
    assert inside[6].nonzero().flatten().tolist() == [3, 4, 5, 6]  # the 4 most recent
    assert rest[6].nonzero().flatten().tolist() == [0, 1, 2]  # the past beyond them


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window,block", [(4, None), (6, 5), (2, 1), (40, None), (4, 7)])
@pytest.mark.parametrize("linear", [True, False])
def test_blocked_path_equals_the_naive_twin(causal, window, block, linear):
    """Values and gradients in q, k, v, omega and gamma, padded batch, every block shape; a
    window wider than the sequence included (then the window is everything)."""
    q, k, v, omega, gamma, mask = _inputs()
    pq, pk = features.softplus(q, omega), features.softplus(k, omega)
    args = (q, k, v, pq, pk, gamma, window, mask)
    kw = dict(causal=causal, linear=linear)
    ref = AF.naive_window_attention(*args, **kw)
    got = AF.window_attention(*args, block=block, **kw)
    assert rel_err(got, ref) < 1e-10
    w = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=ref.dtype)
    inputs = [q, k, v, omega, gamma]
    g_ref = torch.autograd.grad((ref * w).sum(), inputs, allow_unused=True,
                                materialize_grads=True, retain_graph=True)
    g_got = torch.autograd.grad((got * w).sum(), inputs, allow_unused=True,
                                materialize_grads=True)
    names = ("q", "k", "v", "omega", "gamma")
    scale = float(g_ref[0].norm())  # an omega or gamma without any effect has gradient ~0
    for a, b, name in zip(g_got, g_ref, names if linear else names[:3], strict=False):
        assert float((a - b).norm()) <= 1e-8 * max(float(b.norm()), scale), name
    if not linear:  # the window alone: no features, and gamma cancels
        assert float(g_ref[4].abs().max()) < 1e-12 and float(g_got[4].abs().max()) < 1e-12
        assert float(g_got[3].abs().max()) == 0


def test_non_contiguous_inputs_without_padding_rows():
    """Blocks that tile the sequence exactly (21 = 3 x 7: no padded rows) of transposed,
    non-contiguous queries and features give the naive twin's values."""
    q, k, v, omega, gamma, mask = _inputs()
    qt = q.detach().transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    pq = features.softplus(q, omega).detach().transpose(1, 2).contiguous().transpose(1, 2)
    pk = features.softplus(k, omega).detach()
    assert not qt.is_contiguous() and not pq.is_contiguous()
    ref = AF.naive_window_attention(q.detach(), k.detach(), v.detach(), pq, pk, gamma.detach(),
                                    4, mask)
    got = AF.window_attention(qt, k.detach(), v.detach(), pq, pk, gamma.detach(), 4, mask,
                              block=7)
    assert rel_err(got, ref) < 1e-10


def test_log_offsets_of_exp_features_are_the_unshifted_kernel():
    """FAVOR+ features shifted to stay finite, with their log offsets, give the hybrid of the
    unshifted features (large logits included)."""
    q, k, v, omega, gamma, mask = _inputs(seed=3)
    q, k = 3 * q.detach(), 3 * k.detach()
    lq, lk = features.log_positive(q, omega.detach()), features.log_positive(k, omega.detach())
    oq = lq.amax(-1, keepdim=True)
    ok = lk.masked_fill(~mask[:, None, :, None], -math.inf).amax((-2, -1), keepdim=True)
    pq, pk = torch.exp(lq - oq), torch.exp(lk - ok)
    ref = AF.naive_window_attention(q, k, v, lq.exp(), lk.exp(), gamma, 4, mask)
    got = AF.window_attention(q, k, v, pq, pk, gamma, 4, mask, log_q=oq, log_k=ok)
    assert rel_err(got, ref) < 1e-10


def test_padding_equals_each_sequence_alone():
    q, k, v, omega, gamma, mask = _inputs()
    pq, pk = features.softplus(q, omega), features.softplus(k, omega)
    full = AF.window_attention(q, k, v, pq, pk, gamma, 6, mask)
    n = 13
    alone = AF.window_attention(q[1:, :, :n], k[1:, :, :n], v[1:, :, :n], pq[1:, :, :n],
                                pk[1:, :, :n], gamma, 6)
    assert rel_err(full[1:, :, :n], alone) < 1e-12


def test_gamma_one_with_the_exact_kernel_is_softmax_attention():
    """The shared denominator: with gamma = 1 and features whose kernel is exactly exp(q . k)
    (the window part's units), the hybrid is softmax attention, whatever W."""
    q, k, v, _, _, mask = _inputs(d=2)
    q, k, v = q.detach(), k.detach(), v.detach()
    # exact features of exp(q . k) for d = 2: the degree-<=8 Taylor terms would do; use the
    # quadratic twin with pq pk^T = exp(q k^T) through one feature per key (diagonal trick)
    L = q.shape[2]
    ref = AF.softmax_attention(q, k, v, mask)
    expqk = torch.exp(q @ k.transpose(-1, -2))  # (B, H, L, L): feature s of query t
    pq, pk = expqk, torch.eye(L, dtype=q.dtype).expand_as(expqk)
    gamma = torch.ones(q.shape[1], dtype=q.dtype)
    for window in (2, 6, 50):
        got = AF.window_attention(q, k, v, pq, pk, gamma, window, mask)
        assert rel_err(got, ref) < 1e-10, window


def test_window_covering_the_sequence_is_softmax_and_gamma_weighs_the_window():
    q, k, v, omega, gamma, mask = _inputs()
    pq, pk = features.softplus(q, omega), features.softplus(k, omega)
    got = AF.window_attention(q, k, v, pq, pk, gamma, 64, mask)
    assert rel_err(got, AF.softmax_attention(q, k, v, mask)) < 1e-10
    # a tiny gamma: the linear term over the rest dominates
    tiny = torch.full_like(gamma, 1e-12)
    inside, rest = AF.window_masks(q.shape[2], 4)
    lin = AF.naive_window_attention(q, k, v, pq, pk, tiny, 4, mask)
    wpk = pk.detach()
    kern = (pq @ wpk.transpose(-1, -2)) * rest * mask[:, None, None, :]
    assert rel_err(AF.window_attention(q, k, v, pq, pk, tiny, 4, mask),
                   (kern @ v) / kern.sum(-1, keepdim=True)) < 1e-8
    assert rel_err(lin, (kern @ v) / kern.sum(-1, keepdim=True)) < 1e-8


@pytest.mark.parametrize("name", ["favor", "porf_softplus", "softmax_feat", "hedgehog"])
@pytest.mark.parametrize("causal", [False, True])
def test_layer_window_equals_its_naive_twin(name, causal):
    """KernelAttention(window=W): the module's forward against the naive twin on its own
    features (unshifted), per-head particles, padded batch; the weight starts at 0.1."""
    m = KernelAttention(24, 3, name, n_features=8, share_features=False, generator=2,
                        causal=causal).double()
    m.set_window_(4)
    assert torch.allclose(torch.sigmoid(m.window_logit),
                          torch.full((3,), 0.1, dtype=torch.float64), atol=2e-3)
    x = torch.randn(2, 11, 24, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[0, 7:] = False
    q, k, v = m.queries(x), m.keys(x), m._split(m.v_proj(x))
    pq, pk = m._phi(q), m._phi(k)
    ref = AF.naive_window_attention(q, k, v, pq, pk, torch.sigmoid(m.window_logit), 4, mask,
                                    causal=causal)
    ref = m.out_proj(ref.transpose(1, 2).reshape(2, 11, 24))
    assert rel_err(m(x, mask)[mask], ref[mask]) < 1e-9
    m.set_window_(4, linear=False)
    alone = AF.naive_window_attention(q, k, v, None, None, torch.sigmoid(m.window_logit), 4,
                                      mask, causal=causal, linear=False)
    alone = m.out_proj(alone.transpose(1, 2).reshape(2, 11, 24))
    assert rel_err(m(x, mask)[mask], alone[mask]) < 1e-9


def test_layer_window_validation_and_state():
    m = KernelAttention(16, 2, "favor", n_features=8, generator=0)
    for bad, msg in [(0, "> 0"), (-2, "> 0"), (3, "even"), (2.0, "integer")]:
        with pytest.raises(ValueError, match=msg):
            m.set_window_(bad)
    m.set_window_(6)
    sd = m.state_dict()
    assert sd["window_logit"].shape == (2,)
    m2 = KernelAttention(16, 2, "favor", n_features=8, generator=0).set_window_(6)
    with torch.no_grad():
        m.window_logit.fill_(0.7)
    m2.load_state_dict(m.state_dict())
    assert torch.equal(m2.window_logit, m.window_logit)
    m.set_window_(None)
    assert m.window == 0 and "window_logit" not in m.state_dict()
    KernelAttention(16, 2, "favor", n_features=8, causal=True).set_window_(3)  # causal: odd ok

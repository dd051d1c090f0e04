"""The fused Triton kernels (nn/ops/triton_linear.py) against the naive twins, in Triton's
interpreter on the CPU (``TRITON_INTERPRET=1``): values and gradients of q, k, v and omega for
every fused map, shared and per-head omega, padding masks, lengths that are no multiple of the
tile or of the row split, bf16 inputs, large norms, and the dispatch from KernelAttention.

On a GPU the same tests check the compiled kernels: ``COULOMB_TEST_DEVICE=cuda
TRITON_INTERPRET=0 pytest tests/nn/test_triton_linear.py`` (experiments/gpu_fused.sh does)."""

from __future__ import annotations

import os

import pytest
import torch

from coulomb_attention import features
from coulomb_attention.nn import KernelAttention
from coulomb_attention.nn.attention import use_hedgehog_map_
from coulomb_attention.nn.ops import linear_attention, naive_favor_attention
from helpers import rel_err

pytest.importorskip("triton")  # tests/conftest.py sets TRITON_INTERPRET=1 before any import
TL = pytest.importorskip("coulomb_attention.nn.ops.triton_linear")
DEV = os.environ.get("COULOMB_TEST_DEVICE", "cpu")
if DEV == "cpu" and not TL.interpreter_active():
    pytest.skip("triton was imported without TRITON_INTERPRET=1 (its interpreter is off)",
                allow_module_level=True)
if DEV != "cpu" and (not torch.cuda.is_available() or TL.interpreter_active()):
    pytest.skip(f"COULOMB_TEST_DEVICE={DEV} needs CUDA and TRITON_INTERPRET=0",
                allow_module_level=True)
MAPS = ("favor", "porf_softplus", "softmax_feat", "hedgehog")
CORE = {"porf_softplus": features.softplus, "softmax_feat": features.softmax,
        "hedgehog": features.hedgehog_features}


def _fused(q, k, v, om, name="favor", mask=None, **kw):
    """fused_kernel_attention on DEV, the result back on the CPU (gradients flow through)."""
    out = TL.fused_kernel_attention(q.to(DEV), k.to(DEV), v.to(DEV), om.to(DEV), name,
                                    None if mask is None else mask.to(DEV), **kw)
    return out.cpu()


@pytest.fixture(autouse=True)
def _dispatch_cpu(monkeypatch):
    """Let KernelAttention dispatch CPU tensors to the (interpreted) kernels."""
    from coulomb_attention.nn import dispatch

    monkeypatch.setattr(dispatch, "CPU_INTERPRETER", True)


def _inputs(B=2, H=2, T=37, S=29, d=8, e=5, M=12, groups=1, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q, k = (scale * torch.randn(B, H, L, d, generator=g) for L in (T, S))
    v = torch.randn(B, H, S, e, generator=g)
    om = torch.randn(groups, M, d, generator=g)
    return q, k, v, om


def _mask(B, S, lengths):
    return torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]


def _reference(q, k, v, om, name, mask):
    """The naive twin in float64: naive FAVOR+, or linear attention of the core map's
    features (one omega per head group)."""
    q, k, v, om = (t.double() for t in (q, k, v, om))
    if name == "favor":
        return naive_favor_attention(q, k, v, om, mask)

    def phi(u):
        return torch.stack([CORE[name](u[:, h], om[0 if om.shape[0] == 1 else h])
                            for h in range(u.shape[1])], 1)

    return linear_attention(phi(q), phi(k), v, mask)


def _grads(fn, inputs, seed=1):
    xs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*xs)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    (out * w.to(out.dtype)).sum().backward()
    return out.detach(), [x.grad for x in xs]


@pytest.mark.parametrize("name", MAPS)
@pytest.mark.parametrize("groups", [1, 2])
def test_values_and_gradients_match_the_naive_twin(name, groups):
    q, k, v, om = _inputs(groups=groups)
    mask = _mask(2, 29, [29, 17])
    out, grads = _grads(lambda *t: _fused(*t, name, mask, block_rows=16,
                                                             split_rows=16), (q, k, v, om))
    ref, ref_grads = _grads(lambda *t: _reference(*t, name, mask), (q, k, v, om))
    assert out.dtype == torch.float32
    assert rel_err(out, ref) < 1e-5
    for gname, a, b in zip("qkvw", grads, ref_grads, strict=True):
        assert rel_err(a, b) < 1e-4, (gname, rel_err(a, b))


@pytest.mark.parametrize("name", MAPS)
def test_row_splits_and_tiles_do_not_change_the_result(name):
    """Tiles of 16 or 32 rows, splits of 16, 48 or all rows (favor: partial sums rescaled to
    a common per-feature max when combined); one split sees only padded keys."""
    q, k, v, om = _inputs(T=50, S=70, seed=3)
    mask = _mask(2, 70, [70, 20])
    ref = _reference(q, k, v, om, name, mask)
    for block, split in ((16, 16), (32, 48), (16, None), (64, 1 << 10)):
        out = _fused(q, k, v, om, name, mask, block_rows=block,
                                        split_rows=split)
        assert rel_err(out, ref) < 1e-5, (block, split)


def test_bf16_inputs_accumulate_in_float32():
    q, k, v, om = _inputs(T=40, S=40, d=16, e=16, M=32, seed=4)
    ref = _reference(q, k, v, om, "favor", None)
    lo = [t.bfloat16() for t in (q, k, v)]
    out, grads = _grads(lambda *t: _fused(*t, om, "favor", block_rows=16),
                        lo)
    _, ref_grads = _grads(lambda *t: _reference(*t, om, "favor", None), (q, k, v))
    assert out.dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in grads)
    # bf16 has an 8-bit mantissa: products of rounded inputs, float32 sums
    assert rel_err(out.float(), ref) < 2e-2
    for a, b in zip(grads, ref_grads, strict=True):
        assert rel_err(a.float(), b) < 6e-2


def test_large_norms_stay_finite_and_exact():
    """Logits in the hundreds: the per-feature key max and the query row max keep every
    exponent <= 0 (float32 exp overflows at 88)."""
    q, k, v, om = _inputs(scale=12.0, seed=5)
    out, grads = _grads(lambda *t: _fused(*t, "favor", block_rows=16,
                                                             split_rows=16), (q, k, v, om))
    ref, ref_grads = _grads(lambda *t: _reference(*t, "favor", None), (q, k, v, om))
    assert bool(torch.isfinite(out).all())
    assert rel_err(out, ref) < 1e-4
    for a, b in zip(grads, ref_grads, strict=True):
        assert bool(torch.isfinite(a).all()) and rel_err(a, b) < 1e-3


@pytest.mark.parametrize("name", MAPS)
def test_a_sequence_without_real_keys_gives_zero_and_zero_gradients(name):
    q, k, v, om = _inputs(seed=6)
    mask = _mask(2, 29, [29, 0])
    out, grads = _grads(lambda *t: _fused(*t, name, mask, block_rows=16),
                        (q, k, v, om))
    assert bool(torch.isfinite(out).all()) and float(out[1].abs().max()) == 0.0
    ref = _reference(q, k, v, om, name, mask)
    assert rel_err(out[0], ref[0]) < 1e-5
    for g in grads[:3]:
        assert bool(torch.isfinite(g).all()) and float(g[1].abs().max()) == 0.0


def test_padded_keys_get_no_gradient_and_padding_equals_each_sequence_alone():
    q, k, v, om = _inputs(B=2, T=21, S=21, seed=7)
    mask = _mask(2, 21, [21, 13])
    out, (_, dk, dv, _) = _grads(
        lambda *t: _fused(*t, "favor", mask, block_rows=16), (q, k, v, om))
    assert float(dk[1, :, 13:].abs().max()) == 0.0 and float(dv[1, :, 13:].abs().max()) == 0.0
    alone = _fused(q[1:], k[1:, :, :13], v[1:, :, :13], om, "favor",
                                      block_rows=16)
    assert rel_err(out[1:], alone) < 1e-6


def test_token_major_views_need_no_copy():
    """q, k, v as head views of (B, L, H d) projections (strides (L H d, d, H d, 1))."""
    B, L, H, d, M = 2, 33, 3, 8, 16
    g = torch.Generator().manual_seed(8)
    x = [torch.randn(B, L, H * d, generator=g) for _ in range(3)]
    q, k, v = (t.view(B, L, H, d).transpose(1, 2) for t in x)
    assert not q.is_contiguous()
    om = torch.randn(1, M, d, generator=g)
    out = _fused(q, k, v, om, "softmax_feat", block_rows=16)
    ref = _fused(q.contiguous(), k.contiguous(), v.contiguous(), om,
                                    "softmax_feat", block_rows=16)
    assert torch.equal(out, ref)


def test_bad_inputs_raise_clear_errors(monkeypatch):
    q, k, v, om = _inputs()
    with pytest.raises(ValueError, match="feature_map must be one of"):
        _fused(q, k, v, om, "rff")
    with pytest.raises(ValueError, match="even for hedgehog"):
        _fused(q, k, v, om[:, :11], "hedgehog")
    with pytest.raises(ValueError, match="power of two"):
        _fused(q, k, v, om, "favor", block_rows=24)
    with pytest.raises(ValueError, match="float32/bfloat16"):
        _fused(q.double(), k.double(), v.double(), om)
    monkeypatch.setattr(TL, "interpreter_active", lambda: False)
    assert not TL.fused_supported(q, k, v, om, "favor")  # CPU tensors, no interpreter
    with pytest.raises(ValueError, match="need CUDA tensors"):
        TL.fused_kernel_attention(q, k, v, om)  # CPU tensors


# ---------------------------------------------------------------------------- dispatch


def _layer(name, **kw):
    layer = KernelAttention(16, 2, "favor" if name == "hedgehog" else name, n_features=8,
                            generator=0, **kw)
    if name == "hedgehog":
        use_hedgehog_map_(layer)
    return layer.to(DEV)


@pytest.mark.parametrize("name", MAPS)
def test_kernel_attention_dispatches_to_the_fused_path_with_the_same_result(name, monkeypatch):
    calls = []
    real = TL.fused_kernel_attention
    monkeypatch.setattr(TL, "fused_kernel_attention",
                        lambda *a, **kw: calls.append(a[4]) or real(*a, **kw))
    layer = _layer(name, share_features=name != "softmax_feat")
    x = torch.randn(2, 19, 16, generator=torch.Generator().manual_seed(9)).to(DEV)
    mask = _mask(2, 19, [19, 11]).to(DEV)
    fused = layer(x, mask)
    assert calls == [name]
    layer.fused = False  # the opt-out: today's ops
    today = layer(x, mask)
    assert len(calls) == 1
    assert rel_err(fused[0], today[0]) < 1e-5 and rel_err(fused[1, :11], today[1, :11]) < 1e-5


def test_dispatch_falls_back_where_the_kernels_do_not_apply(monkeypatch):
    calls = []
    monkeypatch.setattr(TL, "fused_kernel_attention", lambda *a, **kw: calls.append(a))
    x = torch.randn(1, 9, 16).to(DEV)
    _layer("favor", causal=True)(x)  # causal: today's prefix sums
    _layer("elu")(x)  # no particles
    layer = _layer("favor")
    layer.order = "quadratic"  # an explicit order is honoured
    layer(x)
    weighted = _layer("softmax_feat").load_masses_(torch.rand(8))  # masses: favor only
    weighted(x)
    _layer("favor").double()(x.double())  # float64
    monkeypatch.setenv("COULOMB_ATTENTION_FUSED", "0")  # the global opt-out
    _layer("favor")(x)
    monkeypatch.delenv("COULOMB_ATTENTION_FUSED")
    from coulomb_attention.nn import dispatch

    monkeypatch.setattr(dispatch, "CPU_INTERPRETER", False)  # CPU: today's ops
    _layer("favor").cpu()(x.cpu())
    assert calls == []


def test_weighted_favor_and_trainable_omega_through_the_fused_path():
    """Masses fold into an extra coordinate (the layer's own augmentation), and omega's
    gradient (trainable_omega) equals the unfused one."""
    from coulomb_attention.nn import trainable_omega

    x = torch.randn(2, 17, 16, generator=torch.Generator().manual_seed(10)).to(DEV)
    layer = _layer("favor").load_masses_(torch.rand(8, generator=torch.Generator()
                                                    .manual_seed(1)))
    grads = []
    for fused in (True, False):
        layer.fused = fused
        with trainable_omega(layer):
            out = layer(x)
            out.square().sum().backward()
            grads.append((out.detach(), layer.omega.grad.clone()))
    assert rel_err(grads[0][0], grads[1][0]) < 1e-5
    assert rel_err(grads[0][1], grads[1][1]) < 1e-4

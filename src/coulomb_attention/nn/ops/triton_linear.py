"""Fused Triton kernels for non-causal kernel attention (the GPU path of ``KernelAttention``).

The features are computed inside the kernels from ``q``, ``k`` and ``omega`` and never written
to memory: per (batch, head)

- key pass (:func:`_key_fwd_src`): ``z = k w^T`` tile by tile, ``phi(z)``, accumulated into
  ``phi(K)^T V`` (M, e) and ``phi(K)^T 1`` (M,) in float32; the rows are split into
  ``n_split`` programs whose partial sums one more small kernel combines
  (:func:`_combine_src`);
- query pass (:func:`_query_fwd_src`): ``phi(q)`` of a query tile, ``out = phi(q) KV / phi(q) ks``;
- backward: a query pass (:func:`_query_bwd_src`: ``dq``, ``d KV``, ``d ks``, the queries' part of
  ``d omega``) and a key pass (:func:`_key_bwd_src`: ``dk``, ``dv``, the keys' part of
  ``d omega``), recomputing the features (no ``phi`` saved either).

Maps (:data:`FUSED_MAPS`), ``z = u . w_m``:

- ``favor``: ``exp(z - |u|^2/2)``; the key features carry a per-feature running max ``c_m`` over
  the keys (online rescaling of the accumulators, the max-stabilised exponent of flash
  attention), the query features ``exp(z + c_m - s_t)`` with the row max ``s_t``: every exponent
  is <= 0 and the shifts cancel in the ratio (the same algebra as :mod:`.fused`);
- ``porf_softplus``: ``softplus(z)`` (the ``1/sqrt(M)`` of both sides cancels);
- ``softmax_feat``: ``softmax_m(z)``; ``hedgehog``: ``[softmax(z_A), softmax(z_B)]`` over the
  two halves of the features (:func:`coulomb_attention.features.hedgehog_features`).

Numerics: the products ``k w^T``, ``phi^T v`` and ``phi KV`` run on the inputs' dtype (bf16 or
fp16 tensor cores; float32 as ``torch.backends.cuda.matmul.allow_tf32`` says) with float32
accumulation; exponentials, normalisers and accumulators are float32; the output and the
gradients are in the inputs' dtype, ``d omega`` in omega's. Padded keys (``key_mask`` False)
have features exactly 0; a query without any real key gets output 0 (as the naive twins).

Gradients: ``q``, ``k``, ``v`` and ``omega`` (the last only when omega requires grad:
``trainable_omega``, particle fitting).

Triton's interpreter (``TRITON_INTERPRET=1`` set before triton is first imported: its own
``tl`` functions are decorated then) runs the kernels on CPU tensors, which is how the tests
check them without a GPU (:func:`interpreter_active`). Without Triton this module imports and
:func:`triton_available` is False.
"""

from __future__ import annotations

import torch

from .checks import _check_omega, _check_qkv

try:  # optional dependency (pyproject extra "test")
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None
    tl = None

__all__ = ["FUSED_MAPS", "MAX_DIM", "MAX_FEATURES", "fused_kernel_attention",
           "fused_supported", "interpreter_active", "triton_available"]

#: Feature maps of the fused kernels: name -> the kernels' ``MAP`` constant (0 favor,
#: 1 softplus, 2 softmax over feature groups: one group for ``softmax_feat``, two for
#: ``hedgehog``).
FUSED_MAPS: dict[str, int] = {"favor": 0, "porf_softplus": 1, "softmax_feat": 2,
                              "hedgehog": 2}
#: Largest M and head dims of the fused path (a program holds all M features of its rows).
MAX_FEATURES = 256
MAX_DIM = 256
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Exponent standing for "no key yet / feature 0": finite, so that NEG - NEG = 0, not NaN.
_NEG = -1.0e30


def triton_available() -> bool:
    """Whether Triton imported (the fused path can run)."""
    return triton is not None


def interpreter_active() -> bool:
    """Whether Triton runs in its interpreter (``TRITON_INTERPRET=1`` when triton was first
    imported): the kernels then run on CPU tensors (slowly: for tests)."""
    return triton is not None and isinstance(tl.zeros, InterpretedFunction)


def fused_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, omega: torch.Tensor,
                    feature_map: str) -> bool:
    """Whether :func:`fused_kernel_attention` takes these inputs: Triton present, a map of
    :data:`FUSED_MAPS`, float32/bf16/fp16 inputs, ``M <= MAX_FEATURES`` (even for hedgehog),
    head dims ``<= MAX_DIM``, q, k, v of one dtype, and CUDA tensors (CPU tensors only in
    the interpreter, :func:`interpreter_active`)."""
    if triton is None or feature_map not in FUSED_MAPS:
        return False
    if q.dtype not in _DTYPES or len({q.dtype, k.dtype, v.dtype}) != 1:
        return False
    M = omega.shape[1]
    if M > MAX_FEATURES or (feature_map == "hedgehog" and M % 2):
        return False
    if q.shape[-1] > MAX_DIM or v.shape[-1] > MAX_DIM:
        return False
    devices = {t.device.type for t in (q, k, v, omega)}
    return devices == {"cuda"} or (devices == {"cpu"} and interpreter_active())


# --------------------------------------------------------------------------- kernel sources
# Plain functions, decorated by triton.jit in _kernels(); the helpers are jitted first and put
# into this module's globals under the names the kernels call (placeholders until then).
_NEG_C = tl.constexpr(_NEG) if tl is not None else None
_dot = _features = _features_grad = None


def _dot_src(a, b, PREC: tl.constexpr):
    return tl.dot(a, b, input_precision=PREC)


def _dot_interpreted_src(a, b, PREC: tl.constexpr):
    """The interpreter's ``tl.dot`` multiplies bf16's raw uint16 storage: upcast first. The
    product of two bf16 numbers is exact in float32, so this is the tensor-core result up to
    the order of the float32 sums. Operands of two dtypes fail here as in the compiler."""
    tl.static_assert(a.dtype == b.dtype, "tl.dot operands must share one dtype")
    return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PREC)


def _features_src(z, u2, c, row_ok, col_ok, offs_m, HALF, MAP: tl.constexpr,
                  IS_KEY: tl.constexpr):
    """Features of a (rows, BLOCK_M) tile of logits ``z`` (float32); ``u2`` (rows,) the rows'
    ``|u|^2`` (favor keys), ``c`` (BLOCK_M,) the key shifts (favor) ; rows or columns that
    are not valid give 0."""
    ok = row_ok[:, None] & col_ok[None, :]
    if MAP == 0:
        if IS_KEY:
            a = tl.where(ok, z - 0.5 * u2[:, None] - c[None, :], _NEG_C)
        else:
            a = z + c[None, :]
            a = tl.where(ok, a, _NEG_C)
            a = a - tl.max(a, axis=1)[:, None]
        phi = tl.where(ok, tl.exp(a), 0.0)
    elif MAP == 1:
        phi = tl.maximum(z, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(z)))
        phi = tl.where(z > 20.0, z, phi)
        phi = tl.where(ok, phi, 0.0)
    else:
        zz = tl.where(ok, z, _NEG_C)
        second = (offs_m >= HALF)[None, :]
        m0 = tl.max(tl.where(second, _NEG_C, zz), axis=1)
        m1 = tl.max(tl.where(second, zz, _NEG_C), axis=1)
        ex = tl.where(ok, tl.exp(zz - tl.where(second, m1[:, None], m0[:, None])), 0.0)
        s0 = tl.sum(tl.where(second, 0.0, ex), axis=1)
        s1 = tl.sum(tl.where(second, ex, 0.0), axis=1)
        den = tl.where(second, s1[:, None], s0[:, None])
        phi = ex / tl.where(den > 0.0, den, 1.0)
    return phi


def _features_grad_src(phi, z, dphi, offs_m, HALF, MAP: tl.constexpr):
    """``d loss / dz`` from ``d loss / d phi`` (rows, BLOCK_M): favor ``dphi phi``, softplus
    ``dphi sigmoid(z)``, grouped softmax ``phi (dphi - sum_group phi dphi)``; 0 where phi is
    0 for padding (masked rows/columns give phi = 0 and so dz = 0, also for softplus: dphi
    there is multiplied by the row mask by the caller)."""
    if MAP == 0:
        dz = dphi * phi
    elif MAP == 1:
        ez = tl.exp(-tl.abs(z))  # sigmoid(z) without overflow
        dz = dphi * tl.where(z >= 0.0, 1.0 / (1.0 + ez), ez / (1.0 + ez))
    else:
        second = (offs_m >= HALF)[None, :]
        pd = phi * dphi
        s0 = tl.sum(tl.where(second, 0.0, pd), axis=1)
        s1 = tl.sum(tl.where(second, pd, 0.0), axis=1)
        dz = pd - phi * tl.where(second, s1[:, None], s0[:, None])
    return dz


def _key_fwd_src(K, V, W, MASK, KVP, KSP, CP,
                 skb, skh, sks, svb, svh, svs, smb, sms,
                 H, S, M, D, E, ROWS, HALF, W_PER_HEAD,
                 MAP: tl.constexpr, HAS_MASK: tl.constexpr,
                 PREC: tl.constexpr, BLOCK_S: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_E: tl.constexpr):
    """Partial ``phi(K)^T V``, ``phi(K)^T 1`` (and favor's per-feature max) of rows
    ``[split ROWS, (split + 1) ROWS)`` of one (batch, head): grid (B H, n_split)."""
    bh = tl.program_id(0)
    sp = tl.program_id(1)
    n_split = tl.num_programs(1)
    b = bh // H
    h = bh % H
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    col_ok = offs_m < M
    w = tl.load(W + (h * W_PER_HEAD) * M * D + offs_m[:, None] * D + offs_d[None, :],
                mask=col_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    w_t = tl.trans(w.to(K.dtype.element_ty))  # (BLOCK_D, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_E), dtype=tl.float32)
    ks = tl.zeros((BLOCK_M,), dtype=tl.float32)
    c = tl.full((BLOCK_M,), _NEG_C, dtype=tl.float32)
    start = sp * ROWS
    end = tl.minimum(start + ROWS, S)
    for s0 in range(start, end, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        row_ok = offs_s < end
        if HAS_MASK:
            real = tl.load(MASK + b * smb + offs_s * sms, mask=row_ok, other=0)
            row_ok = row_ok & (real != 0)
        kt = tl.load(K + b * skb + h * skh + offs_s[:, None] * sks + offs_d[None, :],
                     mask=row_ok[:, None] & (offs_d < D)[None, :], other=0.0)
        vt = tl.load(V + b * svb + h * svh + offs_s[:, None] * svs + offs_e[None, :],
                     mask=row_ok[:, None] & (offs_e < E)[None, :], other=0.0)
        z = _dot(kt, w_t, PREC)  # (BLOCK_S, BLOCK_M) float32
        k32 = kt.to(tl.float32)
        u2 = tl.sum(k32 * k32, axis=1)
        if MAP == 0:  # online max per feature, accumulators rescaled to the new shift
            a = tl.where(row_ok[:, None], z - 0.5 * u2[:, None], _NEG_C)
            c_new = tl.maximum(c, tl.max(a, axis=0))
            alpha = tl.exp(c - c_new)
            acc = acc * alpha[:, None]
            ks = ks * alpha
            c = c_new
        phi = _features(z, u2, c, row_ok, col_ok, offs_m, HALF, MAP, True)
        acc += _dot(tl.trans(phi.to(V.dtype.element_ty)), vt, PREC)
        ks += tl.sum(phi, axis=0)
    part = bh * n_split + sp
    tl.store(KVP + part * M * E + offs_m[:, None] * E + offs_e[None, :], acc,
             mask=col_ok[:, None] & (offs_e < E)[None, :])
    tl.store(KSP + part * M + offs_m, ks, mask=col_ok)
    tl.store(CP + part * M + offs_m, c, mask=col_ok)


def _combine_src(KVP, KSP, CP, KV, KS, C, N_SPLIT, M, E,
                 MAP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr):
    """Sum the per-split partials of one (batch, head) (favor: each rescaled to the common
    per-feature max, online over the splits): grid (B H,). One launch instead of a handful of
    torch ops (the partial sums are small; the launches are what costs at short L)."""
    bh = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_e = tl.arange(0, BLOCK_E)
    col_ok = offs_m < M
    tile = col_ok[:, None] & (offs_e < E)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_E), dtype=tl.float32)
    ks = tl.zeros((BLOCK_M,), dtype=tl.float32)
    c = tl.full((BLOCK_M,), _NEG_C, dtype=tl.float32)
    for sp in range(0, N_SPLIT):
        part = bh * N_SPLIT + sp
        kv_p = tl.load(KVP + part * M * E + offs_m[:, None] * E + offs_e[None, :], mask=tile,
                       other=0.0)
        ks_p = tl.load(KSP + part * M + offs_m, mask=col_ok, other=0.0)
        if MAP == 0:
            c_p = tl.load(CP + part * M + offs_m, mask=col_ok, other=_NEG_C)
            c_new = tl.maximum(c, c_p)
            a_old = tl.exp(c - c_new)
            a_new = tl.exp(c_p - c_new)
            acc = acc * a_old[:, None] + kv_p * a_new[:, None]
            ks = ks * a_old + ks_p * a_new
            c = c_new
        else:
            acc += kv_p
            ks += ks_p
    tl.store(KV + bh * M * E + offs_m[:, None] * E + offs_e[None, :], acc, mask=tile)
    tl.store(KS + bh * M + offs_m, ks, mask=col_ok)
    tl.store(C + bh * M + offs_m, c, mask=col_ok)


def _query_fwd_src(Q, W, KV, KS, C, OUT, DEN,
                   sqb, sqh, sqt, sob, soh, sot,
                   H, T, M, D, E, HALF, W_PER_HEAD,
                   MAP: tl.constexpr, PREC: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """``out = phi(q) KV / phi(q) ks`` of one query tile: grid (B H, cdiv(T, BLOCK_T))."""
    bh = tl.program_id(0)
    tb = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    row_ok = offs_t < T
    col_ok = offs_m < M
    w = tl.load(W + (h * W_PER_HEAD) * M * D + offs_m[:, None] * D + offs_d[None, :],
                mask=col_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    kv = tl.load(KV + bh * M * E + offs_m[:, None] * E + offs_e[None, :],
                 mask=col_ok[:, None] & (offs_e < E)[None, :], other=0.0)
    ks = tl.load(KS + bh * M + offs_m, mask=col_ok, other=0.0)
    c = tl.load(C + bh * M + offs_m, mask=col_ok, other=_NEG_C)
    qt = tl.load(Q + b * sqb + h * sqh + offs_t[:, None] * sqt + offs_d[None, :],
                 mask=row_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    z = _dot(qt, tl.trans(w.to(Q.dtype.element_ty)), PREC)
    no_u2 = tl.zeros((BLOCK_T,), dtype=tl.float32)  # |q|^2/2 cancels: unused
    p = _features(z, no_u2, c, row_ok, col_ok, offs_m, HALF, MAP, False)
    p = p.to(Q.dtype.element_ty)
    num = _dot(p, kv.to(Q.dtype.element_ty), PREC)  # (BLOCK_T, BLOCK_E)
    den = tl.sum(p.to(tl.float32) * ks[None, :], axis=1)
    out = tl.where(den[:, None] > 0.0, num / tl.where(den > 0.0, den, 1.0)[:, None], 0.0)
    tl.store(OUT + b * sob + h * soh + offs_t[:, None] * sot + offs_e[None, :],
             out.to(OUT.dtype.element_ty), mask=row_ok[:, None] & (offs_e < E)[None, :])
    tl.store(DEN + bh * T + offs_t, den, mask=row_ok)


def _query_bwd_src(Q, W, KV, KS, C, OUT, DEN, G, DQ, DKVP, DKSP, DWP,
                   sqb, sqh, sqt, sob, soh, sot, sgb, sgh, sgt, sdb, sdh, sdt,
                   H, T, M, D, E, ROWS, HALF, W_PER_HEAD,
                   MAP: tl.constexpr, NEED_W: tl.constexpr,
                   PREC: tl.constexpr, BLOCK_T: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_E: tl.constexpr):
    """Query side of the backward over rows ``[split ROWS, ...)``: ``dq``, and partial
    ``d KV = sum_t phi_t dn_t^T``, ``d ks = sum_t phi_t dden_t``, ``d omega`` (queries):
    grid (B H, n_split)."""
    bh = tl.program_id(0)
    sp = tl.program_id(1)
    n_split = tl.num_programs(1)
    b = bh // H
    h = bh % H
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    col_ok = offs_m < M
    d_ok = offs_d < D
    e_ok = offs_e < E
    w = tl.load(W + (h * W_PER_HEAD) * M * D + offs_m[:, None] * D + offs_d[None, :],
                mask=col_ok[:, None] & d_ok[None, :], other=0.0)
    w_lo = w.to(Q.dtype.element_ty)
    kv = tl.load(KV + bh * M * E + offs_m[:, None] * E + offs_e[None, :],
                 mask=col_ok[:, None] & e_ok[None, :], other=0.0)
    kv_lo = kv.to(Q.dtype.element_ty)
    ks = tl.load(KS + bh * M + offs_m, mask=col_ok, other=0.0)
    c = tl.load(C + bh * M + offs_m, mask=col_ok, other=_NEG_C)
    dkv = tl.zeros((BLOCK_M, BLOCK_E), dtype=tl.float32)
    dks = tl.zeros((BLOCK_M,), dtype=tl.float32)
    dw = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    start = sp * ROWS
    end = tl.minimum(start + ROWS, T)
    for t0 in range(start, end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        row_ok = offs_t < end
        qt = tl.load(Q + b * sqb + h * sqh + offs_t[:, None] * sqt + offs_d[None, :],
                     mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        z = _dot(qt, tl.trans(w_lo), PREC)
        no_u2 = tl.zeros((BLOCK_T,), dtype=tl.float32)  # |q|^2/2 cancels: unused
        p = _features(z, no_u2, c, row_ok, col_ok, offs_m, HALF, MAP, False)
        io = row_ok[:, None] & e_ok[None, :]
        g = tl.load(G + b * sgb + h * sgh + offs_t[:, None] * sgt + offs_e[None, :],
                    mask=io, other=0.0).to(tl.float32)
        out = tl.load(OUT + b * sob + h * soh + offs_t[:, None] * sot + offs_e[None, :],
                      mask=io, other=0.0).to(tl.float32)
        den = tl.load(DEN + bh * T + offs_t, mask=row_ok, other=0.0)
        inv = tl.where(den > 0.0, 1.0 / tl.where(den > 0.0, den, 1.0), 0.0)
        dn = g * inv[:, None]  # d loss / d numerator (BLOCK_T, BLOCK_E)
        dden = -tl.sum(g * out, axis=1) * inv  # d loss / d normaliser (BLOCK_T,)
        dkv += _dot(tl.trans(p.to(Q.dtype.element_ty)), dn.to(Q.dtype.element_ty), PREC)
        dks += tl.sum(p * dden[:, None], axis=0)
        dp = _dot(dn.to(Q.dtype.element_ty), tl.trans(kv_lo), PREC) + dden[:, None] * ks[None, :]
        dp = tl.where(row_ok[:, None], dp, 0.0)
        dz = _features_grad(p, z, dp, offs_m, HALF, MAP)
        dz = tl.where(row_ok[:, None] & col_ok[None, :], dz, 0.0)
        # favor: the -q sum_m dz_m term of d/dq (z - |q|^2/2) is exactly 0 here (a per-row
        # factor of phi(q) cancels in the ratio), so dq = dz w as for the other maps
        dq = _dot(dz.to(Q.dtype.element_ty), w_lo, PREC)
        tl.store(DQ + b * sdb + h * sdh + offs_t[:, None] * sdt + offs_d[None, :],
                 dq.to(DQ.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        if NEED_W:
            dw += _dot(tl.trans(dz.to(Q.dtype.element_ty)), qt, PREC)
    part = bh * n_split + sp
    tl.store(DKVP + part * M * E + offs_m[:, None] * E + offs_e[None, :], dkv,
             mask=col_ok[:, None] & e_ok[None, :])
    tl.store(DKSP + part * M + offs_m, dks, mask=col_ok)
    if NEED_W:
        tl.store(DWP + part * M * D + offs_m[:, None] * D + offs_d[None, :], dw,
                 mask=col_ok[:, None] & d_ok[None, :])


def _key_bwd_src(K, V, W, MASK, C, DKV, DKS, DK, DV, DWP,
                 skb, skh, sks, svb, svh, svs, smb, sms, sdkb, sdkh, sdks, sdvb, sdvh, sdvs,
                 H, S, M, D, E, ROWS, HALF, W_PER_HEAD,
                 MAP: tl.constexpr, HAS_MASK: tl.constexpr,
                 NEED_W: tl.constexpr, PREC: tl.constexpr,
                 BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """Key side of the backward over rows ``[split ROWS, ...)``: ``dv = phi dKV``,
    ``d phi = v dKV^T + dks``, ``dk``, partial ``d omega`` (keys): grid (B H, n_split)."""
    bh = tl.program_id(0)
    sp = tl.program_id(1)
    n_split = tl.num_programs(1)
    b = bh // H
    h = bh % H
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    col_ok = offs_m < M
    d_ok = offs_d < D
    e_ok = offs_e < E
    w = tl.load(W + (h * W_PER_HEAD) * M * D + offs_m[:, None] * D + offs_d[None, :],
                mask=col_ok[:, None] & d_ok[None, :], other=0.0)
    w_lo = w.to(K.dtype.element_ty)
    dkv = tl.load(DKV + bh * M * E + offs_m[:, None] * E + offs_e[None, :],
                  mask=col_ok[:, None] & e_ok[None, :], other=0.0)
    dkv_lo = dkv.to(K.dtype.element_ty)
    dks = tl.load(DKS + bh * M + offs_m, mask=col_ok, other=0.0)
    c = tl.load(C + bh * M + offs_m, mask=col_ok, other=_NEG_C)
    dw = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    start = sp * ROWS
    end = tl.minimum(start + ROWS, S)
    for s0 in range(start, end, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        in_range = offs_s < end
        row_ok = in_range
        if HAS_MASK:
            real = tl.load(MASK + b * smb + offs_s * sms, mask=in_range, other=0)
            row_ok = row_ok & (real != 0)
        kt = tl.load(K + b * skb + h * skh + offs_s[:, None] * sks + offs_d[None, :],
                     mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        vt = tl.load(V + b * svb + h * svh + offs_s[:, None] * svs + offs_e[None, :],
                     mask=row_ok[:, None] & e_ok[None, :], other=0.0)
        z = _dot(kt, tl.trans(w_lo), PREC)
        k32 = kt.to(tl.float32)
        u2 = tl.sum(k32 * k32, axis=1)
        r = _features(z, u2, c, row_ok, col_ok, offs_m, HALF, MAP, True)
        dv = _dot(r.to(K.dtype.element_ty), dkv_lo, PREC)  # (BLOCK_S, BLOCK_E)
        dr = _dot(vt, tl.trans(dkv_lo), PREC) + dks[None, :]
        dr = tl.where(row_ok[:, None], dr, 0.0)
        dz = _features_grad(r, z, dr, offs_m, HALF, MAP)
        dz = tl.where(row_ok[:, None] & col_ok[None, :], dz, 0.0)
        dk = _dot(dz.to(K.dtype.element_ty), w_lo, PREC)
        if MAP == 0:  # d/dk (z - |k|^2/2) = w_m - k
            dk = dk - k32 * tl.sum(dz, axis=1)[:, None]
        tl.store(DK + b * sdkb + h * sdkh + offs_s[:, None] * sdks + offs_d[None, :],
                 dk.to(DK.dtype.element_ty), mask=in_range[:, None] & d_ok[None, :])
        tl.store(DV + b * sdvb + h * sdvh + offs_s[:, None] * sdvs + offs_e[None, :],
                 dv.to(DV.dtype.element_ty), mask=in_range[:, None] & e_ok[None, :])
        if NEED_W:
            dw += _dot(tl.trans(dz.to(K.dtype.element_ty)), kt, PREC)
    if NEED_W:
        part = bh * n_split + sp
        tl.store(DWP + part * M * D + offs_m[:, None] * D + offs_d[None, :], dw,
                 mask=col_ok[:, None] & d_ok[None, :])


_BUILT: dict = {}


def _kernels() -> dict:
    """The jitted kernels, built on first use (helpers first, bound to the globals the
    kernels call), so that importing this module compiles nothing."""
    if not _BUILT:
        dot = _dot_interpreted_src if interpreter_active() else _dot_src
        globals().update({"_dot": triton.jit(dot),
                          "_features": triton.jit(_features_src),
                          "_features_grad": triton.jit(_features_grad_src)})
        _BUILT.update({name: triton.jit(globals()[f"_{name}_src"])
                       for name in ("key_fwd", "combine", "query_fwd", "query_bwd",
                                    "key_bwd")})
    return _BUILT


# --------------------------------------------------------------------------- launch helpers


def _block(n: int) -> int:
    """Power of two >= n and >= 16 (``tl.dot`` needs each dimension >= 16)."""
    return max(16, triton.next_power_of_2(int(n)))


def _splits(L: int, groups: int, block: int, split_rows: int | None) -> tuple[int, int]:
    """(rows per program, programs per (batch, head)) of a row-split pass: enough programs in
    all (~1024) to fill a GPU, rows a multiple of ``block``; ``split_rows`` overrides."""
    if split_rows is None:
        n = max(1, min(triton.cdiv(L, block), triton.cdiv(1024, groups)))
        split_rows = triton.cdiv(triton.cdiv(L, n), block) * block
    split_rows = max(block, triton.cdiv(int(split_rows), block) * block)
    return split_rows, triton.cdiv(max(L, 1), split_rows)


def _precision(t: torch.Tensor) -> str:
    """Input precision of the products: for float32 inputs ``tf32`` where torch's own matmuls
    use it (``torch.backends.cuda.matmul.allow_tf32``), else ``ieee``; bf16/fp16 products are
    exact in float32 whatever the setting (Triton's default, ``tf32``, is passed)."""
    if t.dtype != torch.float32:
        return "tf32"
    if t.is_cuda and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "ieee"


class _FusedFn(torch.autograd.Function):
    """Forward: key pass, combine, query pass; backward: query pass, key pass (module
    docstring). Saves q, k, v, omega, the mask, kv (G, M, e), ks, c (G, M), out and the
    normalisers (G, T): O(L d + M e) per head, no features."""

    @staticmethod
    def forward(ctx, q, k, v, w, key_mask, map_id, half, block_rows, split_rows):
        kern = _kernels()
        B, H, T, D = q.shape
        S, E = k.shape[2], v.shape[3]
        M = w.shape[1]
        G = B * H
        per_head = int(w.shape[0] != 1)
        wc = w.detach().float().contiguous()
        BM, BD, BE = _block(M), _block(D), _block(E)
        prec = _precision(q)
        rows, n_split = _splits(S, G, block_rows, split_rows)
        dev = q.device
        kvp = torch.empty(G, n_split, M, E, device=dev, dtype=torch.float32)
        ksp = torch.empty(G, n_split, M, device=dev, dtype=torch.float32)
        cp = torch.empty(G, n_split, M, device=dev, dtype=torch.float32)
        mask = key_mask.to(torch.int8) if key_mask is not None else None
        ms = mask.stride() if mask is not None else (0, 0)
        warps = 4 if M <= 64 else 8
        kern["key_fwd"][(G, n_split)](
            k, v, wc, mask if mask is not None else k, kvp, ksp, cp,
            k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
            ms[0], ms[1], H, S, M, D, E, rows, half, per_head,
            MAP=map_id, HAS_MASK=mask is not None, PREC=prec, BLOCK_S=block_rows,
            BLOCK_M=BM, BLOCK_D=BD, BLOCK_E=BE, num_warps=warps)
        if n_split == 1:
            kv, ks, c = kvp[:, 0], ksp[:, 0], cp[:, 0]  # contiguous views
        else:
            kv = torch.empty(G, M, E, device=dev, dtype=torch.float32)
            ks = torch.empty(G, M, device=dev, dtype=torch.float32)
            c = torch.empty(G, M, device=dev, dtype=torch.float32)
            kern["combine"][(G,)](kvp, ksp, cp, kv, ks, c, n_split, M, E, MAP=map_id,
                                  BLOCK_M=BM, BLOCK_E=BE, num_warps=warps)
        out = torch.empty(B, H, T, E, device=dev, dtype=v.dtype)
        den = torch.empty(G, T, device=dev, dtype=torch.float32)
        kern["query_fwd"][(G, triton.cdiv(T, block_rows))](
            q, wc, kv, ks, c, out, den,
            q.stride(0), q.stride(1), q.stride(2), out.stride(0), out.stride(1), out.stride(2),
            H, T, M, D, E, half, per_head,
            MAP=map_id, PREC=prec, BLOCK_T=block_rows, BLOCK_M=BM, BLOCK_D=BD, BLOCK_E=BE,
            num_warps=warps)
        ctx.save_for_backward(q, k, v, w, mask, kv, ks, c, out, den)
        ctx.cfg = (map_id, half, block_rows, split_rows)
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, w, mask, kv, ks, c, out, den = ctx.saved_tensors
        map_id, half, block_rows, split_rows = ctx.cfg
        g = _row_major(g)
        kern = _kernels()
        need_w = bool(ctx.needs_input_grad[3])
        B, H, T, D = q.shape
        S, E = k.shape[2], v.shape[3]
        M = w.shape[1]
        G = B * H
        per_head = int(w.shape[0] != 1)
        wc = w.detach().float().contiguous()
        BM, BD, BE = _block(M), _block(D), _block(E)
        prec = _precision(q)
        warps = 4 if M <= 64 else 8
        dev = q.device
        rows_t, n_t = _splits(T, G, block_rows, split_rows)
        dq = torch.empty(B, H, T, D, device=dev, dtype=q.dtype)
        dkvp = torch.empty(G, n_t, M, E, device=dev, dtype=torch.float32)
        dksp = torch.empty(G, n_t, M, device=dev, dtype=torch.float32)
        dwq = torch.empty(G, n_t, M, D, device=dev, dtype=torch.float32) if need_w else dksp
        kern["query_bwd"][(G, n_t)](
            q, wc, kv, ks, c, out, den, g, dq, dkvp, dksp, dwq,
            q.stride(0), q.stride(1), q.stride(2), out.stride(0), out.stride(1), out.stride(2),
            g.stride(0), g.stride(1), g.stride(2), dq.stride(0), dq.stride(1), dq.stride(2),
            H, T, M, D, E, rows_t, half, per_head,
            MAP=map_id, NEED_W=need_w, PREC=prec, BLOCK_T=block_rows, BLOCK_M=BM, BLOCK_D=BD,
            BLOCK_E=BE, num_warps=warps)
        dkv, dks = dkvp.sum(1), dksp.sum(1)
        rows_s, n_s = _splits(S, G, block_rows, split_rows)
        dk = torch.empty(B, H, S, D, device=dev, dtype=k.dtype)
        dv = torch.empty(B, H, S, E, device=dev, dtype=v.dtype)
        dwk = torch.empty(G, n_s, M, D, device=dev, dtype=torch.float32) if need_w else dks
        ms = mask.stride() if mask is not None else (0, 0)
        kern["key_bwd"][(G, n_s)](
            k, v, wc, mask if mask is not None else k, c, dkv, dks, dk, dv, dwk,
            k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
            ms[0], ms[1], dk.stride(0), dk.stride(1), dk.stride(2),
            dv.stride(0), dv.stride(1), dv.stride(2),
            H, S, M, D, E, rows_s, half, per_head,
            MAP=map_id, HAS_MASK=mask is not None, NEED_W=need_w, PREC=prec,
            BLOCK_S=block_rows, BLOCK_M=BM, BLOCK_D=BD, BLOCK_E=BE, num_warps=warps)
        dw = None
        if need_w:
            dw = (dwq.sum(1) + dwk.sum(1)).view(B, H, M, D).sum(0)  # (H, M, D)
            dw = (dw.sum(0, keepdim=True) if not per_head else dw).to(w.dtype)
        # the key pass is skipped by autograd's needs only for dk/dv: both come from one pass
        return dq, dk, dv, dw, None, None, None, None, None


def _row_major(t: torch.Tensor) -> torch.Tensor:
    """``t`` with a unit stride on the last dimension (the kernels' only layout assumption)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def fused_kernel_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    omega: torch.Tensor,
    feature_map: str = "favor",
    key_mask: torch.Tensor | None = None,
    *,
    block_rows: int | None = None,
    split_rows: int | None = None,
) -> torch.Tensor:
    """Non-causal kernel attention with the features computed inside fused Triton kernels.

    Equal (up to rounding) to :func:`.reference.naive_favor_attention` (``favor``) and to
    :func:`.linear.linear_attention` of the map's features (the others); see the module
    docstring for what the kernels do.

    Parameters
    ----------
    q : torch.Tensor, shape (B, H, T, d)
        Queries, already scaled (``KernelAttention.queries``); any strides with a unit last one
        (token-major projections need no copy).
    k : torch.Tensor, shape (B, H, S, d)
    v : torch.Tensor, shape (B, H, S, e)
    omega : torch.Tensor, shape (1 or H, M, d)
    feature_map : {"favor", "porf_softplus", "softmax_feat", "hedgehog"}
    key_mask : torch.Tensor of bool, shape (B, S), optional
        True = real token.
    block_rows : int, optional
        Rows per tile (a power of two >= 16); default 64, 32 for M > 64 (a program holds
        (rows, M) tiles and the (M, e) sums in registers).
    split_rows : int, optional
        Rows per program of the row-split passes (default: enough programs to fill a GPU).

    Returns
    -------
    torch.Tensor, shape (B, H, T, e), dtype of ``v``.
    """
    if triton is None:
        raise RuntimeError("fused_kernel_attention needs triton (pip install triton)")
    _check_qkv(q, k, v, key_mask)
    _check_omega(omega, q.shape[1], q.shape[-1])
    if feature_map not in FUSED_MAPS:
        raise ValueError(f"feature_map must be one of {', '.join(FUSED_MAPS)} for the fused "
                         f"kernels, got {feature_map!r}")
    if not fused_supported(q, k, v, omega, feature_map):
        raise ValueError(
            f"the fused kernels need CUDA tensors (CPU only with TRITON_INTERPRET=1) of dtype "
            f"float32/bfloat16/float16 (one for q, k, v), M <= {MAX_FEATURES} (even for "
            f"hedgehog) and head dims <= {MAX_DIM}; got devices {q.device}/{omega.device}, dtypes "
            f"{q.dtype}/{k.dtype}/{v.dtype}, M = {omega.shape[1]}, d = {q.shape[-1]}, "
            f"e = {v.shape[-1]}")
    if block_rows is None:
        block_rows = 64 if omega.shape[1] <= 64 else 32
    if (isinstance(block_rows, bool) or not isinstance(block_rows, int) or block_rows < 16
            or block_rows & (block_rows - 1)):
        raise ValueError(f"block_rows must be a power of two >= 16, got {block_rows!r}")
    if split_rows is not None and (isinstance(split_rows, bool) or split_rows <= 0):
        raise ValueError(f"split_rows must be a positive integer, got {split_rows!r}")
    M = omega.shape[1]
    half = M // 2 if feature_map == "hedgehog" else M
    with torch.autocast(device_type=q.device.type, enabled=False):
        return _FusedFn.apply(_row_major(q), _row_major(k), _row_major(v), omega, key_mask,
                              FUSED_MAPS[feature_map], half, block_rows, split_rows)

"""Attention ops as pure tensor functions, each with a naive quadratic twin.

Shapes: ``B`` batch, ``H`` heads, ``T`` queries, ``S`` keys, ``d`` head dim of queries/keys,
``e`` head dim of values, ``M`` random features. ``key_mask`` is ``(B, S)`` bool with
``True`` = real token.

- :func:`linear_attention`: ``phi(q)^T (sum_s phi(k_s) v_s^T) / phi(q)^T sum_s phi(k_s)``,
  O((T + S) M e); twin :func:`naive_linear_attention` through the ``(T, S)`` kernel matrix.
- :func:`favor_attention`: FAVOR+ fused (features, shifts and products in chunks along the
  sequence, recomputing backward), O((T + S) M d) time, O((T + S) d) memory; twin
  :func:`naive_favor_attention`.
- :func:`softmax_attention`: exact softmax attention, O(T S d) (the reference FAVOR+
  approximates).

Numerics: features and normalisers are computed in float32 (float64 stays float64) with
autocast switched off inside the ops; the output is cast back to the dtype of ``v``.
FAVOR+ features ``exp(w . x - |x|^2/2)`` are stabilised by shifts that cancel in the
attention ratio: in :func:`favor_features` one per query row (the row max) and one per
(batch, head) over the real keys; in the fused path upper bounds from Cauchy-Schwarz (no pass
over the features), with an exact fallback where a sum would underflow (see :class:`_FavorFn`).
Padded keys contribute exactly zero.
"""

from __future__ import annotations

import math
import threading

import torch

from ..features import log_positive

__all__ = [
    "linear_attention",
    "naive_linear_attention",
    "softmax_attention",
    "favor_features",
    "favor_attention",
    "naive_favor_attention",
    "causal_linear_attention",
    "causal_favor_attention",
    "clear_workspace",
]

# Smallest normaliser: keeps a fully padded row (or total underflow) finite (output 0).
_TINY = torch.finfo(torch.float32).tiny


# --------------------------------------------------------------------------- validation


def _check_4d(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.ndim != 4:
        raise ValueError(f"{name} must have shape (B, H, L, D), got {tuple(t.shape)}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got dtype {t.dtype}")


def _check_qkv(q, k, v, key_mask, q_name="q", k_name="k") -> None:
    _check_4d(q_name, q)
    _check_4d(k_name, k)
    _check_4d("v", v)
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"inconsistent shapes: {q_name} {tuple(q.shape)}, {k_name} {tuple(k.shape)}, "
            f"v {tuple(v.shape)} (need {q_name} (B,H,T,*), {k_name} (B,H,S,*), v (B,H,S,e))"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{q_name} and {k_name} must have the same last dimension, "
            f"got {q.shape[-1]} and {k.shape[-1]}"
        )
    check_key_mask(key_mask, k.shape[0], k.shape[2])


def check_key_mask(key_mask: torch.Tensor | None, batch: int, length: int) -> None:
    """Raise unless ``key_mask`` is ``None`` or a bool tensor of shape ``(batch, length)``."""
    if key_mask is None:
        return
    if not isinstance(key_mask, torch.Tensor):
        raise TypeError(f"mask must be a bool torch.Tensor, got {type(key_mask).__name__}")
    if key_mask.dtype != torch.bool:
        raise TypeError(
            f"mask must have dtype torch.bool (True = real token), got {key_mask.dtype}"
        )
    if tuple(key_mask.shape) != (batch, length):
        raise ValueError(f"mask must have shape ({batch}, {length}), got {tuple(key_mask.shape)}")


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _no_autocast(t: torch.Tensor):
    return torch.autocast(device_type=t.device.type, enabled=False)


# --------------------------------------------------------------------------- generic ops


def linear_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Non-causal linear attention from precomputed non-negative features.

    ``out_t = phi_q[t] @ (sum_s phi_k[s] v[s]^T) / phi_q[t] @ sum_s phi_k[s]``; the numerator
    and the normaliser come out of one matmul with ``v`` extended by a column of ones.

    Parameters
    ----------
    phi_q : torch.Tensor, shape (B, H, T, M)
    phi_k : torch.Tensor, shape (B, H, S, M)
        Key features; padded keys are removed by multiplying ``phi_k`` by ``key_mask``.
    v : torch.Tensor, shape (B, H, S, e)
    key_mask : torch.Tensor of bool, shape (B, S), optional

    Returns
    -------
    torch.Tensor, shape (B, H, T, e), dtype of ``v``.
    """
    _check_qkv(phi_q, phi_k, v, key_mask, "phi_q", "phi_k")
    dt = _compute_dtype(v)
    with _no_autocast(v):
        pq, pk = phi_q.to(dt), phi_k.to(dt)
        if key_mask is not None:
            pk = pk * key_mask[:, None, :, None].to(dt)  # (B, H, S, M)
        v1 = torch.cat([v.to(dt), v.new_ones((*v.shape[:-1], 1), dtype=dt)], dim=-1)
        kv = pk.transpose(-1, -2) @ v1  # (B, H, M, e+1)
        n = pq @ kv  # (B, H, T, e+1)
        out = n[..., :-1] / n[..., -1:].clamp_min(_TINY)
    return out.to(v.dtype)


def naive_linear_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    *,
    causal: bool = False,
) -> torch.Tensor:
    """Quadratic twin of :func:`linear_attention` (and, with ``causal=True``, of
    :func:`causal_linear_attention`): builds the ``(T, S)`` kernel matrix.

    Same arguments and result; ``A = phi_q phi_k^T`` masked over keys (causal: and over
    ``s > t``), rows normalised (a row without any key gives 0).
    """
    _check_qkv(phi_q, phi_k, v, key_mask, "phi_q", "phi_k")
    if causal:
        _check_causal(phi_q, phi_k)
    dt = _compute_dtype(v)
    with _no_autocast(v):
        a = phi_q.to(dt) @ phi_k.to(dt).transpose(-1, -2)  # (B, H, T, S)
        if key_mask is not None:
            a = a * key_mask[:, None, None, :].to(dt)
        if causal:
            a = a.tril()
        out = (a @ v.to(dt)) / a.sum(-1, keepdim=True).clamp_min(_TINY)
    return out.to(v.dtype)


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    *,
    scale: float = 1.0,
    causal: bool = False,
) -> torch.Tensor:
    """Exact softmax attention ``softmax(scale q k^T) v`` (quadratic reference).

    ``causal=True``: query t attends to keys s <= t only (needs T == S).

    ``scale=1`` because :class:`~coulomb_attention.nn.KernelAttention` already scales
    queries and keys by ``d**-0.25`` each (so ``q . k`` carries the usual ``1/sqrt(d)``).
    A query whose keys are all padded gets output 0.

    Parameters
    ----------
    q : torch.Tensor, shape (B, H, T, d)
    k : torch.Tensor, shape (B, H, S, d)
    v : torch.Tensor, shape (B, H, S, e)
    key_mask : torch.Tensor of bool, shape (B, S), optional

    Returns
    -------
    torch.Tensor, shape (B, H, T, e), dtype of ``v``.
    """
    _check_qkv(q, k, v, key_mask)
    dt = _compute_dtype(v)
    with _no_autocast(v):
        logits = scale * (q.to(dt) @ k.to(dt).transpose(-1, -2))  # (B, H, T, S)
        if key_mask is not None:
            logits = logits.masked_fill(~key_mask[:, None, None, :], -math.inf)
        if causal:
            _check_causal(q, k)
            L = q.shape[2]
            future = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1)
            logits = logits.masked_fill(future, -math.inf)
        # Shift by the row max (finite rows only) then normalise: no inf/NaN for any norm.
        m = logits.amax(-1, keepdim=True).detach()
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        a = torch.exp(logits - m)
        out = (a @ v.to(dt)) / a.sum(-1, keepdim=True).clamp_min(_TINY)
    return out.to(v.dtype)


# --------------------------------------------------------------------------- FAVOR+


def _check_omega(omega: torch.Tensor, heads: int, d: int) -> None:
    if not isinstance(omega, torch.Tensor):
        raise TypeError(f"omega must be a torch.Tensor, got {type(omega).__name__}")
    if omega.ndim != 3 or omega.shape[0] not in (1, heads) or omega.shape[2] != d:
        raise ValueError(
            f"omega must have shape (1 or {heads}, n_features, {d}), got {tuple(omega.shape)}"
        )
    if omega.shape[1] == 0:
        raise ValueError("omega has 0 features")


def _safe(shift: torch.Tensor) -> torch.Tensor:
    """Replace -inf shifts (rows/heads without a real key) by 0."""
    return torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))


def _favor_logits(u: torch.Tensor, om: torch.Tensor) -> torch.Tensor:
    """``log_positive(u, w)`` of (B, H, L, d) with omega (1 or H, M, d): (B, H, L, M)."""
    if om.shape[0] == 1:
        return log_positive(u, om[0])
    return torch.stack([log_positive(u[:, h], om[h]) for h in range(om.shape[0])], dim=1)


def favor_features(
    u: torch.Tensor,
    omega: torch.Tensor,
    *,
    is_query: bool,
    key_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Stabilised FAVOR+ features as the attention uses them (float32 or float64).

    ``exp(u . w_m - |u|^2/2 - shift) / sqrt(M)``: the core map
    :func:`coulomb_attention.features.positive` with a shift that cancels in the attention
    ratio, the row max for queries and one max per (batch, head) over the real keys for keys.
    Padded keys (``key_mask`` False) get feature 0 (the same as multiplying by the mask,
    without ever forming ``inf * 0``).

    Parameters
    ----------
    u : torch.Tensor, shape (B, H, L, d)
    omega : torch.Tensor, shape (1 or H, M, d)
    is_query : bool
    key_mask : torch.Tensor of bool, shape (B, L), optional (keys only)

    Returns
    -------
    torch.Tensor, shape (B, H, L, M)
    """
    _check_4d("u", u)
    _check_omega(omega, u.shape[1], u.shape[-1])
    check_key_mask(key_mask, u.shape[0], u.shape[2])
    dt = _compute_dtype(u)
    with _no_autocast(u):
        om = omega.to(dt)
        logits = _favor_logits(u.to(dt), om)  # (B, H, L, M)
        if is_query:
            shift = logits.amax(-1, keepdim=True)  # (B, H, L, 1)
        else:
            if key_mask is not None:
                logits = logits.masked_fill(~key_mask[:, None, :, None], -math.inf)
            shift = logits.amax(dim=(-2, -1), keepdim=True)  # (B, H, 1, 1)
        shift = _safe(shift.detach()) + 0.5 * math.log(om.shape[1])
        return torch.exp(logits - shift)


def naive_favor_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    omega: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    *,
    causal: bool = False,
) -> torch.Tensor:
    """Reference FAVOR+ attention: :func:`favor_features` + :func:`naive_linear_attention`.

    Same arguments and result as :func:`favor_attention` (``causal=True``: as
    :func:`causal_favor_attention`, but with one key shift per (batch, head), so early
    prefixes can underflow where the online shift does not); memory O(T S) per head.
    """
    _check_qkv(q, k, v, key_mask)
    pq = favor_features(q, omega, is_query=True)
    pk = favor_features(k, omega, is_query=False, key_mask=key_mask)
    return naive_linear_attention(pq, pk, v, key_mask, causal=causal)


def _chunks(n: int, size: int):
    return [(i, min(i + size, n)) for i in range(0, n, size)]


# Exponent used for "feature exactly 0" inside the augmented matmuls: finite (no inf * 0 in a
# BLAS kernel), far below float32's exp underflow (-104), and far from overflow when summed.
_NEG = -1e30
# A feature sum (over keys, or over features for one query) below this triggers the exact
# path: the largest term is then above 2**-68, so terms lost to underflow (< 1.2e-38) change
# the result by less than 1e-15 relative; above it the fast path is as accurate as the exact.
_UNDERFLOW = 2.0**-60
# The fast path scales its matmul weights by log2(e) and takes exp2: exp(x) = 2**(x log2 e)
# costs nothing in the matmul, and torch's exp2 is 2-3x faster than exp on CPU (measured).
_LOG2E = 1.0 / math.log(2.0)


def _augment(x, *cols):
    """``[x, *cols]`` along the last dimension, each col a scalar or a tensor of
    ``x.shape[:-1]``: (..., d) -> (..., d + len(cols)), contiguous."""
    d = x.shape[-1]
    out = x.new_empty(*x.shape[:-1], d + len(cols))
    out[..., :d] = x
    for i, col in enumerate(cols):
        out[..., d + i] = col
    return out


# Scratch memory of the fused path, kept between calls (per thread, CPU only): fresh blocks
# in every call cost a page fault per 4 KiB on first touch, since glibc hands large freed
# blocks back to the kernel (measured: 2,600 faults, 10 MB, per forward at L = 4096, M = 64).
_WORKSPACE = threading.local()
_WORKSPACE_MAX_BYTES = 32 << 20  # larger buffers (huge chunk_size) are allocated per call


def clear_workspace() -> None:
    """Free this thread's scratch buffers of :func:`favor_attention` (a few MB at the default
    chunk size; they are kept between calls to avoid page faults and reallocated on demand)."""
    _WORKSPACE.__dict__.pop("bufs", None)


def _scratch(like: torch.Tensor, slot: str, n: int) -> torch.Tensor:
    """A flat tensor of ``n`` elements (dtype/device of ``like``, uninitialised) from this
    thread's workspace buffer ``slot``, grown on demand. Two live users must use different
    slots. Not cached: non-CPU tensors (their caching allocator already reuses memory) and
    buffers over ``_WORKSPACE_MAX_BYTES``."""
    if like.device.type != "cpu" or n * like.element_size() > _WORKSPACE_MAX_BYTES:
        return like.new_empty(n)
    bufs = _WORKSPACE.__dict__.setdefault("bufs", {})
    key = (slot, like.dtype, torch.is_inference_mode_enabled())
    buf = bufs.get(key)
    if buf is None or buf.numel() < n:
        buf = bufs[key] = like.new_empty(n)
    return buf[:n]


class _Blocks:
    """Scratch memory for the per-chunk blocks: ``self(i, G, c, n)`` is a contiguous (G, c, n)
    view of flat buffer ``i`` (workspace slots ``name0``, ``name1``, ...). Writing a matmul
    into a fresh block per chunk (page faults) or into a strided slice of the result (a hidden
    copy) measured up to 2x slower."""

    def __init__(self, like, name, *sizes):
        self.bufs = [_scratch(like, f"{name}{i}", n) for i, n in enumerate(sizes)]

    def __call__(self, i, G, c, n):
        return self.bufs[i][: G * c * n].view(G, c, n)


class _Rows:
    """Augmented rows ``[x, col_0, col_1, ...]`` of one chunk in a reused (G, chunk, d + j)
    buffer: the matmul operands of the fast path, built chunk by chunk in cache (a full-length
    augmented copy would cost one more pass over memory per tensor). ``consts`` gives the
    constant columns (set once) and ``None`` for the columns given per chunk."""

    def __init__(self, x, chunk, consts, key_mask=None, *, slot):
        G, L, d = x.shape
        self.x, self.d, self.mask = x, d, key_mask
        shape = (G, min(chunk, L), d + len(consts))
        self.buf = _scratch(x, slot, math.prod(shape)).view(shape)
        for i, c in enumerate(consts):
            if c is not None:
                self.buf[..., d + i] = c

    def __call__(self, t0, t1, cols=()):
        """Rows ``t0:t1``; ``cols`` pairs (index, (G, t1 - t0) tensor); padded rows zeroed."""
        b = self.buf[:, : t1 - t0]
        x = b[..., : self.d]
        x.copy_(self.x[:, t0:t1])
        if self.mask is not None:
            x.masked_fill_(~self.mask[:, t0:t1, None], 0.0)
        for i, col in cols:
            b[..., self.d + i] = col
        return b


def _key_features(k_c, w, m_c, c, acc):
    """Exact-path key features of a chunk with an online max (the fallback of the fast path).

    ``exp(log_positive(k_c, w) - c)`` (G, c, M), ``c`` (G, 1, M) the running max over the keys
    seen so far, updated in place; the accumulators ``acc = (kv (G, M, e), ksum (G, 1, M))`` are
    rescaled to the new shift. Padded rows (``m_c`` False) get features exactly 0.
    """
    a = k_c @ w.T  # (G, c, M)
    half_sq = 0.5 * (k_c * k_c).sum(-1, keepdim=True)  # (G, c, 1)
    if m_c is not None:
        half_sq = half_sq.masked_fill(~m_c.unsqueeze(-1), math.inf)
    a.sub_(half_sq)
    c_new = torch.maximum(c, a.amax(1, keepdim=True))  # -inf: no real key yet
    factor = torch.exp(c - _safe(c_new))  # (G, 1, M); c = -inf: 0 on zero accumulators
    acc[0].mul_(factor.transpose(1, 2))
    acc[1].mul_(factor)
    c.copy_(c_new)
    return a.sub_(_safe(c)).exp_()


def _key_pass_exact(k, v, w, key_mask, chunk):
    """``lse_m = log sum_s exp(a_sm)`` and ``kv_hat_m = sum_s softmax_s(a_sm) v_s`` with an
    online max per feature: finite for any norm. Returns (lse (G, M), kv_hat (G, M, e))."""
    G, S, e = v.shape
    M = w.shape[0]
    kv = v.new_zeros(G, M, e)
    ksum = v.new_zeros(G, 1, M)
    c = v.new_full((G, 1, M), -math.inf)
    for s0, s1 in _chunks(S, chunk):
        m_c = None if key_mask is None else key_mask[:, s0:s1]
        r = _key_features(k[:, s0:s1], w, m_c, c, (kv, ksum))  # (G, c, M)
        kv.baddbmm_(r.transpose(1, 2), v[:, s0:s1])
        ksum += r.sum(1, keepdim=True)
    # ksum_m >= 1 unless no real key reaches feature m (then lse = -inf, kv_hat = 0).
    lse = (_safe(c) + ksum.log()).squeeze(1)
    kv_hat = torch.where(ksum.transpose(1, 2) > 0, kv / ksum.transpose(1, 2), 0.0)
    return lse, kv_hat


def _key_pass_fast(keys, v, half_k, rk, w, key_mask, chunk):
    """The key pass with a fixed shift per (group, feature) from Cauchy-Schwarz:
    ``a_sm = k_s . w_m - |k_s|^2/2 <= g(|k_s|) <= c_m = max_{r in [r_min, r_max]} g(r)`` with
    ``g(r) = r |w_m| - r^2/2`` (concave, so ``c_m = g(clamp(|w_m|, r_min, r_max))`` over the real
    keys' norms): no exponent is positive; per chunk one matmul of ``[k, -|k|^2/2, 1]`` with
    ``[w, 1, -c]`` gives the exponent, one ``exp2_`` the features, one matmul with ``v``
    ``sum phi v`` and one sum ``sum phi`` (a ones column on ``v`` would make the matmul's
    width 65: measured slower than 64 plus the sum).
    Returns (lse, kv_hat) as :func:`_key_pass_exact`, or None when some feature sum fell
    below ``_UNDERFLOW`` (keys far from a particle, or no real key): the caller takes the exact
    path."""
    G, S = rk.shape
    M = w.shape[0]
    if key_mask is not None:
        r_max = torch.where(key_mask, rk, -math.inf).amax(-1, keepdim=True)
        r_min = torch.where(key_mask, rk, math.inf).amin(-1, keepdim=True)
        if not bool((r_max >= r_min).all()):  # a group without real keys
            return None
    else:
        r_max, r_min = rk.amax(-1, keepdim=True), rk.amin(-1, keepdim=True)
    wn = torch.linalg.vector_norm(w, dim=-1)  # (M,)
    rs = torch.minimum(torch.maximum(wn, r_min), r_max)  # (G, M)
    c = rs * wn - 0.5 * rs * rs
    wk = _augment(w.expand(G, *w.shape), 1.0, -c).mul_(_LOG2E).transpose(1, 2)
    kv = w.new_zeros(G, M, v.shape[-1])
    ksum = w.new_zeros(G, M)
    blocks = _Blocks(w, "key", G * min(chunk, S) * M)
    for s0, s1 in _chunks(S, chunk):
        f = torch.bmm(keys(s0, s1, [(0, half_k[:, s0:s1])]), wk, out=blocks(0, G, s1 - s0, M))
        f.exp2_()  # (G, c, M), <= 1
        kv.baddbmm_(f.transpose(1, 2), v[:, s0:s1])
        ksum += f.sum(1)
    if not bool((ksum >= _UNDERFLOW).all()):
        return None
    return ksum.log() + c, kv / ksum.unsqueeze(-1)


def _query_shift_bound(rq, w, lse, knots: int = 16):
    """Row shifts ``s_t >= max_m (q_t . w_m + lse_m)`` that cost O(T + knots M), not O(T M).

    ``q . w_m <= |q| |w_m|`` (Cauchy-Schwarz), and ``f(r) = max_m (r |w_m| + lse_m)`` is convex
    in r, so on ``[min |q|, max |q|]`` (per group) the chord through ``knots`` equally spaced
    points lies above it: ``s_t`` is the chord at ``|q_t|`` (``rq`` (G, T) the query norms).
    Features without real keys (lse = -inf) are left out; a group without any gets shift 0.
    Returns (G, T).
    """
    lo, hi = rq.amin(-1, keepdim=True), rq.amax(-1, keepdim=True)  # (G, 1)
    h = (hi - lo).clamp_min(1e-6) / (knots - 1)
    grid = lo + h * torch.arange(knots, dtype=rq.dtype, device=rq.device)  # (G, knots)
    f = (grid[:, :, None] * torch.linalg.vector_norm(w, dim=-1) + lse[:, None, :]).amax(-1)
    f = torch.where(torch.isfinite(f), f, 0.0)
    x = (rq - lo) / h
    j = x.floor().clamp_(0, knots - 2)
    f0, f1 = f.gather(1, j.long()), f.gather(1, j.long() + 1)
    return f0 + (f1 - f0) * (x - j).clamp_(0.0, 1.0)


def _query_weights(w, lse):
    """``log2(e) [w, lse, 1]^T`` per group (G, d + 2, M), ``-inf`` lse (no real key) as
    ``_NEG``: with ``[q, 1, -s_t]`` the matmul gives ``log2(e) (q . w_m + lse_m - s_t)``, whose
    ``exp2`` is the query feature times the key normaliser."""
    G, M = lse.shape
    wq = w.new_empty(G, M, w.shape[1] + 2)
    wq[..., :-2] = w
    wq[..., -2] = torch.where(torch.isfinite(lse), lse, _NEG)
    wq[..., -1] = 1.0
    return wq.mul_(_LOG2E).transpose(1, 2)


def _query_features_exact(q_c, wq):
    """Exact-path query features ``exp(q . w_m + lse_m - s_t)`` with the row max as shift (0
    for a row without any real key), so the largest feature of a row is 1. Returns (p, s)."""
    a = torch.bmm(_augment(q_c, 1.0, 0.0), wq)  # (G, c, M), log2 units
    top = a.amax(-1)  # (G, c)
    top = torch.where(top > 0.5 * _NEG, top, 0.0)
    return a.sub_(top.unsqueeze(-1)).exp2_(), top / _LOG2E


class _FavorFn(torch.autograd.Function):
    """FAVOR+ attention in chunks along the sequence, with a recomputing backward.

    Inputs are (G, L, *) contiguous tensors with G = B * H sharing one omega ``w`` (M, d).

    Forward: per feature m, ``lse_m = log sum_s exp(a_sm)`` with ``a = log_positive(k, w)``
    and ``kv_hat_m = sum_s softmax_s(a_sm) v_s`` (weighted means); per query
    ``p = exp(q w^T + lse - s_t)`` with a per-row shift ``s_t``, ``out = p kv_hat / sum_m p_m``.
    This equals ``phi(q)^T (sum_s phi(k_s) [v_s, 1])`` up to a per-row constant that cancels
    in the ratio.

    Fast path (the usual case): shifts bounded by Cauchy-Schwarz (:func:`_key_pass_fast`,
    :func:`_query_shift_bound`), so every exponent is <= 0 (no overflow at any norm) and comes
    out of one matmul of augmented rows (``[k, -|k|^2/2, 1]``, ``[q, 1, -s_t]``, built per
    chunk); each (chunk, M) block then costs one ``exp2_`` (the weights carry ``log2 e``),
    one matmul with ``v`` or ``kv_hat`` (the numerator) and one sum (the normaliser). Where a
    sum of features would underflow (keys or queries far from every particle, large norms)
    the exact path takes over: an online max over keys per feature, the row max for queries.

    Backward recomputes the features chunk by chunk in the same normalised form (derivative of
    ``features.log_positive``, ``d/dx (x . w_m - |x|^2/2) = w_m - x``; the shifts are
    constants that cancel in the ratio). Memory: O(G (T + S) (d + e) + G M e) plus one chunk.
    """

    @staticmethod
    def forward(ctx, q, k, v, w, key_mask, chunk):
        G, S, e = v.shape
        T = q.shape[1]
        rk = torch.linalg.vector_norm(k, dim=-1)  # (G, S)
        half_k = -0.5 * rk * rk
        if key_mask is not None:
            half_k = torch.where(key_mask, half_k, _NEG)  # padded keys: feature exactly 0
        keys = _Rows(k, chunk, [None, 1.0], key_mask, slot="rows_k")
        fast = _key_pass_fast(keys, v, half_k, rk, w, key_mask, chunk)
        lse, kv_hat = fast if fast is not None else _key_pass_exact(k, v, w, key_mask, chunk)
        wq = _query_weights(w, lse)  # (G, d + 2, M)
        kv1 = _augment(kv_hat, 1.0)  # [kv_hat, 1]: (G, M, e + 1)
        shift = _query_shift_bound(torch.linalg.vector_norm(q, dim=-1), w, lse)  # (G, T)
        queries = _Rows(q, chunk, [1.0, None], slot="rows_q")
        out = v.new_empty(G, T, e)
        den = v.new_empty(G, T, 1)
        M, c_max = w.shape[0], min(chunk, T)
        blocks = _Blocks(v, "fwd", G * c_max * M, G * c_max * e)  # the division writes out
        for t0, t1 in _chunks(T, chunk):
            p = torch.bmm(queries(t0, t1, [(1, -shift[:, t0:t1])]), wq,
                          out=blocks(0, G, t1 - t0, M))
            p.exp2_()  # exponents <= 0
            den_c = torch.sum(p, -1, keepdim=True, out=den[:, t0:t1])  # (faster than width 65)
            n = torch.bmm(p, kv_hat, out=blocks(1, G, t1 - t0, e))
            torch.div(n, den_c, out=out[:, t0:t1])
        # Rows whose normaliser is tiny (or 0): the exact row shift, chunk by chunk.
        for t0, t1 in _chunks(T, chunk):
            if bool((den[:, t0:t1] >= _UNDERFLOW).all()):
                continue
            p, shift[:, t0:t1] = _query_features_exact(q[:, t0:t1], wq)
            n = torch.bmm(p, kv1)
            den[:, t0:t1] = n[..., -1:]  # >= 1, or 0 without any real key (output 0)
            out[:, t0:t1] = torch.where(den[:, t0:t1] > 0, n[..., :-1] / den[:, t0:t1], 0.0)
        inv_den = torch.where(den > 0, 1.0 / den, 0.0)
        ctx.save_for_backward(q, k, v, w, key_mask, wq, kv1, lse, shift, half_k, inv_den, out)
        ctx.chunk = chunk
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, w, key_mask, wq, kv1, lse, shift, half_k, inv_den, out = ctx.saved_tensors
        chunk = ctx.chunk
        G, T, e = out.shape
        S = k.shape[1]
        need_q, need_k, need_v, need_w = ctx.needs_input_grad[:4]
        g = g.contiguous()
        # d loss / d [kv_hat, 1]: the value part (G, M, e) and the ones column (G, M, 1).
        dkv1 = torch.zeros_like(kv1)
        dq = torch.empty_like(q) if need_q else None
        dw = torch.zeros_like(w) if need_w else None
        queries = _Rows(q, chunk, [1.0, None], slot="rows_q")
        # Reused contiguous blocks (see _Blocks): features, their gradients, matmul outputs.
        M, d = w.shape
        n = G * min(chunk, max(T, S))
        blocks = _Blocks(w, "bwd", n * M, n * M, n * (e + 1), n * (d + 1))
        for t0, t1 in _chunks(T, chunk):
            c = t1 - t0
            p = torch.bmm(queries(t0, t1, [(1, -shift[:, t0:t1])]), wq, out=blocks(0, G, c, M))
            p.exp2_()  # as forward
            # d out / d n: numerator g/den, normaliser -(g . out)/den.
            dn1 = blocks(2, G, c, e + 1)
            dn = torch.mul(g[:, t0:t1], inv_den[:, t0:t1], out=dn1[..., :-1])  # (G, c, e)
            torch.sum(dn * out[:, t0:t1], -1, keepdim=True, out=dn1[..., -1:]).neg_()
            dkv1.baddbmm_(p.transpose(1, 2), dn1)
            if need_q or need_w:
                da = torch.bmm(dn1, kv1.transpose(1, 2), out=blocks(1, G, c, M)).mul_(p)
                if need_q:
                    # The -q rowsum(da) term of log_positive's derivative is exactly 0 here:
                    # a per-row factor of phi(q) cancels in the ratio.
                    dq[:, t0:t1] = torch.bmm(da, w.expand(G, M, d), out=blocks(3, G, c, d))
                if need_w:
                    dw += torch.bmm(da.transpose(1, 2), q[:, t0:t1]).sum(0)
        dk = torch.empty_like(k) if need_k else None
        dv = torch.empty_like(v) if need_v else None
        if need_k or need_v or need_w:
            # Softmax over keys per feature, exp(a_sm - lse_m): [k, -|k|^2/2, 1] times
            # [w, 1, -lse]; a feature without real keys (lse = -inf) gives 0.
            wk = _augment(w.expand(G, *w.shape), 1.0, torch.where(
                torch.isfinite(lse), -lse, -_NEG)).mul_(_LOG2E).transpose(1, 2)
            dkv = dkv1[..., :-1]
            w1 = _augment(w, 1.0).expand(G, M, d + 1)  # [w, 1]: da @ w1 = [da @ w, rowsum(da)]
            keys = _Rows(k, chunk, [None, 1.0], key_mask, slot="rows_k")
            vals = _Rows(v, chunk, [1.0], slot="rows_v")
            for s0, s1 in _chunks(S, chunk):
                c = s1 - s0
                r = torch.bmm(keys(s0, s1, [(0, half_k[:, s0:s1])]), wk, out=blocks(0, G, c, M))
                r.exp2_()  # (G, c, M)
                if need_v:
                    dv[:, s0:s1] = torch.bmm(r, dkv, out=blocks(2, G, c, e))
                if need_k or need_w:
                    da = torch.bmm(vals(s0, s1), dkv1.transpose(1, 2), out=blocks(1, G, c, M))
                    da.mul_(r)
                    k_c = k[:, s0:s1]
                    if need_k:
                        x = torch.bmm(da, w1, out=blocks(3, G, c, d + 1))  # (G, c, d + 1)
                        torch.addcmul(x[..., :-1], k_c, x[..., -1:], value=-1.0,
                                      out=dk[:, s0:s1])
                    if need_w:
                        dw += torch.bmm(da.transpose(1, 2), k_c).sum(0)
        return dq, dk, dv, dw, None, None


def default_chunk_size(groups: int, n_features: int) -> int:
    """Rows per chunk so that one ``(groups, chunk, n_features)`` float32 block is ~2 MiB
    (in cache on a small CPU). Measured on 2 cores at L = 16384, B * H = 4: 2 MiB blocks were
    the fastest or within noise of it for M = 64 and 256 (1024 to 4096 rows for M = 64)."""
    return int(min(8192, max(64, (1 << 19) // max(1, groups * n_features))))


def favor_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    omega: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    *,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """FAVOR+ linear attention, fused and chunked (the fast path).

    Equal (up to rounding) to :func:`naive_favor_attention`: positive features
    ``exp(w . x - |x|^2/2)`` (the core :func:`coulomb_attention.features.log_positive` plus
    an exponential) with the query row-max shift and one key shift per (batch, head) over the
    real keys, padded keys contributing zero. The features are never materialised for the
    whole sequence: keys then queries are processed in chunks of ``chunk_size`` rows (online
    rescaling of the running key max) and the backward recomputes them chunk by chunk, so
    memory is O(L d) per head instead of O(L M) and the elementwise work stays in cache.

    Parameters
    ----------
    q : torch.Tensor, shape (B, H, T, d)
    k : torch.Tensor, shape (B, H, S, d)
    v : torch.Tensor, shape (B, H, S, e)
    omega : torch.Tensor, shape (1 or H, M, d)
        Particles (rows), shared across heads when the first dimension is 1.
    key_mask : torch.Tensor of bool, shape (B, S), optional
    chunk_size : int, optional
        Rows per chunk; default :func:`default_chunk_size`.

    Returns
    -------
    torch.Tensor, shape (B, H, T, e), dtype of ``v``.
    """
    _check_qkv(q, k, v, key_mask)
    _check_omega(omega, q.shape[1], q.shape[-1])
    B, H, T, d = q.shape
    S, e = v.shape[2], v.shape[3]
    dt = _compute_dtype(v)
    shared = omega.shape[0] == 1
    groups = B * H if shared else B
    chunk_size = _chunk_size(chunk_size, default_chunk_size(groups, omega.shape[1]))
    with _no_autocast(v):
        qq, kk, vv, om = (t.to(dt) for t in (q, k, v, omega))
        if shared:
            mask = None
            if key_mask is not None:
                mask = key_mask[:, None, :].expand(B, H, S).reshape(B * H, S)
            out = _FavorFn.apply(
                qq.reshape(B * H, T, d).contiguous(),
                kk.reshape(B * H, S, d).contiguous(),
                vv.reshape(B * H, S, e).contiguous(),
                om[0],
                mask,
                chunk_size,
            )
            out = out.view(B, H, T, e)
        else:  # one omega per head: one fused call per head
            outs = [
                _FavorFn.apply(
                    qq[:, h].contiguous(), kk[:, h].contiguous(), vv[:, h].contiguous(),
                    om[h], key_mask, chunk_size,
                )
                for h in range(H)
            ]
            out = torch.stack(outs, dim=1)
    return out.to(v.dtype)


# --------------------------------------------------------------------------- causal


def _chunk_size(chunk_size, default: int) -> int:
    """``chunk_size`` checked (a positive int), or ``default`` when it is None."""
    if chunk_size is None:
        return default
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    return chunk_size


def _check_causal(q, k) -> None:
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"causal attention needs as many queries as keys, got {q.shape[2]} "
                         f"and {k.shape[2]}")


def _causal_chunks(pq, pk, v, key_mask, chunk, shift=None):
    """Shared loop of the causal ops: ``pq``/``pk`` (B, H', L, M) are query features and key
    *logits or features*; with ``shift`` a callable, the keys are exponentiated here with an
    online per-feature max (see :func:`causal_favor_attention`)."""
    B, H, L, e = v.shape
    dt = pq.dtype
    v1 = torch.cat([v.to(dt), v.new_ones((B, H, L, 1), dtype=dt)], dim=-1)  # [v, 1]
    if key_mask is not None:
        v1 = v1 * key_mask[:, None, :, None].to(dt)  # padded keys: no value, no weight
    M = pq.shape[-1]
    state = v1.new_zeros(B, H, M, e + 1)  # sum_{s < t0} phi_k[s] [v_s, 1]^T
    c = None if shift is None else v1.new_full((B, H, 1, M), -math.inf)
    outs = []
    for t0, t1 in _chunks(L, chunk):
        fq, fk = pq[:, :, t0:t1], pk[:, :, t0:t1]
        if shift is not None:  # fk are key logits, fq query logits: shift, then exponentiate
            c_new = torch.maximum(c, fk.amax(-2, keepdim=True)).detach()
            state = state * torch.exp(c - _safe(c_new)).transpose(-1, -2)
            c = c_new
            fk = torch.exp(fk - _safe(c))
            fq = shift(fq + c)
        tri = torch.ones(t1 - t0, t1 - t0, dtype=torch.bool, device=v.device).tril()
        a = (fq @ fk.transpose(-1, -2)).masked_fill(~tri, 0.0)  # (B, H, c, c), s <= t
        n = fq @ state + a @ v1[:, :, t0:t1]  # (B, H, c, e + 1)
        den = n[..., -1:]
        outs.append(torch.where(den > 0, n[..., :-1] / den.clamp_min(_TINY), 0.0))
        state = state + fk.transpose(-1, -2) @ v1[:, :, t0:t1]
    return torch.cat(outs, dim=2)


def causal_linear_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    *,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Causal linear attention: position t attends to the real keys s <= t.

    ``out_t = phi_q[t] . sum_{s<=t} phi_k[s] v_s^T / phi_q[t] . sum_{s<=t} phi_k[s]``, in
    blocks of ``chunk_size`` positions (default 128): a running state
    ``sum_{s < t0} phi_k[s] [v_s, 1]^T`` (M x (e+1)) for the earlier blocks plus the masked
    (c, c) kernel inside the block, so time is O(L (M e + c (M + e))) and the memory kept for
    the backward O(L (c + M) + (L / c) M e). A position with no real key at or before it
    gets output 0. Twin: :func:`naive_linear_attention` with ``causal=True``.

    Parameters
    ----------
    phi_q, phi_k : torch.Tensor, shape (B, H, L, M), non-negative
    v : torch.Tensor, shape (B, H, L, e)
    key_mask : torch.Tensor of bool, shape (B, L), optional
    chunk_size : int, optional

    Returns
    -------
    torch.Tensor, shape (B, H, L, e), dtype of ``v``.
    """
    _check_qkv(phi_q, phi_k, v, key_mask, "phi_q", "phi_k")
    _check_causal(phi_q, phi_k)
    chunk = _chunk_size(chunk_size, 128)
    dt = _compute_dtype(v)
    with _no_autocast(v):
        out = _causal_chunks(phi_q.to(dt), phi_k.to(dt), v, key_mask, chunk)
    return out.to(v.dtype)


def causal_favor_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    omega: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    *,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Causal FAVOR+ attention (prefix sums in blocks, as :func:`causal_linear_attention`).

    The features are ``exp(a)`` with ``a = log_positive(x, w)`` (the core map), stabilised
    by shifts that cancel exactly: each key feature m by the running max ``c_m`` of ``a_sm``
    over the real keys up to the end of the current block (the state of earlier blocks is
    rescaled by ``exp(c_old - c_new)`` when it grows), each query feature by ``+c_m`` and
    then the row max. So no exponent is positive and a key feature underflows only when it
    is ~87 (float32) below the largest one *of the same block and feature*. Memory O(L M)
    (the logits are materialised; not the fused path). Twin: :func:`naive_favor_attention`
    with ``causal=True``.

    Parameters and result as :func:`favor_attention` (``T == S``).
    """
    _check_qkv(q, k, v, key_mask)
    _check_omega(omega, q.shape[1], q.shape[-1])
    _check_causal(q, k)
    chunk = _chunk_size(chunk_size, 128)
    dt = _compute_dtype(v)
    with _no_autocast(v):
        om = omega.to(dt)
        b, a = _favor_logits(q.to(dt), om), _favor_logits(k.to(dt), om)  # (B, H, L, M)
        if key_mask is not None:
            a = a.masked_fill(~key_mask[:, None, :, None], -math.inf)

        def exp_rows(x):  # query features, shifted by their row max (cancels in the ratio)
            top = _safe(x.amax(-1, keepdim=True).detach())
            return torch.exp(x - top)

        out = _causal_chunks(b, a, v, key_mask, chunk, shift=exp_rows)
    return out.to(v.dtype)

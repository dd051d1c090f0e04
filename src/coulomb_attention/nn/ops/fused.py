"""FAVOR+ in the linear association order, fused and chunked (the long-sequence path).

``phi(q)^T (sum_s phi(k_s) [v_s, 1]^T)``: keys then queries in chunks along the sequence,
features never materialised for the whole sequence, a recomputing backward
(:class:`_FavorFn`). Memory O(L d) per head, time O((T + S) M (d + e)).
"""

from __future__ import annotations

import math

import torch

from .checks import _chunks, _safe
from .workspace import _Blocks, _Rows

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



def _per_group(w, G):
    """``w`` as (G, M, d): one omega shared by the G groups (M, d) is expanded (a view), one
    omega per group (G, M, d) is returned as is."""
    return w if w.dim() == 3 else w.expand(G, *w.shape)


def _add_dw(dw, x):
    """Accumulate a per-group (G, M, d) gradient into ``dw``: summed over the groups when they
    share one omega."""
    dw += x if dw.dim() == 3 else x.sum(0)


def _key_features(k_c, w, m_c, c, acc):
    """Exact-path key features of a chunk with an online max (the fallback of the fast path).

    ``exp(log_positive(k_c, w) - c)`` (G, c, M), ``c`` (G, 1, M) the running max over the keys
    seen so far, updated in place; the accumulators ``acc = (kv (G, M, e), ksum (G, 1, M))`` are
    rescaled to the new shift. Padded rows (``m_c`` False) get features exactly 0.
    """
    a = k_c @ w.transpose(-1, -2)  # (G, c, M)
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
    M = w.shape[-2]
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
    M = w.shape[-2]
    if key_mask is not None:
        r_max = torch.where(key_mask, rk, -math.inf).amax(-1, keepdim=True)
        r_min = torch.where(key_mask, rk, math.inf).amin(-1, keepdim=True)
        if not bool((r_max >= r_min).all()):  # a group without real keys
            return None
    else:
        r_max, r_min = rk.amax(-1, keepdim=True), rk.amin(-1, keepdim=True)
    wn = torch.linalg.vector_norm(w, dim=-1)  # (M,) or (G, M)
    rs = torch.minimum(torch.maximum(wn, r_min), r_max)  # (G, M)
    c = rs * wn - 0.5 * rs * rs
    wk = _augment(_per_group(w, G), 1.0, -c).mul_(_LOG2E).transpose(1, 2)
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
    wn = torch.linalg.vector_norm(w, dim=-1)  # (M,) or (G, M)
    wn = wn[:, None, :] if wn.dim() == 2 else wn
    f = (grid[:, :, None] * wn + lse[:, None, :]).amax(-1)
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
    wq = w.new_empty(G, M, w.shape[-1] + 2)
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

    Inputs are (G, L, *) contiguous tensors with G = B * H, and omega ``w``: (M, d) shared by
    all groups, or (G, M, d) one per group (per-head particles, all heads in one batched
    pass; the gradient is then per group).

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
        M, c_max = w.shape[-2], min(chunk, T)
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
        M, d = w.shape[-2:]
        wg = _per_group(w, G)
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
                    dq[:, t0:t1] = torch.bmm(da, wg, out=blocks(3, G, c, d))
                if need_w:
                    _add_dw(dw, torch.bmm(da.transpose(1, 2), q[:, t0:t1]))
        dk = torch.empty_like(k) if need_k else None
        dv = torch.empty_like(v) if need_v else None
        if need_k or need_v or need_w:
            # Softmax over keys per feature, exp(a_sm - lse_m): [k, -|k|^2/2, 1] times
            # [w, 1, -lse]; a feature without real keys (lse = -inf) gives 0.
            wk = _augment(wg, 1.0, torch.where(
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
                        _add_dw(dw, torch.bmm(da.transpose(1, 2), k_c))
        return dq, dk, dv, dw, None, None

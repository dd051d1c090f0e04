"""FAVOR+ in the quadratic association order: ``normalise(phi(Q) phi(K)^T) V`` in one batched
pass over all batches and heads (the short-sequence path).

At short sequences the ``(T, S)`` kernel matrix costs fewer operations than the chunked linear
order's overheads (see :func:`.favor.quadratic_is_cheaper`), and it is a handful of large
batched matmuls: features of all heads at once (one matmul with omega shared, one broadcast
matmul with one omega per head), one matmul for the kernel matrix, one for the output.

Shifts (all cancel in the attention ratio): each key feature m by its max over the real keys,
``c_m = max_s a_sm``; each query feature by ``+c_m`` and then its row max ``s_t``. The product
``phi_q[t, m] phi_k[s, m] = exp(b_tm + a_sm - s_t)`` is then exact, every exponent is <= 0,
and each row with a real key has a term equal to 1, so the normaliser is >= 1 at any input
norm (non-causal). The exponentials are ``exp2`` of logits in log2 units (omega carries
``log2 e``; ``exp2`` is 2-3x faster than ``exp`` on CPU). ``-|q|^2/2`` is a per-row constant
and left out (cancels; its gradient term ``-q sum_m dL/db_tm`` is exactly 0).
"""

from __future__ import annotations

import math

import torch

from .checks import _safe

# log2(e): logits in log2 units, features by exp2 (as in the fused path).
_LOG2E = 1.0 / math.log(2.0)


def _heads_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w`` for x (B, H, L, n) and w (1 or H, n, m): one matmul for all heads."""
    return torch.matmul(x, w[0] if w.shape[0] == 1 else w)


def _favor_features_quadratic(q, k, w, key_mask):
    """Query and key features with the shifts of the module docstring, in one expression each.

    q (B, H, T, d), k (B, H, S, d), w (1 or H, M, d). Returns ``phi_q`` (B, H, T, M) and
    ``phi_k`` (B, H, S, M); padded keys have features exactly 0.
    """
    wt = w.transpose(-1, -2) * _LOG2E  # (1 or H, d, M), log2 units
    a = _heads_matmul(k, wt)  # (B, H, S, M)
    rk = torch.linalg.vector_norm(k, dim=-1, keepdim=True)  # (B, H, S, 1)
    a.addcmul_(rk, rk, value=-0.5 * _LOG2E)  # log2 of exp(k . w - |k|^2/2)
    if key_mask is not None:
        a.masked_fill_(~key_mask[:, None, :, None], -math.inf)
    c = _safe(a.amax(-2, keepdim=True))  # (B, H, 1, M); 0 for a head without real keys
    phi_k = a.sub_(c).exp2_()
    b = _heads_matmul(q, wt).add_(c)  # (B, H, T, M)
    phi_q = b.sub_(b.amax(-1, keepdim=True)).exp2_()
    return phi_q, phi_k


class _FavorQuadFn(torch.autograd.Function):
    """Normalised ``(phi(q) phi(k)^T) v`` with a hand-written backward.

    Inputs: q (B, H, T, d), k (B, H, S, d), v (B, H, S, e), w (1 or H, M, d), key_mask (B, S)
    or None, causal (bool, T == S: the kernel matrix keeps s <= t). Returns ``out`` (B, H, T, e)
    and ``ok`` (a bool tensor, not differentiable): False when some causal row with a real key
    has an underflowed normaliser (its keys are far below the per-feature max of the whole
    sequence); the caller then takes the causal chunked path. Non-causal rows never underflow.

    Forward keeps ``A = phi_q phi_k^T`` (B, H, T, S) unnormalised: ``out = (A v) / den``, the
    non-causal ``den = phi_q . sum_s phi_k[s]`` (no pass over A). Backward, with
    ``g' = g / den``: ``dv = A^T g'``; ``dA = g' v^T - g' . out`` (one batched matmul-add);
    ``dphi_q = dA phi_k``, ``dphi_k = dA^T phi_q``; through ``exp``: ``db = dphi_q phi_q``,
    ``da = dphi_k phi_k``; ``dq = db w``, ``dk = da w - k sum_m da``,
    ``dw = sum (db^T q + da^T k)``. The shifts are constants (they cancel in the ratio).
    """

    @staticmethod
    def forward(ctx, q, k, v, w, key_mask, causal):
        phi_q, phi_k = _favor_features_quadratic(q, k, w, key_mask)
        a = torch.matmul(phi_q, phi_k.transpose(-1, -2))  # (B, H, T, S), kept unnormalised
        if causal:
            den = a.tril_().sum(-1, keepdim=True)  # (B, H, T, 1)
        else:  # phi_q . sum_s phi_k[s]: no pass over the (T, S) matrix
            den = torch.matmul(phi_q, phi_k.sum(-2).unsqueeze(-1))
        inv_den = torch.where(den > 0, den.reciprocal(), 0.0)  # a row without keys: output 0
        ok = torch.ones((), dtype=torch.bool)
        if causal:
            has_key = (torch.ones_like(den, dtype=torch.bool) if key_mask is None
                       else (key_mask.cumsum(-1) > 0)[:, None, :, None])
            ok = ((den >= _UNDERFLOW) | ~has_key).all()
        out = torch.matmul(a, v).mul_(inv_den)  # (B, H, T, e)
        ctx.mark_non_differentiable(ok)
        ctx.save_for_backward(q, k, v, w, phi_q, phi_k, a, inv_den, out)
        ctx.causal = causal
        return out, ok

    @staticmethod
    def backward(ctx, g, _g_ok):
        q, k, v, w, phi_q, phi_k, a, inv_den, out = ctx.saved_tensors
        need_q, need_k, need_v, need_w = ctx.needs_input_grad[:4]
        B, H, T, S, e = *a.shape, v.shape[-1]
        gs = g * inv_den  # (B, H, T, e): g / den
        dv = torch.matmul(a.transpose(-1, -2), gs) if need_v else None
        dq = dk = dw = None
        if need_q or need_k or need_w:
            # dL/dA = (g v^T - g . out) / den in one batched matmul-add
            rowdot = (gs * out).sum(-1, keepdim=True).reshape(B * H, T, 1)
            da_mat = torch.baddbmm(rowdot, gs.reshape(B * H, T, e),
                                   v.reshape(B * H, S, e).transpose(1, 2), beta=-1.0)
            da_mat = da_mat.view(B, H, T, S)
            if ctx.causal:
                da_mat.tril_()
            db = torch.matmul(da_mat, phi_k).mul_(phi_q) if (need_q or need_w) else None
            da = (torch.matmul(da_mat.transpose(-1, -2), phi_q).mul_(phi_k)
                  if (need_k or need_w) else None)
            dq, dk, dw = _through_logits(db, da, q, k, w, need_q, need_k, need_w)
        return dq, dk, dv, dw, None, None


def _through_logits(db, da, q, k, w, need_q, need_k, need_w):
    """``(dq, dk, dw)`` from the gradients of the query and key logits ``db`` (B, H, T, M) and
    ``da`` (B, H, S, M): logits ``q . w_m`` and ``k . w_m - |k|^2/2`` (shared by both orders)."""
    w0 = w[0] if w.shape[0] == 1 else w
    dq = torch.matmul(db, w0) if need_q else None
    dk = (torch.matmul(da, w0).addcmul_(k, da.sum(-1, keepdim=True), value=-1.0)
          if need_k else None)
    dw = _dw(db, q, w) + _dw(da, k, w) if need_w else None
    return dq, dk, dw


def _dw(dlogits, x, w):
    """``sum dlogits^T x`` over the batch (and the heads when omega is shared): (1 or H, M, d)."""
    M, d = w.shape[1], w.shape[2]
    if w.shape[0] == 1:
        return (dlogits.reshape(-1, M).T @ x.reshape(-1, d)).unsqueeze(0)
    return torch.matmul(dlogits.transpose(-1, -2), x).sum(0)


class _FavorLinearFn(torch.autograd.Function):
    """Normalised ``phi(q) (phi(k)^T v)`` in one batched pass (non-causal, unchunked): the
    linear association order for short and medium sequences, where the chunked fused path
    (:mod:`.fused`) pays more for its loops than it saves in memory.

    Features and shifts as :func:`_favor_features_quadratic` (so the normaliser is >= 1 for
    every row with a real key). Forward: ``kv = phi_k^T v`` (B, H, M, e), ``ksum = sum_s
    phi_k`` (B, H, M), ``den = phi_q . ksum``, ``out = (phi_q kv) / den``. Backward with
    ``g' = g / den`` and ``r = g' . out`` per row: ``dphi_q = g' kv^T - r ksum^T``,
    ``dkv = phi_q^T g'``, ``dksum = -phi_q^T r``, ``dphi_k = v dkv^T + dksum^T``,
    ``dv = phi_k dkv``; through ``exp`` and the logits as in :class:`_FavorQuadFn`.
    Time O((T + S) M (d + e)) per head in a few large matmuls; memory O((T + S) M).
    """

    @staticmethod
    def forward(ctx, q, k, v, w, key_mask):
        phi_q, phi_k = _favor_features_quadratic(q, k, w, key_mask)
        kv = torch.matmul(phi_k.transpose(-1, -2), v)  # (B, H, M, e)
        ksum = phi_k.sum(-2).unsqueeze(-1)  # (B, H, M, 1)
        den = torch.matmul(phi_q, ksum)  # (B, H, T, 1)
        inv_den = torch.where(den > 0, den.reciprocal(), 0.0)  # a row without keys: output 0
        out = torch.matmul(phi_q, kv).mul_(inv_den)  # (B, H, T, e)
        ctx.save_for_backward(q, k, v, w, phi_q, phi_k, kv, ksum, inv_den, out)
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, w, phi_q, phi_k, kv, ksum, inv_den, out = ctx.saved_tensors
        need_q, need_k, need_v, need_w = ctx.needs_input_grad[:4]
        gs = g * inv_den  # (B, H, T, e)
        r = (gs * out).sum(-1, keepdim=True)  # (B, H, T, 1)
        dkv = torch.matmul(phi_q.transpose(-1, -2), gs)  # (B, H, M, e)
        dv = torch.matmul(phi_k, dkv) if need_v else None
        dq = dk = dw = None
        if need_q or need_k or need_w:
            db = da = None
            if need_q or need_w:
                dphi_q = torch.matmul(gs, kv.transpose(-1, -2))  # (B, H, T, M)
                db = dphi_q.sub_(r * ksum.transpose(-1, -2)).mul_(phi_q)
            if need_k or need_w:
                dksum = torch.matmul(phi_q.transpose(-1, -2), r).neg_()  # (B, H, M, 1)
                dphi_k = torch.matmul(v, dkv.transpose(-1, -2))  # (B, H, S, M)
                da = dphi_k.add_(dksum.transpose(-1, -2)).mul_(phi_k)
            dq, dk, dw = _through_logits(db, da, q, k, w, need_q, need_k, need_w)
        return dq, dk, dv, dw, None


def favor_attention_linear_short(q, k, v, w, key_mask=None):
    """FAVOR+ in the linear order, unchunked (non-causal; inputs in the compute dtype).

    q (B, H, T, d), k (B, H, S, d), v (B, H, S, e), w (1 or H, M, d), key_mask (B, S) or None.
    Returns ``out`` (B, H, T, e).
    """
    return _FavorLinearFn.apply(q, k, v, w, key_mask)


# A causal normaliser below this (with a real key) sends the call to the chunked path.
_UNDERFLOW = 2.0**-60


def favor_attention_quadratic(q, k, v, w, key_mask=None, causal=False):
    """FAVOR+ in the quadratic order (inputs already in the compute dtype).

    q (B, H, T, d), k (B, H, S, d), v (B, H, S, e), w (1 or H, M, d), key_mask (B, S) or None.
    Returns ``out`` (B, H, T, e), or ``None`` when a causal normaliser underflowed.
    """
    out, ok = _FavorQuadFn.apply(q, k, v, w, key_mask, causal)
    return out if bool(ok) else None

"""Causal linear attention (prefix sums in blocks) and causal FAVOR+."""

from __future__ import annotations

import math

import torch

from .checks import (
    _TINY,
    _check_causal,
    _check_omega,
    _check_qkv,
    _chunk_size,
    _chunks,
    _compute_dtype,
    _no_autocast,
    _safe,
)
from .favor import _favor_logits, use_quadratic
from .quadratic import favor_attention_quadratic

__all__ = ["causal_linear_attention", "causal_favor_attention"]


# Cap (in log units) on how far below its shift a key feature's prefix max may lie and still
# set a row's query shift: query features stay <= exp(60) ~ 1e26 (finite in float32, also in
# the masked upper triangle of a block).
_ROW_CAP = 60.0


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
            # prefix max of each key feature up to row t (earlier blocks: c; this block:
            # cummax), for the query shift: a feature's block max may come from a key *after*
            # t, and shifting by it alone can leave a row's normaliser tiny (its backward then
            # overflowed: NaN gradients in training)
            p = torch.maximum(c, torch.cummax(fk, dim=-2).values).detach()  # (B, H, c, M)
            c_new = torch.maximum(c, fk.amax(-2, keepdim=True)).detach()
            state = state * torch.exp(c - _safe(c_new)).transpose(-1, -2)
            c = c_new
            fk = torch.exp(fk - _safe(c))
            fq = shift(fq + c, p - _safe(c))
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
    order: str = "auto",
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

    ``order`` as in :func:`.favor.favor_attention`: at short sequences (``"auto"``) the
    quadratic order (:mod:`.quadratic`, the kernel matrix kept for ``s <= t``) computes the
    same result in one batched pass; its key shift is per feature over the whole sequence, so
    where a row's normaliser would underflow (large norms shrinking along the sequence) the
    call falls back to the blocks above.

    Parameters and result as :func:`.favor.favor_attention` (``T == S``).
    """
    _check_qkv(q, k, v, key_mask)
    _check_omega(omega, q.shape[1], q.shape[-1])
    _check_causal(q, k)
    chunk = _chunk_size(chunk_size, 128)
    dt = _compute_dtype(v)
    quadratic = use_quadratic(order, q.shape[2], k.shape[2], omega.shape[1], v.shape[-1],
                              q.shape[0] * q.shape[1], causal=True)
    with _no_autocast(v):
        om = omega.to(dt)
        if quadratic:
            out = favor_attention_quadratic(q.to(dt), k.to(dt), v.to(dt), om, key_mask,
                                            causal=True)
            if out is not None:
                return out.to(v.dtype)
        b, a = _favor_logits(q.to(dt), om), _favor_logits(k.to(dt), om)  # (B, H, L, M)
        if key_mask is not None:
            a = a.masked_fill(~key_mask[:, None, :, None], -math.inf)

        def exp_rows(x, rel):
            """Query features ``exp(x - s_t)``, ``x = b + c`` (the key shift added back), with
            the row shift ``s_t = max_m (x_m + max(rel_m, -_ROW_CAP))`` (cancels in the ratio),
            ``rel = p - c <= 0`` the prefix max of key feature m up to row t relative to its
            shift. The feature that attains ``s_t`` has a key at or before t with feature
            ``exp(rel_m)``, so the row's normaliser is >= 1 (unless its best feature is capped:
            all of its keys so far are > _ROW_CAP below the block's), and every query feature
            is <= exp(_ROW_CAP), finite in float32."""
            top = (x + rel.clamp_min(-_ROW_CAP)).amax(-1, keepdim=True).detach()
            return torch.exp(x - _safe(top))

        out = _causal_chunks(b, a, v, key_mask, chunk, shift=exp_rows)
    return out.to(v.dtype)

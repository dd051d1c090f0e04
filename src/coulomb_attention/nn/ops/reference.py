"""Naive quadratic twins of the fast ops (test oracles, flash-linear-attention's ``naive.py``).

- :func:`naive_linear_attention`: through the ``(T, S)`` kernel matrix (twin of
  :func:`.linear.linear_attention` and, causal, :func:`.causal.causal_linear_attention`);
- :func:`naive_favor_attention`: :func:`.favor.favor_features` + the above (twin of
  :func:`.favor.favor_attention` and :func:`.causal.causal_favor_attention`);
- :func:`softmax_attention`: exact softmax attention, the reference FAVOR+ approximates.
"""

from __future__ import annotations

import math

import torch

from .checks import _TINY, _check_causal, _check_qkv, _compute_dtype, _no_autocast
from .favor import favor_features

__all__ = ["naive_linear_attention", "naive_favor_attention", "softmax_attention"]


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

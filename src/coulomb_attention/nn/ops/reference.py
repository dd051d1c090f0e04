"""Naive quadratic twins of the fast ops (test oracles, flash-linear-attention's ``naive.py``).

- :func:`naive_linear_attention`: through the ``(T, S)`` kernel matrix (twin of
  :func:`.linear.linear_attention` and, causal, :func:`.causal.causal_linear_attention`);
- :func:`naive_favor_attention`: :func:`.favor.favor_features` + the above (twin of
  :func:`.favor.favor_attention` and :func:`.causal.causal_favor_attention`);
- :func:`naive_recurrent_attention`: causal linear attention one token at a time, unshifted
  (twin of the stateful causal ops and of their one-token steps, grouped queries included);
- :func:`softmax_attention`: exact softmax attention, the reference FAVOR+ approximates.
"""

from __future__ import annotations

import math

import torch

from .checks import _TINY, _check_causal, _check_qkv, _compute_dtype, _no_autocast
from .favor import favor_features

__all__ = ["naive_linear_attention", "naive_favor_attention", "naive_recurrent_attention",
           "softmax_attention"]


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


def naive_recurrent_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    initial_state: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Causal linear attention as the recurrence itself, one token at a time, no shifts (the
    twin of :func:`.causal.causal_linear_attention` / :func:`.causal.causal_favor_attention`
    with a state, and of their steps; use float64).

    ``S_t = S_{t-1} + phi_k[t] v_t^T``, ``z_t = z_{t-1} + phi_k[t]``,
    ``out_t = phi_q[t] S_t / phi_q[t] . z_t`` (0 where the normaliser is 0).

    Parameters
    ----------
    phi_q : torch.Tensor, shape (B, H, L, M)
    phi_k : torch.Tensor, shape (B, Hk, L, M), ``Hk`` dividing ``H`` (query head ``h`` reads
        key head ``h // (H / Hk)``)
    v : torch.Tensor, shape (B, Hk, L, e)
    initial_state : (S (B, Hk, M, e), z (B, Hk, M)), optional

    Returns
    -------
    out : torch.Tensor, shape (B, H, L, e)
    state : (S, z) after the last token
    """
    B, H, L, M = phi_q.shape
    hk, e = phi_k.shape[1], v.shape[-1]
    if H % hk or phi_k.shape != (B, hk, L, M) or v.shape[:3] != (B, hk, L):
        raise ValueError(f"inconsistent shapes: phi_q {tuple(phi_q.shape)}, phi_k "
                         f"{tuple(phi_k.shape)}, v {tuple(v.shape)}")
    g = H // hk
    if initial_state is None:
        S = phi_q.new_zeros(B, hk, M, e)
        z = phi_q.new_zeros(B, hk, M)
    else:
        S, z = (t.clone() for t in initial_state)
    outs = []
    for t in range(L):
        S = S + phi_k[:, :, t, :, None] * v[:, :, t, None, :]
        z = z + phi_k[:, :, t]
        Sg, zg = S.repeat_interleave(g, 1), z.repeat_interleave(g, 1)  # (B, H, M, *)
        num = (phi_q[:, :, t, :, None] * Sg).sum(-2)  # (B, H, e)
        den = (phi_q[:, :, t] * zg).sum(-1, keepdim=True)  # (B, H, 1)
        outs.append(torch.where(den > 0, num / den.clamp_min(_TINY), 0.0))
    return torch.stack(outs, 2), (S, z)

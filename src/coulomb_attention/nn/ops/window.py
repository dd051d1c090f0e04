"""Sliding-window softmax plus linear attention over the rest (the LoLCATs hybrid, eq. 7).

Per head, with ``N(t)`` the window of query ``t`` (encoders: ``|s - t| <= W/2``, the ``W/2``
tokens on each side and ``t`` itself; causal: the ``W`` most recent, ``t - W < s <= t``) and
``R(t)`` the other keys it may see (encoders: every other key; causal: ``s <= t - W``)::

            gamma sum_{s in N(t)} exp(q_t . k_s) v_s  +  sum_{s in R(t)} phi(q_t) . phi(k_s) v_s
    out_t = ---------------------------------------------------------------------------------
            gamma sum_{s in N(t)} exp(q_t . k_s)      +  sum_{s in R(t)} phi(q_t) . phi(k_s)

one shared denominator, ``gamma`` a weight per head (in the layer ``sigmoid`` of a learned
logit, started at ``sigmoid(-2.2) = 0.1`` as in LoLCATs), padded keys in neither sum. LoLCATs
subtracts the window's row maximum inside the window term only; here one row shift ``c_t``
multiplies both terms (``exp(-c_t)`` cancels in the ratio), so the two parts keep the units of
``exp(q . k)``, which FAVOR+'s ``phi(q) . phi(k)`` estimates: with ``gamma = 1`` and an exact
kernel the hybrid is softmax attention. ``linear=False`` drops the second sum (the window
alone: the ablation of the linear branch; ``gamma`` then cancels).

The fast path :func:`window_attention` works on query blocks of ``block`` rows, each against
the ``block + W`` keys around it (a banded computation: no ``L x L`` matrix), and takes the
linear term over ``R(t)`` as the term over every visible key (one ``(M, e)`` state per head;
causal: prefix sums) minus its in-window part (from the same blocked keys): cost
``O(L (W + M) d)``-ish per head (``O(L W (d + M))`` exactly). Its naive twin
:func:`naive_window_attention` builds the ``L x L`` masks.

Features may carry a log offset, for exp-type maps whose features must be shifted to stay
finite: ``phi(q_t) . phi(k_s) = exp(log_q[t] + log_k) pq[t] . pk[s]`` with ``log_q`` (B, H, L, 1)
and ``log_k`` (B, H, 1, 1) (``None``: 0).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .checks import _TINY, _compute_dtype, _no_autocast

__all__ = ["naive_window_attention", "window_attention", "window_masks"]


def _reach(window: int, causal: bool) -> tuple[int, int]:
    """Keys before and after a query inside its window."""
    return (window - 1, 0) if causal else (window // 2, window // 2)


def window_masks(length: int, window: int, causal: bool = False,
                 device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(in_window, rest)`` (L, L) bool: key ``s`` in query ``t``'s window ``N(t)``, and in the
    rest ``R(t)`` it sees by the linear term (module docstring)."""
    t = torch.arange(length, device=device)
    rel = t[None, :] - t[:, None]  # s - t
    before, after = _reach(window, causal)
    inside = (rel >= -before) & (rel <= after)
    rest = ~inside & (rel < 0) if causal else ~inside
    return inside, rest


def _check(q, k, v, window, causal, gamma):
    if q.ndim != 4 or k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"q, k must have the same shape (B, H, L, d) and v (B, H, L, e), got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ValueError(f"window must be an integer > 0, got {window!r}")
    if not causal and window % 2:
        raise ValueError(f"window must be even for an encoder (W/2 tokens on each side), got "
                         f"{window}")
    if gamma.shape != (q.shape[1],):
        raise ValueError(f"gamma must have shape ({q.shape[1]},), got {tuple(gamma.shape)}")


def naive_window_attention(q, k, v, pq, pk, gamma, window, key_mask=None, *, causal=False,
                           log_q=None, log_k=None, linear=True):
    """The hybrid with full ``L x L`` matrices, unshifted (the twin of
    :func:`window_attention`; use float64). Same arguments and result."""
    _check(q, k, v, window, causal, gamma)
    B, H, L, _ = q.shape
    inside, rest = window_masks(L, window, causal, q.device)
    valid = torch.ones(B, L, dtype=torch.bool, device=q.device) if key_mask is None else key_mask
    inside = inside[None, None] & valid[:, None, None, :]  # (B, 1, L, L)
    rest = rest[None, None] & valid[:, None, None, :]
    g = gamma.to(q.dtype)[None, :, None, None]
    w = g * torch.exp(q @ k.transpose(-1, -2)) * inside
    if linear:
        off = (0.0 if log_q is None else log_q) + (0.0 if log_k is None else log_k)
        w = w + torch.exp(torch.as_tensor(off, dtype=q.dtype)) * (pq @ pk.transpose(-1, -2)) * rest
    return (w @ v) / w.sum(-1, keepdim=True).clamp_min(_TINY)


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """(B, H, L, c) zero padded to ``n`` rows (no copy when ``L == n``)."""
    return t if t.shape[2] == n else F.pad(t, (0, 0, 0, n - t.shape[2]))


def _blocks(t: torch.Tensor, before: int, after: int, block: int, n_blocks: int) -> torch.Tensor:
    """(B, H, L, c) -> (B, H, n_blocks, block + before + after, c): the keys around each query
    block (zero padded)."""
    L = t.shape[2]
    padded = F.pad(t, (0, 0, before, n_blocks * block - L + after))
    return padded.unfold(2, block + before + after, block).transpose(-1, -2)


def window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pq: torch.Tensor | None,
    pk: torch.Tensor | None,
    gamma: torch.Tensor,
    window: int,
    key_mask: torch.Tensor | None = None,
    *,
    causal: bool = False,
    log_q: torch.Tensor | None = None,
    log_k: torch.Tensor | None = None,
    linear: bool = True,
    block: int | None = None,
) -> torch.Tensor:
    """The hybrid of the module docstring, blocked (no ``L x L`` matrix).

    Parameters
    ----------
    q, k : (B, H, L, d)   scaled queries and keys (the softmax logits are ``q . k``)
    v : (B, H, L, e)
    pq, pk : (B, H, L, M) non-negative features of the linear term (``None`` with
        ``linear=False``); padded keys are removed here
    gamma : (H,)          weight of the window term per head
    window : int          ``W`` (even for an encoder)
    key_mask : (B, L) bool, optional (True = real token)
    causal : bool
    log_q, log_k : optional log offsets of the features, (B, H, L, 1) and (B, H, 1, 1)
    linear : bool         False: the window alone
    block : int, optional query rows per block (default ``max(W, 16)``)

    Returns
    -------
    (B, H, L, e) in ``v``'s dtype; a query that sees no key gets 0.
    """
    _check(q, k, v, window, causal, gamma)
    B, H, L, _ = q.shape
    e = v.shape[-1]
    before, after = _reach(window, causal)
    bq = max(1, min(L, block or max(window, 16)))
    nb = -(-L // bq)
    dt, out_dtype = _compute_dtype(v), v.dtype
    with _no_autocast(v):
        q, k, v = q.to(dt), k.to(dt), v.to(dt)
        valid = (torch.ones(B, L, dtype=dt, device=q.device) if key_mask is None
                 else key_mask.to(dt))
        kb = _blocks(k, before, after, bq, nb)  # (B, H, nb, Kb, d)
        vb = _blocks(v, before, after, bq, nb)  # (B, H, nb, Kb, e)
        mb = _blocks(valid[:, None, :, None], before, after, bq, nb)[..., 0]  # (B, 1, nb, Kb)
        r = torch.arange(bq, device=q.device)[:, None]
        j = torch.arange(bq + before + after, device=q.device)[None, :]
        band = (j - r >= 0) & (j - r <= before + after)  # (bq, Kb): s - t in [-before, after]
        inside = band & (mb[:, :, :, None, :] > 0)  # (B, 1, nb, bq, Kb)
        qb = _rows(q, nb * bq).reshape(B, H, nb, bq, -1)
        logits = (qb @ kb.transpose(-1, -2)).masked_fill(~inside, float("-inf"))
        shift = logits.amax(-1, keepdim=True)  # (B, H, nb, bq, 1), -inf: empty window
        if linear:
            if pq is None or pk is None:
                raise ValueError("the linear term needs features pq and pk")
            pq, pk = pq.to(dt), pk.to(dt) * valid[:, None, :, None]
            off = torch.zeros(B, H, L, 1, dtype=dt, device=q.device)
            if log_q is not None:
                off = off + log_q.to(dt)
            if log_k is not None:
                off = off + log_k.to(dt)
            offb = _rows(off, nb * bq).reshape(B, H, nb, bq, 1)
            shift = torch.maximum(shift, offb)
        shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift)).detach()
        # the window term's weights, 0 outside the window
        w = gamma.to(dt)[None, :, None, None, None] * torch.exp(logits - shift)
        den = w.sum(-1, keepdim=True)  # (B, H, nb, bq, 1)
        if linear:
            if causal:  # every key s <= t: prefix sums (numerator from the normalised op)
                from .causal import causal_linear_attention

                seen_den = (pq * pk.cumsum(2)).sum(-1, keepdim=True)  # (B, H, L, 1)
                seen = causal_linear_attention(pq, pk, v, None) * seen_den
            else:
                seen = pq @ (pk.transpose(-1, -2) @ v)  # (B, H, L, e)
                seen_den = pq @ pk.sum(2, keepdim=True).transpose(-1, -2)  # (B, H, L, 1)
            seen = _rows(seen, nb * bq).reshape(B, H, nb, bq, e)
            seen_den = _rows(seen_den, nb * bq).reshape(B, H, nb, bq, 1)
            pqb = _rows(pq, nb * bq).reshape(B, H, nb, bq, -1)
            c = torch.exp(offb - shift)
            kw = c * (pqb @ _blocks(pk, before, after, bq, nb).transpose(-1, -2)) * inside
            # the linear term over R(t): all it sees minus its in-window part, folded into the
            # window's weights (one product with the values); its denominator kept >= 0
            w = w - kw
            den = den + (c * seen_den - kw.sum(-1, keepdim=True)).clamp_min(0.0)
            num = w @ vb + c * seen
        else:
            num = w @ vb
        out = num / den.clamp_min(_TINY)
        out = out.reshape(B, H, nb * bq, e)[:, :, :L]
    return out.to(out_dtype)

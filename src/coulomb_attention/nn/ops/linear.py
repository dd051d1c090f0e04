"""Non-causal linear attention from precomputed features (any non-negative map)."""

from __future__ import annotations

import torch

from .checks import _TINY, _check_qkv, _compute_dtype, _no_autocast

__all__ = ["linear_attention"]


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

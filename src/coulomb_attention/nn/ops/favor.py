"""FAVOR+ attention: the stabilised feature map and the entry point that picks the order.

Features ``exp(w . x - |x|^2/2 - shift)`` (the core :func:`coulomb_attention.features.log_positive`
plus an exponential), shifts that cancel in the attention ratio. :func:`favor_attention` computes
the normalised ``phi(Q) phi(K)^T V`` in the cheaper association order: quadratic
(:mod:`.quadratic`, one batched pass) at the shortest sequences, linear beyond, unchunked (a few
batched matmuls, :func:`.quadratic.favor_attention_linear_short`) while the features are small
(:data:`UNCHUNKED_MAX_FEATURES`) and fused and chunked (:mod:`.fused`, O(L d) memory) at long
ones; the crossover is a cost rule (:func:`quadratic_is_cheaper`) and overridable (``order``).
"""

from __future__ import annotations

import math

import torch

from ...features import log_positive
from .checks import (
    _check_4d,
    _check_omega,
    _check_qkv,
    _chunk_size,
    _compute_dtype,
    _no_autocast,
    _safe,
    check_key_mask,
)
from .fused import _FavorFn
from .quadratic import favor_attention_linear_short, favor_attention_quadratic

__all__ = [
    "BLOCK_ELEMENTS",
    "LINEAR_OVERHEAD",
    "QUADRATIC_COST_RATIO",
    "UNCHUNKED_COST_RATIO",
    "UNCHUNKED_MAX_FEATURES",
    "default_chunk_size",
    "favor_attention",
    "favor_attention_blocked",
    "favor_features",
    "linear_is_unchunked",
    "quadratic_is_cheaper",
    "use_blocked_inference",
]


def _favor_logits(u: torch.Tensor, om: torch.Tensor) -> torch.Tensor:
    """``log_positive(u, w)`` of (B, H, L, d) with omega (1 or H, M, d): (B, H, L, M), all
    heads in one (broadcast) matmul."""
    if om.shape[0] == 1:
        return log_positive(u, om[0])
    return torch.matmul(u, om.transpose(-1, -2)) - 0.5 * (u * u).sum(-1, keepdim=True)


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


# Measured crossover of the association orders (2 CPU threads, torch 2.13, fwd+bwd, head dim
# 32, M in {16, 64}, B in {1, 32}; docs/attention.md): per multiply-add the quadratic order's
# big batched matmuls ran ~3x cheaper than the chunked linear order's work, which also pays a
# fixed cost per call (~1 ms: its Python loop, shift bounds, small ops), worth about 1e7 of
# the quadratic order's multiply-adds.
QUADRATIC_COST_RATIO = 3.0
LINEAR_OVERHEAD = 1e7
ORDERS = ("auto", "quadratic", "linear", "chunked")


# The unchunked linear order (non-causal) is a few large batched matmuls like the quadratic
# order: the same cost per multiply-add and no fixed cost. It keeps the features of all rows,
# groups (T + S) M floats (and their gradients), so it runs while that is at most this (32 MiB
# of float32 features); beyond, the chunked fused path (O(L d) memory) is as fast or faster
# (measured fwd+bwd, 1 thread, B = 32, d = 32, M = 64: unchunked / chunked 0.89 at 6M
# feature elements, 1.00 at 8M, 1.07 at 12M).
UNCHUNKED_COST_RATIO = 1.0
UNCHUNKED_MAX_FEATURES = 1 << 23


def linear_is_unchunked(T: int, S: int, n_features: int, groups: int = 1,
                        causal: bool = False) -> bool:
    """Whether the linear order runs unchunked (:func:`.quadratic.favor_attention_linear_short`):
    non-causal, and ``groups (T + S) M <= UNCHUNKED_MAX_FEATURES``."""
    return not causal and groups * (T + S) * n_features <= UNCHUNKED_MAX_FEATURES


def quadratic_is_cheaper(T: int, S: int, n_features: int, e: int, groups: int = 1,
                         ratio: float | None = None, overhead: float | None = None,
                         chunked: bool | None = None) -> bool:
    """Whether the quadratic order ``(phi(Q) phi(K)^T) V`` is the cheaper one.

    Both orders compute the features, ``(T + S) M d`` per head. Beyond that the quadratic order
    costs ``T S (M + e)`` multiply-adds per head (kernel matrix and output) and the linear
    order ``(T + S) M (e + 1)`` (key-value state and output with normaliser). The quadratic
    order is chosen while

        groups T S (M + e) <= ratio groups (T + S) M (e + 1) + overhead

    with ``groups = B H``. The constants depend on how the linear order runs (``chunked``;
    default :func:`linear_is_unchunked` decides): unchunked it is batched matmuls like the
    quadratic order (:data:`UNCHUNKED_COST_RATIO` = 1, no overhead), so for ``M = 64``,
    ``e = 32`` the quadratic order wins up to L ~ 44 and for ``M = 16`` up to L ~ 22; chunked
    (fused) its loops cost :data:`QUADRATIC_COST_RATIO` times more per multiply-add plus
    :data:`LINEAR_OVERHEAD` per call (measured; docs/attention.md).
    """
    if chunked is None:
        chunked = not linear_is_unchunked(T, S, n_features, groups)
    if ratio is None:
        ratio = QUADRATIC_COST_RATIO if chunked else UNCHUNKED_COST_RATIO
    if overhead is None:
        overhead = LINEAR_OVERHEAD if chunked else 0.0
    quad = groups * T * S * (n_features + e)
    return quad <= ratio * groups * (T + S) * n_features * (e + 1) + overhead


#: Feature elements ((T + S) M) of one block of :func:`favor_attention_blocked` (2 MiB of
#: float32: one head of a few sequences, in cache from the product that makes the features to
#: the products that use them).
BLOCK_ELEMENTS = 1 << 19


def use_blocked_inference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          omega: torch.Tensor) -> bool:
    """Whether the linear order runs block by block (:func:`favor_attention_blocked`): on the
    CPU, without autograd, when the features of all heads exceed one block (below, one batched
    pass costs less than a call per head) and one sequence's fit one."""
    B, H, T, _ = q.shape
    S, M = k.shape[2], omega.shape[1]
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, omega))
    return (q.device.type == "cpu" and not grad and B * H * (T + S) * M > BLOCK_ELEMENTS
            and (T + S) * M <= UNCHUNKED_MAX_FEATURES)


def favor_attention_blocked(q, k, v, w, key_mask=None):
    """:func:`.quadratic.favor_attention_linear_short` one head and a few sequences at a time
    (inference; inputs in the compute dtype): each block's q, k, v are views of the inputs (no
    head-first copies of token-major projections) and its features stay in cache.

    q (B, H, T, d), k (B, H, S, d), v (B, H, S, e), w (1 or H, M, d), key_mask (B, S) or None.
    Returns ``out`` (B, H, T, e), laid out token-major (``out.transpose(1, 2)`` is contiguous).
    """
    B, H, T, _ = q.shape
    S, e, M = k.shape[2], v.shape[3], w.shape[1]
    out = torch.empty(B, T, H, e, dtype=v.dtype, device=v.device).transpose(1, 2)
    bb = max(1, min(B, BLOCK_ELEMENTS // ((T + S) * M)))
    for h in range(H):
        wh = w if w.shape[0] == 1 else w[h:h + 1]
        for b0 in range(0, B, bb):
            blk = (slice(b0, b0 + bb), slice(h, h + 1))
            mask = None if key_mask is None else key_mask[b0:b0 + bb]
            out[blk] = favor_attention_linear_short(q[blk], k[blk], v[blk], wh, mask)
    return out


def _check_order(order: str) -> str:
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    return order


def use_quadratic(order: str, T: int, S: int, n_features: int, e: int, groups: int,
                  causal: bool = False) -> bool:
    """``order`` resolved to quadratic (True) or linear (False): ``"quadratic"``;
    ``"linear"`` / ``"chunked"``; ``"auto"`` by :func:`quadratic_is_cheaper` (the causal
    linear order is always chunked)."""
    if _check_order(order) == "auto":
        return quadratic_is_cheaper(T, S, n_features, e, groups,
                                    chunked=True if causal else None)
    return order == "quadratic"


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
    order: str = "auto",
) -> torch.Tensor:
    """FAVOR+ linear attention, in the cheaper association order (the fast path).

    Equal (up to rounding) to :func:`.reference.naive_favor_attention`: positive features
    ``exp(w . x - |x|^2/2)`` (the core :func:`coulomb_attention.features.log_positive` plus
    an exponential) with shifts that cancel in the attention ratio, padded keys contributing
    zero. Two orders compute the same normalised ``phi(Q) phi(K)^T V``:

    - ``"quadratic"``: the ``(T, S)`` kernel matrix in one batched pass over all batches and
      heads (:mod:`.quadratic`); O(T S (M + e)) time and O(T S) memory per head, the fastest
      at short sequences;
    - ``"linear"``: ``phi(Q) (phi(K)^T V)``, O((T + S) M (d + e)) time per head: unchunked in
      a few batched matmuls while the features are small (:func:`linear_is_unchunked`), else
      fused and chunked (:mod:`.fused`): keys then queries in chunks of ``chunk_size`` rows
      with a recomputing backward, O(L d) memory per head;
    - ``"chunked"``: the linear order, always fused and chunked;
    - ``"auto"`` (default): the quadratic order where :func:`quadratic_is_cheaper` says so,
      else ``"linear"``.

    On the CPU without autograd the linear order (``"auto"``, ``"linear"``) runs one head and a
    few sequences at a time where :func:`use_blocked_inference` says so
    (:func:`favor_attention_blocked`: same values, features in cache, no head-first copies).

    Parameters
    ----------
    q : torch.Tensor, shape (B, H, T, d)
    k : torch.Tensor, shape (B, H, S, d)
    v : torch.Tensor, shape (B, H, S, e)
    omega : torch.Tensor, shape (1 or H, M, d)
        Particles (rows), shared across heads when the first dimension is 1.
    key_mask : torch.Tensor of bool, shape (B, S), optional
    chunk_size : int, optional
        Rows per chunk of the linear order; default :func:`default_chunk_size`.
    order : {"auto", "quadratic", "linear", "chunked"}
        Association order (``"chunked"``: linear, always the fused chunked path).

    Returns
    -------
    torch.Tensor, shape (B, H, T, e), dtype of ``v``.
    """
    _check_qkv(q, k, v, key_mask)
    _check_omega(omega, q.shape[1], q.shape[-1])
    B, H, T, d = q.shape
    S, e = v.shape[2], v.shape[3]
    M = omega.shape[1]
    dt = _compute_dtype(v)
    shared = omega.shape[0] == 1
    chunk_size = _chunk_size(chunk_size, default_chunk_size(B * H, M))
    quadratic = use_quadratic(order, T, S, M, e, B * H)
    with _no_autocast(v):
        qq, kk, vv, om = (t.to(dt) for t in (q, k, v, omega))
        if quadratic:
            out = favor_attention_quadratic(qq, kk, vv, om, key_mask)
        elif order != "chunked" and use_blocked_inference(qq, kk, vv, om):
            out = favor_attention_blocked(qq, kk, vv, om, key_mask)
        elif order != "chunked" and linear_is_unchunked(T, S, M, B * H):
            out = favor_attention_linear_short(qq, kk, vv, om, key_mask)
        else:  # all batches and heads in one fused pass (per-head omega: one per group)
            mask = None
            if key_mask is not None:
                mask = key_mask[:, None, :].expand(B, H, S).reshape(B * H, S)
            w = om[0] if shared else om.unsqueeze(0).expand(B, H, M, d).reshape(B * H, M, d)
            out = _FavorFn.apply(
                qq.reshape(B * H, T, d).contiguous(),
                kk.reshape(B * H, S, d).contiguous(),
                vv.reshape(B * H, S, e).contiguous(),
                w,
                mask,
                chunk_size,
            )
            out = out.view(B, H, T, e)
    return out.to(v.dtype)

"""Scratch memory of the fused FAVOR+ path, kept between calls (per thread, CPU only)."""

from __future__ import annotations

import math
import threading

import torch

__all__ = ["clear_workspace"]


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

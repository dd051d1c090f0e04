"""Input checks and numerics shared by the attention ops.

Shapes: ``B`` batch, ``H`` heads, ``T`` queries, ``S`` keys, ``d`` head dim of queries/keys,
``e`` head dim of values, ``M`` random features. ``key_mask`` is ``(B, S)`` bool with
``True`` = real token.

Numerics: the ops compute in float32 (float64 stays float64, :func:`_compute_dtype`) with
autocast switched off inside (:func:`_no_autocast`) and cast the output back to ``v``'s dtype.
"""

from __future__ import annotations

import contextlib

import torch

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


def held_bytes(*tensors: torch.Tensor | None) -> int:
    """Bytes of the distinct storages behind ``tensors`` (``None`` skipped): what keeping them
    costs, not their ``numel`` (a view keeps its whole base alive: a state that held a slice of
    the prompt's keys would hold the prompt's KV cache)."""
    storages = {}
    for t in tensors:
        if t is not None:
            st = t.untyped_storage()
            storages[(st.device, st.data_ptr())] = st.nbytes()
    return sum(storages.values())


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)`` without the call when ``t`` has it already (a no-op ``.to`` still costs
    ~2 us of dispatch, a dozen per layer in a decoding step)."""
    return t if t.dtype == dtype else t.to(dtype)


def _no_autocast(t: torch.Tensor):
    """A context without autocast on ``t``'s device: entering ``torch.autocast`` costs ~9 us,
    a decoding step's budget per layer is ~300 us, so the context is a no-op when autocast is
    off already."""
    device = t.device.type
    if not torch.is_autocast_enabled(device):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, enabled=False)



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



def _chunks(n: int, size: int):
    return [(i, min(i + size, n)) for i in range(0, n, size)]



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


"""Which op runs a :class:`~coulomb_attention.nn.KernelAttention` call: the fused Triton
kernels (:mod:`.ops.triton_linear`) where they apply, else today's ops (``None`` here).

The fused path runs when all hold: the layer is non-causal; its map is one of
:data:`.ops.triton_linear.FUSED_MAPS`; it has no particle masses, or it is FAVOR+ (masses fold
into an extra coordinate, :meth:`KernelAttention._favor_augmented`); ``layer.order`` is not an
explicit ``"quadratic"`` or ``"chunked"``; Triton is importable; the inputs are CUDA tensors of
one dtype among float32/bf16/fp16 (CPU tensors only with :data:`CPU_INTERPRETER` set and
Triton in its interpreter: the tests);
``M <= 256``. Opt-outs: ``layer.fused = False`` (one layer) or ``COULOMB_ATTENTION_FUSED=0``
in the environment (the process).
"""

from __future__ import annotations

import os

import torch

__all__ = ["CPU_INTERPRETER", "fused_attend", "fused_enabled"]

#: Test hook: dispatch CPU tensors too (only where Triton runs in its interpreter). Off: a CPU
#: layer never imports triton.
CPU_INTERPRETER = False


def fused_enabled() -> bool:
    """False when the environment opts out (``COULOMB_ATTENTION_FUSED=0``)."""
    return os.environ.get("COULOMB_ATTENTION_FUSED", "1").lower() not in ("0", "false", "off",
                                                                         "no")


def fused_attend(layer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 mask: torch.Tensor | None) -> torch.Tensor | None:
    """The layer's attention through the fused kernels, or ``None`` where they do not apply
    (the caller then runs today's ops). q, k (B, H, T|S, dh) scaled, v (B, H, S, dh)."""
    if layer.causal or not getattr(layer, "fused", True) or not fused_enabled():
        return None
    if getattr(layer, "order", "auto") in ("quadratic", "chunked") or not q.is_floating_point():
        return None
    if not (q.is_cuda or CPU_INTERPRETER):
        return None  # the common CPU case: no import of triton at all
    from .ops import triton_linear as TL

    name = layer.feature_map
    if name not in TL.FUSED_MAPS:
        return None
    om = layer.omega
    if layer.mass is not None:
        if name != "favor":
            return None
        q, k, om = layer._favor_augmented(q, k)
    if not TL.fused_supported(q, k, v, om, name):
        return None
    return TL.fused_kernel_attention(q, k, v, om, name, mask)

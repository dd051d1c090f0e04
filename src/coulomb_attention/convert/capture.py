"""The one capture hook: the input of an attention layer, without running the rest of the model.

Phase A (label alignment), the teacher-attention distillation and the conversion of pretrained
encoders all need, per attention layer, the representation ``h`` that enters it (computed with
the already-converted earlier layers). :func:`layer_inputs` registers a forward pre-hook that
records ``(h, mask)`` and stops the forward pass there.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn

__all__ = ["layer_inputs"]


class _Stop(Exception):
    """Stops the forward pass once the hooked layer's input is captured."""


def layer_inputs(
    model: nn.Module,
    layer_index: int,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device | str = "cpu",
) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
    """Yield ``(h (B, T, D), mask (B, T) bool or None)`` entering attention layer ``layer_index``.

    Parameters
    ----------
    model : a module with ``attention_layers`` and ``model(input_ids, attention_mask)``
    layer_index : index into ``model.attention_layers``
    batches : ``(input_ids (B, T), attention_mask (B, T))`` pairs
    device : where the model runs

    The model runs in eval mode under ``torch.no_grad()`` (its mode is restored afterwards);
    the hook is removed when the iterator is exhausted or closed.
    """
    layer = model.attention_layers[layer_index]
    captured: dict[str, torch.Tensor | None] = {}

    def hook(module, args, kwargs):
        captured["x"] = args[0] if args else kwargs["x"]
        captured["mask"] = args[1] if len(args) > 1 else kwargs.get("mask")
        raise _Stop

    handle = layer.register_forward_pre_hook(hook, with_kwargs=True)
    was_training = model.training
    model.eval()
    try:
        for ids, mask in batches:
            captured.clear()
            with torch.no_grad():
                try:
                    model(ids.to(device), mask.to(device))
                except _Stop:
                    pass
            if "x" not in captured:
                raise RuntimeError(f"attention layer {layer_index} was not reached")
            yield captured["x"], captured["mask"]
    finally:
        handle.remove()
        model.train(was_training)

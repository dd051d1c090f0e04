"""Learn the particles of your own :class:`~coulomb_attention.nn.KernelAttention` from tensors.

The recipe for a layer that is not part of this package's models: hand it the inputs the layer
sees (``x`` (n, T, dim), optionally a padding mask) and the particles move so that its linear
attention reproduces the softmax attention of the *same* query/key projections, row by row
(the conversion's data term, :class:`~coulomb_attention.energy.TeacherAttention`, mean row KL).
The fit is the conversion's layer-wise stage itself (:func:`~coulomb_attention.convert.distill.
distill_attention` on a one-layer wrapper), so the method, defaults and records are the ones
``coulomb-attention convert`` uses; only ``omega`` changes, every projection stays as it is.

Shapes: ``attn.queries(x)`` / ``attn.keys(x)`` are (n, H, T, head_dim) (scaled by
``head_dim**-0.25``); ``attn.omega`` is (G, M, head_dim) with ``G = 1`` when the heads share
their features (``share_features=True``) and ``G = H`` otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from .distill import DistillConfig, distill_attention


class _OneLayer(nn.Module):
    """A model whose only layer is ``attn`` and whose "token ids" index the rows of ``x``."""

    def __init__(self, attn: nn.Module, x: torch.Tensor) -> None:
        super().__init__()
        self.attention_layers = nn.ModuleList([attn])
        self.register_buffer("x", x, persistent=False)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.x[ids[:, 0], : ids.shape[1]]
        return self.attention_layers[0](h, mask)


def fit_features(
    attn: nn.Module,
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    config: DistillConfig | None = None,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """Fit ``attn``'s particles to the softmax attention of its own projections, in place.

    Parameters
    ----------
    attn : KernelAttention with particles (``feature_map`` favor, porf_softplus, softmax_feat,
        hedgehog, ...); its ``omega`` buffer is replaced, nothing else changes
    x : float tensor (n, T, dim), the inputs the layer sees (e.g. hidden states of your model)
    mask : bool tensor (n, T), False marks padding (default: every position real)
    config : the fit's hyper-parameters (default: the conversion's, with one fifth of the
        sequences (at most 256) held out to measure the fit); ``refine_steps`` is not used
    seed : seeds the split, the sampled query rows, the batch order and the noise
    progress : print a progress bar and one line per fit

    Returns
    -------
    dict: ``kl_before`` / ``kl_after`` (mean row KL on the fitted sequences),
    ``holdout_kl_before`` / ``holdout_kl_after`` (None without held-out sequences), ``steps``,
    ``time_s`` and ``records`` (the conversion's records, one per head group)
    """
    if not getattr(attn, "has_features", False):
        raise ValueError(f"attn must be a KernelAttention with particles (feature_map favor, "
                         f"porf_softplus, softmax_feat, hedgehog, ...), got "
                         f"{type(attn).__name__}" + (f" with feature_map={attn.feature_map!r}"
                                                     if hasattr(attn, "feature_map") else ""))
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a float tensor (n, T, dim), got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.ndim != 3 or x.shape[-1] != attn.dim:
        raise ValueError(f"x must have shape (n, T, {attn.dim}) for this layer, got "
                         f"{tuple(x.shape)}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"x is empty: shape {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("x contains NaN or infinite values")
    n, T, _ = x.shape
    if mask is None:
        mask = torch.ones(n, T, dtype=torch.bool)
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (n, T):
        raise ValueError(f"mask must be a bool tensor of shape ({n}, {T}), got "
                         f"{tuple(getattr(mask, 'shape', ())) or type(mask).__name__}")
    mask = mask.to("cpu").bool()
    if not bool(mask.any(1).all()):
        raise ValueError("every sequence needs at least one real position (a row of mask is "
                         "all False)")
    if config is None:
        holdout = min(n // 5, 256)
        config = DistillConfig(n_examples=n - holdout, holdout=holdout, refine_steps=0)
    elif not isinstance(config, DistillConfig):
        raise TypeError(f"config must be a DistillConfig, got {type(config).__name__}")
    config = dataclasses.replace(config, layers=None)
    device = next(attn.parameters()).device
    model = _OneLayer(attn, x.detach().to(device))
    ids = torch.arange(n)[:, None].expand(n, T).contiguous()
    records = distill_attention(model, ids, mask, config,
                                generator=torch.Generator().manual_seed(int(seed)),
                                progress=progress)

    def mean(key: str) -> float | None:
        values = [r[key] for r in records if r.get(key) is not None]
        return sum(values) / len(values) if values else None

    return {"kl_before": mean("kl_before"), "kl_after": mean("kl_after"),
            "holdout_kl_before": mean("holdout_kl_before"),
            "holdout_kl_after": mean("holdout_kl_after"),
            "steps": config.steps, "time_s": sum(r["time_s"] for r in records),
            "records": records}

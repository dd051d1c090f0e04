"""Forward-pass timing of a converted encoder against its softmax teacher."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["speed_table", "time_forward"]


@torch.no_grad()
def time_forward(fn: Callable[[], Any], repeats: int = 3) -> float:
    """Median wall time (seconds) of ``fn()`` over ``repeats`` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def speed_table(model, teacher, lengths: Sequence[int], layer_lengths: Sequence[int], *,
                batch_size: int = 1, repeats: int = 3, seed: int = 0) -> list[dict[str, Any]]:
    """Forward time of the converted encoder and the softmax one (ms per sequence) for each
    ``lengths``, and of one attention layer alone (converted vs softmax) for ``layer_lengths``
    (beyond the position table; random inputs)."""
    from ..nn.attention import KernelAttention

    gen = torch.Generator().manual_seed(seed)
    rows = []
    vocab = model.config.vocab_size
    for L in lengths:
        ids = torch.randint(1000, vocab, (batch_size, L), generator=gen)
        mask = torch.ones(batch_size, L, dtype=torch.bool)
        conv = time_forward(lambda ids=ids, mask=mask: model.encode(ids, mask), repeats)
        soft = time_forward(lambda ids=ids, mask=mask: teacher.encode(ids, mask), repeats)
        rows.append({"what": "encoder", "length": int(L), "converted_ms": 1e3 * conv / batch_size,
                     "softmax_ms": 1e3 * soft / batch_size})
    src: KernelAttention = model.attention_layers[0]
    ref: KernelAttention = teacher.attention_layers[0]
    for L in layer_lengths:
        x = torch.randn(batch_size, L, src.dim, generator=gen) * 0.5
        rows.append({"what": "layer", "length": int(L),
                     "converted_ms": 1e3 * time_forward(lambda x=x: src(x), repeats) / batch_size,
                     "softmax_ms": 1e3 * time_forward(lambda x=x: ref(x), repeats) / batch_size})
    return rows


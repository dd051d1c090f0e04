"""Encoder forward time versus sequence length (``coulomb-attention minilm timing``).

:func:`time_vs_length` times one eval forward pass of a pretrained encoder per (attention,
length); :func:`write_timing` writes ``timing.csv`` and ``timing.png``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from .._validation import check_positive
from ..results import atomic_write_text

__all__ = ["time_vs_length", "write_timing"]


@torch.no_grad()
def time_vs_length(encoder: str, attentions, lengths, *, batch_size: int = 8,
                   n_features: int = 64, repeats: int = 3, seed: int = 0) -> list[dict]:
    """Median wall time of one eval forward pass of the encoder per (attention, length), on
    random token ids without padding (lengths capped by the checkpoint's positions)."""
    from ..nn.families.bert import load_pretrained_encoder

    repeats = check_positive("repeats", repeats, integer=True)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for attention in attentions:
        model = load_pretrained_encoder(encoder, attention, n_features, generator=seed)
        for length in lengths:
            if length > model.config.max_len:
                raise ValueError(f"length {length} exceeds the encoder's max_len "
                                 f"{model.config.max_len}")
            ids = torch.randint(1000, model.config.vocab_size, (batch_size, length),
                                generator=gen)
            mask = torch.ones_like(ids, dtype=torch.bool)
            model(ids, mask)  # warm-up
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                model(ids, mask)
                times.append(time.perf_counter() - t0)
            s = float(np.median(times))
            rows.append({"attention": attention, "length": length, "batch_size": batch_size,
                         "seconds": s, "ms_per_sequence": 1e3 * s / batch_size,
                         "threads": torch.get_num_threads()})
    return rows


def write_timing(rows: list[dict], out: Path, encoder: str) -> None:
    """``out/timing.csv`` and ``out/timing.png`` (ms per sequence vs length per attention)."""
    from ..reports import pyplot

    out = Path(out)
    header = list(rows[0])
    atomic_write_text(out / "timing.csv", "\n".join(
        [",".join(header)] + [",".join(str(r[k]) for k in header) for r in rows]) + "\n")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for att in dict.fromkeys(r["attention"] for r in rows):
        rs = [r for r in rows if r["attention"] == att]
        ax.plot([r["length"] for r in rs], [r["ms_per_sequence"] for r in rs], "o-", label=att)
    ax.set(xscale="log", yscale="log", xlabel="sequence length (tokens)",
           ylabel="forward ms / sequence", title=f"{encoder} encoder, CPU, eval forward")
    ax.set_xscale("log", base=2)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "timing.png", dpi=120)
    plt.close(fig)

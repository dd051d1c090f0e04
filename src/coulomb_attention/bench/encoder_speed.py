"""Sentences per second of a converted encoder (Hugging Face export) against the original.

The converted encoder is loaded the way a user loads it, ``transformers.AutoModel`` with
``trust_remote_code=True`` from the directory written by
:func:`coulomb_attention.export.export_hf_directory`, and pooled as sentence-transformers does
(masked mean, L2 normalisation); the original is loaded by ``sentence_transformers`` (its
Transformer -> Pooling -> Normalize modules, the softmax attention of ``transformers``). Both
embed the same random token ids, every sentence exactly ``L`` tokens, tokenisation excluded.
Repeats are interleaved (converted, original, converted, ...) so load changes hit both alike;
each row reports the median.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

from .._validation import check_positive

__all__ = ["DEFAULT_LENGTHS", "encoder_speed"]

DEFAULT_LENGTHS = (32, 64, 128, 256, 512)


def _timed(fn, sync) -> float:
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def encoder_speed(
    hf_dir: str | os.PathLike,
    original: str | os.PathLike = "minilm",
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    *,
    batch_size: int = 32,
    repeats: int = 3,
    device: str = "cpu",
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Time ``repeats`` batches of ``batch_size`` sentences of each length through both models.

    Parameters
    ----------
    hf_dir : path
        A Hugging Face export of a converted encoder.
    original : str or path
        ``minilm`` (the packaged all-MiniLM-L6-v2) or a sentence-transformers directory.
    lengths : sequence of int
        Tokens per sentence (at most the position table of both models).
    batch_size, repeats : int
    device : str
        ``cpu`` or ``cuda``.
    seed : int
        Draws the token ids.

    Returns
    -------
    list of dict
        One row per length: ``length``, ``converted_sps``, ``original_sps`` (sentences per
        second, median batch time), ``converted_s``, ``original_s`` (every batch time),
        ``batch_size``, ``repeats``, ``threads``, ``device``.
    """
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from ..nn.bert import resolve_checkpoint_dir

    batch_size = check_positive("batch_size", batch_size, integer=True)
    repeats = check_positive("repeats", repeats, integer=True)
    lengths = [check_positive("length", L, integer=True) for L in lengths]
    conv = AutoModel.from_pretrained(str(hf_dir), trust_remote_code=True).eval().to(device)
    st = SentenceTransformer(str(resolve_checkpoint_dir(original)), device=device).eval()
    limit = min(int(conv.config.max_position_embeddings),
                int(st[0].auto_model.config.max_position_embeddings))
    too_long = [L for L in lengths if L > limit]
    if too_long:
        raise ValueError(f"lengths {too_long} exceed the position table ({limit})")
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    gen = torch.Generator().manual_seed(seed)
    vocab = int(conv.config.vocab_size)
    rows = []
    for L in lengths:
        ids = torch.randint(min(1000, vocab // 2), vocab, (batch_size, L), generator=gen)
        ids = ids.to(device)
        mask = torch.ones_like(ids)
        types = torch.zeros_like(ids)

        @torch.inference_mode()
        def run_converted(ids=ids, mask=mask):
            h = conv(input_ids=ids, attention_mask=mask).last_hidden_state
            m = mask.unsqueeze(-1).to(h.dtype)
            return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)

        @torch.inference_mode()
        def run_original(ids=ids, mask=mask, types=types):
            return st.forward({"input_ids": ids, "attention_mask": mask,
                               "token_type_ids": types})["sentence_embedding"]

        run_converted(), run_original()  # warm-up
        sync()
        tc, to = [], []
        for _ in range(repeats):
            tc.append(_timed(run_converted, sync))
            to.append(_timed(run_original, sync))
        rows.append({"length": int(L), "converted_sps": batch_size / statistics.median(tc),
                     "original_sps": batch_size / statistics.median(to), "converted_s": tc,
                     "original_s": to, "batch_size": batch_size, "repeats": repeats,
                     "threads": torch.get_num_threads(), "device": device})
    return rows

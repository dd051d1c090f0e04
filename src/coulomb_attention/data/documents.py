"""Pseudo-documents: held-out texts concatenated to a fixed token length.

The tasks' sentences are short (a 16-token window covers most of an SST-2 sentence), so the
fidelity of a converted encoder, and above all of a sliding-window hybrid, must also be measured
where the window is a small part of the input. A pseudo-document of ``length`` tokens is
``[CLS] t_1 t_2 ... [SEP]``: texts drawn at random without replacement (a fresh permutation once
the pool is used up, so with many long documents a text can appear in two documents, never twice
in one), joined by spaces until their WordPiece tokens fill ``length - 2`` positions, the last
text cut. Every document is exactly ``length`` tokens (no padding).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["document_texts", "pseudo_documents"]


def document_texts(task: str, data_dir=None) -> list[str]:
    """The texts of ``task``'s evaluation split (both sides of a pair, QQP questions, count
    separately), in file order, duplicates and empty texts dropped."""
    from .loaders import load_task
    from .registry import get_task

    spec = get_task(task)
    ex = load_task(task, spec.eval_split, data_dir)
    seen: set[str] = set()
    out = []
    for texts in ex.texts:
        for t in texts:
            t = t.strip()
            if t and t not in seen:
                seen.add(t)
                out.append(t)
    if not out:
        raise ValueError(f"the {spec.eval_split} split of {task} holds no text")
    return out


def pseudo_documents(tokenizer, texts: Sequence[str], length: int, n: int, seed: int = 0
                     ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """``n`` pseudo-documents of exactly ``length`` tokens (module docstring).

    Returns ``input_ids (n, length)``, ``attention_mask (n, length)`` (all True) and a summary:
    ``texts_per_document`` (mean), ``texts_used`` (distinct), ``reused`` (some text is in two
    documents).
    """
    for name, v, low in (("length", length, 3), ("n", n, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError("no texts to build pseudo-documents from")
    counts = [len(tokenizer.encode(t)) - 2 for t in texts]  # without [CLS]/[SEP]
    if sum(counts) < length - 2:
        raise ValueError(f"the {len(texts)} texts hold {sum(counts)} tokens, fewer than one "
                         f"document of {length}")
    rng = np.random.default_rng(seed)
    order: list[int] = []
    docs, per_doc, used = [], [], set()
    reused = False
    for _ in range(n):
        parts, filled, in_doc = [], 0, set()
        while filled < length - 2:
            if not order:
                order = [int(i) for i in rng.permutation(len(texts)) if int(i) not in in_doc]
            i = order.pop(0)
            reused |= i in used
            in_doc.add(i)
            used.add(i)
            parts.append(texts[i])
            filled += counts[i]
        docs.append(" ".join(parts))
        per_doc.append(len(parts))
    ids, mask = tokenizer.encode_batch(docs, max_length=length)[:2]
    if ids.shape != (n, length) or not bool(mask.all()):
        raise RuntimeError(f"pseudo-documents came out {tuple(ids.shape)} with padding; "
                           f"expected ({n}, {length}) full")
    return ids, mask, {"texts_per_document": float(np.mean(per_doc)), "texts_used": len(used),
                       "reused": reused}

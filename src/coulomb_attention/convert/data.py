"""The sentences a conversion distils on and is measured on (no labels), and their encoding."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["encode_texts", "load_sentences", "position_cap", "read_sentence_file",
           "training_documents"]


def read_sentence_file(path: str | os.PathLike) -> list[str]:
    """Non-empty lines of a UTF-8 text file; an empty file raises ``ValueError``."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"sentence file {str(p)!r} does not exist")
    lines = [s.strip() for s in p.read_text(encoding="utf-8").splitlines()]
    lines = [s for s in lines if s]
    if not lines:
        raise ValueError(f"sentence file {str(p)!r} holds no sentences")
    return lines


def load_sentences(tasks: Sequence[str], split: str, data_dir, n: int, seed: int, *,
                   pairs: bool = False) -> list[str | tuple[str, str]]:
    """``n`` distinct sentences of ``tasks``' ``split`` (``"train"`` or ``"eval"``: each task's
    evaluation split), drawn at random with ``seed``. Each side of a pair counts as one
    sentence; with ``pairs`` a pair task's example stays one ``(a, b)`` tuple instead (encoded
    ``[CLS] a [SEP] b [SEP]``, so attention across the pair is seen)."""
    from ..data import get_task, load_task

    out: list = []
    per = -(-n // max(len(tasks), 1))
    for i, task in enumerate(tasks):
        spec = get_task(task)
        name = spec.train_split if split == "train" else spec.eval_split
        ex = load_task(task, name, data_dir, limit=per, random_state=seed + 101 * i)
        for texts in ex.texts:
            if pairs and len(texts) == 2 and all(t.strip() for t in texts):
                out.append(tuple(texts))
            else:
                out.extend(t for t in texts if t.strip())
    seen, unique = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            unique.append(s)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(unique))[:n]
    if len(order) == 0:
        raise ValueError(f"no sentences in the {split} splits of {', '.join(tasks)}")
    return [unique[i] for i in order]


def position_cap(model, max_length: int) -> int:
    """``max_length``, capped at the positions of ``model`` (a truncation length, never a
    reason to refuse: a model with fewer positions reads its first ones)."""
    return min(int(max_length), int(model.config.max_len))


def encode_texts(tok, texts, max_length):
    ids, mask = tok.encode_batch([t if isinstance(t, tuple) else (t,) for t in texts],
                                 max_length=max_length)[:2]
    return ids, mask


def training_documents(tok, texts, length: int, n: int, seed: int):
    """``n`` documents of exactly ``length`` tokens, the ``texts`` (a conversion's training
    sentences; a pair counts as its two sides) concatenated in a random order (seed ``seed``)
    by :func:`coulomb_attention.data.documents.pseudo_documents`; every text in one document at
    most, so any split of the documents keeps its held-out ones apart.

    Returns ``input_ids (n, length)``, ``attention_mask`` (all True) and a summary
    (``length``, ``n``, ``texts_per_document``, ``texts_used``). Raises ``ValueError`` when the
    texts hold fewer than ``n`` documents' tokens (fewer documents, or more text, is the fix).
    """
    from ..data.documents import pseudo_documents

    flat = [t for x in texts for t in (x if isinstance(x, tuple) else (x,)) if t.strip()]
    ids, mask, info = pseudo_documents(tok, flat, length, n, seed)
    if info["reused"]:
        raise ValueError(
            f"the {len(flat)} training texts are too few for {n} documents of {length} tokens "
            "without repeating a text; fit on fewer documents (--n-sentences, --holdout and "
            "--refine-sentences count documents) or on more text (--sentences FILE)")
    return ids, mask, {"length": length, "n": n, "texts_per_document":
                       info["texts_per_document"], "texts_used": info["texts_used"]}


def sentences_for_documents(n_documents: int, length: int) -> int:
    """How many sentences to draw for ``n_documents`` of ``length`` tokens: enough at 4 tokens
    a sentence (the shortest tasks' phrases average more), plus a document's worth of slack."""
    return (n_documents + 1) * max(1, (length - 2) // 4)

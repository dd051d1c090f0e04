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

__all__ = ["LONG_TEXTS", "document_texts", "long_texts", "pseudo_documents", "token_documents"]

#: The long-text corpus of causal language models: ``<data_dir>/shakespeare/<split>.jsonl.gz``
#: (one work per row, column ``text``; splits by work), a sample shipped in ``data/samples``.
LONG_TEXTS = "shakespeare"


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


def long_texts(split: str, data_dir=None, path=None) -> tuple[list[str], str]:
    """Long documents for causal language models, one string per work.

    Parameters
    ----------
    split : ``train``, ``validation`` or ``test`` (splits by work, never within one)
    data_dir : folder holding ``shakespeare/<split>.jsonl.gz``; ``None``: the small sample
        shipped with the package (smoke tests only; the returned source says so)
    path : a user's own texts instead: a ``.jsonl``/``.jsonl.gz`` file with a ``text`` column,
        or a plain text file (one document)

    Returns
    -------
    (texts, source): the texts in file order and a description of where they came from
    (``"sample: ..."`` for the shipped sample).
    """
    import pathlib

    from .loaders import read_rows

    if split not in ("train", "validation", "test"):
        raise ValueError(f"unknown split {split!r}; valid: test, train, validation")
    if path is not None:
        p = pathlib.Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"texts file {str(p)!r} does not exist")
        if p.name.endswith((".jsonl", ".jsonl.gz")):
            texts = []
            for i, row in read_rows(p):
                if "text" not in row:
                    raise ValueError(f"{p}: row {i} has no 'text' column")
                texts.append(str(row["text"]))
        else:
            texts = [p.read_text(encoding="utf-8")]
        source = str(p)
    else:
        sample = data_dir is None
        root = (pathlib.Path(__file__).parent / "samples" if sample
                else pathlib.Path(data_dir))
        f = root / LONG_TEXTS / f"{split}.jsonl.gz"
        if not f.is_file():
            raise FileNotFoundError(f"no long texts for split {split!r}: {f} does not exist "
                                    f"(expected <data-dir>/{LONG_TEXTS}/{split}.jsonl.gz)")
        texts = [str(row["text"]) for _, row in read_rows(f)]
        source = (f"sample: {f} (the first 24,000 characters of a few works; smoke tests "
                  "only)" if sample else str(f))
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError(f"no text in {source}")
    return texts, source


def token_documents(tokenizer, texts: Sequence[str], length: int, n: int | None = None,
                    bos: int | None = None, spread: bool = False) -> torch.Tensor:
    """Consecutive, non-overlapping windows of ``length`` tokens cut from each text in order
    (a window never spans two texts; a text's tail shorter than ``length`` is dropped), the
    first ``n`` (``None``: all). ``bos``: a token id put first in each window (then
    ``length - 1`` text tokens follow). ``spread``: the windows in round-robin order over the
    texts (every text's first window, then every text's second, ...), so that the first
    ``n`` come from as many texts as possible rather than from the start of the first.

    ``tokenizer`` is a ``tokenizers.Tokenizer`` (``encode(text).ids``) or has
    ``encode(text) -> list[int]``. Returns a LongTensor ``(n_docs, length)``; raises
    ``ValueError`` when no text holds ``length`` tokens.
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise ValueError(f"length must be an integer >= 2, got {length!r}")
    body = length - (bos is not None)
    head = [bos] if bos is not None else []

    def windows(text):
        enc = tokenizer.encode(text)
        ids = list(getattr(enc, "ids", enc))
        return [head + ids[s:s + body] for s in range(0, len(ids) - body + 1, body)]

    docs = []
    if spread:
        cuts = [windows(text) for text in texts]
        for rank in range(max((len(c) for c in cuts), default=0)):
            docs += [c[rank] for c in cuts if rank < len(c)]
    else:
        for text in texts:
            docs += windows(text)
            if n is not None and len(docs) >= n:
                break
    docs = docs if n is None else docs[:n]
    if not docs:
        longest = max(len(list(getattr(tokenizer.encode(t), "ids", tokenizer.encode(t))))
                      for t in texts)
        raise ValueError(f"no text holds {length} tokens (the longest has {longest})")
    return torch.tensor(docs, dtype=torch.long)

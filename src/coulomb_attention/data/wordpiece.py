"""Deterministic WordPiece vocabulary training (byte-pair merges with a ``##`` prefix).

HF ``tokenizers``' ``WordPieceTrainer`` breaks ties between equally frequent merges in hash-map
order, which differs from process to process (huggingface/tokenizers#1794): two trainings on
the same texts give vocabularies that differ in a few tokens, so a re-run of the same seed does
not reproduce its numbers. This module trains the same kind of vocabulary with every tie
broken by a fixed rule; HF ``tokenizers`` still normalises, pre-tokenises and encodes
(greedy longest-match WordPiece).

The algorithm (the BPE trainer behind HF's WordPiece trainer):

1. Count words (already normalised and pre-tokenised), weighting characters by word counts.
2. Alphabet: the ``limit_alphabet`` most frequent characters (ties: smaller code point first);
   other characters are dropped from the words.
3. Each word is a symbol sequence ``c1, ##c2, ..., ##cn``; the initial vocabulary is the
   special tokens, then every symbol that occurs, sorted.
4. Repeatedly merge the most frequent adjacent pair ``(a, b)`` into ``a + b[2:]`` (``b``
   without ``##``), ties broken by the smaller ``(a, b)`` in string order, until the
   vocabulary holds ``vocab_size`` tokens or no pair occurs ``min_frequency`` times.
   Occurrences inside a word are merged left to right without overlap.

:func:`train_wordpiece` keeps pair counts up to date incrementally (a heap with lazy
deletion); :func:`train_wordpiece_naive` recounts every pair at every merge and is the
reference the tests compare it with.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from itertools import pairwise

from .._validation import check_positive

__all__ = ["PREFIX", "train_wordpiece", "train_wordpiece_naive"]

PREFIX = "##"


def _check(word_counts, vocab_size, min_frequency, limit_alphabet, special_tokens):
    """The three sizes as ints, after checking every argument (clear errors)."""
    if not isinstance(word_counts, Mapping):
        raise TypeError(f"word_counts must be a mapping word -> count, got "
                        f"{type(word_counts).__name__}")
    sizes = tuple(check_positive(name, v, integer=True) for name, v in (
        ("vocab_size", vocab_size), ("min_frequency", min_frequency),
        ("limit_alphabet", limit_alphabet)))
    if len(set(special_tokens)) != len(special_tokens):
        raise ValueError(f"special_tokens has duplicates: {list(special_tokens)}")
    for w, c in word_counts.items():
        if not isinstance(w, str) or not w:
            raise ValueError(f"word_counts keys must be non-empty strings, got {w!r}")
        check_positive(f"word_counts[{w!r}]", c, integer=True)
    return sizes


def _initial(word_counts: Mapping[str, int], limit_alphabet: int):
    """(words as symbol lists, their counts, the alphabet's symbols), all in a fixed order."""
    chars: Counter[str] = Counter()
    for w, c in word_counts.items():
        for ch in w:
            chars[ch] += c
    kept = {ch for ch, _ in sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))[:limit_alphabet]}
    words, counts, symbols = [], [], set()
    for w in sorted(word_counts):
        seq = [ch for ch in w if ch in kept]
        if not seq:
            continue
        seq = [seq[0]] + [PREFIX + ch for ch in seq[1:]]
        symbols.update(seq)
        words.append(seq)
        counts.append(word_counts[w])
    return words, counts, symbols


def _merged(a: str, b: str) -> str:
    return a + b[len(PREFIX):]


def _apply(seq: list[str], a: str, b: str, new: str) -> list[str]:
    out, i, n = [], 0, len(seq)
    while i < n:
        if i + 1 < n and seq[i] == a and seq[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(seq[i])
            i += 1
    return out


def _vocab(special_tokens, symbols) -> list[str]:
    vocab = list(special_tokens)
    seen = set(vocab)
    vocab += [s for s in sorted(symbols) if s not in seen]
    return vocab


def train_wordpiece(
    word_counts: Mapping[str, int],
    vocab_size: int,
    *,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    special_tokens: Sequence[str] = (),
) -> list[str]:
    """The vocabulary (a list, index = token id) learned from ``word_counts``.

    Parameters
    ----------
    word_counts : mapping str -> int
        Pre-tokenised words and how often each occurs.
    vocab_size : int
        Target size, special tokens included. The alphabet is always kept whole, so the result
        can be larger when ``vocab_size`` is below the alphabet size, or smaller when no pair
        occurs ``min_frequency`` times.
    min_frequency : int
        A pair is merged only if it occurs at least this many times.
    limit_alphabet : int
        Number of distinct characters kept (the most frequent).
    special_tokens : sequence of str
        First tokens of the vocabulary, in this order.

    The result depends only on the arguments (never on hash or insertion order).
    """
    vocab_size, min_frequency, limit_alphabet = _check(
        word_counts, vocab_size, min_frequency, limit_alphabet, special_tokens)
    words, counts, symbols = _initial(word_counts, limit_alphabet)
    vocab = _vocab(special_tokens, symbols)
    known = set(vocab)

    pair_count: dict[tuple[str, str], int] = defaultdict(int)
    where: dict[tuple[str, str], set[int]] = defaultdict(set)
    for idx, seq in enumerate(words):
        c = counts[idx]
        for p in pairwise(seq):
            pair_count[p] += c
            where[p].add(idx)
    heap = [(-c, p[0], p[1]) for p, c in pair_count.items()]
    heapq.heapify(heap)

    while len(vocab) < vocab_size and heap:
        negc, a, b = heapq.heappop(heap)
        current = pair_count.get((a, b), 0)
        if current != -negc:  # stale entry: the count changed since it was pushed
            if current > 0:
                heapq.heappush(heap, (-current, a, b))
            continue
        if current < min_frequency:
            break
        new = _merged(a, b)
        if new not in known:
            known.add(new)
            vocab.append(new)
        changed: set[tuple[str, str]] = set()
        for idx in sorted(where.pop((a, b))):
            seq, c = words[idx], counts[idx]
            new_seq = _apply(seq, a, b, new)
            old_pairs = Counter(pairwise(seq))
            new_pairs = Counter(pairwise(new_seq))
            for p, k in old_pairs.items():
                pair_count[p] -= k * c
                if p not in new_pairs:
                    where[p].discard(idx)
            for p, k in new_pairs.items():
                pair_count[p] += k * c
                where[p].add(idx)
                changed.add(p)
            words[idx] = new_seq
        pair_count.pop((a, b), None)
        for p in sorted(changed):
            cnt = pair_count[p]
            if cnt > 0:
                heapq.heappush(heap, (-cnt, p[0], p[1]))
    return vocab


def train_wordpiece_naive(
    word_counts: Mapping[str, int],
    vocab_size: int,
    *,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    special_tokens: Sequence[str] = (),
) -> list[str]:
    """Reference for :func:`train_wordpiece`: recounts every pair at every merge (slow)."""
    vocab_size, min_frequency, limit_alphabet = _check(
        word_counts, vocab_size, min_frequency, limit_alphabet, special_tokens)
    words, counts, symbols = _initial(word_counts, limit_alphabet)
    vocab = _vocab(special_tokens, symbols)
    while len(vocab) < vocab_size:
        pairs: Counter[tuple[str, str]] = Counter()
        for seq, c in zip(words, counts, strict=True):
            for p in pairwise(seq):
                pairs[p] += c
        if not pairs:
            break
        (a, b), best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        if best < min_frequency:
            break
        new = _merged(a, b)
        if new not in vocab:
            vocab.append(new)
        words = [_apply(seq, a, b, new) for seq in words]
    return vocab

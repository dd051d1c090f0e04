"""Metrics of a causal language model: pure functions of a model and token tensors.

Everything runs through the model's decoding states (``model(ids, states=..., output_states=
True)``), a chunk of tokens at a time, so a long document never holds its whole ``(T, V)``
logits and every row (the softmax teacher with its KV cache, the linear and hybrid rows with a
constant state, StreamingLLM) is measured by the same code:

* :func:`token_nll` the next-token loss at every position of a document, and
  :func:`position_buckets` its sums over power-of-two position buckets (the loss-vs-position
  curve of the report);
* :func:`passkey_prompt` / :func:`passkey_trial` passkey retrieval (a 5-digit key hidden at a
  depth of repeated filler; greedy decoding after one prefill, :func:`greedy_continue`);
* :func:`repeated_text_nll` a passage given twice: the loss on each copy;
* :func:`memory_matched_window` the StreamingLLM window whose KV cache holds as many bytes as
  a hybrid's window plus its linear state.

``model`` is a :class:`~coulomb_attention.nn.families.llama.LlamaForCausalLM` (any module with
its ``forward(ids, *, states=, output_states=)`` contract). ``tokenizer`` is a
``tokenizers.Tokenizer`` (``encode(text).ids``, ``decode(ids)``) or has ``encode(text) ->
list[int]`` and ``decode``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "FILLER",
    "PASSKEY",
    "QUESTION",
    "coarse_buckets",
    "greedy_continue",
    "log2_edges",
    "memory_matched_window",
    "passkey_prompt",
    "passkey_trial",
    "position_buckets",
    "repeated_text_nll",
    "token_nll",
]

#: the filler of the passkey prompt, repeated (Mohtashami & Jaggi's landmark-attention task)
FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
          "again.")
#: the needle, ``{key}`` a 5-digit number
PASSKEY = "The pass key is {key}. Remember it. {key} is the pass key."
#: the end of the prompt; the model's next tokens should be the key
QUESTION = "What is the pass key? The pass key is"


def _ids(tokenizer, text: str) -> list[int]:
    enc = tokenizer.encode(text)
    return [int(i) for i in getattr(enc, "ids", enc)]


def _check_ids(ids: torch.Tensor) -> torch.Tensor:
    """(T,) or (1, T) long ids -> (1, T)."""
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32):
        raise TypeError("ids must be an integer torch.Tensor")
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] < 1:
        raise ValueError(f"ids must have shape (T,) or (1, T) with T >= 1, got "
                         f"{tuple(ids.shape)}")
    return ids.long()


def _check_chunk(chunk: int) -> int:
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be an integer >= 1, got {chunk!r}")
    return chunk


@torch.no_grad()
def token_nll(model, ids: torch.Tensor, *, chunk: int = 512,
              on_chunk: Callable[[int, int], None] | None = None,
              output_states: bool = False) -> torch.Tensor | tuple[torch.Tensor, list]:
    """Next-token negative log-likelihood (nats) at every position of one document.

    Parameters
    ----------
    model : a causal LM with decoding states
    ids : torch.Tensor
        (T,) or (1, T) long token ids, T >= 2.
    chunk : int
        Tokens per forward call; the states carry the prefix (the result does not depend on
        it beyond float rounding).
    on_chunk : callable ``(done, total)``, optional
        Called after each chunk (progress).
    output_states : bool
        Also return the decoding states after ``ids[:, :T - 1]`` (their size is the row's
        memory at this context).

    Returns
    -------
    nll : torch.Tensor
        (T - 1,) float32: entry ``i`` is ``-log p(ids[i + 1] | ids[: i + 1])`` (the loss of
        target position ``i + 1``).
    states : list of DecodeState
        Only with ``output_states=True``.
    """
    ids = _check_ids(ids)
    chunk = _check_chunk(chunk)
    T = ids.shape[1]
    if T < 2:
        raise ValueError("a document needs at least 2 tokens")
    states, out = None, []
    for s in range(0, T - 1, chunk):
        e = min(s + chunk, T - 1)  # positions s..e-1 predict targets s+1..e
        logits, states = model(ids[:, s:e], states=states, output_states=True)  # (1, c, V)
        logp = F.log_softmax(logits[0].float(), dim=-1)  # (c, V)
        out.append(-logp.gather(1, ids[0, s + 1:e + 1, None]).squeeze(1))
        if on_chunk is not None:
            on_chunk(e, T - 1)
    nll = torch.cat(out)
    return (nll, states) if output_states else nll


def log2_edges(length: int) -> list[int]:
    """Target-position bucket edges ``[1, 2, 4, ..., length]``: bucket ``j`` holds the
    targets ``edges[j] <= t < edges[j + 1]`` (position 0 is never a target)."""
    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise ValueError(f"length must be an integer >= 2, got {length!r}")
    edges = [1]
    while edges[-1] * 2 < length:
        edges.append(edges[-1] * 2)
    return edges + [length]


def position_buckets(nll: torch.Tensor, edges: Sequence[int]) -> tuple[list[float], list[int]]:
    """Sums and counts of ``nll`` (from :func:`token_nll`: entry ``i`` is target ``i + 1``)
    over the target-position buckets ``[edges[j], edges[j + 1])``.

    Returns ``(sums, counts)``, one entry per bucket (``len(edges) - 1``).
    """
    nll = torch.as_tensor(nll, dtype=torch.float64).reshape(-1)
    sums, counts = [], []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        part = nll[max(lo - 1, 0):max(hi - 1, 0)]  # targets lo..hi-1
        sums.append(float(part.sum()))
        counts.append(int(part.numel()))
    return sums, counts


def coarse_buckets(edges: Sequence[int], sums: Sequence[float], counts: Sequence[int],
                   coarse: Sequence[int]) -> tuple[list[float], list[int]]:
    """Fine buckets (``edges``, ``sums``, ``counts``) summed into the ``coarse`` buckets
    ``[coarse[j], coarse[j + 1])``: a fine bucket goes where its lower edge falls (exact when
    every coarse edge is a fine edge, as with powers of two). A fine bucket outside every
    coarse bucket is dropped."""
    out_s = [0.0] * (len(coarse) - 1)
    out_n = [0] * (len(coarse) - 1)
    for lo, s, n in zip(edges[:-1], sums, counts, strict=True):
        for j in range(len(coarse) - 1):
            if coarse[j] <= lo < coarse[j + 1]:
                out_s[j] += s
                out_n[j] += n
                break
    return out_s, out_n


@torch.no_grad()
def _prefill(model, ids: torch.Tensor, chunk: int, on_chunk=None):
    """Run ``ids`` (1, T) through the states; the last position's logits (1, V) and the
    states."""
    states, logits = None, None
    T = ids.shape[1]
    for s in range(0, T, chunk):
        logits, states = model(ids[:, s:s + chunk], states=states, output_states=True)
        if on_chunk is not None:
            on_chunk(min(s + chunk, T), T)
    return logits[:, -1], states


@torch.no_grad()
def greedy_continue(model, ids: torch.Tensor, n_new: int, *, chunk: int = 512,
                    on_chunk: Callable[[int, int], None] | None = None) -> list[int]:
    """Greedy continuation of one prompt: a chunked prefill of ``ids`` ((T,) or (1, T)), then
    one token per step through the states. Returns the ``n_new`` new token ids (as
    :meth:`LlamaForCausalLM.greedy_generate` without an end token)."""
    ids = _check_ids(ids)
    chunk = _check_chunk(chunk)
    if isinstance(n_new, bool) or not isinstance(n_new, int) or n_new < 1:
        raise ValueError(f"n_new must be an integer >= 1, got {n_new!r}")
    last, states = _prefill(model, ids, chunk, on_chunk)
    new: list[int] = []
    for step in range(n_new):
        nxt = last.argmax(-1, keepdim=True)  # (1, 1)
        new.append(int(nxt))
        if step + 1 < n_new:
            logits, states = model(nxt.long(), states=states, output_states=True)
            last = logits[:, -1]
    return new


def passkey_prompt(tokenizer, length: int, depth: float, key: int | str,
                   bos: int | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """A passkey prompt of exactly ``length`` tokens.

    ``[bos] filler[:b] needle filler[b:] question``: the filler is :data:`FILLER` repeated,
    its last ``n`` tokens kept (the text before the question ends with a whole sentence), the
    needle (:data:`PASSKEY` with ``key``) put at the filler's sentence-group boundary nearest to
    ``depth * n``; each piece is tokenized on its own with a leading space.

    Returns
    -------
    ids : torch.Tensor
        (length,) long.
    info : dict
        ``depth`` (the needle's actual depth ``b / n``), ``needle_at`` (its first token's
        index), ``needle_tokens``, ``filler_tokens`` (``n``).

    Raises
    ------
    ValueError
        ``length`` cannot hold the needle and the question, or ``depth`` outside [0, 1].
    """
    if isinstance(length, bool) or not isinstance(length, int):
        raise ValueError(f"length must be an integer, got {length!r}")
    if not 0.0 <= float(depth) <= 1.0:
        raise ValueError(f"depth must lie in [0, 1], got {depth!r}")
    unit = _ids(tokenizer, " " + FILLER)
    needle = _ids(tokenizer, " " + PASSKEY.format(key=key))
    question = _ids(tokenizer, " " + QUESTION)
    head = [] if bos is None else [int(bos)]
    n = length - len(head) - len(needle) - len(question)
    if n < 0:
        raise ValueError(f"a passkey prompt of {length} tokens cannot hold the needle and the "
                         f"question ({length - n} tokens)")
    reps = n // len(unit) + 1
    filler = (unit * reps)[len(unit) * reps - n:]  # the last n tokens
    bounds = sorted({0, n, *(n - j * len(unit) for j in range(reps + 1) if n - j * len(unit) > 0)})
    b = min(bounds, key=lambda x: (abs(x - depth * n), x))
    ids = head + filler[:b] + needle + filler[b:] + question
    assert len(ids) == length
    return torch.tensor(ids, dtype=torch.long), {
        "depth": b / n if n else 0.0, "needle_at": len(head) + b, "needle_tokens": len(needle),
        "filler_tokens": n}


def passkey_trial(model, tokenizer, length: int, depth: float, key: int, *, n_new: int = 8,
                  bos: int | None = None, chunk: int = 512,
                  on_chunk: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """One passkey trial: a prompt of ``length - n_new`` tokens (so prompt and answer fit in
    ``length`` positions), greedy decoding of ``n_new`` tokens; success when the key's digits
    appear in the decoded text.

    Returns ``{"success", "output", "depth", "prompt_tokens"}``.
    """
    key = str(key)
    ids, info = passkey_prompt(tokenizer, length - n_new, depth, key, bos=bos)
    new = greedy_continue(model, ids, n_new, chunk=chunk, on_chunk=on_chunk)
    text = tokenizer.decode(new)
    return {"success": key in text, "output": text, "depth": info["depth"],
            "prompt_tokens": int(ids.numel())}


@torch.no_grad()
def repeated_text_nll(model, passage: torch.Tensor, *, bos: int | None = None,
                      chunk: int = 512) -> tuple[float, float]:
    """A passage (P,) given twice (``[bos] passage passage``): the mean next-token loss on the
    first copy's tokens and on the second's. The second copy is predictable by copying; the
    gap is what induction heads do and what an additive state loses.

    The first copy's first token is a target only after a ``bos``.
    """
    passage = _check_ids(passage)[0]
    P = passage.numel()
    if P < 2:
        raise ValueError("a passage needs at least 2 tokens")
    head = passage.new_tensor([] if bos is None else [int(bos)])
    ids = torch.cat((head, passage, passage))
    nll = token_nll(model, ids, chunk=chunk)  # entry i: target i + 1
    off = head.numel()
    first = nll[max(off - 1, 0):off + P - 1]  # targets off .. off+P-1 (target 0 has none)
    second = nll[off + P - 1:off + 2 * P - 1]  # targets off+P .. off+2P-1
    return float(first.double().mean()), float(second.double().mean())


def memory_matched_window(head_dim: int, n_features: int, window: int,
                          shift: bool = True) -> int:
    """The StreamingLLM window whose KV cache holds the bytes of a hybrid's state.

    Per layer and KV head the hybrid (window ``W``, the same sinks) holds its window's keys and
    values (``2 dh`` floats per token) and a linear state of ``M (dh + 1)`` floats (the
    ``phi(k) [v, 1]`` sums), plus FAVOR+'s running shift (``M`` floats) when ``shift``.
    StreamingLLM's cache holds ``2 dh`` floats per token, so the matched window is
    ``W + M (dh + 1 + shift) / (2 dh)``, rounded to the nearest token (ties up).
    """
    for name, v, low in (("head_dim", head_dim, 1), ("n_features", n_features, 1),
                         ("window", window, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
    extra = n_features * (head_dim + 1 + bool(shift)) / (2 * head_dim)
    return window + int(math.floor(extra + 0.5))

"""``coulomb-attention generate SOURCE --prompt TEXT``: stream text from a llama decoder.

``SOURCE`` is ``smollm2`` (the pretrained SmolLM2-135M-Instruct), a ``.gguf`` file or a
llama directory (``save_pretrained``: a converted model too; it must hold ``tokenizer.json``).
The prompt is prefilled once; then one token per step through the decoding states (the KV
cache for softmax attention, a constant-size state for converted rows), each printed to stdout
as it comes (greedy by default; ``--temperature T > 0`` samples, with nucleus ``--top-p``, from a
generator seeded by ``--seed``). Afterwards one line on stderr: prefill time, decode tokens/s,
and the state's bytes beside what the original's KV cache would hold at the same length
(``2 * layers * kv_heads * head_dim * positions * itemsize``, from the config).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from ._args import add_threads, apply_threads

__all__ = ["add_arguments", "kv_cache_bytes", "next_token", "run", "stream_tokens"]

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="DIR_OR_MODEL",
                        help="smollm2, a .gguf file or a llama directory with tokenizer.json")
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0: greedy (default); > 0: sample from softmax(logits / T)")
    parser.add_argument("--top-p", type=float, default=1.0,
                        help="sampling: the smallest set of tokens with probability >= P")
    parser.add_argument("--seed", type=int, default=0, help="sampling: the generator's seed")
    parser.add_argument("--chat", action="store_true",
                        help="wrap the prompt in the ChatML turn of SmolLM2-Instruct")
    add_threads(parser)


def _check(args: argparse.Namespace) -> None:
    """Bad flags -> ``ValueError`` (one line, exit 2) before anything is loaded."""
    if args.max_new_tokens < 0:
        raise ValueError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if not args.temperature >= 0 or args.temperature == float("inf"):
        raise ValueError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p must lie in (0, 1], got {args.top_p}")
    if args.source != "smollm2" and not Path(args.source).exists():
        raise FileNotFoundError(f"{args.source} does not exist (give smollm2, a .gguf file or "
                                "a llama directory)")


def kv_cache_bytes(config, positions: int, itemsize: int = 4) -> int:
    """Bytes of the original (softmax) model's KV cache after ``positions`` tokens."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * positions * itemsize


def next_token(logits, temperature: float = 0.0, top_p: float = 1.0, generator=None):
    """The next token of each row of ``logits`` (B, V): argmax at ``temperature == 0``, else a
    draw from ``softmax(logits / temperature)`` restricted to the smallest set of most likely
    tokens whose probability reaches ``top_p``. Returns (B, 1) long."""
    import torch

    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    probs = torch.softmax(logits.float() / temperature, -1)
    p, idx = probs.sort(-1, descending=True)
    keep = (p.cumsum(-1) - p) < top_p  # the first token always stays
    p = p * keep
    pick = torch.multinomial(p / p.sum(-1, keepdim=True), 1, generator=generator)
    return idx.gather(-1, pick)


def stream_tokens(model, input_ids, max_new_tokens: int, *, temperature: float = 0.0,
                  top_p: float = 1.0, generator=None, eos_token_id=None,
                  stats: dict | None = None) -> Iterator[int]:
    """Yield up to ``max_new_tokens`` token ids after ``input_ids`` (1, T): one prefill, then
    one step per token through the states (greedy: the tokens of ``greedy_generate``); stops
    after an ``eos_token_id`` (an int or a tuple). ``stats`` (a dict) receives ``prefill_s``,
    ``decode_s`` (the steps after the first token), ``steps`` and ``states``."""
    import torch

    eos = () if eos_token_id is None else (
        tuple(eos_token_id) if isinstance(eos_token_id, (tuple, list)) else (eos_token_id,))
    stats = {} if stats is None else stats
    stats.update(prefill_s=0.0, decode_s=0.0, steps=0, states=None)
    if max_new_tokens == 0:
        return
    with torch.no_grad():
        t0 = time.perf_counter()
        logits, states = model(input_ids, output_states=True)
        stats["prefill_s"], stats["states"] = time.perf_counter() - t0, states
        for i in range(max_new_tokens):
            nxt = next_token(logits[:, -1], temperature, top_p, generator)  # (1, 1)
            yield int(nxt)
            if int(nxt) in eos or i + 1 == max_new_tokens:
                return
            t0 = time.perf_counter()
            logits, states = model(nxt.to(input_ids.dtype), states=states, output_states=True)
            stats["decode_s"] += time.perf_counter() - t0
            stats["steps"] += 1
            stats["states"] = states


def run(args: argparse.Namespace) -> int:
    _check(args)
    import torch

    from ..nn.families import llama

    apply_threads(args)
    model, tokenizer = llama.load(args.source)
    text = CHAT.format(args.prompt) if args.chat else args.prompt
    ids = tokenizer.encode(text).ids
    if not ids:
        raise ValueError("--prompt is empty after tokenisation")
    cfg = model.config
    softmax = any(a.feature_map == "softmax" for a in model.attention_layers)
    if softmax and len(ids) + args.max_new_tokens > cfg.max_positions:
        raise ValueError(
            f"the prompt's {len(ids)} tokens + --max-new-tokens {args.max_new_tokens} exceed "
            f"the softmax model's {cfg.max_positions} positions")
    gen = torch.Generator().manual_seed(args.seed)
    stats: dict = {}
    new: list[int] = []
    shown = ""
    for tok in stream_tokens(model, torch.tensor([ids]), args.max_new_tokens,
                             temperature=args.temperature, top_p=args.top_p, generator=gen,
                             eos_token_id=cfg.eos_token_id, stats=stats):
        new.append(tok)
        piece = tokenizer.decode(new)
        if piece.startswith(shown) and not piece.endswith("\ufffd"):  # whole characters only
            sys.stdout.write(piece[len(shown):])
            sys.stdout.flush()
            shown = piece
    piece = tokenizer.decode(new)
    sys.stdout.write((piece[len(shown):] if piece.startswith(shown) else "") + "\n")
    sys.stdout.flush()
    positions = len(ids) + max(len(new) - 1, 0)  # the states hold every token fed so far
    itemsize = model.embed_tokens.weight.element_size()
    state = model.state_bytes(stats["states"])
    kv = kv_cache_bytes(cfg, positions, itemsize)
    rate = stats["steps"] / stats["decode_s"] if stats["decode_s"] > 0 else float("nan")
    kind = "KV cache" if softmax else "constant-size state"
    print(f"{len(ids)} prompt tokens, prefill {stats['prefill_s']:.3f} s; {len(new)} new tokens, "
          f"decode {rate:.1f} tokens/s; {kind} {state / 2**20:.2f} MB at {positions} positions "
          f"vs the original's KV cache {kv / 2**20:.2f} MB ({state / kv:.4f} x)",
          file=sys.stderr)
    return 0

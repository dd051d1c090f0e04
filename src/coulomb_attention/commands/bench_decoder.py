"""``coulomb-attention bench decoder``: decoding speed and state size of a llama decoder, the
teacher (KV cache) against converted rows (window + sinks hybrid, pure linear), issue 47.

Flags -> :class:`~coulomb_attention.bench.decoder.DecoderBenchConfig` ->
:func:`~coulomb_attention.bench.decoder.run_benchmark`; see that module for what is timed and
for the verdicts (withheld on a busy CPU).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ._args import add_threads, apply_threads, fill, list_arg

__all__ = ["add_arguments", "run"]

ROW_NAMES = ("teacher", "hybrid_hedgehog", "hybrid_favor", "favor")  # bench.decoder.ROWS
DTYPE_NAMES = ("float32", "bfloat16", "float16")  # bench.decoder.DTYPES
DEFAULTS = {"lengths": [512, 2048, 8192, 32768], "batches": [1, 8], "decode_steps": 24}
QUICK = {"lengths": [512, 2048, 8192], "batches": [1], "decode_steps": 16}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--model", default=None,
                     help="smollm2 (the pretrained SmolLM2-135M-Instruct, needs the llama "
                          "extra), or a llama directory / GGUF file (default: smollm2)")
    src.add_argument("--random", action="store_true",
                     help="random weights of SmolLM2's shapes (no gguf needed; speed does not "
                          "depend on the weights)")
    list_arg(parser, "--rows", choices=ROW_NAMES,
             help=f"rows to time (default {' '.join(ROW_NAMES)})")
    list_arg(parser, "--lengths", type=int,
             help=f"contexts L; the teacher runs only up to its positions (default "
                  f"{' '.join(map(str, DEFAULTS['lengths']))})")
    list_arg(parser, "--batches", type=int,
             help=f"batch sizes (default {' '.join(map(str, DEFAULTS['batches']))})")
    parser.add_argument("--decode-steps", type=int, default=None,
                        help=f"timed decode steps per cell, median (default "
                             f"{DEFAULTS['decode_steps']})")
    add_threads(parser)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default="float32")
    parser.add_argument("--features", type=int, default=64,
                        help="particles per KV group of the converted rows")
    parser.add_argument("--window", type=int, default=64, help="hybrid rows: exact window W")
    parser.add_argument("--sinks", type=int, default=4, help="hybrid rows: attention sinks S")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="seconds; the cells left when it is spent are skipped "
                             "(default: no limit)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="L = 512 2048 8192 at batch 1, 16 decode steps; explicit flags "
                             "still win")
    parser.add_argument("--out", default="runs/bench_decoder", help="output directory")


def run(args: argparse.Namespace) -> int:
    from ..bench.decoder import DecoderBenchConfig, run_benchmark

    if args.quick:
        fill(args, QUICK)
    fill(args, DEFAULTS)
    apply_threads(args)
    cfg = DecoderBenchConfig(
        model="random" if args.random else (args.model or "smollm2"),
        rows=tuple(args.rows or ROW_NAMES), lengths=tuple(args.lengths),
        batches=tuple(args.batches), decode_steps=args.decode_steps, n_features=args.features,
        window=args.window, sinks=args.sinks, threads=args.threads, device=args.device,
        dtype=args.dtype, seed=args.seed, budget_s=args.time_budget)
    out = Path(args.out)
    run_benchmark(cfg, out, log=lambda m: print(m, flush=True))
    print(f"wrote {out}/results.json, {out}/results.md")
    return 0

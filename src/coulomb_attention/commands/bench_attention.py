"""``coulomb-attention bench attention``: time, memory and GFLOP/s of attention versus L.

Flags -> :class:`~coulomb_attention.bench.attention.AttentionBenchConfig` ->
:func:`~coulomb_attention.bench.attention.run_benchmark` (or ``run_short`` with ``--short``);
see that module for the methods, the FLOP model and how time and memory are measured.
``--device cuda``: the GPU benchmark instead (fused Triton kernels against flash SDPA, bf16
and float32, :func:`~coulomb_attention.bench.attention_gpu.run_gpu_benchmark`); without a
CUDA device it exits 2 with one line.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ._args import add_threads, apply_threads, fill, list_arg

__all__ = ["add_arguments", "run"]

DEFAULTS = {"lengths": [128, 256, 512, 1024, 2048, 4096, 8192, 16384],
            "features": [64, 128, 256], "repeats": 5}
QUICK = {"lengths": [128, 512, 2048], "features": [64], "repeats": 2}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    list_arg(parser, "--lengths", type=int,
             help=f"sequence lengths L (default {' '.join(map(str, DEFAULTS['lengths']))})")
    list_arg(parser, "--features", type=int,
             help=f"numbers of random features M (default "
                  f"{' '.join(map(str, DEFAULTS['features']))})")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"timed repeats (median) (default {DEFAULTS['repeats']})")
    add_threads(parser)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--budget", type=float, default=20.0,
                        help="seconds: a method whose warm-up call takes longer is timed once")
    parser.add_argument("--peak-size", type=int, default=1024,
                        help="n of the (n, n) float32 matmul that measures the peak")
    parser.add_argument("--no-performer", action="store_true",
                        help="leave performer-pytorch out even if it is installed")
    parser.add_argument("--quick", action="store_true",
                        help="small grid (L=128,512,2048; M=64; 2 repeats), well under a "
                             "minute; explicit flags still win")
    parser.add_argument("--short", action="store_true",
                        help="short-sequence grid of sentence tasks instead (B in {1, 32}, "
                             "L = 16..512, classifier and MiniLM shapes, M in {16, 64}; "
                             "--lengths/--features/--heads/--head-dim/--batch are ignored)")
    parser.add_argument("--device", default="cpu",
                        help="cpu (default) or cuda: the GPU benchmark (fused kernels, SDPA "
                             "flash, fla; --dtypes, --batch-heads, --maps, --time-budget)")
    list_arg(parser, "--dtypes", help="GPU: dtypes (default bfloat16 float32)")
    parser.add_argument("--batch-heads", type=int, default=32, help="GPU: B * H (default 32)")
    list_arg(parser, "--maps", help="GPU: fused maps to time (default favor)")
    parser.add_argument("--no-fla", action="store_true",
                        help="GPU: leave flash-linear-attention out even if installed")
    parser.add_argument("--time-budget", type=float, default=400.0,
                        help="GPU: seconds; lengths left when it is spent are skipped")
    parser.add_argument("--out", default=None,
                        help="output directory (default runs/bench_attention, with --short "
                             "runs/bench_attention_short)")


def run(args: argparse.Namespace) -> int:

    from ..bench.attention import AttentionBenchConfig, run_benchmark, run_short

    if args.device != "cpu":
        return _run_gpu(args)
    if args.quick:
        fill(args, QUICK)
    fill(args, DEFAULTS)
    apply_threads(args)
    cfg = AttentionBenchConfig(
        lengths=tuple(args.lengths), features=tuple(args.features), repeats=args.repeats,
        threads=args.threads, heads=args.heads, head_dim=args.head_dim, batch=args.batch,
        budget=args.budget, peak_size=args.peak_size, no_performer=args.no_performer)
    out = Path(args.out or ("runs/bench_attention_short" if args.short
                            else "runs/bench_attention"))
    log = lambda m: print(m, flush=True)  # noqa: E731
    if args.short:
        run_short(cfg, out, log=log)
        print(f"wrote {out}/results.csv, table.md, summary.json, bench_attention_short.png")
    else:
        run_benchmark(cfg, out, log=log)
        print(f"wrote {out}/results.jsonl, results.csv, table.md, summary.json, "
              "bench_attention.png")
    return 0


def _run_gpu(args: argparse.Namespace) -> int:
    from ..bench.attention_gpu import GpuAttentionBenchConfig, require_device, run_gpu_benchmark

    require_device(args.device)
    if args.quick:
        fill(args, {"lengths": [512, 2048, 8192], "repeats": 3})
    fill(args, {"lengths": DEFAULTS["lengths"], "repeats": 10, "features": [64]})
    cfg = GpuAttentionBenchConfig(
        lengths=tuple(args.lengths), dtypes=tuple(args.dtypes or ("bfloat16", "float32")),
        maps=tuple(args.maps or ("favor",)), batch_heads=args.batch_heads, heads=args.heads,
        head_dim=args.head_dim, n_features=args.features[0], repeats=args.repeats,
        device=args.device, no_performer=args.no_performer, no_fla=args.no_fla,
        budget_s=args.time_budget)
    out = Path(args.out or "runs/bench_attention_gpu")
    run_gpu_benchmark(cfg, out, log=lambda m: print(m, flush=True))
    print(f"wrote {out}/results.json, results.csv, table.md, bench_attention_gpu.png")
    return 0

"""``coulomb-attention bench encoder``: sentences per second of a Hugging Face export of a
converted encoder against the original (sentence-transformers), batch 32, lengths 32..512.

    coulomb-attention bench encoder runs/convert/favor64/hf --out speed.json
    coulomb-attention bench encoder --random-init --device cuda --dtype bfloat16 \\
        --lengths 128 1024 8192 --max-positions 8192 --out gpu/bf16.json

(:func:`coulomb_attention.bench.encoder_speed.encoder_speed`; needs ``transformers`` and
``sentence-transformers``.) ``--random-init`` builds both architectures from configurations
with random weights (:func:`~coulomb_attention.bench.encoder_speed.random_encoder_speed`:
``transformers`` only, no checkpoint; ``HF_DIR``, optional then, supplies the shapes and the
remote code). ``--out X.json`` also writes ``X.csv`` and ``X.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ._args import add_threads, apply_threads


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("hf_dir", nargs="?", default=None,
                   help="a directory written by coulomb-attention export-hf (optional with "
                        "--random-init: shapes and remote code; default MiniLM's shapes, "
                        "FAVOR+ M = 64 per head)")
    p.add_argument("--original", default="minilm",
                   help="minilm or a sentence-transformers directory")
    p.add_argument("--lengths", type=int, nargs="+", default=[32, 64, 128, 256, 512])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    add_threads(p)
    p.add_argument("--random-init", action="store_true",
                   help="random weights from configurations: transformers BertModel (SDPA) "
                        "against the remote code; no checkpoint or sentence-transformers")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="weights and activations (--random-init only)")
    p.add_argument("--max-positions", type=int, default=None,
                   help="position table size of both models (--random-init only; default "
                        "max(512, longest length))")
    p.add_argument("--n-features", type=int, default=None,
                   help="particles M per head (--random-init only; default the config's)")
    p.add_argument("--window", type=int, default=None,
                   help="the sliding-window hybrid with this W (--random-init only; an export "
                        "of `convert --window` carries its own)")
    p.add_argument("--fused", action="store_true",
                   help="the converted encoder's attention through the fused Triton kernels "
                        "(--random-init, CUDA; coulomb_attention.nn.ops.triton_linear)")
    p.add_argument("--out", default=None,
                   help="JSON file for the rows (.csv and .md written beside it)")


def run(args: argparse.Namespace) -> int:

    from ..bench import encoder_speed as es
    from ..bench import machine
    from ..bench.attention_gpu import require_device
    from ..results import atomic_write_json, atomic_write_text

    require_device(args.device)
    if args.fused and not args.random_init:
        raise ValueError("--fused needs --random-init")
    if not args.random_init:
        if args.hf_dir is None:
            raise ValueError("HF_DIR is required without --random-init")
        if (args.dtype != "float32" or args.max_positions is not None or args.n_features
                or args.window is not None):
            raise ValueError("--dtype, --max-positions, --n-features and --window need "
                             "--random-init")

    threads = apply_threads(args)
    load_start = machine.load_average()
    print(machine.machine_line(threads, load_start), flush=True)
    if args.random_init:
        rows = es.random_encoder_speed(args.lengths, args.hf_dir, batch_size=args.batch_size,
                                       repeats=args.repeats, device=args.device,
                                       dtype=args.dtype, max_positions=args.max_positions,
                                       n_features=args.n_features, window=args.window,
                                       fused=args.fused)
        r0 = rows[0]
        caption = (f"random weights (speed only: no pretrained encoder; position table "
                   f"{r0['max_positions']}), {r0['feature_map']} M = {r0['n_features']}"
                   + (f" + window {r0['window']}" if r0.get("window") else "")
                   + (" (fused Triton kernels)" if r0.get("fused") else "") + ", "
                   f"{r0['device']}, {r0['dtype']}, {r0['threads']} thread(s), median of "
                   f"{r0['repeats']} interleaved repeats")
    else:
        rows = es.encoder_speed(args.hf_dir, args.original, args.lengths,
                                batch_size=args.batch_size, repeats=args.repeats,
                                device=args.device)
        caption = (f"{args.hf_dir} against {args.original} (sentence-transformers), "
                   f"{args.device}, {rows[0]['threads']} thread(s), median of {args.repeats} "
                   "interleaved repeats")
    record = machine.machine_record(threads, load_start, machine.load_average())
    for r in rows:  # each row carries the machine it was timed on
        r.update({k: v for k, v in record.items() if k != "threads"})
    caption += "; " + machine.machine_line(threads, record["load_average_start"],
                                           record["load_average_end"], record["cores"])
    table = [caption, "", *es.speed_markdown_rows(rows)]
    if record["verdict_withheld"] and args.device == "cpu":
        table += ["", machine.withheld_line(record["verdict_withheld"])]
    print("\n".join(table))
    if args.out:
        out = Path(args.out)
        atomic_write_json(out, rows)
        atomic_write_text(out.with_suffix(".csv"), es.speed_csv(rows))
        atomic_write_text(out.with_suffix(".md"), "\n".join(table) + "\n")
        print(f"wrote {out} (+ .csv, .md)")
    return 0

"""``coulomb-attention bench encoder``: sentences per second of a Hugging Face export of a
converted encoder against the original (sentence-transformers), batch 32, lengths 32..512.

    coulomb-attention bench encoder runs/convert/favor64/hf --out speed.json

(:func:`coulomb_attention.bench.encoder_speed.encoder_speed`; needs ``transformers`` and
``sentence-transformers``.)
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("hf_dir", help="a directory written by coulomb-attention export-hf")
    p.add_argument("--original", default="minilm",
                   help="minilm or a sentence-transformers directory")
    p.add_argument("--lengths", type=int, nargs="+", default=[32, 64, 128, 256, 512])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="JSON file for the rows")


def run(args: argparse.Namespace) -> int:
    import torch

    from ..bench.encoder_speed import encoder_speed
    from ..export.hf import speed_markdown
    from ..results import atomic_write_json

    torch.set_num_threads(max(1, args.threads))
    rows = encoder_speed(args.hf_dir, args.original, args.lengths, batch_size=args.batch_size,
                         repeats=args.repeats, device=args.device)
    print("\n".join(speed_markdown(rows)))
    if args.out:
        atomic_write_json(args.out, rows)
        print(f"wrote {args.out}")
    return 0

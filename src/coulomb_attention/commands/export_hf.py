"""``coulomb-attention export-hf``: a converted checkpoint as a Hugging Face model directory.

    coulomb-attention export-hf runs/convert/favor64/checkpoint runs/convert/favor64/hf [--speed]

writes OUT_DIR (``AutoModel.from_pretrained(OUT_DIR, trust_remote_code=True)``,
``SentenceTransformer(OUT_DIR, trust_remote_code=True)``; see
:func:`coulomb_attention.export.export_hf_directory`). ``--speed`` also times the export against
the original (sentence-transformers) at batch ``--batch-size`` for ``--lengths`` tokens, puts the
table in the model card and writes ``OUT_DIR/speed.json``
(:func:`coulomb_attention.bench.encoder_speed.encoder_speed`; needs ``transformers`` and
``sentence-transformers``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ._args import add_threads, apply_threads

DEFAULT_LENGTHS = [32, 64, 128, 256, 512]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="converted checkpoint directory (convert's OUT/checkpoint)")
    p.add_argument("out_dir", help="directory to write")
    p.add_argument("--result", default=None,
                   help="result.json of the conversion for the model card (default: beside the "
                        "checkpoint, when present)")
    p.add_argument("--speed", action="store_true",
                   help="time the export against the original and add the table to the card")
    p.add_argument("--original", default="minilm",
                   help="the original for --speed: minilm or a sentence-transformers directory")
    p.add_argument("--lengths", type=int, nargs="+", default=DEFAULT_LENGTHS)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    add_threads(p)


def run(args: argparse.Namespace) -> int:

    from ..export import export_hf_directory
    from ..export.hf import speed_markdown

    apply_threads(args)
    out = export_hf_directory(args.checkpoint, args.out_dir, result=args.result)
    print(f"wrote {out}")
    if args.speed:
        from ..bench.encoder_speed import encoder_speed
        from ..results import atomic_write_json

        rows = encoder_speed(out, args.original, args.lengths, batch_size=args.batch_size,
                             repeats=args.repeats, device=args.device)
        export_hf_directory(args.checkpoint, out, result=args.result, speed=rows)
        atomic_write_json(Path(out) / "speed.json", rows)
        print("\n".join(speed_markdown(rows)))
        print(f"wrote {Path(out) / 'speed.json'} and the speed table of {Path(out) / 'README.md'}")
    return 0

"""No-token-mixing control for the conversion: MiniLM with its attention removed.

    python experiments/convert_none_control.py [--data-dir ../shared/data]

Every pretrained weight kept, the attention output replaced by nothing (``attention="none"``):
how far the embeddings and the probes fall without attention, beside the converted encoders.
Same held-out sentences (512 of the evaluation splits, seed 10000) and probes (2,000 training
examples, full evaluation splits) as ``coulomb-attention convert`` at seed 0; writes
``runs/convert/none_control.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from coulomb_attention.convert import (
    ConvertConfig,
    embed,
    embedding_fidelity,
    load_sentences,
    run_probes,
)
from coulomb_attention.nn.families.bert import (
    load_pretrained_encoder,
    load_pretrained_tokenizer,
    resolve_checkpoint_dir,
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default="../shared/data")
    p.add_argument("--out", default="runs/convert/none_control.json")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = ConvertConfig()
    d = resolve_checkpoint_dir(cfg.encoder)
    tok = load_pretrained_tokenizer(d)
    teacher = load_pretrained_encoder(d, "softmax")
    none = load_pretrained_encoder(d, "none")
    held = load_sentences(cfg.tasks, "eval", args.data_dir, cfg.eval_sentences,
                          10_000 + cfg.seed)
    out = {"fidelity": embedding_fidelity(embed(teacher, tok, held, cfg.max_length),
                                          embed(none, tok, held, cfg.max_length)),
           "probe": run_probes(none, tok, cfg, args.data_dir)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

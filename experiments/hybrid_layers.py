"""Where a converted encoder loses its fidelity: put exact softmax attention back in some layers.

For a converted checkpoint (pure linear or low-rank finished), every layer set ``S`` in the plan
gets the *teacher's* attention module (its projections and exact softmax) in the layers of
``S`` and keeps the converted attention elsewhere; the score is the embedding fidelity to the
teacher on the conversion's held-out sentences (the same draw as ``convert``: the evaluation
splits of SST-2, Rotten Tomatoes and QQP, seed ``10000 + seed``). It answers the question a
scope decision needs: how much of the gap to the teacher one or two softmax layers (a hybrid,
as LoLCATs keeps a sliding window) would close, and which layers to spend them on::

    python experiments/hybrid_layers.py CHECKPOINT_DIR --data-dir /work/shared/data \\
        --out docs/results/convert/hybrid_layers.json

Nothing is trained; a hybrid is quadratic in the softmax layers (not a linear-time model).
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch

from coulomb_attention.convert import embed, embedding_fidelity, load_sentences
from coulomb_attention.nn.families.bert import load_pretrained_encoder, load_pretrained_tokenizer
from coulomb_attention.results import atomic_write_json


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="a converted checkpoint directory")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--sentences", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pairs", action="store_true", help="also every pair of softmax layers")
    p.add_argument("--out", required=True, help="JSON file of the rows")
    a = p.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    teacher = load_pretrained_encoder("minilm", "softmax").eval()
    model = load_pretrained_encoder(a.checkpoint).eval()
    tok = load_pretrained_tokenizer("minilm")
    held = load_sentences(("sst2", "rotten_tomatoes", "qqp"), "eval", a.data_dir, a.sentences,
                          10_000 + a.seed)
    target = embed(teacher, tok, held)
    n = len(model.blocks)
    converted = [b.attn for b in model.blocks]
    plan = [()] + [(i,) for i in range(n)]
    if a.pairs:
        plan += list(itertools.combinations(range(n), 2))
    plan += [tuple(range(k)) for k in (2, 3)] + [tuple(range(n))]
    rows = []
    for layers in dict.fromkeys(plan):
        for i, block in enumerate(model.blocks):
            block.attn = teacher.blocks[i].attn if i in layers else converted[i]
        fid = embedding_fidelity(target, embed(model, tok, held))
        rows.append({"softmax_layers": list(layers), **fid})
        print(f"softmax in {list(layers) or 'none'}: cos {fid['cos_mean']:.4f} "
              f"p5 {fid['cos_p5']:.4f} spearman {fid['spearman']:.4f}", flush=True)
    atomic_write_json(a.out, {"checkpoint": str(a.checkpoint), "sentences": len(held),
                              "seed": a.seed, "rows": rows,
                              "time_s": time.perf_counter() - t0})
    print(f"wrote {a.out} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()

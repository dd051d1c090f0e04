"""Low-rank finishing of an existing converted checkpoint over ranks / learning rates / steps /
objectives.

    python experiments/convert_lowrank_sweep.py CHECKPOINT --data-dir ../shared/data \\
        --ranks 4 8 16 --lrs 2e-3 --steps 200 --objectives embedding tokens layers \\
        [--aux-weights 1] [--targets q_proj k_proj v_proj out_proj [fc1 fc2]] \\
        [--with-particles] [--out sweep.jsonl]

CHECKPOINT is a pure-linear conversion (``OUT/checkpoint`` of ``coulomb-attention convert``
with the default sentences, seed 0); the finishing uses the conversion's sentences and split
(the 256 held-out training-split sentences give ``holdout_cos``) and then the 512 held-out
evaluation sentences of ``convert`` (``fidelity``). One JSON line per setting.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch

from coulomb_attention.convert import (
    ConvertConfig,
    _encode_texts,
    embed,
    embedding_fidelity,
    load_sentences,
)
from coulomb_attention.convert.distill import embedding_data
from coulomb_attention.convert.finish import FinishConfig, finish_lowrank
from coulomb_attention.nn.families.bert import load_pretrained_encoder, load_pretrained_tokenizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--data-dir", default="../shared/data")
    p.add_argument("--ranks", type=int, nargs="+", default=[8])
    p.add_argument("--lrs", type=float, nargs="+", default=[2e-3])
    p.add_argument("--steps", type=int, nargs="+", default=[200])
    p.add_argument("--objectives", nargs="+", default=["embedding"],
                   help="FinishConfig.objective values (convert.finish.OBJECTIVES)")
    p.add_argument("--aux-weights", type=float, nargs="+", default=[1.0])
    p.add_argument("--targets", nargs="+", default=None, help="(default: FinishConfig's)")
    p.add_argument("--with-particles", action="store_true")
    p.add_argument("--refine-sentences", type=int, default=4096,
                   help="sentences the finishing fits on (the conversion's default: 4,096)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = ConvertConfig()
    dc = dataclasses.replace(cfg.distill, refine_examples=args.refine_sentences)
    tok = load_pretrained_tokenizer(args.checkpoint)
    teacher = load_pretrained_encoder("minilm", "softmax")
    sentences = load_sentences(cfg.tasks, "train", args.data_dir,
                               max(dc.n_examples, dc.refine_examples) + dc.holdout, cfg.seed)
    ids, mask = _encode_texts(tok, sentences, cfg.max_length)
    data = embedding_data(teacher, ids, mask, dc, torch.Generator().manual_seed(cfg.seed))
    held = load_sentences(cfg.tasks, "eval", args.data_dir, cfg.eval_sentences, 10_000 + cfg.seed)
    target = embed(teacher, tok, held, cfg.max_length, cfg.batch_size)
    targets = {} if args.targets is None else {"targets": tuple(args.targets)}
    grid = [(r, lr, st, ob, w) for r in args.ranks for lr in args.lrs for st in args.steps
            for ob in args.objectives for w in (args.aux_weights if ob != "embedding" else [1.0])]
    for rank, lr, steps, objective, weight in grid:
        model = load_pretrained_encoder(args.checkpoint)
        t0 = time.perf_counter()
        rec = finish_lowrank(model, teacher, ids, mask, dc, FinishConfig(
            rank=rank, lr=lr, steps=steps, with_particles=args.with_particles,
            objective=objective, aux_weight=weight, **targets),
            generator=torch.Generator().manual_seed(cfg.seed), data=data)
        row = {"rank": rank, "lr": lr, "steps": steps, "objective": objective,
               "aux_weight": rec["aux_weight"], "targets": rec["targets"],
               "n_train": rec["n_train"], "with_particles": args.with_particles,
               "threads": args.threads, "time_s": time.perf_counter() - t0, "finish": rec,
               "fidelity": embedding_fidelity(target, embed(model, tok, held, cfg.max_length))}
        print(f"rank {rank} lr {lr:g} steps {steps} {objective} (w {rec['aux_weight']}) "
              f"{'+'.join(rec['targets'])}: {rec['trained_params']} trained; held-out (train "
              f"split) {rec['holdout_cos_before']:.4f} -> {rec['holdout_cos_after']:.4f}, fit "
              f"{rec['cos_after']:.4f}, eval cos {row['fidelity']['cos_mean']:.4f} (p5 "
              f"{row['fidelity']['cos_p5']:.4f}), {row['time_s']:.0f} s", flush=True)
        if args.out:
            with open(args.out, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()

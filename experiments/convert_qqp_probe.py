"""QQP pair probe (``[u, v, |u - v|, u * v]``) of a converted MiniLM against the softmax teacher.

    python experiments/convert_qqp_probe.py [CHECKPOINT] [--data-dir ../shared/data]

CHECKPOINT defaults to ``runs/convert/favor64_refine/checkpoint`` (written by
``coulomb-attention convert ... --out runs/convert/favor64_refine``). 2,000 training pairs,
2,000 random pairs of the evaluation split; writes ``runs/convert/qqp_probe.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from coulomb_attention.convert import ConvertConfig, run_probes
from coulomb_attention.nn.families.bert import (
    load_pretrained_encoder,
    load_pretrained_tokenizer,
    resolve_checkpoint_dir,
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", nargs="?", default="runs/convert/favor64_refine/checkpoint")
    p.add_argument("--data-dir", default="../shared/data")
    p.add_argument("--out", default="runs/convert/qqp_probe.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = ConvertConfig(probe_tasks=("qqp",), probe_train=2000, probe_eval=2000)
    teacher = resolve_checkpoint_dir("minilm")
    out = {
        "teacher": run_probes(load_pretrained_encoder(teacher, "softmax"),
                              load_pretrained_tokenizer(teacher), cfg, args.data_dir)["qqp"],
        "converted": run_probes(load_pretrained_encoder(args.checkpoint),
                                load_pretrained_tokenizer(args.checkpoint), cfg,
                                args.data_dir)["qqp"],
    }
    print(json.dumps(out, indent=1))
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""``coulomb-attention train``: one Transformer classifier, fixed or learned kernel.

Flags -> :class:`~coulomb_attention.train.run.RunConfig` -> :func:`coulomb_attention.train.run.run`
-> ``OUT/metrics.json``. The same pipeline serves the scratch encoder and a pretrained one
(``--encoder minilm`` or a BERT checkpoint directory), resumes after a kill (``--resume``)
and runs under ``torchrun`` (rank 0 writes).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import TYPE_CHECKING, Any

from ..config import load_overrides
from ..data.registry import DATASETS
from ..names import ATTENTIONS as _ATTENTIONS
from ..names import TRAIN_OBJECTIVES as OBJECTIVES
from ._args import add_progress, add_threads, apply_threads, progress_mode

if TYPE_CHECKING:  # torch and the pipeline are imported in run(): --help prints without them
    from ..train.loop import Runtime
    from ..train.run import RunConfig

__all__ = ["COMMON_FLAGS", "DEFAULTS", "add_arguments", "add_common_arguments", "build_config",
           "run", "setup_runtime"]

# for --help without importing the pipeline (the vocabulary, coulomb_attention.names)
ATTENTIONS = tuple(sorted(_ATTENTIONS))

# flag -> (config path, type, help)
COMMON_FLAGS: dict[str, tuple[tuple[str, ...], type, str]] = {
    "encoder": (("encoder",), str, "scratch (default) or a pretrained encoder: minilm or a "
                "BERT checkpoint directory (its weights, vocabulary and architecture)"),
    "objective": (("objective",), str, f"phase-A objective of a learned kernel: "
                  f"{' or '.join(OBJECTIVES)} (default: labels)"),
    "epochs": (("train", "epochs"), int, "phase-B (fine-tuning) epochs"),
    "warmup_epochs": (("warmup_epochs",), int, "warm-up cross-entropy epochs"),
    "batch_size": (("train", "batch_size"), int, "training batch size"),
    "lr": (("train", "lr"), float, "peak learning rate"),
    "dim": (("model", "dim"), int, "model width (scratch encoder)"),
    "layers": (("model", "layers"), int, "encoder blocks (scratch encoder)"),
    "heads": (("model", "heads"), int, "attention heads (scratch encoder)"),
    "n_features": (("model", "n_features"), int, "random features per head"),
    "dropout": (("model", "dropout"), float, "dropout"),
    "max_length": (("data", "max_length"), int, "truncation length in tokens"),
    "vocab_size": (("data", "vocab_size"), int, "WordPiece vocabulary size (scratch)"),
    "train_limit": (("data", "train_limit"), int, "random subset of the training split"),
    "eval_limit": (("data", "eval_limit"), int, "random subset of the evaluation split"),
    "embeddings": (("embeddings",), str, "token embeddings of the scratch encoder: scratch "
                   "(default) or a pretrained checkpoint (minilm or a BERT directory: its "
                   "vocabulary and frozen token table)"),
    "align_steps": (("align", "steps"), int, "phase-A Langevin steps per layer"),
    "align_examples": (("align", "n_examples"), int, "phase-A cached training examples"),
    "lam": (("align", "lam"), float, "phase-A repulsion strength"),
    "distill_method": (("distill", "method"), str, "how the teacher objective fits the "
                       "particles: langevin (the method), hedgehog (Hedgehog's tied Adam "
                       "baseline on its map), adam, weighted"),
}


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by ``train``, ``suite`` and ``minilm``: data, config file, overrides."""
    parser.add_argument("--data-dir", default=None,
                        help="data directory (default: $COULOMB_DATA_DIR, else the shipped "
                             "samples); the real data: ../shared/data")
    parser.add_argument("--config", default=None, metavar="FILE.json",
                        help="JSON overrides of the run config (unknown keys raise)")
    for name, (_, typ, help_) in COMMON_FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=typ, default=None,
                            help=help_ if "default" in help_ else help_ + _default_text(name))
    parser.add_argument("--convert-cache", default="runs/convert_cache", metavar="DIR",
                        help="where phase A of a pretrained encoder with --objective teacher "
                             "(the conversion of `coulomb-attention convert`) is cached per "
                             "encoder, map, M and seed, shared by every task (default: "
                             "runs/convert_cache)")
    add_threads(parser)
    add_progress(parser)


# flag -> (scratch default, pretrained-encoder default) of the run config, for --help only;
# tests/commands/test_help_and_args.py checks them against make_run_config
DEFAULTS: dict[str, tuple[Any, Any]] = {
    "encoder": ("scratch", "minilm"), "objective": ("labels", "labels"), "epochs": (2, 1),
    "warmup_epochs": (1, 0), "batch_size": (64, 32), "lr": (0.001, 0.0001), "dim": (128, 128),
    "layers": (2, 2), "heads": (4, 4), "n_features": (64, 64), "dropout": (0.1, 0.1),
    "max_length": (64, 64), "vocab_size": (8000, 8000), "train_limit": (None, 2000),
    "eval_limit": (None, None), "embeddings": ("scratch", "scratch"),
    "align_steps": (100, 60), "align_examples": (4096, 512), "lam": (0.5, 0.5),
    "distill_method": ("langevin", "langevin"),
}


def _default_text(name: str) -> str:
    """`` (default: X)`` of the run config, with the pretrained preset where it differs."""
    a, b = (("all" if v is None else v) for v in DEFAULTS[name])
    return f" (default: {a})" if a == b else f" (default: {a}; pretrained encoder: {b})"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="sst2", help=f"one of {', '.join(sorted(DATASETS))}")
    parser.add_argument("--attention", default="favor",
                        help=f"one of {', '.join(ATTENTIONS)}")
    parser.add_argument("--kernel", default="learned", help="vanilla or learned")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the data order, init and features")
    parser.add_argument("--out", default=None,
                        help="output directory (default runs/train/TASK-ATTENTION-KERNEL-sSEED)")
    parser.add_argument("--resume", nargs="?", const=True, default=False, type=_resume_mode,
                        metavar="auto",
                        help="continue from the checkpoints in --out (an --out that does not "
                             "exist is an error); '--resume auto': resume if there is "
                             "anything to resume, else start fresh")
    add_common_arguments(parser)


def _resume_mode(text: str):
    if text != "auto":
        raise argparse.ArgumentTypeError(f"expected nothing or 'auto', got {text!r}")
    return "auto"


def build_config(args: argparse.Namespace, base: dict | None = None) -> RunConfig:
    """RunConfig from ``--config``, then ``base`` (task/attention/kernel/seed), then flags."""
    from ..train.run import make_run_config

    merged: dict[str, Any] = load_overrides(args.config) if args.config else {}
    merged.update(base or {})
    for name, (path, _, _) in COMMON_FLAGS.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        node = merged
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return make_run_config(merged)


def setup_runtime(args) -> Runtime:
    """Single-process runtime, or the torch.distributed one under torchrun (a missing
    ``--data-dir`` is an error before anything runs)."""
    from ..data.registry import resolve_data_dir
    from ..train.distributed import init_distributed

    resolve_data_dir(getattr(args, "data_dir", None))
    apply_threads(args)
    return init_distributed(progress=progress_mode(args) != "none")


def run(args: argparse.Namespace) -> int:
    from ..train.run import SAMPLE_WARNING
    from ..train.run import run as run_pipeline

    config = build_config(args, {"task": args.task, "attention": args.attention,
                                 "kernel": args.kernel, "seed": args.seed})
    runtime = setup_runtime(args)
    enc = "" if config.encoder == "scratch" else f"{config.encoder.rstrip('/').split('/')[-1]}-"
    out = args.out or (f"runs/train/{config.task}-{enc}{config.attention}-{config.kernel}-"
                       f"s{config.seed}")
    try:
        metrics = run_pipeline(config, out, runtime, data_dir=args.data_dir,
                               resume=args.resume,
                               convert_cache=getattr(args, "convert_cache", None))
    finally:
        runtime.close()
    keys = ("accuracy", "mcc", "f1", "ece", "log_loss", "brier")
    if runtime.is_main:
        print(json.dumps({k: round(metrics[k], 4) for k in keys}))
        if metrics.get("data_is_sample"):
            print(SAMPLE_WARNING, file=sys.stderr)
    if not all(math.isfinite(metrics[k]) for k in keys):
        raise FloatingPointError("non-finite metrics")
    return 0

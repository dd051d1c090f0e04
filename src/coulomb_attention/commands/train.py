"""``coulomb-attention train``: one Transformer classifier, fixed or learned kernel.

Stages (each resumable; checkpoints under ``OUT/ckpt/``)::

    warm-up   cross-entropy, fixed features           OUT/ckpt/warmup/    (warmup_epochs)
    phase A   particles by alignment + repulsion      OUT/ckpt/aligned/   (--kernel learned)
    phase B   cross-entropy, particles frozen         OUT/ckpt/finetune/  (train.epochs)
    evaluate  eval split, corruptions, AdvGLUE        OUT/metrics.json

``--kernel vanilla`` runs the same stages without phase A, so both kernels get the same
number of cross-entropy epochs. The warm-up does not depend on the kernel, so a suite may
reuse one warm-up checkpoint for both (see :func:`warmup_config`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import metrics as M
from .._validation import check_choice, check_nonnegative, check_positive
from ..config import from_dict, load_overrides, override, to_dict
from ..data import CORRUPTIONS, DATASETS, build_tokenizer, corrupt_tokens, load_task
from ..data import resolve_data_dir as _resolve_data_dir
from ..nn.attention import ATTENTION_FEATURES
from ..nn.model import ModelConfig, TransformerClassifier
from ..train.checkpoint import (
    atomic_write_json,
    atomic_write_text,
    latest_checkpoint,
    load_model_file,
    save_model_file,
)
from ..train.loop import EncodedDataset, Runtime, TrainConfig, fit, predict_proba
from ..train.phases import AlignConfig, align_features

__all__ = [
    "DataConfig",
    "KERNELS",
    "RobustConfig",
    "RunConfig",
    "add_arguments",
    "build_config",
    "run",
    "train_one",
    "warmup_config",
]

KERNELS = ("vanilla", "learned")


@dataclass(frozen=True)
class DataConfig:
    """Data settings: truncation length, tokenizer size and optional subsets.

    ``train_limit`` keeps a uniformly random subset of the training split (seeded by the
    run's seed); ``eval_limit`` does the same for the evaluation split (None: all of it).
    """

    max_length: int = 64
    vocab_size: int = 8000
    train_limit: int | None = None
    eval_limit: int | None = None

    def __post_init__(self) -> None:
        check_positive("max_length", self.max_length, integer=True)
        check_positive("vocab_size", self.vocab_size, integer=True)
        for name in ("train_limit", "eval_limit"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name), integer=True)


@dataclass(frozen=True)
class RobustConfig:
    """Test-time corruptions (each kind at each rate, fixed seed) and the AdvGLUE set."""

    kinds: tuple[str, ...] = CORRUPTIONS
    rates: tuple[float, ...] = (0.1, 0.2)
    seed: int = 1234
    advglue: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", tuple(self.kinds))
        object.__setattr__(self, "rates", tuple(float(r) for r in self.rates))
        for k in self.kinds:
            check_choice("corruption", k, CORRUPTIONS)
        for r in self.rates:
            if not 0 <= r <= 1:
                raise ValueError(f"corruption rates must be in [0, 1], got {r}")


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one run (stored in checkpoints and in metrics.json).

    ``model.vocab_size``/``model.num_labels``/``model.pad_id`` are set from the tokenizer and
    the task when the run starts; ``train.epochs`` are the phase-B epochs.

    ``embeddings``: ``"scratch"`` (default: a WordPiece vocabulary trained on the training
    split, ``data.vocab_size`` tokens, a random token table) or a pretrained BERT-style
    checkpoint (``"minilm"`` or a checkpoint directory): its WordPiece vocabulary and its token
    table, frozen, with a learned projection to ``model.dim``. Everything else is still trained
    from scratch.
    """

    task: str = "sst2"
    attention: str = "favor"
    kernel: str = "learned"
    seed: int = 0
    warmup_epochs: int = 1
    embeddings: str = "scratch"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=2))
    align: AlignConfig = field(default_factory=AlignConfig)
    robust: RobustConfig = field(default_factory=RobustConfig)

    def __post_init__(self) -> None:
        check_choice("task", self.task, DATASETS)
        check_choice("attention", self.attention, ATTENTION_FEATURES)
        check_choice("kernel", self.kernel, KERNELS)
        check_nonnegative("seed", self.seed)
        check_nonnegative("warmup_epochs", self.warmup_epochs)
        if not isinstance(self.embeddings, str) or not self.embeddings:
            raise ValueError(f"embeddings must be 'scratch', 'minilm' or a checkpoint "
                             f"directory, got {self.embeddings!r}")
        if self.model.attention != self.attention:
            object.__setattr__(self, "model", override(self.model, {
                "attention": self.attention, "tie_qk": None}))
        if self.kernel == "learned" and not ATTENTION_FEATURES[self.attention].has_features:
            valid = sorted(k for k, v in ATTENTION_FEATURES.items() if v.has_features)
            raise ValueError(f"attention {self.attention!r} has no particles to learn; use "
                             f"--kernel vanilla, or one of: {', '.join(valid)}")
        if self.kernel == "learned" and self.warmup_epochs == 0:
            raise ValueError("--kernel learned needs warmup_epochs >= 1 (phase A aligns the "
                             "representations of a warmed-up model)")


# Config keys added after checkpoints were first written, with the value every older run had.
# They are left out of the config stored in (and compared with) checkpoints while they hold
# that value, so runs written before a key existed still resume.
_LATER_KEYS: dict[tuple[str, ...], Any] = {
    ("embeddings",): "scratch",
    ("model", "embedding_dim"): None,
}


def checkpoint_config(d: dict) -> dict:
    """``d`` (a config dict) as stored in checkpoints: :data:`_LATER_KEYS` at their old value
    dropped. A copy; ``d`` is unchanged."""
    d = json.loads(json.dumps(d))
    for path, old in _LATER_KEYS.items():
        node = d
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and path[-1] in node and node[path[-1]] == old:
            del node[path[-1]]
    return d


def warmup_config(config: RunConfig) -> dict:
    """The part of the config the warm-up depends on (identical for vanilla and learned)."""
    d = to_dict(config)
    return checkpoint_config({k: d[k] for k in ("task", "attention", "seed", "warmup_epochs",
                                                "embeddings", "data", "model")})


# ---------------------------------------------------------------------------- data


def _encode(tokenizer, texts, labels, max_length) -> EncodedDataset:
    ids, mask = tokenizer.encode_batch(texts, max_length=max_length)
    return EncodedDataset(ids, mask, torch.as_tensor(np.asarray(labels), dtype=torch.long))


def _load_data(config: RunConfig, data_dir, out: Path, tokenizer_from=None):
    """Task splits and the tokenizer. ``out/tokenizer.json`` is reused when it exists; else,
    with ``tokenizer_from`` (the run whose warm-up will be reused), that run's tokenizer when
    it was built from the same texts and settings (see :func:`_copy_warmup`); else a new one
    is trained."""
    spec = DATASETS[config.task]
    train = load_task(config.task, spec.train_split, data_dir, limit=config.data.train_limit,
                      random_state=config.seed)
    ev = load_task(config.task, spec.eval_split, data_dir, limit=config.data.eval_limit,
                   random_state=0)
    adv = None
    if config.robust.advglue and spec.has_adversarial:
        try:
            adv = load_task(config.task, "advglue", data_dir)
        except FileNotFoundError:
            adv = None
    if config.embeddings == "scratch":
        own = out / "tokenizer.json"
        src = None if tokenizer_from is None else Path(tokenizer_from) / "tokenizer.json"
        if not own.is_file() and src is not None and src.is_file():
            try:  # loads and checks the fingerprint (same texts and settings)
                build_tokenizer(train.texts, vocab_size=config.data.vocab_size, cache_path=src)
                atomic_write_text(own, src.read_text(encoding="utf-8"))
            except ValueError:
                pass  # built from other texts: train this run's own
        tokenizer = build_tokenizer(train.texts, vocab_size=config.data.vocab_size,
                                    cache_path=own)
    else:
        from ..nn.pretrained import load_pretrained_tokenizer

        tokenizer = load_pretrained_tokenizer(config.embeddings)
    return spec, train, ev, adv, tokenizer


def _pretrained_table(config: RunConfig) -> torch.Tensor | None:
    """The frozen token table of ``config.embeddings`` (None for ``scratch``)."""
    if config.embeddings == "scratch":
        return None
    from ..nn.pretrained import load_token_embeddings

    return load_token_embeddings(config.embeddings)


# ---------------------------------------------------------------------------- evaluation


def _metrics(probs: torch.Tensor, labels: np.ndarray) -> dict[str, float]:
    return {k: float(v) for k, v in M.classification_metrics(probs.numpy(), labels).items()}


def _evaluate_all(model, ev_set, ev_labels, adv_set, adv_labels, tokenizer, config, bs):
    t0 = time.perf_counter()
    probs = predict_proba(model, ev_set, bs)
    infer_s = time.perf_counter() - t0
    result = _metrics(probs, ev_labels)
    reliability = {k: [None if isinstance(x, float) and math.isnan(x) else x for x in v]
                   for k, v in M.reliability_bins(probs.numpy(), ev_labels).items()}
    robust: dict[str, Any] = {}
    for kind in config.robust.kinds:
        for rate in config.robust.rates:
            ids, mask = corrupt_tokens(ev_set.input_ids, ev_set.attention_mask, kind, rate,
                                       seed=config.robust.seed,
                                       special_ids=tokenizer.special_ids,
                                       unk_id=tokenizer.unk_id, pad_id=tokenizer.pad_id)
            p = predict_proba(model, EncodedDataset(ids, mask, ev_set.labels), bs)
            robust[f"{kind}@{rate:g}"] = _metrics(p, ev_labels)
    if adv_set is not None:
        robust["advglue"] = _metrics(predict_proba(model, adv_set, bs), adv_labels)
        robust["advglue"]["n"] = len(adv_labels)
    return result, reliability, robust, infer_s / len(ev_labels)


# ---------------------------------------------------------------------------- one run


def train_one(
    config: RunConfig,
    out: str | Path,
    *,
    data_dir=None,
    resume: bool = False,
    runtime: Runtime | None = None,
    warmup_from: str | Path | None = None,
    log=print,
) -> dict[str, Any]:
    """Run every stage of one configuration and write ``OUT/metrics.json``.

    Parameters
    ----------
    config : RunConfig
    out : output directory
    data_dir : see :func:`coulomb_attention.data.resolve_data_dir`
    resume : continue from the checkpoints in ``out`` (without it, an ``out`` that already
        holds checkpoints raises ``ValueError``)
    runtime : loop runtime (device, progress bar, distribution)
    warmup_from : a run directory whose finished warm-up (same :func:`warmup_config`) is
        copied instead of recomputed
    log : callable used for one-line progress messages

    Returns
    -------
    dict : the content of ``metrics.json``
    """
    runtime = runtime or Runtime()
    if not runtime.is_main:  # one process prints and writes (all compute)
        def log(*_args, **_kwargs):
            return None
    out = Path(out)
    ckpt_root = out / "ckpt"
    if ckpt_root.exists() and any(ckpt_root.iterdir()) and not resume:
        raise ValueError(f"{out} already holds checkpoints; pass --resume to continue or "
                         "choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    data_dir = _resolve_data_dir(data_dir)
    t_start = time.perf_counter()
    with _main_first(runtime):  # rank 0 writes the tokenizer cache, the others then read it
        spec, train, ev, adv, tokenizer = _load_data(config, data_dir, out, warmup_from)
    table = _pretrained_table(config)
    if table is not None and table.shape[0] != tokenizer.vocab_size:
        raise ValueError(f"embeddings {config.embeddings!r}: the token table has "
                         f"{table.shape[0]} rows, the vocabulary {tokenizer.vocab_size} tokens")
    config = override(config, {"model": {"vocab_size": tokenizer.vocab_size,
                                          "num_labels": spec.num_labels,
                                          "pad_id": tokenizer.pad_id,
                                          "max_len": max(config.model.max_len,
                                                         config.data.max_length),
                                          **({} if table is None else
                                             {"embedding_dim": table.shape[1]})}})
    max_len = config.data.max_length
    train_set = _encode(tokenizer, train.texts, train.labels, max_len)
    ev_set = _encode(tokenizer, ev.texts, ev.labels, max_len)
    adv_set = _encode(tokenizer, adv.texts, adv.labels, max_len) if adv is not None else None
    timings: dict[str, float] = {"data_s": time.perf_counter() - t_start}
    log(f"[{config.task}/{config.attention}/{config.kernel}/seed{config.seed}] "
        f"train {len(train)} ({train.split}), eval {len(ev)} ({ev.split}), "
        f"vocab {tokenizer.vocab_size}")

    gen = torch.Generator().manual_seed(int(config.seed))
    model = TransformerClassifier(config.model, generator=gen)
    if table is not None:  # pretrained token table: loaded once, never trained
        with torch.no_grad():
            model.embeddings.word_embeddings.weight.copy_(table)
        model.embeddings.word_embeddings.weight.requires_grad_(False)
    bs = config.train.eval_batch_size

    def monitor(m) -> dict[str, float]:
        p = predict_proba(m, ev_set, bs)
        r = _metrics(p, ev.labels)
        return {"eval_accuracy": r["accuracy"], "eval_log_loss": r["log_loss"]}

    history: dict[str, list] = {}
    # -- warm-up (fixed features)
    warm_dir = ckpt_root / "warmup"
    if warmup_from is not None and latest_checkpoint(warm_dir) is None:
        _copy_warmup(Path(warmup_from), out, config)
    if config.warmup_epochs:
        res = fit(model, train_set, override(config.train, {"epochs": config.warmup_epochs}),
                  seed=config.seed, evaluate=monitor, runtime=runtime, checkpoint_dir=warm_dir,
                  resume=True, run_config=warmup_config(config), desc="warm-up")
        timings["warmup_s"] = res.train_time_s
        history["warmup"] = res.history
    # -- phase A (alignment of the particles)
    alignment: list[dict] = []
    if config.kernel == "learned":
        a_dir = ckpt_root / "aligned"
        if (a_dir / "alignment.json").is_file():
            load_model_file(a_dir / "model.safetensors", model)
            saved = json.loads((a_dir / "alignment.json").read_text())
            alignment, timings["phase_a_s"] = saved["alignment"], saved["time_s"]
        else:
            t0 = time.perf_counter()
            # a checkpoint after every aligned layer: a killed phase A resumes at the next layer
            partial = _load_phase_a_partial(a_dir, model)
            spent = partial.pop("time_s") if partial else 0.0

            def on_layer_done(next_layer, records, generator_state):
                if runtime.is_main:
                    _save_phase_a_partial(a_dir, model, next_layer, records, generator_state,
                                          spent + time.perf_counter() - t0)
                runtime.barrier()

            # data-parallel: each process aligns on its shard (per-process n_examples and
            # batch_size), statistics and gradients are all-reduced, the particles stay equal
            distributed = runtime.world_size > 1
            alignment = align_features(
                model,
                runtime.shard(train_set, strided=True, equal=True) if distributed else train_set,
                config.align,
                generator=torch.Generator().manual_seed(int(config.seed) + 7919),
                device=runtime.device, progress=runtime.progress and runtime.is_main,
                reduce=runtime.all_reduce_sum if distributed else None,
                on_layer_done=on_layer_done, resume=partial)
            timings["phase_a_s"] = spent + time.perf_counter() - t0
            if runtime.is_main:
                a_dir.mkdir(parents=True, exist_ok=True)
                save_model_file(a_dir / "model.safetensors.tmp", model)
                (a_dir / "model.safetensors.tmp").replace(a_dir / "model.safetensors")
                atomic_write_json(a_dir / "alignment.json",
                                  {"alignment": alignment, "time_s": timings["phase_a_s"]})
    # -- phase B (fine-tuning, particles frozen)
    omega_before = [layer.omega.clone() for layer in model.attention_layers]
    res = fit(model, train_set, config.train, seed=config.seed + 1, evaluate=monitor,
              runtime=runtime, checkpoint_dir=ckpt_root / "finetune", resume=True,
              run_config=checkpoint_config(to_dict(config)), desc="fine-tune")
    for layer, before in zip(model.attention_layers, omega_before, strict=False):
        assert torch.equal(layer.omega, before), "phase B must not move the particles"
    timings["phase_b_s"] = res.train_time_s
    history["finetune"] = res.history
    # -- evaluation
    t0 = time.perf_counter()
    result, reliability, robust, per_example = _evaluate_all(
        model, ev_set, ev.labels, adv_set, adv.labels if adv is not None else None,
        tokenizer, config, bs)
    timings["eval_s"] = time.perf_counter() - t0
    timings["inference_s_per_example"] = per_example
    timings["total_s"] = time.perf_counter() - t_start  # this process (resumes: the rest)
    timings["stages_s"] = sum(timings.get(k, 0.0) for k in (
        "data_s", "warmup_s", "phase_a_s", "phase_b_s", "eval_s"))  # over all resumes
    n_params = sum(p.numel() for p in model.parameters())
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    metrics = {
        **result,
        "robust": robust,
        "reliability": reliability,
        "alignment": alignment,
        "timings": timings,
        "history": history,
        "task": config.task,
        "attention": config.attention,
        "kernel": config.kernel,
        "seed": config.seed,
        "eval_split": ev.split,
        "eval_source": ev.source,
        "eval_description": getattr(ev, "description", ""),
        "train_split": train.split,
        "n_train": len(train),
        "n_eval": len(ev),
        "n_params": n_params,
        "n_trainable_params": n_trainable,
        "torch_threads": torch.get_num_threads(),
        "tokenizer": {"trainer": tokenizer.trainer, "vocab_size": tokenizer.vocab_size,
                      "fingerprint": tokenizer.meta.get("fingerprint")},
        "config": to_dict(config),
    }
    if runtime.is_main:
        atomic_write_json(out / "metrics.json", metrics)
    log(f"[{config.task}/{config.attention}/{config.kernel}/seed{config.seed}] "
        f"accuracy {result['accuracy']:.4f}  mcc {result['mcc']:.4f}  ece {result['ece']:.4f}  "
        f"({timings['total_s']:.0f} s) -> {out / 'metrics.json'}")
    return metrics


def _copy_warmup(src_run: Path, dst_run: Path, config: RunConfig) -> None:
    """Copy the finished warm-up of run ``src_run`` (same :func:`warmup_config`) into
    ``dst_run``, only if both runs encode with the same tokenizer: a warm-up checkpoint is valid
    only with the vocabulary it was trained on. Vocabularies are now trained deterministically,
    but run folders from earlier versions hold ones from HF's WordPieceTrainer, which breaks
    tied merges in hash-map order (huggingface/tokenizers#1794); :func:`_load_data` gives the
    copying run its source's tokenizer."""
    import shutil

    ck = latest_checkpoint(src_run / "ckpt" / "warmup")
    if ck is None:
        return
    meta = json.loads((ck / "state.json").read_text())
    if meta["epoch"] != config.warmup_epochs or meta["config"]["run"] != json.loads(
            json.dumps(warmup_config(config))):
        return
    src_tok, dst_tok = src_run / "tokenizer.json", dst_run / "tokenizer.json"
    if src_tok.is_file() != dst_tok.is_file() or (
            src_tok.is_file() and src_tok.read_bytes() != dst_tok.read_bytes()):
        return
    dst = dst_run / "ckpt" / "warmup"
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ck, dst / ck.name, dirs_exist_ok=True)
    atomic_write_json(dst / "latest.json", {"name": ck.name})


# ---------------------------------------------------------------------------- CLI

# flag -> (config path, type)
COMMON_FLAGS: dict[str, tuple[tuple[str, ...], type, str]] = {
    "epochs": (("train", "epochs"), int, "phase-B (fine-tuning) epochs"),
    "warmup_epochs": (("warmup_epochs",), int, "warm-up cross-entropy epochs"),
    "batch_size": (("train", "batch_size"), int, "training batch size"),
    "lr": (("train", "lr"), float, "peak learning rate"),
    "dim": (("model", "dim"), int, "model width"),
    "layers": (("model", "layers"), int, "encoder blocks"),
    "heads": (("model", "heads"), int, "attention heads"),
    "n_features": (("model", "n_features"), int, "random features per head"),
    "dropout": (("model", "dropout"), float, "dropout"),
    "max_length": (("data", "max_length"), int, "truncation length in tokens"),
    "vocab_size": (("data", "vocab_size"), int, "WordPiece vocabulary size"),
    "train_limit": (("data", "train_limit"), int, "random subset of the training split"),
    "embeddings": (("embeddings",), str, "token embeddings: scratch (default; vocabulary "
                   "trained on the task) or a pretrained checkpoint (minilm or a BERT "
                   "directory: its vocabulary and frozen token table)"),
    "eval_limit": (("data", "eval_limit"), int, "random subset of the evaluation split"),
    "align_steps": (("align", "steps"), int, "phase-A Langevin steps per layer"),
    "align_examples": (("align", "n_examples"), int, "phase-A cached training examples"),
    "lam": (("align", "lam"), float, "phase-A repulsion strength"),
}


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by ``train`` and ``suite``: data, config file, size overrides."""
    parser.add_argument("--data-dir", default=None,
                        help="data directory (default: $COULOMB_DATA_DIR, else the shipped "
                             "samples); the real data: ../shared/data")
    parser.add_argument("--config", default=None, metavar="FILE.json",
                        help="JSON overrides of the run config (unknown keys raise)")
    for name, (_, typ, help_) in COMMON_FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=typ, default=None, help=help_)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="sst2", help=f"one of {', '.join(sorted(DATASETS))}")
    parser.add_argument("--attention", default="favor",
                        help=f"one of {', '.join(sorted(ATTENTION_FEATURES))}")
    parser.add_argument("--kernel", default="learned", help="vanilla or learned")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None,
                        help="output directory (default runs/train/TASK-ATTENTION-KERNEL-sSEED)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the checkpoints in --out")
    parser.add_argument("--encoder", default=None,
                        help="fine-tune a pretrained encoder instead (minilm or a BERT "
                             "checkpoint directory; --kernel may also be softmax_align); "
                             "see docs/minilm.md")
    add_common_arguments(parser)


def build_config(args: argparse.Namespace, base: dict | None = None) -> RunConfig:
    """RunConfig from ``base`` (e.g. task/attention/kernel/seed), ``--config`` and flags."""
    merged: dict[str, Any] = {}
    if args.config:
        merged = load_overrides(args.config)
    for key, value in (base or {}).items():
        merged[key] = value
    for name, (path_, _, _) in COMMON_FLAGS.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        node = merged
        for part in path_[:-1]:
            node = node.setdefault(part, {})
        node[path_[-1]] = value
    sections = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig,
                "align": AlignConfig, "robust": RobustConfig}
    defaults = RunConfig.__dataclass_fields__
    for key, _cls in sections.items():
        if key in merged:
            if not isinstance(merged[key], dict):
                raise ValueError(f"config section {key!r} must be an object")
            default = defaults[key].default_factory()
            merged[key] = override(default, merged[key])
    if "model" in merged and "attention" in merged and \
            merged["model"].attention != merged["attention"]:
        merged["model"] = override(merged["model"], {"attention": merged["attention"],
                                                     "tie_qk": None})
    return from_dict(RunConfig, merged)


def _save_phase_a_partial(a_dir: Path, model, next_layer: int, records: list,
                          generator_state: torch.Tensor, time_s: float) -> None:
    """Phase-A checkpoint after a layer: ``a_dir/layer-NNN/`` then the pointer ``partial.json``.

    The pointer is written last (atomically), so a kill at any point leaves either the
    previous complete checkpoint or this one.
    """
    from safetensors.torch import save_file

    d = a_dir / f"layer-{next_layer:03d}"
    d.mkdir(parents=True, exist_ok=True)
    save_model_file(d / "model.safetensors.tmp", model)
    (d / "model.safetensors.tmp").replace(d / "model.safetensors")
    save_file({"generator": generator_state.contiguous()}, str(d / "generator.safetensors.tmp"))
    (d / "generator.safetensors.tmp").replace(d / "generator.safetensors")
    atomic_write_json(a_dir / "partial.json", {"dir": d.name, "next_layer": next_layer,
                                               "records": records, "time_s": time_s})


def _load_phase_a_partial(a_dir: Path, model) -> dict[str, Any] | None:
    """The last per-layer phase-A checkpoint (model loaded in place), or None."""
    pointer = a_dir / "partial.json"
    if not pointer.is_file():
        return None
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        meta = json.loads(pointer.read_text())
        d = a_dir / meta["dir"]
        load_model_file(d / "model.safetensors", model)
        state = load_file(str(d / "generator.safetensors"))["generator"]
    except (json.JSONDecodeError, KeyError, TypeError, SafetensorError) as exc:
        raise ValueError(f"{pointer}: corrupt phase-A checkpoint ({exc})") from exc
    return {"next_layer": int(meta["next_layer"]), "records": meta["records"],
            "generator_state": state, "time_s": float(meta["time_s"])}


def _main_first(runtime):
    main_first = getattr(runtime, "main_process_first", None)
    return main_first() if main_first is not None else contextlib.nullcontext()


def _setup(args) -> Runtime:
    """Single-process runtime, or the torch.distributed one under torchrun."""
    from ..train.distributed import init_distributed

    if args.threads is not None:
        torch.set_num_threads(check_positive("--threads", args.threads, integer=True))
    return init_distributed(progress=not args.no_progress)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "encoder", None):
        from .minilm import run_from_train_args

        return run_from_train_args(args)
    config = build_config(args, {"task": args.task, "attention": args.attention,
                                 "kernel": args.kernel, "seed": args.seed})
    runtime = _setup(args)
    out = args.out or (f"runs/train/{config.task}-{config.attention}-{config.kernel}-"
                       f"s{config.seed}")
    try:
        metrics = train_one(config, out, data_dir=args.data_dir, resume=args.resume,
                            runtime=runtime)
    finally:
        runtime.close()
    keys = ("accuracy", "mcc", "f1", "ece", "log_loss", "brier")
    if runtime.is_main:
        print(json.dumps({k: round(metrics[k], 4) for k in keys}))
    if not all(math.isfinite(metrics[k]) for k in keys):
        raise FloatingPointError("non-finite metrics")
    return 0

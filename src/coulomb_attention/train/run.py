"""The one run pipeline: one classifier, scratch or pretrained encoder, fixed or learned kernel.

Stages (each resumable after a kill; checkpoints under ``OUT/ckpt/``)::

    load      task splits, tokenizer (trained on the task, or the checkpoint's vocabulary),
              model (a TransformerClassifier from scratch, or a pretrained BERT-style encoder
              with its attention replaced by the chosen kernel)
    warm-up   cross-entropy, fixed features                        OUT/ckpt/warmup/
    phase A   particles of every attention layer, layer by layer    OUT/ckpt/aligned/
              objective "labels": kernel-target alignment + repulsion (train.phases)
              objective "teacher": the model's own softmax attention (convert.distill)
    probe     optional: the head fitted by logistic regression (LP-FT)
    phase B   cross-entropy, particles frozen                       OUT/ckpt/finetune/
    evaluate  evaluation split, corruptions, AdvGLUE                OUT/metrics.json

``kernel="vanilla"`` runs the same stages without phase A, so both kernels get the same
number of cross-entropy epochs. Under torchrun every process computes, rank 0 writes:
phase A is exactly data-parallel (all-reduced statistics, :attr:`Runtime.comm`), phase B
uses DDP. The resolved configuration is stored in every checkpoint and in ``metrics.json``;
:func:`coulomb_attention.results.is_done` compares it before a finished run is reused.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._validation import check_choice, check_nonnegative, check_positive
from ..config import deep_merge, from_dict, override, to_dict
from ..convert import Conversion, cached_conversion, conversion_of_run, load_conversion
from ..convert.distill import DistillConfig, distill_attention
from ..data import DATASETS, build_tokenizer, load_task, resolve_data_dir
from ..data.registry import SAMPLE_WARNING, data_source
from ..nn.attention import ATTENTION_FEATURES
from ..nn.model import ModelConfig, TransformerClassifier
from ..results import atomic_write_json, atomic_write_text
from .checkpoint import (
    latest_checkpoint,
    load_model_file,
    load_phase_a_partial,
    save_model_file,
    save_phase_a_partial,
)
from .evaluate import RobustConfig, evaluate, metrics_of
from .loop import EncodedDataset, Runtime, TrainConfig, fit, predict_proba
from .phases import AlignConfig, align_features, probe_init_head

__all__ = [
    "KERNELS",
    "OBJECTIVES",
    "PRETRAINED_PRESET",
    "RESUME_MODES",
    "SAMPLE_WARNING",
    "DataConfig",
    "RunConfig",
    "checkpoint_config",
    "converted_particles",
    "make_run_config",
    "needs_conversion",
    "resume_point",
    "run",
    "warmup_config",
]

KERNELS = ("vanilla", "learned")
#: phase-A objectives of a learned kernel
OBJECTIVES = ("labels", "teacher")
#: keys of the stored config filled in from the data / checkpoint when a run starts
RESOLVED_KEYS = ("model.vocab_size", "model.num_labels", "model.pad_id", "model.max_len",
                 "model.embedding_dim")


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
class RunConfig:
    """Everything that defines one run (stored in checkpoints and in ``metrics.json``).

    Attributes
    ----------
    task, attention, kernel, seed
    encoder : ``"scratch"`` (a TransformerClassifier of ``model``) or a pretrained BERT-style
        checkpoint (``"minilm"`` or a directory): its weights, vocabulary and architecture;
        ``model`` then only contributes ``n_features``, ``share_features`` and ``dropout``
    objective : phase-A objective of a learned kernel, ``labels`` or ``teacher``
    warmup_epochs : cross-entropy epochs with fixed features before phase A
    embeddings : for the scratch encoder, ``"scratch"`` or a pretrained token table
        (``"minilm"`` or a checkpoint directory: its vocabulary and frozen token table)
    probe_init : fit the head by logistic regression before phase B (LP-FT)
    freeze_word_embeddings : keep the token table fixed in phase B
    data, model, train (phase B), align (phase A, labels), distill (phase A, teacher),
    robust (evaluation)
    """

    task: str = "sst2"
    attention: str = "favor"
    kernel: str = "learned"
    seed: int = 0
    encoder: str = "scratch"
    objective: str = "labels"
    warmup_epochs: int = 1
    embeddings: str = "scratch"
    probe_init: bool = False
    freeze_word_embeddings: bool = False
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=2))
    align: AlignConfig = field(default_factory=AlignConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    robust: RobustConfig = field(default_factory=RobustConfig)

    def __post_init__(self) -> None:
        check_choice("task", self.task, DATASETS)
        check_choice("attention", self.attention, ATTENTION_FEATURES)
        check_choice("kernel", self.kernel, KERNELS)
        check_choice("objective", self.objective, OBJECTIVES)
        check_nonnegative("seed", self.seed)
        check_nonnegative("warmup_epochs", self.warmup_epochs)
        for name in ("encoder", "embeddings"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be 'scratch', 'minilm' or a checkpoint "
                                 f"directory, got {getattr(self, name)!r}")
        if self.encoder != "scratch" and self.embeddings != "scratch":
            raise ValueError("embeddings applies to the scratch encoder only (a pretrained "
                             "encoder brings its own token table)")
        if self.model.attention != self.attention:
            object.__setattr__(self, "model", override(self.model, {
                "attention": self.attention, "tie_qk": None}))
        if self.kernel == "learned" and not ATTENTION_FEATURES[self.attention].has_features:
            valid = sorted(k for k, v in ATTENTION_FEATURES.items() if v.has_features)
            raise ValueError(f"attention {self.attention!r} has no particles to learn; use "
                             f"--kernel vanilla, or one of: {', '.join(valid)}")
        if (self.kernel == "learned" and self.objective == "labels" and self.warmup_epochs == 0
                and self.encoder == "scratch"):
            raise ValueError("--kernel learned needs warmup_epochs >= 1 (phase A aligns the "
                             "representations of a warmed-up model)")


#: Defaults of a pretrained encoder (applied under the user's config file and flags): a short
#: fine-tune of a subset, the head initialised by a linear probe, the token table frozen.
PRETRAINED_PRESET: dict[str, Any] = {
    "warmup_epochs": 0,
    "probe_init": True,
    "freeze_word_embeddings": True,
    "model": {"share_features": False},  # one omega per head, as the conversion
    "data": {"train_limit": 2000},
    "train": {"epochs": 1, "batch_size": 32, "lr": 1e-4, "weight_decay": 0.01,
              "warmup_fraction": 0.1, "schedule": "linear", "eval_batch_size": 128},
    "align": {"n_examples": 512, "holdout": 128, "batch_size": 128, "steps": 60,
              "eta": 0.05, "eta_end": 0.005},
}
#: model keys a pretrained encoder honours (the rest comes from its checkpoint)
PRETRAINED_MODEL_KEYS = ("attention", "tie_qk", "n_features", "share_features", "dropout")


def make_run_config(overrides: dict[str, Any]) -> RunConfig:
    """A RunConfig from nested overrides (a config file merged with flags); unknown keys
    raise. With a pretrained ``encoder`` the :data:`PRETRAINED_PRESET` lies under the
    overrides, and model keys it cannot honour (``dim``, ``layers``, ...) raise."""
    merged = dict(overrides)
    if merged.get("encoder", "scratch") != "scratch":
        bad = sorted(set(merged.get("model", {})) - set(PRETRAINED_MODEL_KEYS))
        if bad:
            raise ValueError(f"model setting(s) {', '.join(bad)} do not apply to a pretrained "
                             f"encoder (its architecture comes from the checkpoint); valid: "
                             f"{', '.join(PRETRAINED_MODEL_KEYS)}")
        merged = deep_merge(PRETRAINED_PRESET, merged)
    defaults = RunConfig.__dataclass_fields__
    sections = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig,
                "align": AlignConfig, "distill": DistillConfig, "robust": RobustConfig}
    for key in sections:
        if key in merged:
            if not isinstance(merged[key], dict):
                raise ValueError(f"config section {key!r} must be an object")
            merged[key] = override(defaults[key].default_factory(), merged[key])
    if isinstance(merged.get("model"), ModelConfig) and "attention" in merged and \
            merged["model"].attention != merged["attention"]:
        merged["model"] = override(merged["model"], {"attention": merged["attention"],
                                                     "tie_qk": None})
    return from_dict(RunConfig, merged)


# Config keys added after checkpoints were first written, with the value every older run had.
# They are left out of the config stored in (and compared with) checkpoints while they hold
# that value, so runs written before a key existed still resume.
_LATER_KEYS: dict[tuple[str, ...], Any] = {
    ("embeddings",): "scratch",
    ("model", "embedding_dim"): None,
    ("encoder",): "scratch",
    ("objective",): "labels",
    ("probe_init",): False,
    ("freeze_word_embeddings",): False,
    ("distill",): to_dict(DistillConfig()),
    ("distill", "pairs"): False,
    # how the particles move, in every ParticleConfig since the one particle fit (issue 34)
    **{("align", k): getattr(AlignConfig(), k)
       for k in ("method", "lr", "tau", "w_min", "normalize_drift")},
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
                                                "embeddings", "encoder", "data", "model")})


# ---------------------------------------------------------------------------- load


def _encode(tokenizer, split, max_length) -> EncodedDataset:
    ids, mask = tokenizer.encode_batch(split.texts, max_length=max_length)
    return EncodedDataset(ids, mask, torch.as_tensor(np.asarray(split.labels), dtype=torch.long))


def _tokenizer(config: RunConfig, train_texts, out: Path, tokenizer_from=None):
    """The checkpoint's vocabulary, or one trained on the task (``out/tokenizer.json`` is
    reused; with ``tokenizer_from``, that run's when built from the same texts/settings)."""
    source = config.encoder if config.encoder != "scratch" else config.embeddings
    if source != "scratch":
        from ..nn.families.bert import load_pretrained_tokenizer

        return load_pretrained_tokenizer(source)
    own = out / "tokenizer.json"
    src = None if tokenizer_from is None else Path(tokenizer_from) / "tokenizer.json"
    if not own.is_file() and src is not None and src.is_file():
        try:  # loads and checks the fingerprint (same texts and settings)
            build_tokenizer(train_texts, vocab_size=config.data.vocab_size, cache_path=src)
            atomic_write_text(own, src.read_text(encoding="utf-8"))
        except ValueError:
            pass  # built from other texts: train this run's own
    return build_tokenizer(train_texts, vocab_size=config.data.vocab_size, cache_path=own)


def converted_particles(encoder: str, attention: str) -> bool:
    """Whether pretrained ``encoder`` is a converted checkpoint whose saved particles are
    ``attention``'s (a run on it starts from those particles: phase A is done)."""
    if encoder == "scratch":
        return False
    from ..nn.families.bert import KERNEL_KEY, read_bert_config, resolve_checkpoint_dir

    saved = read_bert_config(resolve_checkpoint_dir(encoder)).get(KERNEL_KEY)
    return saved is not None and saved.get("attention") == attention


def needs_conversion(config: RunConfig) -> bool:
    """Whether phase A of ``config`` is a conversion still to be made (or reused from the
    cache): a pretrained encoder, learned particles by the teacher objective, and an encoder
    that does not already carry converted ``config.attention`` particles."""
    return (config.encoder != "scratch" and config.kernel == "learned"
            and config.objective == "teacher"
            and not converted_particles(config.encoder, config.attention))


def _build_model(config: RunConfig, tokenizer, num_labels: int, source=None):
    """The model and the config with its data-dependent fields resolved; ``source`` (a
    converted encoder in memory) replaces a pretrained ``config.encoder`` as the weights."""
    gen = torch.Generator().manual_seed(int(config.seed))
    if config.encoder != "scratch":
        from ..nn.families.bert import load_pretrained_encoder

        model = load_pretrained_encoder(
            source or config.encoder, config.attention, config.model.n_features,
            num_labels=num_labels, share_features=config.model.share_features,
            dropout=config.model.dropout, generator=gen)
        if model.config.vocab_size != tokenizer.vocab_size:
            raise ValueError(f"encoder {config.encoder!r}: {model.config.vocab_size} token "
                             f"embeddings for a vocabulary of {tokenizer.vocab_size}")
        return model.train(), config
    table = None
    if config.embeddings != "scratch":
        from ..nn.families.bert import load_token_embeddings

        table = load_token_embeddings(config.embeddings)
        if table.shape[0] != tokenizer.vocab_size:
            raise ValueError(f"embeddings {config.embeddings!r}: the token table has "
                             f"{table.shape[0]} rows, the vocabulary {tokenizer.vocab_size} "
                             "tokens")
    config = override(config, {"model": {
        "vocab_size": tokenizer.vocab_size, "num_labels": num_labels,
        "pad_id": tokenizer.pad_id, "max_len": max(config.model.max_len, config.data.max_length),
        **({} if table is None else {"embedding_dim": table.shape[1]})}})
    model = TransformerClassifier(config.model, generator=gen)
    if table is not None:  # a pretrained token table: loaded once, never trained
        with torch.no_grad():
            model.embeddings.word_embeddings.weight.copy_(table)
        model.embeddings.word_embeddings.weight.requires_grad_(False)
    return model, config


# ---------------------------------------------------------------------------- phase A


def _phase_a(model, config: RunConfig, train_set: EncodedDataset, a_dir: Path,
             runtime: Runtime) -> tuple[list[dict], float]:
    """Phase A with a checkpoint after every layer; returns (records, seconds)."""
    if (a_dir / "alignment.json").is_file():  # finished before
        load_model_file(a_dir / "model.safetensors", model)
        saved = json.loads((a_dir / "alignment.json").read_text())
        return saved["alignment"], saved["time_s"]
    t0 = time.perf_counter()
    partial = load_phase_a_partial(a_dir, model)
    spent = partial.pop("time_s") if partial else 0.0

    def on_layer_done(next_layer, records, generator_state):
        if runtime.is_main:
            save_phase_a_partial(a_dir, model, next_layer, records, generator_state,
                                 spent + time.perf_counter() - t0)
        runtime.barrier()

    distributed = runtime.world_size > 1
    # data-parallel: each process takes its shard; statistics and gradients are all-reduced
    data = runtime.shard(train_set, strided=True, equal=True) if distributed else train_set
    gen = torch.Generator().manual_seed(int(config.seed) + 7919)
    progress = runtime.progress and runtime.is_main
    if config.objective == "labels":
        records = align_features(model, data, config.align, generator=gen,
                                 device=runtime.device, progress=progress, comm=runtime.comm,
                                 on_layer_done=on_layer_done, resume=partial)
    else:
        records = distill_attention(
            model, data.input_ids, data.attention_mask, config.distill,
            generator=gen, progress=progress, comm=runtime.comm, on_layer_done=on_layer_done,
            resume=partial)
    time_s = spent + time.perf_counter() - t0
    if runtime.is_main:
        a_dir.mkdir(parents=True, exist_ok=True)
        save_model_file(a_dir / "model.safetensors", model)
        atomic_write_json(a_dir / "alignment.json", {"alignment": records, "time_s": time_s})
    runtime.barrier()
    return records, time_s


def _conversion(config: RunConfig, converted, convert_cache, runtime: Runtime, data_dir,
                log) -> Conversion | None:
    """Phase A of a pretrained encoder with the teacher objective: the conversion, in memory
    (``converted``: a :class:`~coulomb_attention.convert.Conversion` or its directory; else
    made, or reused, under ``convert_cache``), checked against ``config`` (map, ``M``, seed,
    distillation)."""
    route = (config.encoder != "scratch" and config.kernel == "learned"
             and config.objective == "teacher")
    if config.kernel == "vanilla" and converted_particles(config.encoder, config.attention):
        raise ValueError(f"{config.encoder} holds learned {config.attention} particles: use "
                         "--kernel learned to fine-tune them, or the original encoder for "
                         "fresh (vanilla) ones")
    if converted is None and convert_cache is not None and needs_conversion(config):
        with runtime.main_process_first():  # rank 0 converts, the others then reuse it
            converted = cached_conversion(conversion_of_run(config), convert_cache,
                                          data_dir=data_dir,
                                          progress=runtime.progress and runtime.is_main,
                                          log=log)
    if converted is None:
        if needs_conversion(config):
            raise ValueError("phase A of a pretrained encoder with the teacher objective is "
                             "the conversion: pass convert_cache= (the train and minilm "
                             "commands' --convert-cache) or a conversion (converted=)")
        return None
    if not route:
        raise ValueError("converted= is phase A of a pretrained encoder with --kernel learned "
                         f"--objective teacher, not of encoder={config.encoder!r} kernel="
                         f"{config.kernel!r} objective={config.objective!r}")
    conv = converted if isinstance(converted, Conversion) else load_conversion(converted)
    c = conv.config
    method = "hedgehog" if c.variant == "hedgehog" else c.distill.method
    want = {"feature_map": config.attention, "n_features": config.model.n_features,
            "seed": config.seed, "method": config.distill.method}
    have = {"feature_map": c.feature_map, "n_features": c.n_features, "seed": c.seed,
            "method": method}
    if want != have:
        diff = ", ".join(f"{k} {have[k]!r} (run: {want[k]!r})" for k in want
                         if want[k] != have[k])
        raise ValueError(f"conversion {conv.directory} does not match the run: {diff}")
    return conv


def copy_warmup(src_run: Path, dst_run: Path, config: RunConfig) -> None:
    """Copy the finished warm-up of run ``src_run`` (same :func:`warmup_config`) into
    ``dst_run``, only if both runs encode with the same tokenizer (a warm-up checkpoint is valid
    only with the vocabulary it was trained on; run folders of earlier versions may hold
    vocabularies from HF's non-deterministic trainer)."""
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


# ---------------------------------------------------------------------------- one run


RESUME_MODES = (False, True, "auto")
# SAMPLE_WARNING: data.registry's, re-exported (the train command prints it after the result)


#: the per-epoch monitor (history only: no model selection) reads at most this many evaluation
#: examples; the full split is evaluated once, after training
MONITOR_EXAMPLES = 2000


def monitor_subset(ev_set: EncodedDataset, limit: int = MONITOR_EXAMPLES) -> EncodedDataset:
    """The evaluation examples the per-epoch monitor reads: all of them up to ``limit``, else a
    fixed random subset of ``limit`` (seed 0, the same for every run and variant)."""
    if len(ev_set) <= limit:
        return ev_set
    idx = torch.randperm(len(ev_set), generator=torch.Generator().manual_seed(0))[:limit]
    idx = idx.sort().values
    return EncodedDataset(ev_set.input_ids[idx], ev_set.attention_mask[idx], ev_set.labels[idx])


def resume_point(out: str | Path) -> str | None:
    """Where a run in ``out`` would resume, in words (``"after warm-up epoch 2"``), or ``None``
    when it holds nothing to resume from. The latest stage wins: fine-tune, phase A, warm-up."""
    out, ckpt = Path(out), Path(out) / "ckpt"
    done = " (finished: re-evaluates)" if (out / "metrics.json").is_file() else ""

    def epoch_of(stage: str) -> str | None:
        last = latest_checkpoint(ckpt / stage)
        return None if last is None else str(
            json.loads((last / "state.json").read_text()).get("epoch", "?"))

    if (epoch := epoch_of("finetune")) is not None:
        return f"after fine-tune epoch {epoch}{done}"
    if (ckpt / "aligned" / "alignment.json").is_file():
        return f"after phase A{done}"
    if (ckpt / "aligned" / "partial.json").is_file():
        meta = json.loads((ckpt / "aligned" / "partial.json").read_text())
        return f"in phase A, {int(meta['next_layer'])} layer(s) aligned{done}"
    if (epoch := epoch_of("warmup")) is not None:
        return f"after warm-up epoch {epoch}{done}"
    return None


def run(
    config: RunConfig,
    out: str | Path,
    runtime: Runtime | None = None,
    *,
    data_dir=None,
    resume: bool | str = False,
    warmup_from: str | Path | None = None,
    converted: Conversion | str | Path | None = None,
    convert_cache: str | Path | None = None,
    log=print,
) -> dict[str, Any]:
    """Run every stage of one configuration and write ``OUT/metrics.json``.

    Parameters
    ----------
    config : RunConfig
    out : output directory
    runtime : loop runtime (device, progress bar, distribution); default one CPU process
    data_dir : see :func:`coulomb_attention.data.resolve_data_dir`
    resume : False, True or ``"auto"``. False: an ``out`` that already holds checkpoints raises
        ``ValueError``. True: continue from the checkpoints in ``out``; an ``out`` that does not
        exist raises ``FileNotFoundError`` (a mistyped folder is not silently a fresh run).
        ``"auto"``: resume when there is something to resume, else start fresh. Either way
        the log says which (``resuming OUT after ...`` / ``nothing to resume in OUT``).
    warmup_from : a run directory whose finished warm-up (same :func:`warmup_config`) is
        copied instead of recomputed
    converted : phase A of a pretrained encoder with the teacher objective: the conversion
        (a :class:`~coulomb_attention.convert.Conversion` in memory, or the directory of a
        finished ``coulomb-attention convert``), whose particles the run starts from
    convert_cache : else, where that conversion
        (:func:`~coulomb_attention.convert.conversion_of_run` of ``config``) is made, or reused
        when finished (:func:`coulomb_attention.convert.cached_conversion`); one of the two is
        required for that route (the conversion has one implementation)
    log : one-line progress messages (rank 0 only)

    Returns
    -------
    dict : the content of ``metrics.json``
    """
    if not isinstance(config, RunConfig):
        raise TypeError(f"config must be a RunConfig, got {type(config).__name__}")
    runtime = runtime or Runtime()
    if not runtime.is_main:
        def log(*_args, **_kwargs):
            return None
    if resume not in RESUME_MODES:
        raise ValueError(f"resume must be one of {RESUME_MODES}, got {resume!r}")
    out = Path(out)
    ckpt_root = out / "ckpt"
    if ckpt_root.exists() and any(ckpt_root.iterdir()) and not resume:
        raise ValueError(f"{out} already holds checkpoints; pass --resume to continue or "
                         "choose another --out")
    if resume is True and not out.is_dir():
        raise FileNotFoundError(f"--resume: {out} does not exist, nothing to resume (check "
                                "--out; drop --resume, or pass --resume auto, to start fresh)")
    if resume:
        point = resume_point(out)
        log(f"resuming {out} {point}" if point else f"nothing to resume in {out}: starting "
            "fresh")
    out.mkdir(parents=True, exist_ok=True)
    data_dir = resolve_data_dir(data_dir)
    t_start = time.perf_counter()
    spec = DATASETS[config.task]
    train = load_task(config.task, spec.train_split, data_dir, limit=config.data.train_limit,
                      random_state=config.seed)
    ev = load_task(config.task, spec.eval_split, data_dir, limit=config.data.eval_limit,
                   random_state=0)
    for what, limit, part in (("train_limit", config.data.train_limit, train),
                              ("eval_limit", config.data.eval_limit, ev)):
        if limit is not None and limit > len(part):
            log(f"note: {what} {limit} is more than the {len(part)} rows of "
                f"{config.task}/{part.split}: using all {len(part)}")
    sample = train.is_sample or ev.is_sample
    if sample:
        log(SAMPLE_WARNING)
    adv = None
    if config.robust.advglue and spec.has_adversarial:
        with contextlib.suppress(FileNotFoundError):
            adv = load_task(config.task, "advglue", data_dir)
    with runtime.main_process_first():  # rank 0 writes the tokenizer cache, the others then read it
        tokenizer = _tokenizer(config, train.texts, out, warmup_from)
    conversion = _conversion(config, converted, convert_cache, runtime, data_dir, log)
    model, config = _build_model(config, tokenizer, spec.num_labels,
                                 conversion.model if conversion else None)
    max_len = config.data.max_length
    train_set, ev_set = _encode(tokenizer, train, max_len), _encode(tokenizer, ev, max_len)
    adv_set = _encode(tokenizer, adv, max_len) if adv is not None else None
    timings: dict[str, float] = {"data_s": time.perf_counter() - t_start}
    name = f"{config.task}/{config.attention}/{config.kernel}/seed{config.seed}"
    log(f"[{name}] encoder {config.encoder}, train {len(train)} ({train.split}), eval "
        f"{len(ev)} ({ev.split}), vocab {tokenizer.vocab_size}")
    stored = checkpoint_config(to_dict(config))
    bs = config.train.eval_batch_size

    watch = monitor_subset(ev_set)

    def monitor(m) -> dict[str, float]:
        r = metrics_of(predict_proba(m, watch, bs), watch.labels.numpy())
        return {"eval_accuracy": r["accuracy"], "eval_log_loss": r["log_loss"],
                "eval_n": len(watch)}

    history: dict[str, list] = {}
    warm_dir = ckpt_root / "warmup"
    if warmup_from is not None and latest_checkpoint(warm_dir) is None:
        copy_warmup(Path(warmup_from), out, config)
    if config.warmup_epochs:
        res = fit(model, train_set, override(config.train, {"epochs": config.warmup_epochs}),
                  seed=config.seed, evaluate=monitor, runtime=runtime, checkpoint_dir=warm_dir,
                  resume=True, run_config=warmup_config(config), desc="warm-up")
        timings["warmup_s"] = res.train_time_s
        history["warmup"] = res.history
    alignment: list[dict] = []
    if conversion is not None:  # phase A was the conversion (its own directory and time)
        alignment, timings["phase_a_s"] = conversion.records, conversion.time_s
        log(f"[{name}] phase A: the conversion {conversion.directory}")
    elif config.kernel == "learned" and converted_particles(config.encoder, config.attention):
        log(f"[{name}] phase A: the particles of the converted encoder {config.encoder}")
    elif config.kernel == "learned":
        alignment, timings["phase_a_s"] = _phase_a(model, config, train_set,
                                                   ckpt_root / "aligned", runtime)
    finetune_dir = ckpt_root / "finetune"
    if config.probe_init and latest_checkpoint(finetune_dir) is None:
        t0 = time.perf_counter()
        acc = probe_init_head(model, train_set, bs)
        timings["probe_s"] = time.perf_counter() - t0
        log(f"[{name}] head initialised by a linear probe (train accuracy {acc:.4f})")
    if config.freeze_word_embeddings:
        model.embeddings.word_embeddings.weight.requires_grad_(False)
    omega_before = [layer.omega.clone() for layer in model.attention_layers]
    res = fit(model, train_set, config.train, seed=config.seed + 1, evaluate=monitor,
              runtime=runtime, checkpoint_dir=finetune_dir, resume=True, run_config=stored,
              desc="fine-tune")
    for layer, before in zip(model.attention_layers, omega_before, strict=True):
        assert torch.equal(layer.omega, before), "phase B must not move the particles"
    timings["phase_b_s"] = res.train_time_s
    history["finetune"] = res.history
    t0 = time.perf_counter()
    ev_result = evaluate(model, ev_set, tokenizer, config.robust, adv_set, bs)
    timings["eval_s"] = time.perf_counter() - t0
    timings["inference_s_per_example"] = ev_result["inference_s_per_example"]
    timings["total_s"] = time.perf_counter() - t_start  # this process (resumes: the rest)
    timings["stages_s"] = sum(timings.get(k, 0.0) for k in (
        "data_s", "warmup_s", "phase_a_s", "probe_s", "phase_b_s", "eval_s"))
    result = ev_result["metrics"]
    metrics = {
        **result,
        "robust": ev_result["robust"],
        "reliability": ev_result["reliability"],
        "alignment": alignment,
        "timings": timings,
        "history": history,
        "task": config.task,
        "encoder": config.encoder,
        "attention": config.attention,
        "kernel": config.kernel,
        "seed": config.seed,
        "conversion": None if conversion is None else {
            "dir": str(conversion.directory), "config": conversion.result["config"],
            "time_s": conversion.time_s, "refine": conversion.result.get("refine")},
        "eval_split": ev.split,
        "eval_source": ev.source,
        "eval_description": getattr(ev, "description", ""),
        "train_split": train.split,
        "n_train": len(train),
        "n_eval": len(ev),
        "n_params": sum(p.numel() for p in model.parameters()),
        "n_trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "data_is_sample": bool(sample),
        "data": data_source(data_dir),  # samples / dir / hf, and the path
        "torch_threads": torch.get_num_threads(),
        "world_size": runtime.world_size,  # processes (torchrun), one shard of data each
        "batch_size_per_process": config.train.batch_size,
        "global_batch_size": config.train.batch_size * runtime.world_size,
        "tokenizer": {"trainer": tokenizer.trainer, "vocab_size": tokenizer.vocab_size,
                      "fingerprint": tokenizer.meta.get("fingerprint")},
        "model_config": to_dict(model.config),
        "config": to_dict(config),
    }
    if runtime.is_main:
        atomic_write_json(out / "metrics.json", metrics)
    log(f"[{name}] accuracy {result['accuracy']:.4f}  mcc {result['mcc']:.4f}  ece "
        f"{result['ece']:.4f}  ({timings['total_s']:.0f} s) -> {out / 'metrics.json'}"
        + ("  [SHIPPED SAMPLE: smoke test only, not a result]" if sample else ""))
    return metrics

"""Pretrained all-MiniLM-L6-v2 converted to kernel attention: phase A + phase B + evaluation.

One run (:func:`run_one`)::

    load     pretrained encoder with its Q/K/V/O weights, attention replaced by the chosen
             kernel (nn.pretrained.load_pretrained_encoder), its own WordPiece vocabulary
    phase A  kernel "learned":       particles aligned with the task labels
                                     (train.phases.align_features, the project's phase A)
             kernel "softmax_align": particles aligned with the pretrained softmax attention
                                     weights on sampled token pairs (nn.pretrained.align_to_softmax)
             kernel "vanilla":       no phase A (fixed random features, or exact softmax)
    phase B  cross-entropy fine-tuning of every weight, particles frozen (train.loop.fit)
    evaluate accuracy, MCC, F1, ECE, log-loss, Brier on the evaluation split -> OUT/metrics.json

Commands::

    python -m coulomb_attention.commands.minilm run --task sst2 --attention favor \
        --kernel learned --data-dir ../shared/data --out runs/minilm/sst2-favor-learned
    python -m coulomb_attention.commands.minilm compare --tasks sst2 rotten_tomatoes \
        --data-dir ../shared/data --out runs/minilm
    python -m coulomb_attention.commands.minilm timing --out runs/minilm

``compare`` writes ``OUT/results.jsonl`` (one row per run), ``OUT/table.md``; ``timing``
writes ``OUT/timing.csv`` and ``OUT/timing.png`` (encoder forward time versus sequence length).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import metrics as M
from .._validation import check_choice, check_positive
from ..config import from_dict, override, to_dict
from ..data import DATASETS, load_task
from ..data import resolve_data_dir as _resolve_data_dir
from ..nn.attention import ATTENTION_FEATURES
from ..nn.pretrained import (
    align_to_softmax,
    load_pretrained_encoder,
    load_pretrained_tokenizer,
)
from ..train.checkpoint import atomic_write_json, atomic_write_text, save_model_file
from ..train.loop import EncodedDataset, Runtime, TrainConfig, fit, predict_proba
from ..train.phases import AlignConfig, align_features

__all__ = [
    "KERNELS",
    "MiniLMConfig",
    "VARIANTS",
    "add_arguments",
    "build_model",
    "compare",
    "main",
    "run",
    "run_from_train_args",
    "run_one",
    "time_vs_length",
    "write_table",
]

#: phase A of a run: none, label alignment (project phase A), alignment with softmax attention
KERNELS = ("vanilla", "learned", "softmax_align")

#: (attention, kernel) pairs of ``compare``, in table order
VARIANTS: tuple[tuple[str, str], ...] = (
    ("softmax", "vanilla"),
    ("favor", "vanilla"),
    ("favor", "learned"),
    ("favor", "softmax_align"),
    ("porf_softplus", "vanilla"),
    ("porf_softplus", "learned"),
)


def _default_train() -> TrainConfig:
    return TrainConfig(epochs=1, batch_size=32, lr=1e-4, weight_decay=0.01,
                       warmup_fraction=0.1, schedule="linear", eval_batch_size=128)


def _default_align() -> AlignConfig:
    return AlignConfig(n_examples=512, holdout=128, batch_size=128, steps=60, eta=0.05,
                       eta_end=0.005)


@dataclass(frozen=True)
class MiniLMConfig:
    """One pretrained-encoder run (stored in ``metrics.json``).

    Attributes
    ----------
    task : str               sst2, rotten_tomatoes or qqp
    encoder : str            ``minilm`` or a local BERT checkpoint directory
    attention : str          one of ATTENTION_FEATURES
    kernel : str             vanilla, learned (labels) or softmax_align
    n_features : int         particles per layer
    seed : int
    train_limit : int        random training subset (None: the whole split)
    eval_limit : int         random evaluation subset (None: the whole split)
    max_length : int         truncation length in tokens
    rows_per_sequence : int  query rows per sequence for softmax_align
    probe_init : bool        initialise the head by logistic regression on the converted
                             encoder's pooled features of the training subset before phase B
                             (linear probing then fine-tuning, LP-FT; each variant gets the
                             probe of its own features)
    freeze_word_embeddings : bool  keep the (30522, 384) token table fixed in phase B (saves
                             a third of the parameters' optimiser work on a small CPU budget)
    train : TrainConfig      phase B
    align : AlignConfig      phase A
    """

    task: str = "sst2"
    encoder: str = "minilm"
    attention: str = "favor"
    kernel: str = "vanilla"
    n_features: int = 64
    seed: int = 0
    train_limit: int | None = 2000
    eval_limit: int | None = None
    max_length: int = 64
    rows_per_sequence: int = 8
    probe_init: bool = True
    freeze_word_embeddings: bool = True
    train: TrainConfig = field(default_factory=_default_train)
    align: AlignConfig = field(default_factory=_default_align)

    def __post_init__(self) -> None:
        check_choice("task", self.task, DATASETS)
        check_choice("attention", self.attention, ATTENTION_FEATURES)
        check_choice("kernel", self.kernel, KERNELS)
        check_positive("n_features", self.n_features, integer=True)
        check_positive("max_length", self.max_length, integer=True)
        check_positive("rows_per_sequence", self.rows_per_sequence, integer=True)
        for name in ("train_limit", "eval_limit"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name), integer=True)
        if self.kernel != "vanilla" and not ATTENTION_FEATURES[self.attention].has_features:
            valid = sorted(k for k, v in ATTENTION_FEATURES.items() if v.has_features)
            raise ValueError(f"attention {self.attention!r} has no particles to learn; use "
                             f"kernel 'vanilla' or one of: {', '.join(valid)}")


def build_model(
    encoder: str = "minilm",
    attention: str = "softmax",
    *,
    n_features: int = 64,
    num_labels: int = 2,
    seed: int = 0,
    share_features: bool = True,
    dropout: float | None = None,
):
    """The pretrained classifier and its tokenizer (what ``train --encoder`` calls).

    Returns
    -------
    model : PretrainedClassifier
        Head and particles drawn from ``torch.Generator().manual_seed(seed)``.
    tokenizer : coulomb_attention.data.Tokenizer
    """
    model = load_pretrained_encoder(encoder, attention, n_features, num_labels=num_labels,
                                    share_features=share_features, dropout=dropout,
                                    generator=torch.Generator().manual_seed(int(seed)))
    return model, load_pretrained_tokenizer(encoder)


def _log(*args) -> None:
    print(*args, flush=True)


def _encode(tokenizer, texts, labels, max_length) -> EncodedDataset:
    ids, mask = tokenizer.encode_batch(texts, max_length=max_length)
    return EncodedDataset(ids, mask, torch.as_tensor(np.asarray(labels), dtype=torch.long))


def _metrics(probs: torch.Tensor, labels: np.ndarray) -> dict[str, float]:
    return {k: float(v) for k, v in M.classification_metrics(probs.numpy(), labels).items()}


@torch.no_grad()
def _probe_init_head(model, dataset: EncodedDataset, batch_size: int) -> float:
    """Fit the head by L2-regularised logistic regression (sklearn, lbfgs, C=1) on the pooled
    features of ``dataset`` (eval mode); returns the probe's training accuracy."""
    from sklearn.linear_model import LogisticRegression

    was_training = model.training
    model.eval()
    feats = []
    for start in range(0, len(dataset), batch_size):
        ids = dataset.input_ids[start:start + batch_size]
        mask = dataset.attention_mask[start:start + batch_size]
        feats.append(model.pool(model.encode(ids, mask), mask).double())
    x = torch.cat(feats).numpy()
    y = dataset.labels.numpy()
    clf = LogisticRegression(C=1.0, max_iter=2000).fit(x, y)
    coef = torch.as_tensor(clf.coef_)
    bias = torch.as_tensor(clf.intercept_)
    if coef.shape[0] == 1:  # binary: logit difference w.x + b -> two symmetric rows
        coef, bias = torch.cat([-coef / 2, coef / 2]), torch.cat([-bias / 2, bias / 2])
    model.head.weight.copy_(coef.to(model.head.weight))
    model.head.bias.copy_(bias.to(model.head.bias))
    model.train(was_training)
    return float(clf.score(x, y))


def _finite_or_none(obj):
    """NaN (empty reliability bins) -> None, so the JSON stays strict."""
    if isinstance(obj, dict):
        return {k: _finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite_or_none(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def run_one(config: MiniLMConfig, out: str | Path, *, data_dir=None,
            runtime: Runtime | None = None, log=_log) -> dict[str, Any]:
    """Load, (phase A), phase B, evaluate one configuration; write ``OUT/metrics.json``.

    Returns the content of ``metrics.json`` (metrics, timings, phase-A records, config).
    """
    runtime = runtime or Runtime(progress=False)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    data_dir = _resolve_data_dir(data_dir)
    spec = DATASETS[config.task]
    train = load_task(config.task, spec.train_split, data_dir, limit=config.train_limit,
                      random_state=config.seed)
    ev = load_task(config.task, spec.eval_split, data_dir, limit=config.eval_limit,
                   random_state=0)
    model, tokenizer = build_model(config.encoder, config.attention,
                                   n_features=config.n_features,
                                   num_labels=spec.num_labels, seed=config.seed)
    train_set = _encode(tokenizer, train.texts, train.labels, config.max_length)
    ev_set = _encode(tokenizer, ev.texts, ev.labels, config.max_length)
    timings: dict[str, float] = {"load_s": time.perf_counter() - t_start}
    name = f"{config.task}/{config.attention}/{config.kernel}/seed{config.seed}"
    log(f"[{name}] train {len(train)} ({train.split}), eval {len(ev)} ({ev.split})")

    alignment: list[dict] = []
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(int(config.seed) + 7919)
    if config.kernel == "learned":
        alignment = align_features(model, train_set, config.align, generator=gen,
                                   progress=runtime.progress)
    elif config.kernel == "softmax_align":
        alignment = align_to_softmax(model, train_set.input_ids, train_set.attention_mask,
                                     config.align, generator=gen,
                                     rows_per_sequence=config.rows_per_sequence,
                                     progress=runtime.progress)
    timings["phase_a_s"] = time.perf_counter() - t0
    log(f"[{name}] loaded in {timings['load_s']:.0f} s, phase A {timings['phase_a_s']:.0f} s")
    for r in alignment:
        log(f"[{name}] phase A layer {r['layer']}: alignment {r['train_before']:.4f} -> "
            f"{r['train_after']:.4f}" + ("" if r.get("holdout_after") is None else
                                         f" (held-out {r['holdout_before']:.4f} -> "
                                         f"{r['holdout_after']:.4f})"))

    bs = config.train.eval_batch_size
    if config.probe_init:
        t0 = time.perf_counter()
        probe_acc = _probe_init_head(model, train_set, config.train.eval_batch_size)
        timings["probe_s"] = time.perf_counter() - t0
        log(f"[{name}] head initialised by a linear probe (train accuracy {probe_acc:.4f}, "
            f"{timings['probe_s']:.0f} s)")
    if config.freeze_word_embeddings:
        model.embeddings.word_embeddings.weight.requires_grad_(False)
    omega_before = [layer.omega.clone() for layer in model.attention_layers]
    log(f"[{name}] phase B: {len(train_set)} examples, {config.train.epochs} epoch(s)")
    res = fit(model, train_set, config.train, seed=config.seed + 1, runtime=runtime,
              run_config=to_dict(config), desc="fine-tune")
    for layer, before in zip(model.attention_layers, omega_before, strict=True):
        assert torch.equal(layer.omega, before), "phase B must not move the particles"
    timings["phase_b_s"] = res.train_time_s

    t0 = time.perf_counter()
    probs = predict_proba(model, ev_set, bs)
    timings["eval_s"] = time.perf_counter() - t0
    timings["inference_s_per_example"] = timings["eval_s"] / len(ev)
    result = _metrics(probs, ev.labels)
    timings["total_s"] = time.perf_counter() - t_start
    metrics = {
        **result,
        "reliability": _finite_or_none(M.reliability_bins(probs.numpy(), ev.labels)),
        "alignment": alignment,
        "timings": timings,
        "history": res.history,
        "task": config.task,
        "encoder": config.encoder,
        "attention": config.attention,
        "kernel": config.kernel,
        "seed": config.seed,
        "train_split": train.split,
        "eval_split": ev.split,
        "eval_source": ev.source,
        "n_train": len(train),
        "n_eval": len(ev),
        "n_params": sum(p.numel() for p in model.parameters()),
        "torch_threads": torch.get_num_threads(),
        "config": to_dict(config),
    }
    atomic_write_json(out / "metrics.json", metrics)
    save_model_file(out / "model.safetensors", model)
    log(f"[{name}] accuracy {result['accuracy']:.4f}  ece {result['ece']:.4f}  "
        f"log-loss {result['log_loss']:.4f}  brier {result['brier']:.4f}  "
        f"({timings['total_s']:.0f} s) -> {out / 'metrics.json'}")
    return metrics


# ---------------------------------------------------------------------------- comparison

_TABLE_KEYS = ("accuracy", "ece", "log_loss", "brier")


def _row(m: dict[str, Any]) -> dict[str, Any]:
    t = m["timings"]
    return {"task": m["task"], "attention": m["attention"], "kernel": m["kernel"],
            "seed": m["seed"], **{k: m[k] for k in (*_TABLE_KEYS, "mcc", "f1")},
            "n_train": m["n_train"], "n_eval": m["n_eval"], "eval_split": m["eval_split"],
            "phase_a_s": t["phase_a_s"], "phase_b_s": t["phase_b_s"],
            "ms_per_example": 1e3 * t["inference_s_per_example"], "total_s": t["total_s"]}


def write_table(rows: list[dict[str, Any]], path: str | Path) -> str:
    """Markdown table of result rows (one line per run; accuracy gap to softmax per task)."""
    soft = {r["task"]: r["accuracy"] for r in rows
            if r["attention"] == "softmax" and r["kernel"] == "vanilla"}
    lines = ["| task | attention | kernel | accuracy | vs softmax (pts) | ECE | log-loss | "
             "Brier | phase A s | phase B s | eval ms/ex |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        gap = (f"{100 * (r['accuracy'] - soft[r['task']]):+.1f}" if r["task"] in soft else "")
        lines.append(
            f"| {r['task']} | {r['attention']} | {r['kernel']} | {r['accuracy']:.4f} | {gap} | "
            f"{r['ece']:.4f} | {r['log_loss']:.4f} | {r['brier']:.4f} | {r['phase_a_s']:.0f} | "
            f"{r['phase_b_s']:.0f} | {r['ms_per_example']:.2f} |")
    text = "\n".join(lines) + "\n"
    atomic_write_text(path, text)
    return text


def compare(base: MiniLMConfig, tasks: list[str], variants, out: str | Path, *,
            data_dir=None, runtime: Runtime | None = None, log=_log) -> list[dict]:
    """Run every (task, attention, kernel); finished runs (``metrics.json``) are reused.

    Writes ``OUT/results.jsonl`` and ``OUT/table.md``; returns the rows.
    """
    out = Path(out)
    rows = []
    for task in tasks:
        for attention, kernel in variants:
            cfg = override(base, {"task": task, "attention": attention, "kernel": kernel})
            run_dir = out / f"{task}-{attention}-{kernel}-s{cfg.seed}"
            done = run_dir / "metrics.json"
            if done.is_file() and json.loads(done.read_text())["config"] == json.loads(
                    json.dumps(to_dict(cfg))):
                m = json.loads(done.read_text())
                log(f"[{task}/{attention}/{kernel}] reused {done}")
            else:
                m = run_one(cfg, run_dir, data_dir=data_dir, runtime=runtime, log=log)
            rows.append(_row(m))
            with open(out / "results.jsonl", "w", encoding="utf-8") as fh:
                for r in rows:
                    fh.write(json.dumps(r) + "\n")
            write_table(rows, out / "table.md")
    return rows


# ---------------------------------------------------------------------------- timing


@torch.no_grad()
def time_vs_length(
    encoder: str = "minilm",
    attentions: tuple[str, ...] = ("softmax", "favor", "porf_softplus"),
    lengths: tuple[int, ...] = (64, 128, 256, 512),
    *,
    batch_size: int = 8,
    n_features: int = 64,
    repeats: int = 3,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Median wall time of one eval forward pass of the encoder per (attention, length).

    Random token ids (batch ``batch_size``, no padding); lengths are capped by the
    checkpoint's ``max_position_embeddings``. Returns rows ``attention, length, batch_size,
    seconds, ms_per_sequence``.
    """
    repeats = check_positive("repeats", repeats, integer=True)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for attention in attentions:
        model = load_pretrained_encoder(encoder, attention, n_features, generator=seed)
        for length in lengths:
            if length > model.config.max_len:
                raise ValueError(f"length {length} exceeds the encoder's max_len "
                                 f"{model.config.max_len}")
            ids = torch.randint(1000, model.config.vocab_size, (batch_size, length),
                                generator=gen)
            mask = torch.ones_like(ids, dtype=torch.bool)
            model(ids, mask)  # warm-up
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                model(ids, mask)
                times.append(time.perf_counter() - t0)
            s = float(np.median(times))
            rows.append({"attention": attention, "length": length, "batch_size": batch_size,
                         "seconds": s, "ms_per_sequence": 1e3 * s / batch_size,
                         "threads": torch.get_num_threads()})
    return rows


def _plot_timing(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for att in dict.fromkeys(r["attention"] for r in rows):
        rs = [r for r in rows if r["attention"] == att]
        ax.plot([r["length"] for r in rs], [r["ms_per_sequence"] for r in rs], "o-", label=att)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("forward ms / sequence")
    ax.set_title("MiniLM-L6 encoder, CPU, eval forward")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------- CLI


def _config_from_args(args: argparse.Namespace, **base) -> MiniLMConfig:
    data: dict[str, Any] = {}
    if getattr(args, "config", None):
        path = Path(args.config)
        if not path.is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        data = json.loads(path.read_text())
    data.update({k: v for k, v in base.items() if v is not None})
    for key in ("encoder", "n_features", "seed", "max_length", "rows_per_sequence"):
        if getattr(args, key, None) is not None:
            data[key] = getattr(args, key)
    for key in ("train_limit", "eval_limit"):
        value = getattr(args, key, None)
        if value is not None:
            data[key] = None if value == 0 else value
    train = dict(data.get("train", {}))
    for flag, key in (("epochs", "epochs"), ("batch_size", "batch_size"), ("lr", "lr")):
        if getattr(args, flag, None) is not None:
            train[key] = getattr(args, flag)
    align = dict(data.get("align", {}))
    for flag, key in (("align_steps", "steps"), ("align_examples", "n_examples"),
                      ("lam", "lam")):
        if getattr(args, flag, None) is not None:
            align[key] = getattr(args, flag)
    data["train"] = override(_default_train(), train)
    data["align"] = override(_default_align(), align)
    return from_dict(MiniLMConfig, data)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--encoder", default=None, help="minilm (default) or a BERT checkpoint dir")
    p.add_argument("--data-dir", default=None,
                   help="data directory (default $COULOMB_DATA_DIR, else the shipped samples)")
    p.add_argument("--config", default=None, metavar="FILE.json",
                   help="JSON overrides of MiniLMConfig (unknown keys raise)")
    p.add_argument("--n-features", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-length", type=int, default=None)
    p.add_argument("--train-limit", type=int, default=None, help="0: the whole split")
    p.add_argument("--eval-limit", type=int, default=None, help="0: the whole split")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--align-steps", type=int, default=None)
    p.add_argument("--align-examples", type=int, default=None)
    p.add_argument("--lam", type=float, default=None)
    p.add_argument("--rows-per-sequence", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--progress", action="store_true", help="progress bars")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    one = sub.add_parser("run", help="one (task, attention, kernel) run")
    one.add_argument("--task", default="sst2", help=f"one of {', '.join(sorted(DATASETS))}")
    one.add_argument("--attention", default="favor",
                     help=f"one of {', '.join(sorted(ATTENTION_FEATURES))}")
    one.add_argument("--kernel", default="vanilla", help=f"one of {', '.join(KERNELS)}")
    one.add_argument("--out", default=None)
    _common(one)
    cmp_ = sub.add_parser("compare", help="every variant on every task + table.md")
    cmp_.add_argument("--tasks", nargs="+", default=["sst2", "rotten_tomatoes"])
    cmp_.add_argument("--variants", nargs="+", default=None, metavar="ATTENTION:KERNEL",
                      help="default: " + " ".join(f"{a}:{k}" for a, k in VARIANTS))
    cmp_.add_argument("--out", default="runs/minilm")
    _common(cmp_)
    tim = sub.add_parser("timing", help="encoder forward time versus sequence length")
    tim.add_argument("--encoder", default="minilm")
    tim.add_argument("--attentions", nargs="+", default=["softmax", "favor", "porf_softplus"])
    tim.add_argument("--lengths", nargs="+", type=int, default=[64, 128, 256, 512])
    tim.add_argument("--batch-size", type=int, default=8)
    tim.add_argument("--n-features", type=int, default=64)
    tim.add_argument("--repeats", type=int, default=3)
    tim.add_argument("--threads", type=int, default=None)
    tim.add_argument("--out", default="runs/minilm")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "threads", None) is not None:
        torch.set_num_threads(check_positive("--threads", args.threads, integer=True))
    action = getattr(args, "action", None)
    if action == "timing":
        rows = time_vs_length(args.encoder, tuple(args.attentions), tuple(args.lengths),
                              batch_size=args.batch_size, n_features=args.n_features,
                              repeats=args.repeats)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "timing.csv", "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        _plot_timing(rows, out / "timing.png")
        for r in rows:
            print(f"{r['attention']:>14} L={r['length']:4d}  {r['ms_per_sequence']:8.2f} ms/seq")
        print(f"-> {out / 'timing.csv'}, {out / 'timing.png'}")
        return 0
    runtime = Runtime(progress=bool(getattr(args, "progress", False)))
    if action == "run":
        cfg = _config_from_args(args, task=args.task, attention=args.attention,
                                kernel=args.kernel)
        out = args.out or f"runs/minilm/{cfg.task}-{cfg.attention}-{cfg.kernel}-s{cfg.seed}"
        m = run_one(cfg, out, data_dir=args.data_dir, runtime=runtime)
        print(json.dumps({k: round(m[k], 4) for k in (*_TABLE_KEYS, "mcc", "f1")}))
        return 0
    if action == "compare":
        variants = VARIANTS
        if args.variants:
            variants = []
            for v in args.variants:
                a, _, k = v.partition(":")
                variants.append((a, k or "vanilla"))
        cfg = _config_from_args(args)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        rows = compare(cfg, list(args.tasks), variants, out, data_dir=args.data_dir,
                       runtime=runtime)
        print(write_table(rows, out / "table.md"))
        return 0
    raise ValueError("choose an action: run, compare or timing")


def run_from_train_args(args: argparse.Namespace) -> int:
    """Entry for ``coulomb-attention train --encoder NAME ...`` (the train command's flags:
    task, attention, kernel, seed, out, data_dir, epochs, batch_size, lr, n_features,
    max_length, train_limit, eval_limit, align_steps, align_examples, lam, threads)."""
    if getattr(args, "threads", None) is not None:
        torch.set_num_threads(check_positive("--threads", args.threads, integer=True))
    cfg = _config_from_args(args, task=args.task, attention=args.attention, kernel=args.kernel,
                            encoder=args.encoder)
    out = args.out or f"runs/train/{cfg.task}-{cfg.encoder}-{cfg.attention}-{cfg.kernel}-" \
                      f"s{cfg.seed}"
    runtime = Runtime(progress=not getattr(args, "no_progress", False))
    m = run_one(cfg, out, data_dir=args.data_dir, runtime=runtime)
    keys = ("accuracy", "mcc", "f1", "ece", "log_loss", "brier")
    print(json.dumps({k: round(m[k], 4) for k in keys}))
    if not all(math.isfinite(m[k]) for k in keys):
        raise FloatingPointError("non-finite metrics")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coulomb_attention.commands.minilm",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ValueError, TypeError, FileNotFoundError, ImportError) as exc:
        print(f"minilm: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

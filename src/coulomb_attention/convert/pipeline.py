"""Convert a pretrained encoder to linear attention by distilling its attention into particles.

One conversion (:func:`convert_encoder`): load the encoder twice (the softmax teacher and the
student with ``feature_map`` and fresh per-head particles), distil the student's particles layer
by layer (:func:`coulomb_attention.train.distill.distill_attention`, a checkpoint of the
particles after every layer, so an interrupted run resumes), write the converted checkpoint
(``checkpoint/``: safetensors + config + vocabulary, loadable with
:func:`coulomb_attention.nn.pretrained.load_pretrained_encoder`), then measure

* fidelity without labels (:func:`embedding_fidelity`): cosine of the converted sentence
  embeddings (mean pooled, L2-normalised) to the teacher's on held-out sentences (mean, 5th
  percentile) and the Spearman correlation of teacher vs converted pairwise cosines;
* downstream at CPU cost (:func:`probe_metrics`): a logistic-regression probe on the frozen
  embeddings (SST-2, Rotten Tomatoes), accuracy / ECE / log-loss, next to the teacher's probe.

Result files: ``records.jsonl`` (per layer and head group: row KL / output MSE before and
after), ``result.json`` (config, fidelity, probes, times). Reports and plots are made from these
files by :mod:`coulomb_attention.reports.convert`.

Optional low-rank finishing (``ConvertConfig.finish``, :mod:`coulomb_attention.train.finish`):
after the kernel stage, LoRA adapters on the attention projections are trained on the
embedding objective and merged into a second checkpoint ``lowrank/checkpoint/``;
``result.json["lowrank"]`` holds its own fidelity and probes, apart from the pure-linear row
(``fidelity``, ``probe``: the particles-only conversion, ``checkpoint/``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._validation import check_choice, check_positive
from .nn.attention import ATTENTION_FEATURES
from .results import atomic_write_json, save_tensors
from .train.distill import (
    DistillConfig,
    WindowFitConfig,
    distill_attention,
    embedding_data,
    refine_encoder,
)
from .train.finish import FinishConfig, finish_lowrank

__all__ = [
    "ConvertConfig",
    "EVAL_FIELDS",
    "VARIANTS",
    "cached_conversion",
    "conversion_key",
    "config_of_result",
    "conversion_of_run",
    "convert_encoder",
    "document_fidelity",
    "embed",
    "embedding_fidelity",
    "evaluate_conversion",
    "evaluate_encoder",
    "held_out",
    "load_sentences",
    "position_cap",
    "probe_metrics",
    "read_sentence_file",
    "time_forward",
    "window_mass",
]

#: Variants of the comparison: how the particles are obtained.
VARIANTS = ("vanilla", "particles", "hedgehog", "softmax")


@dataclass(frozen=True)
class ConvertConfig:
    """One conversion.

    Attributes
    ----------
    encoder : str             ``minilm`` or a BERT checkpoint directory
    feature_map : str         the map the particles move in: ``favor``, ``softmax_feat``,
                              ``porf_softplus`` or ``hedgehog`` (Hedgehog's map
                              ``[softmax(A x), softmax(B x)]``: started tied, ``B = -A``, every
                              row of omega then a particle, untied); the maps with particles
                              of :data:`coulomb_attention.features.MAPS`
    n_features : int          particles per head
    seed : int                particles, sentence draws, Langevin noise
    variant : str             ``particles`` (distilled, the method), ``vanilla`` (fresh fixed
                              features), ``hedgehog`` (baseline), ``softmax`` (the teacher)
    distill : DistillConfig   the distillation (``n_examples`` + ``holdout`` sentences)
    tasks : tuple of str      registry tasks whose *training* text is distilled on (no labels)
    sentences_file : str      optional text file, one sentence per line, instead of ``tasks``
    max_length : int          tokens per sentence (with [CLS]/[SEP])
    eval_sentences : int      held-out sentences for the fidelity (evaluation splits)
    probe_tasks : tuple       tasks of the logistic-regression probe
    probe_train : int         training examples of the probe (0: whole split)
    probe_eval : int          evaluation examples (0: whole evaluation split)
    probe_c : float           inverse L2 strength of the probe
    batch_size : int          sentences per forward pass when embedding
    finish : FinishConfig or None  low-rank finishing after the kernel stage (``particles``
                              only; with ``finish.with_particles`` it replaces the joint
                              refinement: the particles move with the adapters)
    window : int              the sliding-window hybrid (LoLCATs eq. 7, ``KernelAttention.
                              set_window_``): softmax over the ``window/2`` tokens on each side
                              plus the particles' linear term over the rest, the window weight
                              per head learned in both stages (``window_fit``); even, at most
                              the model's positions; 0: pure linear (default)
    window_linear : bool      False: the window alone, no linear term (the ablation of the
                              linear branch; nothing to learn, the stages are skipped)
    window_fit : WindowFitConfig  how the window weights are learned
    doc_lengths : tuple of int  also measure the fidelity on held-out pseudo-documents of these
                              token lengths (:func:`document_fidelity`; at most the model's
                              positions); empty: none (default)
    doc_count : int           pseudo-documents per length (>= 3)
    doc_task : str            the task whose evaluation texts are concatenated
    """

    encoder: str = "minilm"
    feature_map: str = "hedgehog"
    n_features: int = 64
    seed: int = 0
    variant: str = "particles"
    distill: DistillConfig = field(default_factory=DistillConfig)
    tasks: tuple[str, ...] = ("sst2", "rotten_tomatoes", "qqp")
    sentences_file: str | None = None
    max_length: int = 64
    eval_sentences: int = 512
    probe_tasks: tuple[str, ...] = ("sst2", "rotten_tomatoes")
    probe_train: int = 2000
    probe_eval: int = 0
    probe_c: float = 1.0
    batch_size: int = 64
    finish: FinishConfig | None = None
    window: int = 0
    window_linear: bool = True
    window_fit: WindowFitConfig = field(default_factory=WindowFitConfig)
    doc_lengths: tuple[int, ...] = ()
    doc_count: int = 32
    doc_task: str = "rotten_tomatoes"

    def __post_init__(self) -> None:
        maps = [n for n, f in ATTENTION_FEATURES.items() if f.has_features]
        check_choice("feature_map", self.feature_map, maps)
        check_choice("variant", self.variant, VARIANTS)
        for name in ("n_features", "max_length", "eval_sentences", "batch_size"):
            check_positive(name, getattr(self, name), integer=True)
        for name in ("probe_train", "probe_eval"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        check_positive("probe_c", self.probe_c)
        if not isinstance(self.distill, DistillConfig):
            raise TypeError("distill must be a DistillConfig")
        object.__setattr__(self, "tasks", tuple(self.tasks))
        object.__setattr__(self, "probe_tasks", tuple(self.probe_tasks))
        if self.finish is not None:
            if not isinstance(self.finish, FinishConfig):
                raise TypeError("finish must be a FinishConfig or None")
            if self.variant != "particles":
                raise ValueError(f"low-rank finishing applies to the particles variant, not "
                                 f"{self.variant!r}")
        if self.variant == "hedgehog" and self.n_features % 2:
            raise ValueError(f"n_features must be even for the hedgehog baseline, got "
                             f"{self.n_features}")
        w = self.window
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ValueError(f"window must be an integer >= 0 (0: none), got {w!r}")
        if w % 2:
            raise ValueError(f"window must be even for an encoder (window/2 tokens on each "
                             f"side), got {w}")
        if not self.window_linear and not w:
            raise ValueError("window_linear=False (the window alone) needs a window > 0")
        if w and self.variant not in ("particles", "vanilla", "hedgehog"):
            raise ValueError(f"a window applies to a linear variant, not {self.variant!r}")
        if w and self.finish is not None:
            raise ValueError("a window and low-rank finishing are separate rows; pick one")
        if not isinstance(self.window_fit, WindowFitConfig):
            raise TypeError("window_fit must be a WindowFitConfig")
        if self.feature_map == "hedgehog" and self.n_features % 2:
            raise ValueError(f"n_features must be even for feature_map 'hedgehog', got "
                             f"{self.n_features}")
        object.__setattr__(self, "doc_lengths", tuple(self.doc_lengths))
        for n in self.doc_lengths:
            if isinstance(n, bool) or not isinstance(n, int) or n < 3:
                raise ValueError(f"doc_lengths must be integers >= 3, got {n!r}")
        if isinstance(self.doc_count, bool) or not isinstance(self.doc_count, int) or \
                self.doc_count < 3:  # Spearman of pairwise cosines needs 2 pairs or more
            raise ValueError(f"doc_count must be an integer >= 3, got {self.doc_count!r}")


# ---------------------------------------------------------------------------- data


def read_sentence_file(path: str | os.PathLike) -> list[str]:
    """Non-empty lines of a UTF-8 text file; an empty file raises ``ValueError``."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"sentence file {str(p)!r} does not exist")
    lines = [s.strip() for s in p.read_text(encoding="utf-8").splitlines()]
    lines = [s for s in lines if s]
    if not lines:
        raise ValueError(f"sentence file {str(p)!r} holds no sentences")
    return lines


def load_sentences(tasks: Sequence[str], split: str, data_dir, n: int, seed: int, *,
                   pairs: bool = False) -> list[str | tuple[str, str]]:
    """``n`` distinct sentences of ``tasks``' ``split`` (``"train"`` or ``"eval"``: each task's
    evaluation split), drawn at random with ``seed``. Each side of a pair counts as one
    sentence; with ``pairs`` a pair task's example stays one ``(a, b)`` tuple instead (encoded
    ``[CLS] a [SEP] b [SEP]``, so attention across the pair is seen)."""
    from .data import get_task, load_task

    out: list = []
    per = -(-n // max(len(tasks), 1))
    for i, task in enumerate(tasks):
        spec = get_task(task)
        name = spec.train_split if split == "train" else spec.eval_split
        ex = load_task(task, name, data_dir, limit=per, random_state=seed + 101 * i)
        for texts in ex.texts:
            if pairs and len(texts) == 2 and all(t.strip() for t in texts):
                out.append(tuple(texts))
            else:
                out.extend(t for t in texts if t.strip())
    seen, unique = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            unique.append(s)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(unique))[:n]
    if len(order) == 0:
        raise ValueError(f"no sentences in the {split} splits of {', '.join(tasks)}")
    return [unique[i] for i in order]


@torch.no_grad()
def embed(model, tokenizer, texts: Sequence, max_length: int = 64,
          batch_size: int = 64) -> torch.Tensor:
    """Sentence embeddings ``(n, D)`` (masked mean, L2-normalised) of ``texts`` (str or pairs).

    Texts are processed sorted by length (less padding); the result is in input order. Texts
    are truncated at ``max_length`` tokens or the model's positions, whichever is fewer."""
    max_length = position_cap(model, max_length)
    order = sorted(range(len(texts)), key=lambda i: len(str(texts[i])))
    out = [None] * len(texts)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        batch = [texts[i] if isinstance(texts[i], tuple) else (texts[i],) for i in idx]
        ids, mask = tokenizer.encode_batch(batch, max_length=max_length)[:2]
        t = max(int(mask.sum(1).max()), 1)
        e = model.sentence_embedding(ids[:, :t], mask[:, :t])
        for j, i in enumerate(idx):
            out[i] = e[j]
    return torch.stack(out).float()


def _rank(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(len(x), dtype=np.float64)
    return ranks  # ties are measure-zero for continuous cosines


def embedding_fidelity(teacher: torch.Tensor, student: torch.Tensor) -> dict[str, float]:
    """Agreement of two sets of L2-normalised embeddings ``(n, D)`` of the same sentences.

    Returns ``cos_mean``, ``cos_p5`` (5th percentile), ``cos_min`` of the per-sentence cosine,
    and ``spearman``: the rank correlation of the teacher's pairwise cosines with the
    converted ones over all ``n (n - 1) / 2`` sentence pairs.
    """
    if teacher.shape != student.shape or teacher.ndim != 2:
        raise ValueError(f"embeddings must have the same shape (n, D), got "
                         f"{tuple(teacher.shape)} and {tuple(student.shape)}")
    t, s = teacher.double(), student.double()
    cos = (torch.nn.functional.normalize(t, dim=1) * torch.nn.functional.normalize(s, dim=1)
           ).sum(1).numpy()
    iu = np.triu_indices(t.shape[0], k=1)
    pt, ps = (t @ t.T).numpy()[iu], (s @ s.T).numpy()[iu]
    rho = float(np.corrcoef(_rank(pt), _rank(ps))[0, 1]) if len(pt) > 1 else float("nan")
    return {"cos_mean": float(cos.mean()), "cos_p5": float(np.percentile(cos, 5)),
            "cos_min": float(cos.min()), "spearman": rho, "n": int(t.shape[0])}


@torch.no_grad()
def window_mass(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, window: int,
                batch_size: int = 8) -> list[float]:
    """Per layer, the share of a softmax model's attention mass inside the window (``|s - t| <=
    window / 2``, the hybrid's ``N(t)``; causal layers: the ``window`` most recent keys), mean
    over heads and real query rows. How much a window alone could carry."""
    from .nn.ops.window import window_masks
    from .train.capture import layer_inputs

    mask = attention_mask.bool()
    chunks = [(input_ids[i:i + batch_size], mask[i:i + batch_size])
              for i in range(0, len(input_ids), batch_size)]
    out = []
    for li, layer in enumerate(model.attention_layers):
        total, rows = 0.0, 0
        for (h, _), (_, m) in zip(layer_inputs(model, li, chunks), chunks, strict=True):
            logits = layer.queries(h).double() @ layer.keys(h).double().transpose(-1, -2)
            inside, rest = window_masks(h.shape[1], window, layer.causal)
            visible = m[:, None, None, :] & (inside | rest)[None, None]  # causal: s <= t
            p = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
            share = (p * inside[None, None]).sum(-1)  # (B, H, T)
            total += float((share * m[:, None, :]).sum())
            rows += int(m.sum()) * share.shape[1]
        out.append(total / rows)
    return out


def _check_doc_lengths(lengths, positions: int) -> None:
    too_long = [n for n in lengths if n > positions]
    if too_long:
        raise ValueError(f"pseudo-documents of {too_long} tokens exceed the model's {positions} "
                         "positions")


def document_fidelity(teacher, model, tokenizer, config: ConvertConfig, data_dir=None
                      ) -> dict[str, Any]:
    """The fidelity (:func:`embedding_fidelity`) on held-out pseudo-documents of every
    ``config.doc_lengths`` (:func:`coulomb_attention.data.documents.pseudo_documents` of
    ``config.doc_task``'s evaluation texts; seed ``20_000 + config.seed``) and, with a window,
    the teacher's attention mass inside it (:func:`window_mass`)."""
    from .data.documents import document_texts, pseudo_documents

    _check_doc_lengths(config.doc_lengths, int(teacher.config.max_len))
    texts = document_texts(config.doc_task, data_dir)
    out: dict[str, Any] = {"task": config.doc_task, "n": config.doc_count, "lengths": {}}
    for length in config.doc_lengths:
        ids, mask, info = pseudo_documents(tokenizer, texts, length, config.doc_count,
                                           20_000 + config.seed)
        bs = max(1, min(config.batch_size, 4096 // length))

        def emb(m, ids=ids, mask=mask, bs=bs):
            with torch.no_grad():
                return torch.cat([m.sentence_embedding(ids[i:i + bs], mask[i:i + bs])
                                  for i in range(0, len(ids), bs)]).float()

        row = {**embedding_fidelity(emb(teacher), emb(model)), **info}
        if config.window:
            per_layer = window_mass(teacher, ids, mask, config.window, bs)
            row["window_mass"] = {"per_layer": per_layer,
                                  "mean": sum(per_layer) / len(per_layer)}
        out["lengths"][str(length)] = row
    return out


def probe_features(emb: torch.Tensor, pair: bool) -> np.ndarray:
    """Probe inputs: the embedding, or for a pair ``[u, v, |u - v|, u * v]`` (emb (n, 2, D))."""
    if not pair:
        return emb.numpy()
    u, v = emb[:, 0], emb[:, 1]
    return torch.cat([u, v, (u - v).abs(), u * v], 1).numpy()


def probe_metrics(x_train: np.ndarray, y_train: np.ndarray, x_eval: np.ndarray,
                  y_eval: np.ndarray, c: float = 1.0) -> dict[str, float]:
    """Logistic-regression probe (L2, ``C=c``) on frozen features: accuracy, MCC, ECE (15
    bins), log-loss, Brier on the evaluation set (:mod:`coulomb_attention.metrics`)."""
    from sklearn.linear_model import LogisticRegression

    from .metrics import classification_metrics

    clf = LogisticRegression(C=c, max_iter=2000)
    clf.fit(x_train, y_train)
    return classification_metrics(clf.predict_proba(x_eval), y_eval)


def _task_embeddings(model, tok, task, split, data_dir, limit, seed, cfg):
    from .data import get_task, load_task

    spec = get_task(task)
    ex = load_task(task, split, data_dir, limit=limit or None, random_state=seed)
    if spec.is_pair:
        flat = [s for pair in ex.texts for s in pair]
        emb = embed(model, tok, flat, cfg.max_length, cfg.batch_size).view(len(ex), 2, -1)
    else:
        emb = embed(model, tok, [t[0] for t in ex.texts], cfg.max_length, cfg.batch_size)
    return probe_features(emb, spec.is_pair), ex.labels


def run_probes(model, tok, cfg: ConvertConfig, data_dir) -> dict[str, dict[str, float]]:
    """The probe of every ``cfg.probe_tasks`` task (train subset -> evaluation split)."""
    from .data import get_task

    out = {}
    for task in cfg.probe_tasks:
        spec = get_task(task)
        xt, yt = _task_embeddings(model, tok, task, spec.train_split, data_dir, cfg.probe_train,
                                  0, cfg)
        xe, ye = _task_embeddings(model, tok, task, spec.eval_split, data_dir, cfg.probe_eval,
                                  0, cfg)
        out[task] = {**probe_metrics(xt, yt, xe, ye, cfg.probe_c), "n_train": len(yt),
                     "n_eval": len(ye)}
    return out


# ---------------------------------------------------------------------------- conversion


def _save_progress(state_dir: Path, model, next_layer: int, records, gen_state,
                   config: dict | None = None, stages: dict | None = None) -> None:
    omegas = {f"layer{i}": layer.omega
              for i, layer in enumerate(model.attention_layers) if layer.has_features}
    omegas.update({f"window{i}": layer.window_logit
                   for i, layer in enumerate(model.attention_layers) if layer.window})
    save_tensors(state_dir / "omega.safetensors", omegas)
    save_tensors(state_dir / "generator.safetensors", {"state": gen_state})
    atomic_write_json(state_dir / "progress.json",  # last: it names a complete state
                      {"next_layer": next_layer, "records": records, "config": config,
                       **({"stages": stages} if stages else {})})


def _load_progress(state_dir: Path, model, config: dict | None = None) -> dict[str, Any] | None:
    if not (state_dir / "progress.json").is_file():
        return None
    from safetensors.torch import load_file

    prog = json.loads((state_dir / "progress.json").read_text())
    if config is not None and prog.get("config") != config:
        raise ValueError(f"{state_dir.parent} holds an unfinished conversion with another "
                         "configuration; use another --out or delete it")
    omegas = load_file(str(state_dir / "omega.safetensors"))
    for i, layer in enumerate(model.attention_layers):
        if f"layer{i}" in omegas:
            layer.load_features_(omegas[f"layer{i}"])
        if f"window{i}" in omegas and layer.window:
            with torch.no_grad():
                layer.window_logit.copy_(omegas[f"window{i}"])
    return {"next_layer": prog["next_layer"], "records": prog["records"],
            "generator_state": load_file(str(state_dir / "generator.safetensors"))["state"],
            "stages": prog.get("stages", {})}


def position_cap(model, max_length: int) -> int:
    """``max_length``, capped at the positions of ``model`` (a truncation length, never a
    reason to refuse: a model with fewer positions reads its first ones)."""
    return min(int(max_length), int(model.config.max_len))


def _encode_texts(tok, texts, max_length):
    ids, mask = tok.encode_batch([t if isinstance(t, tuple) else (t,) for t in texts],
                                 max_length=max_length)[:2]
    return ids, mask


def convert_encoder(
    config: ConvertConfig,
    out: str | os.PathLike,
    *,
    data_dir=None,
    progress: bool = False,
    log: Callable[[str], None] = print,
    evaluate: bool = True,
) -> dict[str, Any]:
    """Run one conversion into ``out`` (resuming a previous interrupted run there).

    Writes ``out/checkpoint/`` (the converted encoder; with ``variant="hedgehog"`` its layers
    name the baseline map, restored on loading), ``out/records.jsonl`` and ``out/result.json``;
    ``out/state/`` holds the per-layer progress while the run is unfinished. Returns the result.
    """
    from .nn.bert import check_vocabulary
    from .nn.pretrained import (
        load_pretrained_encoder,
        load_pretrained_tokenizer,
        read_bert_config,
        resolve_checkpoint_dir,
        save_pretrained_encoder,
    )

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    directory = resolve_checkpoint_dir(config.encoder)  # unknown encoder: one-line error
    bert = read_bert_config(directory)  # unsupported architecture: one-line error
    check_vocabulary(directory, int(bert["vocab_size"]))  # another model's tokenizer
    tok = load_pretrained_tokenizer(directory)
    teacher = load_pretrained_encoder(directory, "softmax")
    if config.variant == "softmax":
        model = teacher
    else:
        model = load_pretrained_encoder(directory, config.feature_map, config.n_features,
                                        share_features=False, generator=config.seed)
    # before the conversion, not after it
    _check_doc_lengths(config.doc_lengths, int(bert["max_position_embeddings"]))
    if config.window:
        if config.window > int(bert["max_position_embeddings"]):
            raise ValueError(f"window {config.window} is larger than the model's "
                             f"{bert['max_position_embeddings']} positions")
        for layer in model.attention_layers:
            layer.set_window_(config.window, linear=config.window_linear)
    finish_cfg = config.finish
    if finish_cfg is not None and finish_cfg.rank > model.config.dim:
        raise ValueError(f"LoRA rank must be at most the projections' width "
                         f"{model.config.dim}, got {finish_cfg.rank}")
    if config.sentences_file:
        sentences = read_sentence_file(config.sentences_file)
    else:
        dc = config.distill
        pool = max(dc.n_examples, dc.refine_examples if dc.refine_steps else 0)
        sentences = load_sentences(config.tasks, "train", data_dir, pool + dc.holdout,
                                   config.seed, pairs=dc.pairs)
    records: list[dict] = []
    refine: dict | None = None
    distill_s = 0.0
    stages: dict[str, Any] = {}  # finished stages after the layers (kernel, finish): resume
    data = None  # the end-to-end stages' batches, shared by the refinement and the finishing
    trains = config.variant in ("particles", "hedgehog") and config.window_linear
    if trains:
        ids, mask = _encode_texts(tok, sentences, position_cap(model, config.max_length))
        dcfg = config.distill
        if config.variant == "hedgehog":
            dcfg = dataclasses.replace(dcfg, method="hedgehog")
        state_dir = out / "state"
        stamp = _to_json(config)
        resume = (_load_progress(state_dir, model, stamp) if config.variant == "particles"
                  else None)
        stages = dict(resume["stages"]) if resume is not None else {}
        if resume is not None:
            log("resuming after the kernel stage" if "kernel" in stages
                else f"resuming at layer {resume['next_layer']}")
        if "kernel" in stages:
            records, refine = resume["records"], stages["kernel"]["refine"]
            distill_s = stages["kernel"]["distill_s"]
        else:
            t0 = time.perf_counter()
            gen = torch.Generator().manual_seed(config.seed)
            records = distill_attention(
                model, ids, mask, dcfg, generator=gen, progress=progress, resume=resume,
                window_fit=config.window_fit,
                on_layer_done=(lambda nl, rec, gs: _save_progress(state_dir, model, nl, rec, gs,
                                                                  stamp))
                if config.variant == "particles" else None)
            # time_s is the layer's time, on each of its head-group records
            distill_s = time.perf_counter() - t0 + (
                sum({r["layer"]: r["time_s"] for r in resume["records"]}.values()) if resume
                else 0.0)
            # with finish.with_particles the particles move with the adapters instead
            if dcfg.refine_steps and not (finish_cfg is not None and finish_cfg.with_particles):
                t0 = time.perf_counter()
                if finish_cfg is not None:
                    data = embedding_data(teacher, ids, mask, dcfg,
                                          torch.Generator().manual_seed(config.seed))
                refine = refine_encoder(model, teacher, ids, mask, dcfg,
                                        generator=torch.Generator().manual_seed(config.seed),
                                        progress=progress, data=data,
                                        window_fit=config.window_fit)
                distill_s += time.perf_counter() - t0
            if config.variant == "particles":
                stages["kernel"] = {"refine": refine, "distill_s": distill_s}
                _save_progress(state_dir, model, len(model.attention_layers), records,
                               gen.get_state(), stamp, stages)
    if config.variant in ("particles", "vanilla", "hedgehog"):
        save_pretrained_encoder(model, out / "checkpoint", vocab_from=directory,
                                extra={"variant": config.variant, "seed": config.seed,
                                       "distill": dataclasses.asdict(config.distill)
                                       if trains else None})
    finished, finish_rec = None, None
    if finish_cfg is not None:
        finished, finish_rec = _finish_stage(config, model, teacher, ids, mask, data, out,
                                             directory, stages, records, progress)
    with open(out / "records.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    result: dict[str, Any] = {"config": _to_json(config), "encoder_dir": str(directory),
                              "n_sentences": len(sentences), "distill_s": distill_s,
                              "refine": refine}
    if finish_rec is not None:
        result["lowrank"] = {"finish": finish_rec, "checkpoint": "lowrank/checkpoint",
                             "conversion_s": distill_s + finish_rec["time_s"]}
    if evaluate:
        t0 = time.perf_counter()
        held = held_out(teacher, tok, config, data_dir)
        result.update(evaluate_encoder(model, teacher, tok, config, data_dir, held=held))
        result["eval_s"] = time.perf_counter() - t0  # with the held-out sentences' time
        if finished is not None:  # its own row, never mixed with the pure-linear one
            result["lowrank"].update(evaluate_encoder(finished, teacher, tok, config, data_dir,
                                                      documents=False, held=held))
    result["total_s"] = time.perf_counter() - t_start
    atomic_write_json(out / "result.json", result)
    if (out / "state").is_dir():
        import shutil

        shutil.rmtree(out / "state")
    return result


#: the fields of ConvertConfig that only the evaluation reads (``convert --evaluate`` may
#: change them without converting again)
EVAL_FIELDS = ("eval_sentences", "probe_tasks", "probe_train", "probe_eval", "probe_c",
               "doc_lengths", "doc_count", "doc_task")


def held_out(teacher, tokenizer, config: ConvertConfig, data_dir=None
             ) -> tuple[list[str], torch.Tensor]:
    """``config.eval_sentences`` held-out sentences (evaluation splits, seed ``10_000 +
    config.seed``) and the teacher's embeddings of them."""
    held = load_sentences(("sst2", "rotten_tomatoes", "qqp") if config.sentences_file
                          else config.tasks, "eval", data_dir, config.eval_sentences,
                          10_000 + config.seed)
    return held, embed(teacher, tokenizer, held, config.max_length, config.batch_size)


def evaluate_encoder(model, teacher, tokenizer, config: ConvertConfig, data_dir=None, *,
                     documents: bool = True, held=None) -> dict[str, Any]:
    """``fidelity`` on the held-out sentences (:func:`held_out`; pass its result as ``held``
    to share it between rows), ``probe`` of ``config.probe_tasks``, with ``documents`` and
    ``config.doc_lengths`` the pseudo-documents' (:func:`document_fidelity`), and ``eval_s``."""
    t0 = time.perf_counter()
    sentences, target = held if held is not None else held_out(teacher, tokenizer, config,
                                                               data_dir)
    out: dict[str, Any] = {"fidelity": embedding_fidelity(
        target, embed(model, tokenizer, sentences, config.max_length, config.batch_size))}
    out["probe"] = run_probes(model, tokenizer, config, data_dir)
    if documents and config.doc_lengths:
        out["documents"] = document_fidelity(teacher, model, tokenizer, config, data_dir)
    out["eval_s"] = time.perf_counter() - t0
    return out


def config_of_result(saved: dict[str, Any]) -> ConvertConfig:
    """The :class:`ConvertConfig` of a ``result.json``'s ``config``."""
    from .config import from_dict

    data = dict(saved)
    finish = data.pop("finish", None)
    return dataclasses.replace(from_dict(ConvertConfig, data), finish=None if finish is None
                               else from_dict(FinishConfig, finish))


def evaluate_conversion(directory: str | os.PathLike, changes: dict[str, Any] | None = None, *,
                        data_dir=None) -> dict[str, Any]:
    """Measure a finished conversion again (its ``checkpoint/``; nothing is trained) with the
    evaluation fields :data:`EVAL_FIELDS` changed by ``changes``; the new ``fidelity``,
    ``probe``, ``documents`` and the ``evaluation`` settings replace the old ones in
    ``result.json`` (its ``config`` stays the conversion's: a cache still recognises it)."""
    from .nn.pretrained import load_pretrained_encoder, load_pretrained_tokenizer

    d = Path(directory)
    res = (json.loads((d / "result.json").read_text(encoding="utf-8"))
           if (d / "result.json").is_file() else {})
    if not res or (res["config"]["variant"] != "softmax"
                   and not (d / "checkpoint" / "config.json").is_file()):
        raise FileNotFoundError(f"{d} holds no finished conversion (result.json and "
                                "checkpoint/)")
    bad = sorted(set(changes or {}) - set(EVAL_FIELDS))
    if bad:
        raise ValueError(f"only the evaluation can change without converting again, not "
                         f"{', '.join(bad)}")
    config = dataclasses.replace(config_of_result(res["config"]), **(changes or {}))
    teacher = load_pretrained_encoder(res["encoder_dir"], "softmax")
    model = (teacher if config.variant == "softmax"
             else load_pretrained_encoder(d / "checkpoint"))
    tok = load_pretrained_tokenizer(res["encoder_dir"])
    for key in ("fidelity", "probe", "documents"):
        res.pop(key, None)
    res.update(evaluate_encoder(model, teacher, tok, config, data_dir))
    settings = json.loads(json.dumps(dataclasses.asdict(config), default=list))
    res["evaluation"] = {k: settings[k] for k in EVAL_FIELDS}
    atomic_write_json(d / "result.json", res)
    return res


def _finish_stage(config, model, teacher, ids, mask, data, out, directory, stages, records,
                  progress):
    """The low-rank finishing of a copy of the converted ``model`` into
    ``out/lowrank/checkpoint`` (reused when a resumed run already finished it)."""
    import copy

    from .nn.pretrained import load_pretrained_encoder, save_pretrained_encoder

    ckpt = out / "lowrank" / "checkpoint"
    if "finish" in stages and (ckpt / "config.json").is_file():
        return load_pretrained_encoder(ckpt), stages["finish"]
    finished = copy.deepcopy(model)
    rec = finish_lowrank(finished, teacher, ids, mask, config.distill, config.finish,
                         generator=torch.Generator().manual_seed(config.seed), data=data,
                         progress=progress)
    save_pretrained_encoder(finished, ckpt, vocab_from=directory,
                            extra={"variant": "particles+lowrank", "seed": config.seed,
                                   "distill": dataclasses.asdict(config.distill),
                                   "finish": _to_json(config.finish),
                                   "trained_params": rec["trained_params"]})
    stages["finish"] = rec
    gen = torch.Generator().manual_seed(config.seed)  # the state is not used after the layers
    _save_progress(out / "state", model, len(model.attention_layers), records, gen.get_state(),
                   _to_json(config), stages)
    return finished, rec


def _to_json(config) -> dict[str, Any]:
    d = dataclasses.asdict(config)
    if isinstance(config, ConvertConfig) and config.finish is None:
        d.pop("finish")  # configurations from before the finishing stage compare equal
    if isinstance(config, ConvertConfig) and not config.window:
        for key in ("window", "window_linear", "window_fit"):  # likewise the window's
            d.pop(key)
    if isinstance(config, ConvertConfig) and not config.distill.pairs:
        d["distill"].pop("pairs")  # and the pair sequences'
    if isinstance(config, ConvertConfig) and not config.doc_lengths:
        for key in ("doc_lengths", "doc_count", "doc_task"):  # and the pseudo-documents'
            d.pop(key)
    return json.loads(json.dumps(d, default=list))


# ---------------------------------------------------------------------------- speed


@torch.no_grad()
def time_forward(fn: Callable[[], Any], repeats: int = 3) -> float:
    """Median wall time (seconds) of ``fn()`` over ``repeats`` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def speed_table(model, teacher, lengths: Sequence[int], layer_lengths: Sequence[int], *,
                batch_size: int = 1, repeats: int = 3, seed: int = 0) -> list[dict[str, Any]]:
    """Forward time of the converted encoder and the softmax one (ms per sequence) for each
    ``lengths``, and of one attention layer alone (converted vs softmax) for ``layer_lengths``
    (beyond the position table; random inputs)."""
    from .nn.attention import KernelAttention

    gen = torch.Generator().manual_seed(seed)
    rows = []
    vocab = model.config.vocab_size
    for L in lengths:
        ids = torch.randint(1000, vocab, (batch_size, L), generator=gen)
        mask = torch.ones(batch_size, L, dtype=torch.bool)
        conv = time_forward(lambda ids=ids, mask=mask: model.encode(ids, mask), repeats)
        soft = time_forward(lambda ids=ids, mask=mask: teacher.encode(ids, mask), repeats)
        rows.append({"what": "encoder", "length": int(L), "converted_ms": 1e3 * conv / batch_size,
                     "softmax_ms": 1e3 * soft / batch_size})
    src: KernelAttention = model.attention_layers[0]
    ref: KernelAttention = teacher.attention_layers[0]
    for L in layer_lengths:
        x = torch.randn(batch_size, L, src.dim, generator=gen) * 0.5
        rows.append({"what": "layer", "length": int(L),
                     "converted_ms": 1e3 * time_forward(lambda x=x: src(x), repeats) / batch_size,
                     "softmax_ms": 1e3 * time_forward(lambda x=x: ref(x), repeats) / batch_size})
    return rows


# ---------------------------------------------------------------------------- phase A of a run


def conversion_of_run(run_config) -> ConvertConfig:
    """The conversion that is phase A of a pretrained-encoder run with the teacher objective.

    ``run_config`` (:class:`~coulomb_attention.train.run.RunConfig`) contributes the encoder,
    the map (``attention``), ``M`` (``model.n_features``), the seed and the distillation
    (``distill``; ``distill.method == "hedgehog"`` gives the Hedgehog baseline); everything
    else is :class:`ConvertConfig`'s default, so ``coulomb-attention convert`` with the same
    four choices makes the same checkpoint, and every task reuses it (the conversion
    distils on the unlabelled training text of ``ConvertConfig.tasks``, not on one task).
    """
    variant = "hedgehog" if run_config.distill.method == "hedgehog" else "particles"
    distill = run_config.distill
    if variant == "hedgehog":
        distill = dataclasses.replace(distill, method=DistillConfig().method)
    return ConvertConfig(encoder=run_config.encoder, feature_map=run_config.attention,
                         n_features=run_config.model.n_features, seed=run_config.seed,
                         variant=variant, distill=distill)


def conversion_key(config: ConvertConfig) -> str:
    """Directory name of ``config`` in a conversion cache: readable fields + a config hash."""
    import hashlib

    digest = hashlib.sha256(json.dumps(_to_json(config), sort_keys=True).encode()).hexdigest()
    encoder = Path(str(config.encoder).rstrip("/")).name or "encoder"
    return (f"{encoder}-{config.feature_map}-{config.variant}-M{config.n_features}"
            f"-s{config.seed}-{digest[:10]}")


def cached_conversion(config: ConvertConfig, cache_dir: str | os.PathLike, *, data_dir=None,
                      progress: bool = False, log: Callable[[str], None] = print) -> Path:
    """The directory of conversion ``config`` under ``cache_dir`` (``conversion_key``), made
    by :func:`convert_encoder` (without the fidelity/probe evaluation) if it is not there yet
    and reused otherwise; an interrupted conversion resumes. Returns the conversion directory
    (``checkpoint/``, ``records.jsonl``, ``result.json``)."""
    out = Path(cache_dir) / conversion_key(config)
    if (out / "result.json").is_file() and (out / "checkpoint" / "config.json").is_file():
        saved = json.loads((out / "result.json").read_text(encoding="utf-8"))
        if saved.get("config") != _to_json(config):  # a hash collision or an edited file
            raise ValueError(f"{out} holds another conversion; delete it")
        log(f"conversion reused: {out}")
        return out
    log(f"converting ({config.feature_map}, {config.variant}, M={config.n_features}, seed "
        f"{config.seed}) into {out}")
    convert_encoder(config, out, data_dir=data_dir, progress=progress, log=log, evaluate=False)
    return out

"""Convert a pretrained causal language model (the llama family) to linear attention.

The attention transfer is the encoder's (:func:`~coulomb_attention.convert.distill.
distill_attention`), layer by layer in order, each layer's inputs computed with the already
converted layers (so a layer is fitted on the converted model's own inputs): the particles of
each KV group move on the rotated queries and keys of the group's query heads, against the
teacher's causal softmax rows (row KL, plus the output MSE with ``output_weight``), and the
window weights of the hybrid by Adam with the particles held. Fitted on long documents: windows
of ``fit_length`` tokens cut from the long texts (:func:`coulomb_attention.data.long_texts`,
Shakespeare's train works by default, ``texts=`` for a user's own).

Rows (never mixed in one directory): pure linear (``window=0``: FAVOR+, Hedgehog's map,
softmax features), the hybrid (``window=W, sinks=S``: exact softmax over the first ``S`` and the
last ``W`` tokens, the particles' term for the rest, one denominator), fixed features
(``learned=False``: drawn, not fitted), the window and sinks alone (``linear=False``:
StreamingLLM). A conversion directory (:class:`~coulomb_attention.convert.artifact.Artifact`)
holds ``checkpoint/`` (a Hugging Face llama directory with the particles,
:func:`coulomb_attention.nn.families.llama.save_pretrained`), ``records.jsonl`` and
``result.json``; a killed run resumes at the next layer with the same particles. The
finishing (``finish_steps``) starts once the transfer row is written (``result.json`` with
``"finished": null``) and saves its resume point every :data:`FINISH_CHECKPOINT_EVERY` steps
(parameters, Adam's moments, the generator), so a killed finishing resumes to the same weights.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from .._validation import check_choice, check_positive
from ..nn.attention import ATTENTION_FEATURES
from .artifact import Artifact
from .distill import DistillConfig, WindowFitConfig, distill_attention
from .pipeline import _load_progress, _save_progress

__all__ = ["DecoderConfig", "convert_decoder", "finish_decoder", "load_converted"]

#: The maps a decoder is converted on (the attention maps with particles).
DECODER_MAPS = tuple(n for n, s in ATTENTION_FEATURES.items() if s.has_features)
#: the finishing's learning-rate schedules
FINISH_SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True)
class DecoderConfig:
    """One conversion of a causal language model.

    Attributes
    ----------
    model : str            ``smollm2`` (the packaged SmolLM2-135M-Instruct), a GGUF file or a
                           Hugging Face llama directory
    feature_map : str      ``hedgehog`` (default, Hedgehog's map, particles untied after a tied
                           start), ``favor``, ``softmax_feat``, ``porf_softplus``
    n_features : int       particles per KV group (M)
    window, sinks : int    the hybrid's exact window and sinks (``window=0``: pure linear)
    linear : bool          False: the window and sinks alone (StreamingLLM; nothing to fit)
    learned : bool         False: the drawn features, not fitted (the fixed row)
    method : str           ``langevin`` (the particles) or ``adam`` (the same parameters by
                           plain Adam: no noise, no repulsion; the ablation)
    fit_length : int       tokens per training document
    n_docs, holdout : int  training documents, held-out documents (row KL only)
    rows_per_sequence : int query rows sampled per document and step batch
    batch_size : int       documents per step
    steps : int            particle steps per layer
    output_weight : float  weight of the output MSE beside the row KL
    window_steps : int     Adam steps of the window weights per layer (hybrid)
    window_lr : float      their learning rate
    lam : float            Riesz repulsion strength (0: none)
    eta, eta_end : float   the particles' step size (cosine schedule)
    seed : int
    finish_steps : int     end-to-end finishing after the transfer (:func:`finish_decoder`:
                           particles, window weights and LoRA adapters by Adam on the teacher's
                           next-token distribution; 0: none); its own row in ``lowrank/``
    finish_lr : float      its learning rate (the peak, with ``finish_schedule="cosine"``)
    finish_length : int    tokens of the finishing documents (the first of each document)
    lora_rank : int        rank of the finishing's LoRA adapters on q/k/v/out (0: none)
    finish_docs : int      documents of the finishing: 0, the transfer's ``n_docs`` training
                           documents (cut in order from the first works); > 0, that many
                           windows of ``finish_length`` tokens spread round-robin over all
                           the training works (:func:`~coulomb_attention.data.token_documents`
                           with ``spread=True``)
    finish_schedule : str  ``constant`` or ``cosine`` (from ``finish_lr`` to 0 over the steps)
    finish_clip : float    the finishing's gradient-norm clip (0: none)
    """

    model: str = "smollm2"
    feature_map: str = "hedgehog"
    n_features: int = 64
    window: int = 64
    sinks: int = 4
    linear: bool = True
    learned: bool = True
    method: str = "langevin"
    fit_length: int = 1024
    n_docs: int = 16
    holdout: int = 4
    rows_per_sequence: int = 128
    batch_size: int = 4
    steps: int = 100
    output_weight: float = 1.0
    window_steps: int = 100
    window_lr: float = 0.05
    lam: float = 0.0
    eta: float = 3.0
    eta_end: float = 0.3
    seed: int = 0
    finish_steps: int = 0
    finish_lr: float = 0.01
    finish_length: int = 512
    lora_rank: int = 0
    finish_docs: int = 0
    finish_schedule: str = "constant"
    finish_clip: float = 0.0

    def __post_init__(self) -> None:
        check_choice("feature_map", self.feature_map, DECODER_MAPS)
        check_choice("method", self.method, ("langevin", "adam"))
        check_choice("finish_schedule", self.finish_schedule, FINISH_SCHEDULES)
        for name in ("n_features", "fit_length", "n_docs", "rows_per_sequence", "batch_size",
                     "steps"):
            check_positive(name, getattr(self, name), integer=True)
        for name in ("window", "sinks", "holdout", "window_steps", "seed", "finish_steps",
                     "lora_rank", "finish_docs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        if self.sinks and not self.window:
            raise ValueError("sinks need a window (--window W > 0)")
        if not self.linear and not self.window:
            raise ValueError("the window alone (no linear term) needs a window > 0")
        if self.fit_length < 2:
            raise ValueError(f"fit_length must be >= 2, got {self.fit_length}")
        for name in ("output_weight", "lam", "finish_clip"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("window_lr", "eta", "eta_end", "finish_lr"):
            check_positive(name, getattr(self, name))
        check_positive("finish_length", self.finish_length, integer=True)
        if (self.lora_rank or self.finish_steps) and not (self.linear and self.finish_steps):
            raise ValueError("finishing needs --finish-steps > 0 and a row with a linear term "
                             "(--lora-rank goes with --finish-steps)")
        if not self.finish_steps and (self.finish_docs or self.finish_clip
                                      or self.finish_schedule != "constant"):
            raise ValueError("--finish-docs, --finish-schedule and --finish-clip go with "
                             "--finish-steps")

    @property
    def row(self) -> str:
        """The row's name in tables: e.g. ``hybrid W=64 S=4 hedgehog learned (langevin)``."""
        if not self.linear:
            return f"streaming W={self.window} S={self.sinks}"
        kind = f"hybrid W={self.window} S={self.sinks}" if self.window else "linear"
        how = f"learned ({self.method})" if self.learned else "fixed"
        return f"{kind} {self.feature_map} M={self.n_features} {how}"

    def distill(self) -> DistillConfig:
        """The layer-wise distillation this conversion runs."""
        return DistillConfig(
            n_examples=self.n_docs, holdout=self.holdout, batch_size=self.batch_size,
            rows_per_sequence=self.rows_per_sequence, steps=self.steps, method=self.method,
            output_weight=self.output_weight, lam=self.lam, eta=self.eta,
            eta_end=self.eta_end, dtype="float32", refine_steps=0)


def _build(teacher, config: DecoderConfig):
    from ..nn.families.llama import convert_attention_

    student = copy.deepcopy(teacher)
    return convert_attention_(student, config.feature_map, config.n_features,
                              window=config.window, sinks=config.sinks, linear=config.linear,
                              generator=config.seed)


def convert_decoder(config: DecoderConfig, out: str | os.PathLike, *, data_dir=None,
                    texts: str | os.PathLike | None = None, progress: bool = True,
                    force: bool = False, log=print) -> dict[str, Any]:
    """Convert ``config.model`` into ``out`` (module docstring) and return ``result.json``.

    A finished directory is returned as it is (``force=True`` converts again); an unfinished
    one with the same configuration resumes at its next layer (another configuration raises).
    """
    from ..nn.families.llama import load, save_pretrained

    if not isinstance(config, DecoderConfig):
        raise TypeError(f"config must be a DecoderConfig, got {type(config).__name__}")
    art = Artifact(out)
    stamp = dataclasses.asdict(config)
    if art.is_finished() and not force:
        result = art.read_result()
        pending = bool(config.finish_steps) and not result.get("finished")
        if _stamp(result.get("config")) == stamp and not pending:
            log(f"{art.root} is already converted ({config.row}); --force converts again")
            return result
        same_transfer = _transfer(_stamp(result.get("config"))) == _transfer(stamp)
        if not (config.finish_steps and same_transfer):
            raise ValueError(f"{art.root} holds a finished conversion with another "
                             "configuration; use another --out or --force")
        # the same transfer, its finishing interrupted or another one asked: reuse the
        # transfer row, finish it
        log(f"{art.root}: reusing its transfer row; finishing it ({config.finish_steps} steps)")
        teacher, tok = load(config.model)
        student, _ = load(art.checkpoint)
        docs, _, texts_list = _documents(config, tok, data_dir, texts, log)
        result = {**result, "config": stamp,
                  "finished": _finish_stage(config, student, teacher, docs, tok, art, log,
                                            texts_list=texts_list)}
        art.write_result(result)
        return result
    if force:
        art.clear_state()
    art.root.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    teacher, tok = load(config.model)
    positions = teacher.config.max_positions
    if config.fit_length > positions:
        raise ValueError(f"fit_length {config.fit_length} exceeds the model's {positions} "
                         "positions")
    if config.window and config.window + config.sinks >= config.fit_length:
        raise ValueError(f"window + sinks = {config.window + config.sinks} leave no key to the "
                         f"linear term in documents of {config.fit_length} tokens")
    student = _build(teacher, config)
    docs, source, texts_list = _documents(config, tok, data_dir, texts, log)
    records: list[dict] = []
    t_fit = time.perf_counter()
    if config.learned and config.linear:
        generator = torch.Generator().manual_seed(config.seed)
        resume = _load_progress(art, student, stamp)
        if resume is not None:
            log(f"resuming at layer {resume['next_layer']}")
        mask = torch.ones_like(docs, dtype=torch.bool)
        records = distill_attention(
            student, docs, mask, config.distill(), generator=generator, progress=progress,
            on_layer_done=lambda nl, rec, gs: _save_progress(art, student, nl, rec, gs, stamp),
            resume=resume,
            window_fit=WindowFitConfig(steps=config.window_steps, lr=config.window_lr,
                                       refine_steps=0))
    fit_s = time.perf_counter() - t_fit
    save_pretrained(student, art.checkpoint, tokenizer=tok)
    art.write_records(records)
    kl = [(r["kl_before"], r["kl_after"], r.get("holdout_kl_after")) for r in records]
    result = {
        "config": stamp, "row": config.row, "data": source,
        "fit_documents": int(min(docs.shape[0], config.n_docs)),
        "holdout_documents": int(max(docs.shape[0] - config.n_docs, 0)),
        "row_kl_before": _mean([k[0] for k in kl]), "row_kl_after": _mean([k[1] for k in kl]),
        "holdout_row_kl_after": _mean([k[2] for k in kl]),
        "finished": None,
        "time_s": {"fit": fit_s, "total": time.perf_counter() - t_start},
        "threads": torch.get_num_threads(),
    }
    # the transfer row is complete: written before the finishing, which resumes from it
    art.write_result(result)
    art.clear_state()
    if config.finish_steps:
        result["finished"] = _finish_stage(config, student, teacher, docs, tok, art, log,
                                           texts_list=texts_list)
        result["time_s"]["total"] = time.perf_counter() - t_start
        art.write_result(result)
    return result


@contextmanager
def _trainable_window_logits(model):
    """Within the block the hybrid layers' window logits are parameters (buffers again on
    exit, holding the trained values)."""
    layers = [a for a in model.attention_layers if a.window and a.window_linear]
    for a in layers:
        a.window_logit = torch.nn.Parameter(a._buffers.pop("window_logit").detach().clone())
    try:
        yield [a.window_logit for a in layers]
    finally:
        for a in layers:
            w = a._parameters.pop("window_logit").detach().clone()
            a.register_buffer("window_logit", w)


def finish_decoder(student, teacher, docs: torch.Tensor, *, steps: int, lr: float,
                   lora_rank: int = 0, batch_size: int = 1, seed: int = 0,
                   schedule: str = "constant", clip: float = 0.0,
                   resume: dict[str, Any] | None = None,
                   on_checkpoint: Callable[[dict[str, Any]], None] | None = None,
                   every: int = 10, log=print) -> list[dict[str, Any]]:
    """Finish a converted decoder end to end: the particles, the window weights and, with
    ``lora_rank > 0``, LoRA adapters on q/k/v/out (merged at the end) trained by Adam on the
    KL divergence of the student's next-token distribution from the teacher's, over every
    position of the documents ``docs`` (n, T). ``schedule``: ``constant`` or ``cosine``
    (``lr`` at the first step, 0 after the last); ``clip`` > 0 clips the gradient's norm.
    Returns one record per step ``{step, kl, lr, grad_norm}`` (the norm before clipping).

    Every ``every`` steps (and after the last) ``on_checkpoint`` receives the resume point
    ``{step, records, tensors, generator_state}`` (``step``: the next step; ``tensors``: the
    trained parameters ``param{i}`` and Adam's state ``adam{i}.{key}``); passing it back as
    ``resume`` (to the same student and configuration) continues to the same weights as an
    uninterrupted run."""
    from ..nn.attention import trainable_omega
    from ..nn.lora import add_lora_, lora_parameters, merge_lora_

    check_positive("steps", steps, integer=True)
    check_positive("lr", lr)
    check_choice("schedule", schedule, FINISH_SCHEDULES)
    if not clip >= 0:
        raise ValueError(f"clip must be >= 0, got {clip!r}")
    g = torch.Generator().manual_seed(seed)
    teacher.eval()
    student.train(False)  # no dropout in these models; eval keeps the ops' inference paths
    if lora_rank:
        add_lora_(student, lora_rank, generator=g)
    else:
        student.requires_grad_(False)
    records = []
    with trainable_omega(student) as layers, _trainable_window_logits(student) as logits:
        params = [a.omega for a in layers] + logits
        if lora_rank:
            params += lora_parameters(student)
        opt = torch.optim.Adam(params, lr=lr)
        start = 0
        if resume is not None:
            start = _restore_finishing(resume, params, opt, g, steps)
            records = list(resume["records"])
            log(f"  resuming the finishing at step {start + 1}/{steps}")
        t0 = time.perf_counter()
        for step in range(start, steps):
            idx = torch.randint(0, docs.shape[0], (batch_size,), generator=g)
            ids = docs[idx]
            with torch.no_grad():
                target = torch.log_softmax(teacher(ids), -1)
            out = torch.log_softmax(student(ids), -1)
            kl = (target.exp() * (target - out)).sum(-1).mean()
            opt.zero_grad()
            kl.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, clip if clip else float("inf"))
            rate = finish_rate(lr, step, steps, schedule)
            for group in opt.param_groups:
                group["lr"] = rate
            opt.step()
            records.append({"step": step, "kl": kl.item(), "lr": rate,
                            "grad_norm": norm.item()})
            if step % 10 == 0 or step == steps - 1:
                log(f"  finish step {step + 1}/{steps}: next-token KL {kl.item():.4f} "
                    f"({time.perf_counter() - t0:.0f} s)")
            if on_checkpoint is not None and ((step + 1) % every == 0 or step == steps - 1):
                on_checkpoint(_finishing_snapshot(step + 1, records, params, opt, g))
    if lora_rank:
        merge_lora_(student)
    student.requires_grad_(False)
    return records


def finish_rate(lr: float, step: int, steps: int, schedule: str) -> float:
    """The finishing's learning rate at ``step`` (0-based) of ``steps``: ``lr`` throughout
    (``constant``) or ``lr * (1 + cos(pi * step / steps)) / 2`` (``cosine``)."""
    if schedule == "constant":
        return lr
    check_choice("schedule", schedule, FINISH_SCHEDULES)
    return lr * 0.5 * (1.0 + math.cos(math.pi * step / steps))


def _finishing_snapshot(next_step: int, records, params, opt, g) -> dict[str, Any]:
    """The finishing's resume point (copies: later steps do not change it)."""
    tensors = {f"param{i}": p.detach().clone() for i, p in enumerate(params)}
    for i, state in opt.state_dict()["state"].items():
        for key, value in state.items():
            tensors[f"adam{i}.{key}"] = torch.as_tensor(value).detach().clone().reshape(-1)
    return {"step": next_step, "records": [dict(r) for r in records], "tensors": tensors,
            "generator_state": g.get_state()}


def _restore_finishing(resume: dict[str, Any], params, opt, g, steps: int) -> int:
    """Load a :func:`_finishing_snapshot` into the parameters, Adam and the generator;
    returns the next step. A snapshot of other parameters raises."""
    tensors = resume["tensors"]
    n_saved = sum(1 for k in tensors if k.startswith("param"))
    if n_saved != len(params) or not 0 < int(resume["step"]) <= steps:
        raise ValueError(f"the finishing's resume point does not match this run ({n_saved} "
                         f"saved parameters, {len(params)} here; step {resume['step']} of "
                         f"{steps})")
    with torch.no_grad():
        for i, p in enumerate(params):
            saved = tensors[f"param{i}"]
            if saved.shape != p.shape:
                raise ValueError(f"the finishing's resume point holds param{i} of shape "
                                 f"{tuple(saved.shape)}, this run {tuple(p.shape)}")
            p.copy_(saved)
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        if name.startswith("adam"):
            index, key = name[4:].split(".", 1)
            shape = () if key == "step" else params[int(index)].shape
            state.setdefault(int(index), {})[key] = value.reshape(shape).clone()
    sd = opt.state_dict()
    opt.load_state_dict({"state": state, "param_groups": sd["param_groups"]})
    g.set_state(resume["generator_state"])
    return int(resume["step"])


#: the fields of the finishing stage (the transfer before it does not depend on them)
FINISH_FIELDS = ("finish_steps", "finish_lr", "finish_length", "lora_rank", "finish_docs",
                 "finish_schedule", "finish_clip")
#: steps between the finishing's resume points
FINISH_CHECKPOINT_EVERY = 10


def _stamp(saved: dict | None) -> dict:
    """A saved configuration with the fields added since it was written at their defaults
    (what those runs did), so that it compares equal to the same configuration now."""
    return {**{f.name: f.default for f in dataclasses.fields(DecoderConfig)}, **(saved or {})}


def _transfer(stamp: dict) -> dict:
    return {k: v for k, v in stamp.items() if k not in FINISH_FIELDS}


def _documents(config: DecoderConfig, tok, data_dir, texts, log):
    """The training and held-out documents ``(n, fit_length)``, their source, and the
    training texts (read once: the finishing's spread documents cut them again)."""
    from ..data import long_texts, token_documents

    texts_list, source = long_texts("train", data_dir, texts)
    if source.startswith("sample:"):
        log("WARNING: fitting on the small shipped sample of long texts (smoke test only); "
            "pass --data-dir (e.g. ../shared/data) or --texts for a real conversion")
    n = config.n_docs + config.holdout
    docs = token_documents(tok, texts_list, config.fit_length, n=n)
    if docs.shape[0] < n:
        log(f"note: {docs.shape[0]} documents of {config.fit_length} tokens available, "
            f"{n} asked for")
    return docs, source, texts_list


def _finishing_documents(config: DecoderConfig, tok, docs, texts_list, log):
    """The finishing's documents: the training documents' first ``finish_length`` tokens, or
    with ``finish_docs`` that many windows spread over all the training texts."""
    from ..data import token_documents

    if not config.finish_docs:
        return docs[:config.n_docs, :config.finish_length]
    fdocs = token_documents(tok, texts_list, config.finish_length, n=config.finish_docs,
                            spread=True)
    log(f"finishing on {fdocs.shape[0]} documents of {config.finish_length} tokens spread "
        f"over {len(texts_list)} works")
    return fdocs


def _finish_stage(config, student, teacher, docs, tok, art: Artifact, log, *,
                  texts_list=()) -> dict:
    """The finishing (its own row in ``lowrank/``; the transfer row stays in
    ``checkpoint/``), on :func:`_finishing_documents`."""
    from ..nn.families.llama import save_pretrained

    t0 = time.perf_counter()
    stamp = dataclasses.asdict(config)
    fdocs = _finishing_documents(config, tok, docs, texts_list, log)
    trace = finish_decoder(student, teacher, fdocs, steps=config.finish_steps,
                           lr=config.finish_lr, lora_rank=config.lora_rank,
                           schedule=config.finish_schedule, clip=config.finish_clip,
                           seed=config.seed, resume=_load_finishing(art, stamp, log),
                           on_checkpoint=lambda snap: _save_finishing(art, stamp, snap),
                           every=FINISH_CHECKPOINT_EVERY, log=log)
    save_pretrained(student, art.lowrank_checkpoint, tokenizer=tok)
    art.clear_state()
    tail = trace[-min(10, len(trace)):]
    return {"checkpoint": Artifact.relative_lowrank_checkpoint(), "kl_first": trace[0]["kl"],
            "kl_last10": sum(r["kl"] for r in tail) / len(tail),
            "time_s": time.perf_counter() - t0, "lora_rank": config.lora_rank,
            "documents": int(fdocs.shape[0]), "trace": trace}


def _save_finishing(art: Artifact, stamp: dict, snap: dict[str, Any]) -> None:
    art.save_state(snap["tensors"], snap["generator_state"],
                   {"stage": "finish", "config": stamp, "next_step": snap["step"],
                    "records": snap["records"]})


def _load_finishing(art: Artifact, stamp: dict, log) -> dict[str, Any] | None:
    """The finishing's resume point in ``art`` (None: start the finishing afresh). A
    finishing of another configuration raises; a stale transfer state is dropped."""
    saved = art.load_state()
    if saved is None:
        return None
    progress, tensors, generator_state = saved
    if progress.get("stage") != "finish":
        log(f"{art.state}: dropping a stale transfer resume point (the transfer row is "
            "already written)")
        art.clear_state()
        return None
    if _stamp(progress.get("config")) != stamp:
        raise ValueError(f"{art.root} holds an unfinished finishing with another "
                         "configuration; use another --out or delete its state/")
    return {"step": progress["next_step"], "records": progress["records"],
            "tensors": tensors, "generator_state": generator_state}


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def load_converted(directory: str | os.PathLike):
    """``(model, tokenizer)`` of a decoder conversion directory (its ``checkpoint/``) or of a
    model directory / GGUF file / ``smollm2``."""
    from ..nn.families.llama import load

    art = Artifact(directory)
    if art.checkpoint_complete():
        return load(art.checkpoint)
    return load(directory)

"""One associative-recall run: warm-up, token-level phase A (learned kernels), phase B, eval.

The stages mirror the Transformer classifier (docs/transformer.md): ``warmup_epochs`` of
cross-entropy with the fixed random features, then (``kernel="learned"`` only) phase A on the
attention layers that have particles, then ``train.epochs`` of cross-entropy with the
particles frozen. Both kernels get the same number of cross-entropy epochs and schedules;
for a given seed they share the data, the initial weights and the initial particles.

Cross-entropy runs in the library's one loop, :func:`coulomb_attention.train.loop.fit`: the
model's logits are handed to it channel-first, ``(B, vocab, T)``, with targets ``(B, T)``
(``IGNORE`` off the query positions), which ``cross_entropy`` reads as a token-level loss.

Phase A (token level). For the last attention layer (the retrieval layer; earlier layers,
if any, keep their features), with ``h`` its input (the capture hook
:func:`~coulomb_attention.convert.capture.layer_inputs`), ``q = layer.queries(h)`` at the query
positions and ``k = layer.keys(h)`` at every position: the data term is
:class:`~coulomb_attention.energy.token_pair.TokenPairAlignment` with the retrieval positions
of the generator as target (which key each query must read), the pairs restricted to
``s <= t`` (causal). ``H = -A + lam W_{N,s}`` (:class:`~coulomb_attention.energy.Hamiltonian`)
moves the particles by :func:`~coulomb_attention.dynamics.learn_particles` (one cached
mini-batch of sequences per step, cosine step size, ball of radius ``radius sqrt(d_head)``,
drift normalised to an RMS of ``eta`` per particle: the token-pair alignment's gradient is
small and its scale varies with the warm-up),
exactly the settings object of the sequence-level phase A (:class:`~.phases.AlignConfig`).

The teacher route (``init="teacher"``, :mod:`.recall_teacher`): instead of the warm-up, a
softmax model of the same architecture is trained (``teacher_train``; cached per seed as
safetensors under ``teacher_dir``) and its weights are copied into the student, which keeps
its own omega; ``kernel="learned"`` then fits omega to the rows of ``objective``
(``teacher``, ``teacher_query``, ``indicator``; ``fit``), ``kernel="vanilla"`` keeps the
draw (the fair fixed baseline: same teacher, same fine-tuning); phase B as above.
"""

from __future__ import annotations

import hashlib
import json
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._validation import check_choice, check_positive
from ..config import to_dict
from ..convert.capture import layer_inputs
from ..convert.driver import langevin_setup, run_phase_a
from ..data.mqar import IGNORE, MQARConfig, MQARData, make_mqar
from ..dynamics import cycle, learn_particles
from ..energy import Hamiltonian
from ..energy.token_pair import TokenPairAlignment, token_pair_stats
from ..nn.attention import ATTENTION_FEATURES, trainable_omega
from ..nn.recall import RecallModel, RecallModelConfig
from .loop import Runtime, TrainConfig, fit
from .phases import AlignConfig
from .recall_levels import RECALL_LEVELS
from .recall_teacher import (
    OBJECTIVES,
    RecallFitConfig,
    fit_recall_omega,
    load_teacher_weights_,
    omega_diagnostics,
)

__all__ = ["INITS", "KERNELS", "RECALL_LEVELS", "RECALL_OBJECTIVES", "RecallRunConfig",
           "evaluate_recall", "recall_phase_a", "run_recall", "train_teacher"]

KERNELS = ("vanilla", "learned")
INITS = ("warmup", "teacher")
RECALL_OBJECTIVES = ("token_pair", *OBJECTIVES)

def _recall_train_default() -> TrainConfig:
    return TrainConfig(epochs=8, batch_size=64, lr=3e-3, weight_decay=0.1, warmup_fraction=0.1,
                       schedule="cosine", length_grouping=0)


def _recall_teacher_default() -> TrainConfig:
    return replace(_recall_train_default(), epochs=6, lr=6e-3)


def _recall_align_default() -> AlignConfig:
    return AlignConfig(n_examples=1024, holdout=512, batch_size=128, steps=100, eta=0.05,
                       eta_end=0.005, lam=0.5)


@dataclass(frozen=True)
class RecallRunConfig:
    """One recall run (stored with its result row).

    Attributes
    ----------
    task : MQARConfig            the difficulty
    model : RecallModelConfig    (``attention``, ``n_features`` are the variant)
    train : TrainConfig          phase-B cross-entropy (``epochs``)
    align : AlignConfig          token-level phase A (``kernel="learned"``)
    kernel : str                 vanilla or learned
    seed : int                   data, initial weights, particles, data order, Langevin noise
    n_train, n_eval : int        training / evaluation sequences (the eval set does not depend
                                 on the seed)
    warmup_epochs : int          cross-entropy epochs before phase A (both kernels;
                                 ``init="warmup"`` only)
    init : str                   warmup (fixed-feature warm-up) or teacher (weights of a
                                 trained softmax model of the same architecture)
    objective : str              phase A's target: token_pair (``align``) or, with
                                 ``fit``, teacher / teacher_query / indicator
                                 (:mod:`.recall_teacher`; teacher rows need ``init="teacher"``)
    fit : RecallFitConfig        omega fit of the non-token-pair objectives
    teacher_train : TrainConfig  the softmax teacher's training (``init="teacher"``)
    tune_omega : bool            phase B trains omega of every kernel layer too, by the same
                                 cross-entropy (:func:`~coulomb_attention.nn.trainable_omega`):
                                 the end-to-end ablation, an upper reference for what M
                                 features of the map reach at this budget (default False:
                                 omega frozen, the method's phase B)
    omega_lr_scale : float       with ``tune_omega``: omega's learning rate in phase B, as a
                                 multiple of ``train.lr`` (default 1)
    """

    task: MQARConfig = field(default_factory=MQARConfig)
    model: RecallModelConfig = field(default_factory=RecallModelConfig)
    train: TrainConfig = field(default_factory=_recall_train_default)
    align: AlignConfig = field(default_factory=_recall_align_default)
    kernel: str = "vanilla"
    seed: int = 0
    n_train: int = 20000
    n_eval: int = 2000
    warmup_epochs: int = 2
    init: str = "warmup"
    objective: str = "token_pair"
    fit: RecallFitConfig = field(default_factory=RecallFitConfig)
    teacher_train: TrainConfig = field(default_factory=_recall_teacher_default)
    tune_omega: bool = False
    omega_lr_scale: float = 1.0

    def __post_init__(self) -> None:
        check_choice("kernel", self.kernel, KERNELS)
        check_choice("init", self.init, INITS)
        check_choice("objective", self.objective, RECALL_OBJECTIVES)
        if self.objective in ("teacher", "teacher_query") and self.init != "teacher":
            raise ValueError(f"objective {self.objective!r} fits the teacher's rows: it needs "
                             "init='teacher'")
        if self.fit.method in ("hedgehog", "weighted") and self.objective == "token_pair":
            raise ValueError(f"fit.method {self.fit.method!r} needs a row objective (teacher, "
                             "teacher_query, indicator), not token_pair")
        if not isinstance(self.tune_omega, bool):
            raise TypeError(f"tune_omega must be a bool, got {type(self.tune_omega).__name__}")
        if self.tune_omega and not ATTENTION_FEATURES[self.model.attention].has_features:
            with_particles = [k for k, v in ATTENTION_FEATURES.items() if v.has_features]
            raise ValueError(f"tune_omega needs a map with particles {with_particles}, got "
                             f"attention={self.model.attention!r}")
        check_positive("omega_lr_scale", self.omega_lr_scale)
        if self.omega_lr_scale != 1.0 and not self.tune_omega:
            raise ValueError(f"omega_lr_scale={self.omega_lr_scale} needs tune_omega=True "
                             "(omega is frozen in phase B otherwise)")
        for name in ("n_train", "n_eval", "warmup_epochs"):
            check_positive(name, getattr(self, name), integer=True)
        if self.model.vocab_size < self.task.vocab_size:
            raise ValueError(f"model.vocab_size={self.model.vocab_size} < task.vocab_size="
                             f"{self.task.vocab_size}")
        if self.model.max_len < self.task.seq_len:
            raise ValueError(f"model.max_len={self.model.max_len} < task.seq_len="
                             f"{self.task.seq_len}")
        if self.kernel == "learned" and self.model.attention in ("softmax", "elu", "none"):
            raise ValueError(f"attention {self.model.attention!r} has no particles to learn; "
                             "use kernel='vanilla'")


class _ChannelFirst(nn.Module):
    """``(ids, mask) -> logits (B, vocab, T)``: token-level cross-entropy inside ``fit``."""

    def __init__(self, model: RecallModel) -> None:
        super().__init__()
        self.model = model

    @property
    def attention_layers(self):
        return self.model.attention_layers

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(ids, mask).transpose(1, 2)


@torch.no_grad()
def evaluate_recall(model: RecallModel, data: MQARData, batch_size: int = 256) -> dict[str, float]:
    """Exact-match accuracy over the queried positions (argmax over the whole vocabulary) and
    the fraction of sequences with every query right."""
    was = model.training
    model.eval()
    right = total = seq_right = 0
    for i in range(0, len(data), batch_size):
        ids, tgt = data.inputs[i:i + batch_size], data.targets[i:i + batch_size]
        pred = model(ids, torch.ones_like(ids, dtype=torch.bool)).argmax(-1)  # (B, T)
        q = tgt != IGNORE
        ok = (pred == tgt) & q
        right += int(ok.sum())
        total += int(q.sum())
        seq_right += int((ok.sum(1) == q.sum(1)).sum())
    model.train(was)
    return {"accuracy": right / max(total, 1), "sequence_accuracy": seq_right / len(data)}


def _pair_batches(model: nn.Module, layer_index: int, data: MQARData, batch_size: int):
    """Token-pair batches of layer ``layer_index``: ``((q (B, H, Q, dh), k (B, H, T, dh),
    valid (B, Q, T)), target (B, Q, T))`` with the generator's retrieval positions."""
    layer = model.attention_layers[layer_index]
    chunks = [(data.inputs[i:i + batch_size], data.retrieve[i:i + batch_size])
              for i in range(0, len(data), batch_size)]
    pairs = ((ids, torch.ones_like(ids, dtype=torch.bool)) for ids, _ in chunks)
    out = []
    for (h, _), (_, ret) in zip(layer_inputs(model, layer_index, pairs), chunks, strict=True):
        with torch.no_grad():
            q, k = layer.queries(h).float(), layer.keys(h).float()  # (B, H, T, dh)
        B, T = ret.shape
        pos = (ret >= 0).nonzero()[:, 1].view(B, -1)  # (B, Q) query positions, in order
        tgt_pos = ret.gather(1, pos)  # (B, Q)
        q_rows = q.gather(2, pos[:, None, :, None].expand(-1, q.shape[1], -1, q.shape[3]))
        s = torch.arange(T)
        valid = s[None, None, :] <= pos[:, :, None]  # (B, Q, T)
        target = (s[None, None, :] == tgt_pos[:, :, None]).float()
        out.append(((q_rows.contiguous(), k.contiguous(), valid), target))
    return out


def _alignment(feature, omega, batches, center) -> float:
    with torch.no_grad():
        st = sum(token_pair_stats(feature, omega, x, y, center) for x, y in batches)
    return float(st[0] / (st[1] * st[2]).sqrt())


def recall_phase_a(model: nn.Module, fit_data: MQARData, hold_data: MQARData,
                   config: AlignConfig, generator: torch.Generator) -> list[dict[str, Any]]:
    """Token-level phase A on the last attention layer (module doc); updates its ``omega``.

    Returns one record per head group: alignment before/after on the fitted and held-out
    sequences, first/last energy, boundary fraction, relative omega shift, time.
    """
    li = len(model.attention_layers) - 1
    layer = model.attention_layers[li]
    if not layer.has_features:
        return []

    def fit_layer(li: int) -> list[dict[str, Any]]:
        fit_b = _pair_batches(model, li, fit_data, config.batch_size)
        hold_b = _pair_batches(model, li, hold_data, config.batch_size)
        omega_all = layer.omega.detach().float().clone()  # (G, M, dh)
        G, _, dh = omega_all.shape
        heads_per = layer.heads // G
        records = []
        for g in range(G):
            hs = slice(g * heads_per, (g + 1) * heads_per)
            fb = [((q[:, hs], k[:, hs], v), y) for (q, k, v), y in fit_b]
            hb = [((q[:, hs], k[:, hs], v), y) for (q, k, v), y in hold_b]
            potential, projection, sched = langevin_setup(config, dh)
            ham = Hamiltonian(TokenPairAlignment(layer.feature, center=config.center), potential,
                              lam=config.lam)
            om0 = omega_all[g].clone()
            rec = {"layer": li, "heads": [hs.start, hs.stop],
                   "train_before": _alignment(layer.feature, om0, fb, config.center),
                   "holdout_before": _alignment(layer.feature, om0, hb, config.center)}
            order = torch.randperm(len(fb), generator=generator).tolist()
            run = learn_particles(ham, om0, sched, cycle(fb, order), projection=projection,
                                  generator=generator, normalize_drift=True)
            omega_all[g] = run.omega
            rec.update({
                "train_after": _alignment(layer.feature, run.omega, fb, config.center),
                "holdout_after": _alignment(layer.feature, run.omega, hb, config.center),
                "energy_first": run.trace[0]["energy"], "energy_last": run.trace[-1]["energy"],
                "boundary_fraction": run.trace[-1]["boundary_fraction"],
                "omega_shift": float((run.omega - om0).norm() / om0.norm()),
            })
            records.append(rec)
        layer.load_features_(omega_all.to(layer.omega.dtype))
        return records

    return run_phase_a([li], fit_layer)


def _new_model(model_config: RecallModelConfig, seed: int) -> RecallModel:
    """The run's initial model: weights from torch's generator seeded ``seed`` (in
    ``fork_rng``), particles from a generator seeded ``seed + 1``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return RecallModel(model_config, generator=torch.Generator().manual_seed(seed + 1))


def _teacher_key(config: RecallRunConfig) -> dict[str, Any]:
    """Everything the teacher of ``config`` depends on (its cache key; the softmax model has
    no particles, so ``n_features`` is not part of it)."""
    return {"task": to_dict(config.task),
            "model": to_dict(replace(config.model, attention="softmax", n_features=1)),
            "train": to_dict(config.teacher_train), "seed": int(config.seed),
            "n_train": config.n_train}


def train_teacher(config: RecallRunConfig, train_data: MQARData, eval_data: MQARData,
                  teacher_dir: str | Path | None = None, progress: bool = False
                  ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The softmax teacher of ``config``: the same architecture with ``attention="softmax"``,
    the same initial weights as the student (seed), trained ``teacher_train`` on
    ``train_data``. With ``teacher_dir`` it is cached there (``teacher-<key>.safetensors`` +
    ``.json``: key, accuracy) and reused by every run with the same key (map, M, kernel and
    objective are not part of it).

    Returns ``(state_dict, info)`` with ``info = {"accuracy", "time_s", "cached", "path"}``.
    """
    from safetensors.torch import load_file

    from ..results import atomic_write_json, save_tensors

    key = _teacher_key(config)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = None if teacher_dir is None else \
        Path(teacher_dir) / f"teacher-seed{config.seed}-{digest}.safetensors"
    if path is not None and path.is_file() and path.with_suffix(".json").is_file():
        meta = json.loads(path.with_suffix(".json").read_text())
        if meta.get("key") == key:
            return load_file(str(path)), {"accuracy": meta["accuracy"], "time_s": 0.0,
                                          "cached": True, "path": str(path)}
    t0 = time.perf_counter()
    teacher = _new_model(replace(config.model, attention="softmax"), int(config.seed))
    fit(_ChannelFirst(teacher), train_data, config.teacher_train, seed=int(config.seed),
        runtime=Runtime(progress=progress), desc="teacher")
    acc = evaluate_recall(teacher, eval_data)["accuracy"]
    state = {k: v.detach().clone().contiguous() for k, v in teacher.state_dict().items()}
    info = {"accuracy": acc, "time_s": time.perf_counter() - t0, "cached": False,
            "path": None if path is None else str(path)}
    if path is not None:
        save_tensors(path, state)
        atomic_write_json(path.with_suffix(".json"), {"key": key, "accuracy": acc,
                                                      "time_s": info["time_s"]})
    return state, info


def run_recall(config: RecallRunConfig, progress: bool = False,
               teacher_dir: str | Path | None = None) -> dict[str, Any]:
    """Train and evaluate one recall model; returns the result row (JSON-ready, with the
    resolved ``config``). ``teacher_dir``: where the softmax teachers of ``init="teacher"``
    are cached (None: trained anew every run)."""
    if not isinstance(config, RecallRunConfig):
        raise TypeError(f"config must be a RecallRunConfig, got {type(config).__name__}")
    t_start = time.perf_counter()
    seed = int(config.seed)
    gen = torch.Generator().manual_seed(seed)
    train_data = make_mqar(config.task, config.n_train, gen)
    routed = config.init == "teacher" or config.objective != "token_pair"
    hold_n = config.fit.holdout if routed else (config.align.holdout or 1)
    hold_data = make_mqar(config.task, hold_n, gen)
    eval_data = make_mqar(config.task, config.n_eval, torch.Generator().manual_seed(10**6))
    model = _new_model(config.model, seed)
    net = _ChannelFirst(model)
    runtime = Runtime(progress=progress)
    t0 = time.perf_counter()
    history: list = []
    extra: dict[str, Any] = {}
    if config.init == "teacher":
        state, tinfo = train_teacher(config, train_data, eval_data, teacher_dir, progress)
        load_teacher_weights_(model, state)
        extra["teacher"] = tinfo
        extra["teacher_accuracy"] = tinfo["accuracy"]
        start_eval = evaluate_recall(model, eval_data)  # the swap, before any fit or tuning
        extra["swap_accuracy"] = start_eval["accuracy"]
    else:
        warm = fit(net, train_data, replace(config.train, epochs=config.warmup_epochs),
                   seed=seed, runtime=runtime, desc="warm-up")
        history += warm.history
        start_eval = evaluate_recall(model, eval_data)
    t_warm = time.perf_counter() - t0
    align: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    if config.kernel == "learned":
        n_fit = min(config.fit.n_examples if routed else config.align.n_examples,
                    config.n_train)
        fit_subset = MQARData(*(t[:n_fit] for t in (train_data.inputs, train_data.targets,
                                                    train_data.retrieve)))
        if config.objective == "token_pair":
            align = recall_phase_a(net, fit_subset, hold_data, config.align,
                                   torch.Generator().manual_seed(seed + 2))
        else:
            align = [fit_recall_omega(net, fit_subset, hold_data, config.objective, config.fit,
                                      torch.Generator().manual_seed(seed + 2))]
            extra["fit_accuracy"] = evaluate_recall(model, eval_data)["accuracy"]
    t_a = time.perf_counter() - t0
    t0 = time.perf_counter()
    with trainable_omega(model) if config.tune_omega else nullcontext():
        tune = fit(net, train_data, config.train, seed=seed + 3, runtime=runtime,
                   desc="phase B", omega_lr_scale=config.omega_lr_scale)
    history += tune.history
    t_b = time.perf_counter() - t0
    metrics = evaluate_recall(model, eval_data)
    route = None  # the token-pair path (rows as before the teacher route existed)
    if config.init == "teacher" or config.objective != "token_pair":
        route = config.init + ("" if config.kernel == "vanilla" else
                               f"+{config.objective}" + ("" if config.objective == "token_pair"
                                                         else f"+{config.fit.method}"))
    return {
        "attention": config.model.attention,
        "kernel": config.kernel,
        "route": route,
        "n_features": config.model.n_features,
        "seed": seed,
        "accuracy": metrics["accuracy"],
        "sequence_accuracy": metrics["sequence_accuracy"],
        "chance": config.task.chance,
        "warmup_accuracy": start_eval["accuracy"],
        "alignment": align,
        "history": history,
        "timings": {"warmup_s": t_warm, "phase_a_s": t_a, "phase_b_s": t_b,
                    "total_s": time.perf_counter() - t_start},
        **extra,
        "diagnostics": omega_diagnostics(model, hold_data),
        "config": to_dict(config),
    }

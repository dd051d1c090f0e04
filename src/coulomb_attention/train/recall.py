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
:func:`~coulomb_attention.train.capture.layer_inputs`), ``q = layer.queries(h)`` at the query
positions and ``k = layer.keys(h)`` at every position: the data term is
:class:`~coulomb_attention.energy.token_pair.TokenPairAlignment` with the retrieval positions
of the generator as target (which key each query must read), the pairs restricted to
``s <= t`` (causal). ``H = -A + lam W_{N,s}`` (:class:`~coulomb_attention.energy.Hamiltonian`)
moves the particles by :func:`~coulomb_attention.dynamics.learn_particles` (one cached
mini-batch of sequences per step, cosine step size, ball of radius ``radius sqrt(d_head)``,
drift normalised to an RMS of ``eta`` per particle: the token-pair alignment's gradient is
small and its scale varies with the warm-up),
exactly the settings object of the sequence-level phase A (:class:`~.phases.AlignConfig`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from .._validation import check_choice, check_positive
from ..config import to_dict
from ..data.mqar import IGNORE, MQARConfig, MQARData, make_mqar
from ..dynamics import cycle, learn_particles
from ..energy import Hamiltonian
from ..energy.token_pair import TokenPairAlignment, token_pair_stats
from ..nn.recall import RecallModel, RecallModelConfig
from .capture import layer_inputs
from .loop import Runtime, TrainConfig, fit
from .phases import AlignConfig, langevin_setup

__all__ = ["KERNELS", "RecallRunConfig", "evaluate_recall", "recall_phase_a", "run_recall"]

KERNELS = ("vanilla", "learned")


def _recall_train_default() -> TrainConfig:
    return TrainConfig(epochs=8, batch_size=64, lr=3e-3, weight_decay=0.1, warmup_fraction=0.1,
                       schedule="cosine", length_grouping=0)


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
    warmup_epochs : int          cross-entropy epochs before phase A (both kernels)
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

    def __post_init__(self) -> None:
        check_choice("kernel", self.kernel, KERNELS)
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
    t0 = time.perf_counter()
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
    for r in records:
        r["time_s"] = time.perf_counter() - t0
    return records


def run_recall(config: RecallRunConfig, progress: bool = False) -> dict[str, Any]:
    """Train and evaluate one recall model; returns the result row (JSON-ready, with the
    resolved ``config``)."""
    if not isinstance(config, RecallRunConfig):
        raise TypeError(f"config must be a RecallRunConfig, got {type(config).__name__}")
    t_start = time.perf_counter()
    seed = int(config.seed)
    gen = torch.Generator().manual_seed(seed)
    train_data = make_mqar(config.task, config.n_train, gen)
    hold_data = make_mqar(config.task, config.align.holdout or 1, gen)
    eval_data = make_mqar(config.task, config.n_eval, torch.Generator().manual_seed(10**6))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = RecallModel(config.model, generator=torch.Generator().manual_seed(seed + 1))
    net = _ChannelFirst(model)
    runtime = Runtime(progress=progress)
    t0 = time.perf_counter()
    warm = fit(net, train_data, replace(config.train, epochs=config.warmup_epochs), seed=seed,
               runtime=runtime, desc="warm-up")
    warm_eval = evaluate_recall(model, eval_data)
    t_warm = time.perf_counter() - t0
    align: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    if config.kernel == "learned":
        n_fit = min(config.align.n_examples, config.n_train)
        fit_subset = MQARData(*(t[:n_fit] for t in (train_data.inputs, train_data.targets,
                                                    train_data.retrieve)))
        align = recall_phase_a(net, fit_subset, hold_data, config.align,
                               torch.Generator().manual_seed(seed + 2))
    t_a = time.perf_counter() - t0
    t0 = time.perf_counter()
    tune = fit(net, train_data, config.train, seed=seed + 3, runtime=runtime, desc="phase B")
    t_b = time.perf_counter() - t0
    metrics = evaluate_recall(model, eval_data)
    return {
        "attention": config.model.attention,
        "kernel": config.kernel,
        "n_features": config.model.n_features,
        "seed": seed,
        "accuracy": metrics["accuracy"],
        "sequence_accuracy": metrics["sequence_accuracy"],
        "chance": config.task.chance,
        "warmup_accuracy": warm_eval["accuracy"],
        "alignment": align,
        "history": warm.history + tune.history,
        "timings": {"warmup_s": t_warm, "phase_a_s": t_a, "phase_b_s": t_b,
                    "total_s": time.perf_counter() - t_start},
        "config": to_dict(config),
    }

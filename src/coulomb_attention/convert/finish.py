"""Low-rank finishing of a converted encoder (a practical stage, not the method).

The conversion proper (:mod:`coulomb_attention.convert.distill`) learns only the particles; at
M = 64 FAVOR+ features per head on MiniLM it stops near an embedding cosine of 0.96 to the
teacher. As LoLCATs (Zhang et al. 2024) does after its attention transfer, this stage also
learns low-rank adapters (:mod:`coulomb_attention.nn.lora`) on the query, key, value and output
projections of every attention layer, on the same end-to-end objective as the joint refinement
(:class:`~coulomb_attention.energy.EmbeddingTeacher`'s data term)

    L(A, B [, Omega]) = mean over sentences of 1 - cos(e(x; A, B, Omega), e_teacher(x))

with the same sentences and batches (:func:`~coulomb_attention.convert.distill.embedding_data`:
the layer-wise fit sentences and further ones up to ``refine_examples``, never the held-out
ones), and merges the adapters into the weights. The result has the original size and class;
what it learned beyond the kernel (``trained_params``) is reported with it, always as its own
row next to the pure-linear conversion.

One 384-vector per sentence is a thin signal (the adapters fit the training batches far
better than held-out sentences), so an objective (:data:`OBJECTIVES`) may add an auxiliary
term that matches hidden states token by token (``mask`` the padding, ``w = aux_weight``):

    "embedding":  L = mean 1 - cos(e, e_teacher)                   (the refinement's term)
    "tokens":     L + w nmse(h_L, h_L_teacher)                     (the last hidden states)
    "layers":     L + w mean_l nmse(h_l, h_l_teacher)              (every block's output, as
                                                                    TinyBERT / LoLCATs match them)

    nmse(h, t) = sum over real tokens |h - t|^2 / sum over real tokens |t|^2

(:func:`hidden_state_loss`); the teacher's hidden states of the training batches are computed
once, without gradients (:func:`teacher_states`).

Optimiser: Adam, cosine learning rate ``lr -> lr / 10`` over ``steps``; with
``with_particles`` the particles of all layers move in the same loop (Adam, ``particle_lr``,
projected on the distillation's ball of radius ``radius * sqrt(d_head)``) instead of being
frozen at the values of the kernel stage.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._validation import check_positive
from ..dynamics import cycle
from ..nn.lora import (
    ALL_TARGETS,
    LORA_TARGETS,
    add_lora_,
    count_lora_parameters,
    lora_parameters,
    merge_lora_,
)
from ..progress import Ticker
from .distill import DistillConfig, _ParticlesOf, embedding_data

__all__ = ["OBJECTIVES", "FinishConfig", "finish_lowrank", "finish_loss", "hidden_state_loss",
           "teacher_states"]


def _no_states(model: nn.Module) -> list[nn.Module]:
    return []


def _last_states(model: nn.Module) -> list[nn.Module]:
    final = getattr(model, "final_norm", None)
    return [final if final is not None else model.blocks[-1]]


def _block_states(model: nn.Module) -> list[nn.Module]:
    return list(model.blocks)


#: objective -> the modules whose outputs ``(B, T, D)`` are matched to the teacher's
#: (``model -> list``; none: the sentence embedding alone)
OBJECTIVES: dict[str, Callable[[nn.Module], list[nn.Module]]] = {
    "embedding": _no_states, "tokens": _last_states, "layers": _block_states}


@dataclass(frozen=True)
class FinishConfig:
    """Low-rank finishing.

    Attributes
    ----------
    rank : int              adapter rank (>= 1; at most the projections' width)
    alpha : float or None   LoRA scaling numerator (scaling ``alpha / rank``; default
                            ``2 rank``, as LoLCATs)
    steps : int             optimiser steps (one batch of ``DistillConfig.batch_size``
                            sentences each)
    lr : float              Adam learning rate of the adapters (cosine to a tenth)
    with_particles : bool   move the particles in the same loop
    particle_lr : float     Adam learning rate of the particles (cosine to a tenth)
    targets : tuple of str  adapted maps (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``;
                            also ``fc1``, ``fc2`` of the feed-forward blocks)
    objective : str         a key of :data:`OBJECTIVES`
    aux_weight : float      weight of the hidden-state term (``tokens``, ``layers``)
    """

    rank: int = 8
    alpha: float | None = None
    steps: int = 200
    lr: float = 2e-3
    with_particles: bool = False
    particle_lr: float = 3e-3
    targets: tuple[str, ...] = LORA_TARGETS
    objective: str = "embedding"
    aux_weight: float = 1.0

    def __post_init__(self) -> None:
        check_positive("rank", self.rank, integer=True)
        check_positive("steps", self.steps, integer=True)
        check_positive("lr", self.lr)
        check_positive("particle_lr", self.particle_lr)
        check_positive("aux_weight", self.aux_weight)
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got "
                             f"{self.objective!r}")
        if self.alpha is not None:
            check_positive("alpha", self.alpha)
        if not isinstance(self.with_particles, bool):
            raise TypeError(f"with_particles must be a bool, got {self.with_particles!r}")
        targets = tuple(self.targets)
        bad = [t for t in targets if t not in ALL_TARGETS]
        if not targets or bad or len(set(targets)) != len(targets):
            raise ValueError(f"targets must be distinct names among {', '.join(ALL_TARGETS)}, "
                             f"got {targets!r}")
        object.__setattr__(self, "targets", targets)


@contextmanager
def _capturing(modules: Sequence[nn.Module]):
    """Collect the outputs of ``modules`` (in forward order) while the block runs."""
    got: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: got.append(out)) for m in modules]
    try:
        yield got
    finally:
        for h in hooks:
            h.remove()


def hidden_state_loss(student: Sequence[torch.Tensor], teacher: Sequence[torch.Tensor],
                      mask: torch.Tensor) -> torch.Tensor:
    """Mean over layers of the normalised squared error of the real tokens' hidden states.

    Parameters
    ----------
    student, teacher : sequences of (B, T, D), one per matched layer
    mask : (B, T) bool, True at real tokens (padding does not count)

    Returns
    -------
    scalar: ``mean_l sum_{b,t real} |s - t|^2 / sum_{b,t real} |t|^2`` (0 when equal)
    """
    if len(student) != len(teacher) or not student:
        raise ValueError(f"hidden_state_loss needs as many student as teacher layers (>= 1), "
                         f"got {len(student)} and {len(teacher)}")
    w = mask.to(student[0].dtype).unsqueeze(-1)  # (B, T, 1)
    terms = [((s - t.to(s)).square() * w).sum() / (t.to(s).square() * w).sum().clamp_min(1e-30)
             for s, t in zip(student, teacher, strict=True)]
    return torch.stack(terms).mean()


@torch.no_grad()
def teacher_states(teacher: nn.Module, objective: str, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor) -> list[torch.Tensor]:
    """The teacher's hidden states that ``objective`` matches: a list of (B, T, D) (empty for
    ``embedding``)."""
    modules = OBJECTIVES[objective](teacher)
    if not modules:
        return []
    with _capturing(modules) as got:
        teacher.sentence_embedding(input_ids, attention_mask)
    return [t.detach() for t in got]


def finish_loss(model: nn.Module, objective: str, inputs: tuple[torch.Tensor, torch.Tensor],
                target: torch.Tensor, states: Sequence[torch.Tensor], aux_weight: float = 1.0,
                embed: Callable | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The finishing objective of one batch.

    Parameters
    ----------
    model : the student (its modules named by ``OBJECTIVES[objective]`` are watched)
    objective : str                 a key of :data:`OBJECTIVES`
    inputs : (ids (B, T), mask (B, T))
    target : (B, D)                 the teacher's sentence embeddings
    states : list of (B, T, D)      :func:`teacher_states` of the same batch
    aux_weight : float              weight of the hidden-state term
    embed : ``inputs -> (B, D)``    how the student embeds (default
                                    ``model.sentence_embedding``; the particles' swap)

    Returns
    -------
    (loss, aux): ``mean 1 - cos + aux_weight * aux`` and the hidden-state term (None for
    ``embedding``)
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    embed = embed if embed is not None else (lambda inp: model.sentence_embedding(*inp))
    with _capturing(OBJECTIVES[objective](model)) as got:
        e = embed(inputs)
    loss = (1 - nn.functional.cosine_similarity(e, target.to(e), dim=-1)).mean()
    if not got:
        return loss, None
    aux = hidden_state_loss(got, states, inputs[1])
    return loss + aux_weight * aux, aux


@torch.no_grad()
def _mean_cos(embed, batches) -> float | None:
    if not batches:
        return None
    total, n = 0.0, 0
    for inputs, target in batches:
        e = embed(inputs)
        total += float(nn.functional.cosine_similarity(e, target.to(e), dim=-1).double().sum())
        n += e.shape[0]
    return total / n


def finish_lowrank(
    model: nn.Module,
    teacher: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    distill: DistillConfig,
    config: FinishConfig,
    *,
    generator: torch.Generator,
    data: dict[str, Any] | None = None,
    merge: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """Train low-rank adapters (and optionally the particles) of a converted ``model`` in place
    so its sentence embeddings match ``teacher``'s, then merge them (``merge=False``: leave
    the :class:`~coulomb_attention.nn.lora.LoRALinear` modules in, e.g. to save them first).

    Parameters
    ----------
    model : converted encoder (``attention_layers`` with particles, ``sentence_embedding``)
    teacher : the softmax encoder (its embeddings; its hidden states for ``tokens``/``layers``)
    input_ids, attention_mask : (n, T) the conversion's sequences
    distill : DistillConfig     the split and batches (``n_examples``, ``holdout``,
                                ``refine_examples``, ``batch_size``, ``radius``)
    config : FinishConfig
    generator : torch.Generator  seeded as the distillation's: draws the split first (the
                                 distillation's), then the adapters' ``A`` and the batch order
    data : optional result of :func:`~coulomb_attention.convert.distill.embedding_data` with the
        same split (skips the teacher's forward passes); the split is still drawn

    Returns
    -------
    dict: ``stage`` "finish", ``rank``, ``alpha``, ``targets``, ``objective``, ``aux_weight``,
    ``aux_first``/``aux_last`` (the hidden-state term on training batches), ``with_particles``,
    ``trained_params`` (adapters, + particles when they move), ``adapter_params``,
    ``cos_before``/``cos_after`` (layer-wise fit sentences), ``holdout_cos_before``/``_after``,
    ``loss_first``/``loss_last`` (training batches), ``n_train``, ``steps``, ``time_s``.
    """
    if not isinstance(distill, DistillConfig):
        raise TypeError(f"distill must be a DistillConfig, got {type(distill).__name__}")
    if not isinstance(config, FinishConfig):
        raise TypeError(f"config must be a FinishConfig, got {type(config).__name__}")
    layers = [layer for layer in model.attention_layers if layer.has_features]
    if config.with_particles and not layers:
        raise ValueError("with_particles needs attention layers with particles")
    t0 = time.perf_counter()
    if data is None:
        data = embedding_data(teacher, input_ids, attention_mask, distill, generator)
    else:
        from .distill import split_examples

        split_examples(input_ids.shape[0], distill, generator)  # the same draw as above
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    alpha = 2.0 * config.rank if config.alpha is None else float(config.alpha)
    was_training = model.training
    model.eval()
    add_lora_(model, config.rank, alpha=alpha, targets=config.targets,
              generator=torch.Generator().manual_seed(seed))
    n_adapter = count_lora_parameters(model)
    groups = [{"params": lora_parameters(model), "lr": config.lr}]
    omega = None
    if config.with_particles:
        omega = torch.cat([layer.omega.detach() for layer in layers]).clone().float()
        omega.requires_grad_(True)  # (L G, M, dh)
        groups.append({"params": [omega], "lr": config.particle_lr})
        swap = _ParticlesOf(model, layers)
        radius = distill.radius * math.sqrt(omega.shape[-1])

        def embed(inputs):
            return swap(omega, inputs)
    else:
        def embed(inputs):
            return model.sentence_embedding(*inputs)

    before = (_mean_cos(embed, data["fit"]), _mean_cos(embed, data["holdout"]))
    opt = torch.optim.Adam(groups)
    steps = config.steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: 0.1 + 0.45 * (1 + math.cos(math.pi * min(k, steps) / steps)))
    order = torch.randperm(len(data["train"]), generator=generator).tolist()
    # the teacher's hidden states of every training batch, once (none for "embedding")
    states = [teacher_states(teacher, config.objective, *inputs) for inputs, _ in data["train"]]
    stream = cycle(list(zip(data["train"], states, strict=True)), order)
    losses, aux_losses = [], []
    tick = Ticker(f"finish (rank {config.rank})", total=steps, enabled=progress)  # every 30 s
    for k in range(steps):
        (inputs, target), state = next(stream)
        loss, aux = finish_loss(model, config.objective, inputs, target, state,
                                config.aux_weight, embed)
        if not bool(torch.isfinite(loss)):
            raise FloatingPointError(f"low-rank finishing diverged at step {k} (loss {loss}); "
                                     "lower the learning rate")
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if omega is not None:
            with torch.no_grad():  # the distillation's ball
                norm = omega.norm(dim=-1, keepdim=True).clamp_min(1e-30)
                omega.mul_((radius / norm).clamp(max=1.0))
        losses.append(float(loss.detach()))
        if aux is not None:
            aux_losses.append(float(aux.detach()))
        if progress and (k + 1) % max(1, steps // 10) == 0:
            print(f"  finish step {k + 1}/{steps}: loss {losses[-1]:.5f}", flush=True)
        else:
            tick.update(k + 1, loss=losses[-1])
    if omega is not None:
        G = layers[0].omega.shape[0]
        for j, layer in enumerate(layers):
            layer.load_features_(omega.detach()[j * G:(j + 1) * G].to(layer.omega.dtype))

        def embed(inputs):
            return model.sentence_embedding(*inputs)

    after = (_mean_cos(embed, data["fit"]), _mean_cos(embed, data["holdout"]))
    for p in lora_parameters(model):
        p.requires_grad_(False)
    if merge:
        merge_lora_(model)
    model.train(was_training)
    del states
    record = {
        "stage": "finish", "rank": config.rank, "alpha": alpha, "targets": list(config.targets),
        "objective": config.objective,
        "aux_weight": config.aux_weight if config.objective != "embedding" else None,
        "aux_first": aux_losses[0] if aux_losses else None,
        "aux_last": aux_losses[-1] if aux_losses else None,
        "with_particles": config.with_particles,
        "adapter_params": n_adapter,
        "trained_params": n_adapter + (omega.numel() if omega is not None else 0),
        "cos_before": before[0], "cos_after": after[0],
        "holdout_cos_before": before[1], "holdout_cos_after": after[1],
        "loss_first": losses[0], "loss_last": losses[-1],
        "n_train": len(data["train_idx"]), "n_fit": len(data["fit_idx"]),
        "n_holdout": len(data["hold_idx"]), "steps": steps, "lr": config.lr,
        "particle_lr": config.particle_lr if config.with_particles else None,
        "time_s": time.perf_counter() - t0,
    }
    if progress:
        msg = f"  finish (rank {config.rank}): embedding cosine {before[0]:.4f} -> {after[0]:.4f}"
        if data["holdout"]:
            msg += f" (held-out {before[1]:.4f} -> {after[1]:.4f})"
        print(msg + f", {record['time_s']:.0f} s", flush=True)
    return record

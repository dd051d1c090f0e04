"""Phase A of the teacher route for associative recall: fit omega to target attention rows.

The token-pair alignment of :func:`~coulomb_attention.train.recall.recall_phase_a` is label-free
and rises while the features drift away from what retrieval needs (docs/recall.md). The
teacher route gives phase A a target that tells a good retrieval kernel from a bad one:

1. a softmax model of the same architecture is trained (the *teacher*; once per seed, cached);
2. its weights are copied into the kernel-attention student (every parameter; the student keeps
   its own random omega), so the student's queries and keys *are* the teacher's;
3. omega of the last attention layer (the retrieval layer) is fitted to target rows on the
   layer's causal queries/keys (this module);
4. phase B fine-tunes everything but omega (:func:`~coulomb_attention.train.recall.run_recall`).

The fixed baseline takes steps 1, 2 and 4 (same teacher, same fine-tuning, omega as drawn):
the comparison then measures the kernel, not the teacher (docs/DESIGN.md, fair comparisons).

Objectives (:data:`OBJECTIVES`), all the causal row KL of
:class:`~coulomb_attention.energy.TeacherAttention` (``row_pos``: row ``t`` sees ``s <= t``):

- ``teacher``        the teacher's softmax row at every position of the sequence
- ``teacher_query``  the teacher's softmax row at the query positions only (the rows that
                     retrieval depends on)
- ``indicator``      the one-hot row of the retrieval position ``s*(t)`` at the query
                     positions (row KL = cross-entropy ``-log a_{t s*(t)}``; no teacher rows)

Fitting methods (:data:`FIT_METHODS`, all moved by
:func:`~coulomb_attention.dynamics.fit_particles`): ``langevin`` (the method: the Hamiltonian
``D + lam W_{N,s}`` through :func:`~coulomb_attention.dynamics.learn_particles`; ``lam = 0``
and finite ``beta`` is the noise-only ablation), ``adam`` (plain Adam on ``D``, no noise, no
repulsion, projected on the same ball after each step: the reviewer's "gradient" ablation),
``hedgehog`` (Hedgehog's map ``[softmax(W x), softmax(-W x)]`` at the same feature count, Adam
on ``W``, all head groups in one run: :func:`~coulomb_attention.nn.attention.use_hedgehog_map_`)
and ``weighted``
(Wasserstein-Fisher-Rao particles, :mod:`coulomb_attention.dynamics.weighted`: each particle
carries a mass ``w_i`` (uniform ``1/M`` at the start), the row objective sees features scaled
by ``sqrt(M w_i)`` (:class:`~coulomb_attention.energy.TeacherAttention` with ``weights=``);
positions follow the same projected Langevin transport as ``langevin`` (same ``eta``,
``beta``, ``lam``), masses the Fisher-Rao reaction by ``dD/dw_i`` (step ``tau``, normalised)
with birth-death below ``w_min / M``; one run per head group. The fitted masses go into the
layer (:meth:`~coulomb_attention.nn.KernelAttention.load_masses_`) and stay frozen in phase B).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._validation import check_choice, check_positive
from ..convert.capture import layer_inputs
from ..convert.driver import langevin_setup, run_phase_a
from ..data.mqar import MQARData
from ..dynamics import ParticleConfig, fit_particles, subsample_trace
from ..dynamics.diagnostics import particle_diagnostics
from ..energy import POTENTIALS, Hamiltonian, TeacherAttention, TeacherBatch, per_head
from ..nn.attention import use_hedgehog_map_

__all__ = ["FIT_METHODS", "OBJECTIVES", "RecallFitConfig", "fit_recall_omega",
           "load_teacher_weights_", "omega_diagnostics", "teacher_batches"]

OBJECTIVES = ("teacher", "teacher_query", "indicator")
# every method of the particle fit (dynamics.FIT_METHODS), in the order the command lists them
FIT_METHODS = ("langevin", "adam", "hedgehog", "weighted")


@dataclass(frozen=True)
class RecallFitConfig(ParticleConfig):
    """Fitting omega to target rows (the teacher route's phase A): the particle system's
    hyper-parameters (:class:`~coulomb_attention.dynamics.ParticleConfig`; ``radius`` applies
    to every method) with this fit's defaults, and its own.

    Attributes
    ----------
    n_examples : int         training sequences the rows come from (the first ones)
    holdout : int            further sequences (not trained on), to measure the row KL
    batch_size : int         sequences per step (one cached mini-batch)
    """

    n_examples: int = 2048
    holdout: int = 512
    batch_size: int = 128
    steps: int = 300
    eta: float = 3.0
    eta_end: float = 0.3
    beta: float = 1e6
    # Coulomb lam 10 by the data: against lam 0 (the same noise and steps) it is never worse
    # beyond noise and better at hard FAVOR+ M = 16/32/64/128 and easy FAVOR+ M = 8
    # (docs/ablation.md, MQAR arena)
    lam: float = 10.0
    potential: str = "riesz"
    s: float = 1.0
    eps: float = 0.1
    radius: float = 3.0
    max_drift: float = 0.3
    lr: float = 0.03

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("potential", self.potential, POTENTIALS)
        for name in ("n_examples", "holdout", "batch_size"):
            check_positive(name, getattr(self, name), integer=True)


@torch.no_grad()
def load_teacher_weights_(student: nn.Module, teacher_state: dict[str, torch.Tensor]) -> None:
    """Copy every parameter and buffer of the teacher into ``student`` except the particles
    (``omega`` and any masses: the student keeps its own). Shapes must match; a missing or
    extra weight raises ``ValueError``."""
    own = student.state_dict()
    skip = {k for k in own if k.endswith((".omega", ".mass"))}
    missing = sorted(set(own) - skip - set(teacher_state))
    extra = sorted(set(teacher_state) - set(own))
    if missing or extra:
        raise ValueError(f"teacher weights do not fit the student: missing {missing[:5]}, "
                         f"unexpected {extra[:5]}")
    for k, v in own.items():
        if k in skip:
            continue
        if tuple(teacher_state[k].shape) != tuple(v.shape):
            raise ValueError(f"teacher weight {k} has shape {tuple(teacher_state[k].shape)}, "
                             f"the student's {tuple(v.shape)}")
        v.copy_(teacher_state[k])


def teacher_batches(model: nn.Module, layer_index: int, data: MQARData, objective: str,
                    batch_size: int) -> list[TeacherBatch]:
    """Causal :class:`~coulomb_attention.energy.TeacherBatch` es of one attention layer.

    ``q = layer.queries(h)`` at the rows of ``objective`` (every position, or the query
    positions), ``k = layer.keys(h)`` at every position, ``row_pos`` the rows' positions;
    ``indicator`` adds the one-hot target of the retrieval positions. Float32, (B, H, R|T, dh).
    """
    check_choice("objective", objective, OBJECTIVES)
    layer = model.attention_layers[layer_index]
    chunks = [(data.inputs[i:i + batch_size], data.retrieve[i:i + batch_size])
              for i in range(0, len(data), batch_size)]
    pairs = ((ids, torch.ones_like(ids, dtype=torch.bool)) for ids, _ in chunks)
    out = []
    for (h, _), (ids, ret) in zip(layer_inputs(model, layer_index, pairs), chunks, strict=True):
        with torch.no_grad():
            q, k = layer.queries(h).float(), layer.keys(h).float()  # (B, H, T, dh)
        B, T = ids.shape
        if objective == "teacher":
            pos = torch.arange(T).expand(B, T)
        else:
            pos = (ret >= 0).nonzero()[:, 1].view(B, -1)  # (B, Q), in order
        rows = q.gather(2, pos[:, None, :, None].expand(-1, q.shape[1], -1, q.shape[3]))
        target = None
        if objective == "indicator":
            s = torch.arange(T)
            target = (s[None, None, :] == ret.gather(1, pos)[:, :, None]).float()  # (B, Q, T)
        out.append(TeacherBatch(rows.contiguous(), k.contiguous(),
                                torch.ones(B, T, dtype=torch.bool),
                                torch.ones(pos.shape, dtype=torch.bool),
                                row_pos=pos.contiguous(), target=target))
    return out


def fit_recall_omega(model: nn.Module, fit_data: MQARData, hold_data: MQARData,
                     objective: str, config: RecallFitConfig,
                     generator: torch.Generator) -> dict[str, Any]:
    """Fit omega of the last attention layer to the rows of ``objective`` (module doc); the
    layer's ``omega`` is replaced in place (``hedgehog``: the layer switches to that map).

    Returns
    -------
    dict: ``objective``, ``method``, ``kl_before``/``kl_after`` (fitted sequences),
    ``holdout_kl_before``/``holdout_kl_after``, ``omega_shift``, ``energy_trace`` (at most 50
    points ``{step, energy, data, repulsion}``; ``data`` the mean row KL), ``time_s``;
    ``weighted`` adds ``births`` (birth-death events) and ``ess`` (the masses' effective
    sample size over M, mean over head groups).
    """
    if not isinstance(config, RecallFitConfig):
        raise TypeError(f"config must be a RecallFitConfig, got {type(config).__name__}")
    li = len(model.attention_layers) - 1
    layer = model.attention_layers[li]
    if not layer.has_features:
        raise ValueError(f"attention {layer.feature_map!r} has no particles to fit")
    def fit_layer(li: int) -> list[dict[str, Any]]:
        if config.method == "hedgehog":
            use_hedgehog_map_(layer)
        fit_b = teacher_batches(model, li, fit_data, objective, config.batch_size)
        hold_b = teacher_batches(model, li, hold_data, objective, config.batch_size)
        omega0 = layer.omega.detach().double().clone()  # (G, M, dh)
        G, M, dh = omega0.shape
        grouped = G > 1
        term = TeacherAttention(per_head(layer.feature) if grouped else layer.feature)

        def kl(om, batches, mass=None):
            if mass is not None and not grouped:
                mass = mass[0]
            return term.evaluate(om if grouped else om[0], batches, weights=mass)["kl"]

        rec: dict[str, Any] = {"objective": objective, "method": config.method,
                               "kl_before": kl(omega0, fit_b),
                               "holdout_kl_before": kl(omega0, hold_b)}
        potential, projection, schedule = langevin_setup(config, dh)
        order = torch.randperm(len(fit_b), generator=generator).tolist()
        per = layer.heads // G
        fit = fit_particles(
            term, TeacherAttention(layer.feature), omega0, fit_b, order, config=config,
            lift=lambda t, g: Hamiltonian(t, potential, lam=config.lam, groups=g),
            projection=projection, schedule=schedule,
            # the noise seed is drawn only by the methods with noise (langevin, weighted)
            noise=lambda: torch.Generator().manual_seed(
                int(torch.randint(0, 2**62, (1,), generator=generator))),
            group_batches=lambda g: [b.heads(slice(g * per, (g + 1) * per)) for b in fit_b])
        omega, mass, trace = fit.omega, fit.masses, fit.trace
        if mass is not None:
            rec["births"] = fit.births
            rec["ess"] = float((1 / (mass * mass).sum(-1)).mean()) / M
        layer.load_features_(omega.to(layer.omega.dtype))
        layer.load_masses_(mass)
        rec.update({
            "kl_after": kl(omega, fit_b, mass), "holdout_kl_after": kl(omega, hold_b, mass),
            "omega_shift": float((omega - omega0).norm() / omega0.norm().clamp_min(1e-30)),
            "energy_trace": subsample_trace(trace),
        })
        if not all(math.isfinite(rec[k]) for k in ("kl_after", "holdout_kl_after")):
            raise FloatingPointError(f"the {config.method} fit of omega gave a non-finite row KL")
        return [rec]

    return run_phase_a([li], fit_layer)[0]


@torch.no_grad()
def omega_diagnostics(model: nn.Module, data: MQARData, batch_size: int = 256) -> dict[str, float]:
    """:func:`~coulomb_attention.dynamics.diagnostics.particle_diagnostics` of the last attention
    layer's particles with its features of the queries at the query positions of ``data``
    (held-out), per head group, averaged over the groups; a weighted layer's features are
    scaled by ``sqrt(M mass)`` as in its attention."""
    li = len(model.attention_layers) - 1
    layer = model.attention_layers[li]
    if not layer.has_features:
        return {}
    qs = []
    for b in teacher_batches(model, li, data, "teacher_query", batch_size):
        qs.append(b.q.transpose(0, 1).reshape(b.q.shape[1], -1, b.q.shape[-1]))  # (H, n, dh)
    q = torch.cat(qs, 1)
    G = layer.omega.shape[0]
    per = layer.heads // G
    scale = layer.feature_scale()  # (G, M) or None
    out: dict[str, list[float]] = {}
    for g in range(G):
        om = layer.omega[g].double()
        feats = layer.feature(q[g * per:(g + 1) * per].reshape(-1, q.shape[-1]).double(), om)
        if scale is not None:
            feats = feats * scale[g]
        for k, v in particle_diagnostics(om, feats).items():
            out.setdefault(k, []).append(v)
    return {k: sum(v) / len(v) for k, v in out.items()}

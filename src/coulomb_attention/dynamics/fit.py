"""The one grouped particle fit: how a learner's particles move, for every method.

A learner (attention distillation, its joint refinement, the MQAR teacher route) hands over a
data term, the starting particles of ``G`` head groups ``(G, M, d)``, its batches and their
order, a noise generator and its :class:`~coulomb_attention.dynamics.ParticleConfig`; the
method (``config.method``) is answered here and nowhere else:

==========  =================================================================================
langevin    all groups in ONE projected Langevin run (:func:`learn_particles` on the lifted
            energy with ``groups=G``: repulsion within each group, the data term the mean of
            the per-group terms, so each particle feels its own group's force); cosine
            ``eta`` schedule, ``beta``, ``lam``, ``max_drift``, ``normalize_drift``
weighted    Wasserstein-Fisher-Rao particles: one run per group (its own masses, uniform at
            the start; ``tau``, ``w_min``), the groups in turn on one noise stream
adam        projected Adam (learning rate ``lr``, constant) on the data term alone: no noise,
            no repulsion, the same ball after every step; all groups in one run (Adam's step
            is invariant to the 1/G scale of the grouped mean, so each group moves as in its
            own run up to Adam's ``eps``)
hedgehog    the same Adam on ``W`` with ``omega = [W; -W]`` along the particle axis (Hedgehog's
            map; no projection), all groups in one run
==========  =================================================================================

The trace of every method is the driver's per-step info; :func:`subsample_trace` turns it into
the one stored format ``{step, energy, data, repulsion}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .config import ParticleConfig
from .driver import LangevinSchedule, cycle, learn_particles
from .weighted import Reaction

__all__ = ["TRACE_POINTS", "ParticleFit", "adam_fit", "fit_particles", "subsample_trace"]

TRACE_POINTS = 50
# the data part of a step's info, first found wins: a row KL, 1 - cos of an embedding
# objective (stored as its complement), minus a label alignment (an energy to minimise)
_DATA = (("kl", 1.0, 0.0), ("cos", -1.0, 1.0), ("alignment", -1.0, 0.0))


@dataclass
class ParticleFit:
    """The result of :func:`fit_particles`.

    Attributes
    ----------
    omega : Tensor (G, M, d)          the fitted particles (the dtype of ``omega0``)
    masses : Tensor (G, M) or None    the masses of a ``weighted`` fit
    traces : list of G lists of dict  the per-step info of the run that moved each group (one
                                      shared run: the same list for every group)
    births : int                      birth-death events (``weighted``; else 0)
    """

    omega: torch.Tensor
    masses: torch.Tensor | None
    traces: list[list[dict]]
    births: int = 0

    @property
    def trace(self) -> list[dict]:
        """The first group's trace (all groups' when they move in one run)."""
        return self.traces[0]


def fit_particles(
    term,
    group_term,
    omega0: torch.Tensor,
    batches: Sequence,
    order: Sequence[int],
    *,
    config: ParticleConfig,
    lift: Callable,
    projection: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    schedule: LangevinSchedule,
    noise: torch.Generator | Callable[[], torch.Generator],
    group_batches: Callable[[int], Sequence] | None = None,
    comm=None,
    progress: bool | str = False,
    positions_only: bool = False,
) -> ParticleFit:
    """Fit ``G`` groups of particles by ``config.method`` (module doc).

    Parameters
    ----------
    term : data term of all groups, ``value_and_grad(omega (G, M, d), batches, comm)``
        (e.g. :class:`~coulomb_attention.energy.TeacherAttention` of
        :func:`~coulomb_attention.energy.per_head`); used when ``G > 1``
    group_term : data term of one group, ``value_and_grad(omega (M, d), batches, comm[,
        weights=])``; used when ``G == 1`` and by the per-group ``weighted`` runs
    omega0 : Tensor (G, M, d)   starting particles
    batches : the batches of all groups (one per step, cycled in ``order``)
    order : the order of the batches (drawn by the caller)
    config : ParticleConfig (``method``, ``lr``, ``lam``, ``tau``, ``w_min``,
        ``normalize_drift``; the schedule's fields through ``schedule``)
    lift : ``lift(data_term, groups) -> energy``: the data term plus the pair potential
        (``Hamiltonian(data_term, potential, lam=lam, groups=groups)``)
    projection : ``(N, d) -> (projected, on-boundary mask)`` (the ball of the Langevin runs)
    schedule : the Langevin step-size schedule (``ParticleConfig.schedule()``)
    noise : the Langevin noise generator, or a function returning it (called once, only by
        the methods with noise, so an Adam fit draws nothing from the caller's generator)
    group_batches : ``group_batches(g)``: group ``g``'s part of ``batches`` (default
        ``batches``); used when ``G == 1`` and by the ``weighted`` runs
    comm : optional cross-process hook (exact data parallelism)
    progress : progress bar (a string: its description)
    positions_only : a ``weighted`` config moves the positions only, by the Langevin run (the
        masses are held by the caller, e.g. in the layers' buffers)

    Returns
    -------
    ParticleFit
    """
    if not isinstance(config, ParticleConfig):
        raise TypeError(f"config must be a ParticleConfig, got {type(config).__name__}")
    if omega0.ndim != 3:
        raise ValueError(f"omega0 must have shape (G, M, d), got {tuple(omega0.shape)}")
    G, M, d = omega0.shape
    order = list(order)
    parts = group_batches or (lambda g: batches)
    grouped = G > 1
    method = config.method
    if method == "weighted" and positions_only:
        method = "langevin"

    def noise_gen() -> torch.Generator:
        return noise if isinstance(noise, torch.Generator) else noise()

    if method == "weighted":  # one run per group: its own masses
        gen = noise_gen()
        reaction = Reaction(tau=config.tau, w_min=config.w_min)
        runs = [learn_particles(
            lift(group_term, 1), omega0[g], schedule, cycle(parts(g), order),
            projection=projection, generator=gen, comm=comm,
            normalize_drift=config.normalize_drift, reaction=reaction,
            progress=f"{progress} head group {g} (weighted)" if progress else False)
            for g in range(G)]
        return ParticleFit(omega=torch.stack([r.omega for r in runs]).to(omega0.dtype),
                           masses=torch.stack([r.weights for r in runs]).to(omega0.dtype),
                           traces=[r.trace for r in runs],
                           births=sum(int(r.state.births) for r in runs))
    data_term = term if grouped else group_term
    stream = cycle(batches if grouped else parts(0), order)
    start = omega0 if grouped else omega0[0]
    if method == "langevin":
        run = learn_particles(lift(data_term, G), start.reshape(G * M, d), schedule, stream,
                              projection=projection, generator=noise_gen(), comm=comm,
                              normalize_drift=config.normalize_drift, progress=progress)
    else:  # adam, hedgehog: Adam's learning rate, constant, on the data term alone
        run = learn_particles(data_term, start, LangevinSchedule(steps=config.steps), stream,
                              projection=projection if method == "adam" else None,
                              generator=torch.Generator(), comm=comm, method=method,
                              lr=config.lr, progress=progress)
    return ParticleFit(omega=run.omega.reshape(omega0.shape).to(omega0.dtype), masses=None,
                       traces=[run.trace] * G)


def subsample_trace(trace: list[dict], n: int = TRACE_POINTS) -> list[dict]:
    """At most ``n`` entries of a run's per-step ``trace``, evenly spaced (first and last kept),
    each ``{step, energy, data, repulsion}``: ``step`` the entry's index (0 .. len - 1),
    ``data`` the data term (a row KL; ``1 - cos`` of an embedding objective; minus a label
    alignment; None when absent), ``repulsion`` the pair energy (0.0 when absent); a
    non-finite value (not computed) is None."""
    if n <= 0 or not trace:
        return []
    k = min(n, len(trace))
    idx = sorted({round(i * (len(trace) - 1) / max(k - 1, 1)) for i in range(k)})

    def num(x):
        return None if x is None or not math.isfinite(float(x)) else float(x)

    out = []
    for i in idx:
        t = trace[i]
        data = next((shift + sign * t[key] for key, sign, shift in _DATA if key in t), None)
        out.append({"step": i, "energy": num(t["energy"]), "data": num(data),
                    "repulsion": num(t.get("repulsion", 0.0))})
    return out


def adam_fit(term, x0: torch.Tensor, stream, steps: int, lr: float, *, comm=None,
             projection=None) -> tuple[torch.Tensor, list[dict]]:
    """Plain Adam (learning rate ``lr``, constant) on a parameter that is not a particle
    system, e.g. the window logits of a hybrid layer ``(H,)`` or ``(L, H)``: ``steps`` steps of
    :func:`learn_particles` with ``method="adam"``, one item of ``stream`` per step, on
    ``term.value_and_grad(x, batches, comm)``. Returns ``(x, trace)``."""
    run = learn_particles(term, x0, LangevinSchedule(steps=steps), stream, projection=projection,
                          generator=torch.Generator(), comm=comm, method="adam", lr=lr)
    return run.omega, run.trace

"""Projected Langevin dynamics as ``(init_fn, step_fn)`` and the projections (ball, box);
weighted (Wasserstein-Fisher-Rao) particles and the projected-Adam ablation; the one grouped
particle fit of the learners (:func:`fit_particles`) and its trace format."""

from .adam import AdamState, projected_adam
from .config import FIT_METHODS, ParticleConfig
from .driver import (
    METHODS,
    DriftNormalizer,
    LangevinSchedule,
    ParticleRun,
    cycle,
    learn_particles,
)
from .fit import TRACE_POINTS, ParticleFit, adam_fit, fit_particles, subsample_trace
from .langevin import (
    SCHEDULES,
    LangevinState,
    NonFiniteEnergyError,
    make_schedule,
    projected_langevin,
)
from .projections import PROJECTIONS, Ball, Box, make_projection
from .transport import cap_drift, transport_step
from .weighted import (
    Reaction,
    ReactionNormalizer,
    WeightedState,
    birth_death,
    uniform_weights,
    weighted_langevin,
)

__all__ = [
    "AdamState",
    "FIT_METHODS",
    "METHODS",
    "ParticleFit",
    "TRACE_POINTS",
    "adam_fit",
    "fit_particles",
    "subsample_trace",
    "ParticleConfig",
    "Reaction",
    "ReactionNormalizer",
    "WeightedState",
    "birth_death",
    "projected_adam",
    "uniform_weights",
    "weighted_langevin",
    "DriftNormalizer",
    "LangevinSchedule",
    "ParticleRun",
    "cycle",
    "learn_particles",
    "PROJECTIONS",
    "SCHEDULES",
    "Ball",
    "Box",
    "LangevinState",
    "NonFiniteEnergyError",
    "make_projection",
    "make_schedule",
    "projected_langevin",
    "cap_drift",
    "transport_step",
]

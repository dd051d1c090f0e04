"""Projected Langevin dynamics as ``(init_fn, step_fn)`` and the projections (ball, box);
weighted (Wasserstein-Fisher-Rao) particles and the projected-Adam ablation."""

from .adam import AdamState, projected_adam
from .config import ParticleConfig
from .driver import (
    METHODS,
    DriftNormalizer,
    LangevinSchedule,
    ParticleRun,
    cycle,
    learn_particles,
)
from .langevin import (
    SCHEDULES,
    LangevinState,
    NonFiniteEnergyError,
    make_schedule,
    projected_langevin,
)
from .projections import PROJECTIONS, Ball, Box, make_projection
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
    "METHODS",
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
]

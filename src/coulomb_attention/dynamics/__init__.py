"""Projected Langevin dynamics as ``(init_fn, step_fn)`` and the projections (ball, box)."""

from .driver import (
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
    run,
)
from .projections import PROJECTIONS, Ball, Box, make_projection

__all__ = [
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
    "run",
]

"""The particle system's hyper-parameters: one frozen dataclass every learner builds on.

:class:`ParticleConfig` holds what defines a run of the particle dynamics of a phase A
(``docs/DESIGN.md``: step size, temperature, repulsion, the projection set, the steps); the
learners' configs (``train.phases.AlignConfig`` for label alignment, ``train.distill.DistillConfig``
for attention distillation, ``train.recall_teacher.FitConfig`` for MQAR's teacher route) are
subclasses of it that set their own defaults and add what is theirs (data sizes, the
optimiser, the objective's options). The pair potential is built from ``potential``, ``s``,
``eps`` and ``lam`` by the energy layer (``train.phases.langevin_setup``); the schedule and the
projection come from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._validation import check_nonnegative, check_positive
from .driver import LangevinSchedule
from .projections import make_projection

__all__ = ["ParticleConfig"]


@dataclass(frozen=True)
class ParticleConfig:
    """Hyper-parameters of one run of the projected Langevin dynamics of a phase A.

    Attributes
    ----------
    steps : int          Langevin steps (per layer and head group)
    eta, eta_end : float step size, cosine schedule eta -> eta_end over ``steps``
    beta : float         inverse temperature (0 reads as infinity: projected gradient descent)
    lam : float          repulsion strength lambda (0: no repulsion)
    potential : str      pair potential: riesz, coulomb or log (checked by the energy layer)
    s, eps : float       Riesz exponent and softening
    radius : float       radius of the projection ball, in units of sqrt(head_dim)
    max_drift : float    cap on one particle's drift per step (0: none)
    """

    steps: int = 100
    eta: float = 0.05
    eta_end: float = 0.005
    beta: float = 1e5
    lam: float = 0.0
    potential: str = "riesz"
    s: float = 1.0
    eps: float = 0.1
    radius: float = 3.0
    max_drift: float = 0.5

    def __post_init__(self) -> None:
        check_positive("steps", self.steps, integer=True)
        for name in ("eta", "eta_end", "radius", "eps"):
            check_positive(name, getattr(self, name))
        for name in ("beta", "lam", "max_drift", "s"):
            check_nonnegative(name, getattr(self, name))

    def schedule(self) -> LangevinSchedule:
        """The cosine step-size schedule ``eta -> eta_end`` over ``steps`` at ``beta``."""
        return LangevinSchedule(steps=self.steps, eta=self.eta, eta_end=self.eta_end,
                                eta_schedule="cosine", beta=self.beta,
                                max_drift=self.max_drift or None)

    def projection(self, dim: int):
        """The ball of radius ``radius * sqrt(dim)`` (``omega -> (projected, on_boundary)``)."""
        return make_projection("ball", self.radius * math.sqrt(dim))

"""The particle system's hyper-parameters: one frozen dataclass every learner builds on.

:class:`ParticleConfig` holds what defines a run of the particle dynamics of a phase A
(``docs/DESIGN.md``: step size, temperature, repulsion, the projection set, the steps); the
learners' configs (``train.phases.AlignConfig`` for label alignment,
``convert.distill.DistillConfig`` for attention distillation,
``train.recall_teacher.RecallFitConfig`` for MQAR's teacher route) are subclasses of it that
set their own defaults and add what is theirs (data sizes, the objective's options).
How the particles move (``method``: langevin, weighted, adam, hedgehog,
with ``lr`` for the Adam methods and ``tau``, ``w_min`` for the weighted one) is here too, and
:func:`~coulomb_attention.dynamics.fit.fit_particles` reads it. The pair potential is built
from ``potential``, ``s``, ``eps`` and ``lam`` by the energy layer
(``convert.driver.langevin_setup``); the schedule and the projection come from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from .._validation import check_choice, check_nonnegative, check_positive
from ..names import FIT_METHODS
from .driver import LangevinSchedule
from .projections import make_projection
from .weighted import Reaction

__all__ = ["FIT_METHODS", "ParticleConfig"]

# FIT_METHODS: how a learner's particles move (dynamics.fit.fit_particles), the vocabulary's


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
    method : str         langevin (the method), weighted (Wasserstein-Fisher-Rao particles:
                         positions and masses), adam (the same particles by projected Adam:
                         the plain-gradient ablation) or hedgehog (Adam on ``W``, ``omega =
                         [W; -W]``, Hedgehog's map); a learner may allow fewer
                         (``methods``)
    lr : float           Adam's learning rate (adam, hedgehog)
    tau : float          reaction step of the masses (weighted; normalised: the RMS change of
                         ``log w_i`` per step, following the eta schedule)
    w_min : float        death threshold of a mass in units of ``1/M`` (weighted; 0: no
                         birth-death)
    normalize_drift : bool  scale-free Langevin steps (running RMS of the drift)
    """

    methods: ClassVar[tuple[str, ...]] = FIT_METHODS

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
    method: str = "langevin"
    lr: float = 0.02
    tau: float = 0.05
    w_min: float = 0.1
    normalize_drift: bool = False

    def __post_init__(self) -> None:
        check_positive("steps", self.steps, integer=True)
        for name in ("eta", "eta_end", "radius", "eps", "lr"):
            check_positive(name, getattr(self, name))
        for name in ("beta", "lam", "max_drift", "s"):
            check_nonnegative(name, getattr(self, name))
        check_choice("method", self.method, self.methods)
        Reaction(tau=self.tau, w_min=self.w_min)  # validates both
        if not isinstance(self.normalize_drift, bool):
            raise TypeError(f"normalize_drift must be a bool, got {self.normalize_drift!r}")

    def schedule(self) -> LangevinSchedule:
        """The cosine step-size schedule ``eta -> eta_end`` over ``steps`` at ``beta``."""
        return LangevinSchedule(steps=self.steps, eta=self.eta, eta_end=self.eta_end,
                                eta_schedule="cosine", beta=self.beta,
                                max_drift=self.max_drift or None)

    def projection(self, dim: int):
        """The ball of radius ``radius * sqrt(dim)`` (``omega -> (projected, on_boundary)``)."""
        return make_projection("ball", self.radius * math.sqrt(dim))

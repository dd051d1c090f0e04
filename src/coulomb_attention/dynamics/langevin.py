"""Projected Langevin dynamics of the particle system (the paper's Algorithm 1).

    omega_i <- Proj_K( omega_i - eta * N * grad_i H + sqrt(2 eta / beta) xi_i ),   xi_i ~ N(0, I)

Built jax-md style as ``(init_fn, step_fn)`` from an energy-gradient function and a
projection; ``eta`` and ``beta`` can be overridden per step, so annealing is a schedule
(:class:`~coulomb_attention.dynamics.LangevinSchedule`, run by
:func:`~coulomb_attention.dynamics.learn_particles`). ``beta = inf`` is projected gradient descent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._validation import check_choice, check_positive
from .transport import transport_step

__all__ = [
    "LangevinState",
    "NonFiniteEnergyError",
    "SCHEDULES",
    "make_schedule",
    "projected_langevin",
]

EnergyGradFn = Callable[[torch.Tensor, object], tuple[torch.Tensor, torch.Tensor, dict]]


class NonFiniteEnergyError(FloatingPointError):
    """The energy or its gradient became NaN/inf: the run stops instead of writing NaN."""


@dataclass
class LangevinState:
    """Particles (N, d), the number of steps taken and the noise generator."""

    omega: torch.Tensor
    step: int
    generator: torch.Generator


def projected_langevin(
    energy_grad_fn: EnergyGradFn,
    projection: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    *,
    eta: float = 1e-2,
    beta: float = math.inf,
    max_drift: float | None = None,
):
    """Build ``(init_fn, step_fn)``.

    Parameters
    ----------
    energy_grad_fn : ``(omega, batch) -> (energy, grad (N, d), info dict)``
    projection : ``omega -> (projected omega, on-boundary mask (N,))``
    eta : step size > 0
    beta : inverse temperature > 0 (``math.inf``: no noise)
    max_drift : optional cap on the length of each particle's drift step (guards against
        the singular part of a pair potential); ``None``: no cap.

    Returns
    -------
    init_fn(omega, generator) -> LangevinState
    step_fn(state, batch=None, *, eta=None, beta=None) -> (LangevinState, info dict)
    """
    check_positive("eta", eta)
    check_positive("beta", beta, allow_inf=True)
    if max_drift is not None:
        check_positive("max_drift", max_drift)

    def init_fn(omega: torch.Tensor, generator: torch.Generator) -> LangevinState:
        if omega.ndim != 2:
            raise ValueError(f"omega must have shape (N, d), got {tuple(omega.shape)}")
        omega, _ = projection(omega.detach().clone())
        return LangevinState(omega=omega, step=0, generator=generator)

    def step_fn(state: LangevinState, batch=None, *, eta: float | None = eta, beta=beta):
        eta_ = check_positive("eta", eta)
        beta_ = check_positive("beta", beta, allow_inf=True)
        omega = state.omega
        n = omega.shape[0]
        energy, grad, info = energy_grad_fn(omega, batch)
        if not bool(torch.isfinite(energy)) or not bool(torch.isfinite(grad).all()):
            raise NonFiniteEnergyError(
                f"non-finite energy or gradient at Langevin step {state.step} "
                f"(energy={float(energy)}); lower eta, raise eps, or check the data"
            )
        new_omega, on_boundary = transport_step(omega, -eta_ * n * grad, projection, eta=eta_,
                                                beta=beta_, generator=state.generator,
                                                max_drift=max_drift)
        info = dict(info)
        info.update(
            step=state.step,
            energy=float(energy),
            boundary_fraction=float(on_boundary.float().mean()),
            grad_norm=float(grad.norm()),
            eta=eta_,
            beta=beta_,
        )
        return LangevinState(new_omega, state.step + 1, state.generator), info

    return init_fn, step_fn


def _constant(start: float, end: float | None, total: int) -> Callable[[int], float]:
    return lambda k: start


def _cosine(start: float, end: float, total: int) -> Callable[[int], float]:
    def f(k: int) -> float:
        t = min(k / max(total - 1, 1), 1.0)
        return end + 0.5 * (start - end) * (1 + math.cos(math.pi * t))

    return f


def _geometric(start: float, end: float, total: int) -> Callable[[int], float]:
    if math.isinf(end) or math.isinf(start):
        raise ValueError("a geometric schedule needs finite start and end")

    def f(k: int) -> float:
        t = min(k / max(total - 1, 1), 1.0)
        return start * (end / start) ** t

    return f


SCHEDULES = {"constant": _constant, "cosine": _cosine, "geometric": _geometric}


def make_schedule(
    name: str, start: float, end: float | None = None, total: int = 1
) -> Callable[[int], float]:
    """Schedule ``k -> value``: ``constant``, ``cosine`` (start -> end) or ``geometric``
    (log-linear start -> end, e.g. annealing beta upward)."""
    check_choice("schedule", name, SCHEDULES)
    if name != "constant" and end is None:
        raise ValueError(f"schedule {name!r} needs an end value")
    return SCHEDULES[name](start, end, total)

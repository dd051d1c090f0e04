"""Projected Adam on the particles: the plain-optimiser ablation of the Langevin dynamics.

    omega <- Proj_K( Adam step of H at omega, learning rate eta / sqrt(d) )

The same energy (``value_and_grad``), projection and step budget as the Langevin run, but
``torch.optim.Adam`` instead of the Langevin drift and no noise: what a reviewer means by
"the same parameters trained by plain gradient descent". Adam's step is about ``lr`` per
coordinate, so ``lr = eta / sqrt(d)`` makes ``eta`` the per-particle step length, as for the
normalised Langevin drift. Built as ``(init_fn, step_fn)`` like
:func:`~coulomb_attention.dynamics.projected_langevin`; ``eta`` can be overridden per step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._validation import check_positive
from .langevin import EnergyGradFn, NonFiniteEnergyError

__all__ = ["AdamState", "projected_adam"]


@dataclass
class AdamState:
    """Particles (N, d), steps taken, the generator (unused; kept for the protocol) and the
    optimiser (its moments)."""

    omega: torch.Tensor
    step: int
    generator: torch.Generator
    optimizer: torch.optim.Adam | None = None


def projected_adam(
    energy_grad_fn: EnergyGradFn,
    projection: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    *,
    eta: float = 1e-2,
    betas: tuple[float, float] = (0.9, 0.999),
):
    """Build ``(init_fn, step_fn)`` of projected Adam.

    Parameters
    ----------
    energy_grad_fn : ``(omega, batch) -> (energy, grad (N, d), info dict)``
    projection : ``omega -> (projected omega, on-boundary mask (N,))``
    eta : per-particle step length > 0 (Adam's ``lr = eta / sqrt(d)``)
    betas : Adam's moment decays

    Returns
    -------
    init_fn(omega, generator) -> AdamState
    step_fn(state, batch=None, *, eta=None, beta=None) -> (AdamState, info dict); ``beta``
        must be ``inf`` (no noise)
    """
    check_positive("eta", eta)

    def init_fn(omega: torch.Tensor, generator: torch.Generator) -> AdamState:
        if omega.ndim != 2:
            raise ValueError(f"omega must have shape (N, d), got {tuple(omega.shape)}")
        omega, _ = projection(omega.detach().clone())
        param = omega.clone().requires_grad_(True)
        opt = torch.optim.Adam([param], lr=eta / math.sqrt(omega.shape[1]), betas=betas)
        return AdamState(omega=omega, step=0, generator=generator, optimizer=opt)

    def step_fn(state: AdamState, batch=None, *, eta: float | None = eta, beta=math.inf):
        eta_ = check_positive("eta", eta)
        if math.isfinite(check_positive("beta", beta, allow_inf=True)):
            raise ValueError(f"projected Adam has no noise: beta must be inf, got {beta}")
        opt = state.optimizer
        (param,) = opt.param_groups[0]["params"]
        energy, grad, info = energy_grad_fn(param.detach(), batch)
        if not bool(torch.isfinite(energy)) or not bool(torch.isfinite(grad).all()):
            raise NonFiniteEnergyError(
                f"non-finite energy or gradient at Adam step {state.step} "
                f"(energy={float(energy)}); lower eta or check the data")
        opt.param_groups[0]["lr"] = eta_ / math.sqrt(param.shape[1])
        param.grad = grad.detach().to(param.dtype)
        opt.step()
        with torch.no_grad():
            projected, on_boundary = projection(param)
            param.copy_(projected)
        info = dict(info)
        info.update(step=state.step, energy=float(energy),
                    boundary_fraction=float(on_boundary.float().mean()),
                    grad_norm=float(grad.norm()), eta=eta_, beta=math.inf)
        return AdamState(param.detach().clone(), state.step + 1, state.generator, opt), info

    return init_fn, step_fn

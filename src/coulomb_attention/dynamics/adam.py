"""Projected Adam on the particles: the one plain-optimiser loop of the package.

    omega <- Proj_K( Adam step of H at omega, learning rate lr )

The same energy (``value_and_grad``), projection and step budget as a Langevin run, but
``torch.optim.Adam`` instead of the Langevin drift and no noise: what a reviewer means by
"the same parameters trained by plain gradient descent". ``lr`` is Adam's own learning rate
(its step is about ``lr`` per coordinate; ``lr = eta / sqrt(d)`` makes ``eta`` a per-particle
step length). Built as ``(init_fn, step_fn)`` like
:func:`~coulomb_attention.dynamics.projected_langevin`; ``lr`` can be overridden per step.

Two parametrisations of the same loop:

* untied: Adam on ``omega`` itself, any shape ``(..., N, d)`` (``(N, d)`` particles, ``(G, M,
  d)`` head groups moved together; also a plain parameter such as window logits ``(H,)``
  with no projection);
* tied (Hedgehog's map, ``tied_dim``): Adam on ``W``, the first half of ``omega`` along
  ``tied_dim``, with ``omega = [W; -W]`` along that dimension; the gradient of ``W`` is
  ``grad_top - grad_bottom``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._validation import check_positive
from .langevin import EnergyGradFn, NonFiniteEnergyError

__all__ = ["AdamState", "projected_adam"]

Projection = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class AdamState:
    """Particles (the full ``omega``; tied: ``[W; -W]``), steps taken, the generator (unused;
    kept for the protocol) and the optimiser (its parameter: ``omega`` or ``W``, and moments)."""

    omega: torch.Tensor
    step: int
    generator: torch.Generator | None
    optimizer: torch.optim.Adam | None = None


def projected_adam(
    energy_grad_fn: EnergyGradFn,
    projection: Projection | None = None,
    *,
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    tied_dim: int | None = None,
):
    """Build ``(init_fn, step_fn)`` of projected Adam.

    Parameters
    ----------
    energy_grad_fn : ``(omega, batch) -> (energy, grad (same shape as omega), info dict)``
    projection : ``(N, d) -> (projected, on-boundary mask (N,))``, applied to the rows of the
        parameter (``view(-1, d)``) at the start and after every step; None: no constraint.
        Untied only.
    lr : Adam's learning rate > 0
    betas : Adam's moment decays
    tied_dim : None (untied) or the dimension along which ``omega = [W; -W]`` (even length)

    Returns
    -------
    init_fn(omega, generator=None) -> AdamState
    step_fn(state, batch=None, *, lr=None, beta=inf) -> (AdamState, info dict); ``beta`` must
        be ``inf`` (no noise); the info holds the energy function's info and ``step``,
        ``energy``, ``boundary_fraction``, ``grad_norm``, ``lr``, ``beta``
    """
    check_positive("lr", lr)
    if projection is not None and tied_dim is not None:
        raise ValueError("projection applies to the untied parametrisation (tied_dim=None) only")

    def full(w: torch.Tensor) -> torch.Tensor:
        return w if tied_dim is None else torch.cat([w, -w], tied_dim)

    def project_(w: torch.Tensor) -> torch.Tensor:
        """Project ``w`` in place; returns the on-boundary mask."""
        if projection is None:
            return w.new_zeros((), dtype=torch.bool)
        projected, on_boundary = projection(w.view(-1, w.shape[-1]))
        w.copy_(projected.view(w.shape))
        return on_boundary

    def init_fn(omega: torch.Tensor, generator: torch.Generator | None = None) -> AdamState:
        if omega.ndim == 0:
            raise ValueError("omega must have at least one dimension")
        if tied_dim is not None:
            n = omega.shape[tied_dim]
            if n % 2:
                raise ValueError(f"the tied parametrisation needs an even length along dim "
                                 f"{tied_dim}, got {tuple(omega.shape)}")
            w = omega.detach().narrow(tied_dim, 0, n // 2).clone()
        else:
            w = omega.detach().clone()
            with torch.no_grad():
                project_(w)
        param = w.requires_grad_(True)
        opt = torch.optim.Adam([param], lr=lr, betas=betas)
        return AdamState(omega=full(param.detach()).clone(), step=0, generator=generator,
                         optimizer=opt)

    def step_fn(state: AdamState, batch=None, *, lr: float | None = lr, beta=math.inf):
        lr_ = check_positive("lr", lr)
        if math.isfinite(check_positive("beta", beta, allow_inf=True)):
            raise ValueError(f"projected Adam has no noise: beta must be inf, got {beta}")
        opt = state.optimizer
        (param,) = opt.param_groups[0]["params"]
        energy, grad, info = energy_grad_fn(full(param.detach()), batch)
        if not bool(torch.isfinite(energy)) or not bool(torch.isfinite(grad).all()):
            raise NonFiniteEnergyError(
                f"non-finite energy or gradient at Adam step {state.step} "
                f"(energy={float(energy)}); lower lr or check the data")
        if tied_dim is not None:
            half = param.shape[tied_dim]
            grad = grad.narrow(tied_dim, 0, half) - grad.narrow(tied_dim, half, half)
        opt.param_groups[0]["lr"] = lr_
        param.grad = grad.detach().to(param.dtype)
        opt.step()
        with torch.no_grad():
            on_boundary = project_(param)
        info = dict(info)
        info.update(step=state.step, energy=float(energy),
                    boundary_fraction=float(on_boundary.float().mean()),
                    grad_norm=float(grad.norm()), lr=lr_, beta=math.inf)
        return AdamState(full(param.detach()).clone(), state.step + 1, state.generator, opt), info

    return init_fn, step_fn

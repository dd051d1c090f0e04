"""The one transport step of the particle dynamics (projected Langevin and the weighted
particles' transport half)::

    omega_i <- Proj_K( omega_i + cap(d_i) + sqrt(2 eta / beta) xi_i ),   xi_i ~ N(0, I)

``d_i`` is the caller's drift (``-eta N grad_i H`` for :func:`~.langevin.projected_langevin`,
``-eta grad_i H / w_i`` for :func:`~.weighted.weighted_langevin`), ``cap`` shortens each
particle's drift to at most ``max_drift`` (guards against the singular part of a pair
potential), ``beta = inf`` draws no noise (projected gradient descent) and leaves the
generator untouched.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = ["cap_drift", "transport_step"]


def cap_drift(drift: torch.Tensor, max_drift: float | None) -> torch.Tensor:
    """``drift`` (N, d) with each row's length capped at ``max_drift`` (``None``: unchanged)."""
    if max_drift is None:
        return drift
    length = drift.norm(dim=1, keepdim=True)  # (N, 1)
    return drift * (max_drift / length.clamp_min(max_drift))


def transport_step(
    omega: torch.Tensor,
    drift: torch.Tensor,
    projection: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    *,
    eta: float,
    beta: float,
    generator: torch.Generator,
    max_drift: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One projected, noisy move of the particles.

    Parameters
    ----------
    omega : (N, d)          the particles
    drift : (N, d)          the deterministic step (already scaled by ``eta``)
    projection : ``omega -> (projected omega, on-boundary mask (N,))``
    eta : float > 0         the step size (scales the noise: ``sqrt(2 eta / beta)``)
    beta : float > 0        inverse temperature; ``math.inf``: no noise
    generator : the noise's generator (one ``randn`` of shape (N, d) per noisy step)
    max_drift : optional cap on each particle's drift length

    Returns
    -------
    (new omega (N, d), on-boundary mask (N,))
    """
    proposal = omega + cap_drift(drift, max_drift)
    if math.isfinite(beta):
        noise = torch.randn(omega.shape, generator=generator, dtype=omega.dtype)  # (N, d)
        proposal = proposal + math.sqrt(2.0 * eta / beta) * noise
    return projection(proposal)

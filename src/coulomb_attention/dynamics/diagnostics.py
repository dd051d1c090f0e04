"""Diagnostics of a particle configuration: spacing, collapse and the rank of its features.

What the ablation study records per run to show *why* a variant wins or loses: repulsion
should raise the nearest-neighbour distance, lower the share of near-collapsed pairs and raise
the effective rank of the feature matrix on held-out inputs.
"""

from __future__ import annotations

import math

import torch

__all__ = ["effective_rank", "nearest_neighbour_distances", "particle_diagnostics"]


def nearest_neighbour_distances(omega: torch.Tensor) -> torch.Tensor:
    """Distance of every particle to its nearest other particle.

    Parameters
    ----------
    omega : Tensor (N, d), N >= 2

    Returns
    -------
    Tensor (N,) in float64
    """
    if omega.ndim != 2 or omega.shape[0] < 2:
        raise ValueError(f"omega must have shape (N, d) with N >= 2, got {tuple(omega.shape)}")
    w = omega.detach().double()
    dist = torch.cdist(w, w)  # (N, N)
    dist.fill_diagonal_(math.inf)
    return dist.min(dim=1).values


def effective_rank(features: torch.Tensor) -> float:
    """Effective rank (Roy & Vetterli 2007): ``exp`` of the entropy of the normalised
    singular values of ``features`` (n, M). Between 1 and ``min(n, M)``."""
    if features.ndim != 2:
        raise ValueError(f"features must have shape (n, M), got {tuple(features.shape)}")
    s = torch.linalg.svdvals(features.detach().double())
    total = s.sum()
    if not torch.isfinite(total) or total <= 0:
        return math.nan
    p = s / total
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def particle_diagnostics(omega: torch.Tensor, features: torch.Tensor | None = None,
                         collapse_fraction: float = 0.05) -> dict[str, float]:
    """Spacing and collapse of ``omega`` (N, d), and the effective rank of ``features``.

    A particle is in a near-collapsed pair when its nearest neighbour is closer than
    ``collapse_fraction * sqrt(d)`` (``sqrt(d)``: the scale of standard Gaussian draws).

    Returns
    -------
    dict with ``nn_min``, ``nn_median`` (nearest-neighbour distances), ``collapsed_share``
    (share of particles whose nearest neighbour is closer than ``collapse_fraction * sqrt(d)``)
    and, when ``features`` (n, M) is given, ``effective_rank`` and ``effective_rank_share``
    (effective rank / min(n, M)).
    """
    nn = nearest_neighbour_distances(omega)
    d = omega.shape[1]
    out = {
        "nn_min": float(nn.min()),
        "nn_median": float(nn.median()),
        "collapsed_share": float((nn < collapse_fraction * math.sqrt(d)).double().mean()),
    }
    if features is not None:
        r = effective_rank(features)
        out["effective_rank"] = r
        out["effective_rank_share"] = r / min(features.shape)
    return out

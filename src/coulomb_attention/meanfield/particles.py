"""The particle side of the mean-field comparison and the distances between a particle
cloud and a grid density.

:func:`particle_hamiltonian` gives the core particle driver the energy

    H_N(Omega) = (1/N) sum_i V(omega_i) + lam W_{N,s}(Omega)

(the core :class:`~coulomb_attention.energy.Hamiltonian` with a ``LinearPotential`` data
term), whose mean-field limit is the PDE of
:mod:`coulomb_attention.meanfield.solver`. Distances of the empirical measure of ``N``
samples to a piecewise-constant grid density:

* :func:`w1_to_grid_density` (1-D): the exact ``W1 = int |F_N - F|``;
* :func:`mmd_to_grid_density` (1-D or 2-D): the Gaussian-kernel MMD, with the density's
  cell integrals done exactly (erf) for the cross term and by Gauss-Legendre for the
  self term.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import torch

from .._validation import as_float_tensor, check_nonnegative, check_positive
from ..energy import Hamiltonian, LinearPotential, PairPotential
from ..stats import loglog_fit
from .grid import Grid

__all__ = [
    "loglog_slope",
    "mmd_to_grid_density",
    "particle_hamiltonian",
    "w1_to_grid_density",
]


def particle_hamiltonian(
    potential: Callable[[torch.Tensor], torch.Tensor],
    pair: PairPotential | None,
    lam: float,
    *,
    repulsion_energy: bool = True,
) -> Hamiltonian:
    """The core Hamiltonian ``(1/N) sum_i V(omega_i) + lam W_{N,s}`` of the particle system,
    for :func:`coulomb_attention.dynamics.learn_particles`.

    Parameters
    ----------
    potential : callable ``omega (N, dim) -> V (N,)``, differentiable (e.g. ``DataPotential``)
    pair : PairPotential or None (no repulsion)
    lam : float >= 0
    repulsion_energy : bool
        Evaluate ``lam W_{N,s}`` for the returned energy (an extra O(N^2) pass). When False
        the returned energy is the data term ``(1/N) sum V`` only and ``info["repulsion"]``
        is NaN; the gradient always includes the repulsion.
    """
    check_nonnegative("lam", lam)
    return Hamiltonian(LinearPotential(potential), pair, lam=lam,
                       pair_energy=repulsion_energy)


def _samples(name: str, samples, dim: int) -> np.ndarray:
    x = as_float_tensor(name, samples, ndim=(1, 2), dtype=torch.float64)
    if x.ndim == 1:
        x = x.unsqueeze(1)
    if x.shape[1] != dim:
        raise ValueError(f"{name} must have shape (N, {dim}), got {tuple(x.shape)}")
    return x.numpy()


def w1_to_grid_density(grid: Grid, rho: torch.Tensor, samples) -> float:
    """Exact 1-D Wasserstein-1 distance between the empirical measure of ``samples`` (N,) or
    (N, 1) and the piecewise-constant density ``rho`` (n,) on ``grid``:
    ``int_{-R}^{R} |F_N(x) - F(x)| dx`` (``F`` is piecewise linear, ``F_N`` a step function).
    Samples outside the box are clipped to it (the projection keeps them inside)."""
    if grid.dim != 1:
        raise ValueError("w1_to_grid_density is 1-D; use mmd_to_grid_density in 2-D")
    rho = grid.check_density("rho", rho).numpy()
    x = np.sort(np.clip(_samples("samples", samples, 1)[:, 0], -grid.half_width,
                        grid.half_width))
    edges = grid.edges_1d().numpy()
    cdf_edges = np.concatenate([[0.0], np.cumsum(rho) * grid.h])
    cdf_edges /= cdf_edges[-1]
    pts = np.unique(np.concatenate([edges, x]))  # sorted breakpoints in [-R, R]
    u, v = pts[:-1], pts[1:]
    fu, fv = np.interp(u, edges, cdf_edges), np.interp(v, edges, cdf_edges)
    c = np.searchsorted(x, u, side="right") / x.size  # F_N on (u, v)
    a, b = fu - c, fv - c
    width = v - u
    same = a * b >= 0
    denom = np.where(same, 1.0, np.abs(b - a))
    integral = np.where(same, 0.5 * (np.abs(a) + np.abs(b)) * width,
                        0.5 * (a * a + b * b) / denom * width)
    return float(integral.sum())


def _cell_gauss_1d(grid: Grid, x: np.ndarray, bandwidth: float) -> np.ndarray:
    """``A[i, j] = (1/h) int_{cell j} exp(-(x_i - w)^2 / (2 bw^2)) dw`` via erf, (N, n)."""
    from scipy.special import erf

    edges = grid.edges_1d().numpy()
    z = (edges[None, :] - x[:, None]) / (bandwidth * math.sqrt(2.0))  # (N, n+1)
    e = erf(z)
    return (e[:, 1:] - e[:, :-1]) * (bandwidth * math.sqrt(math.pi / 2.0) / grid.h)


@functools.lru_cache(maxsize=8)
def _cell_cell_gauss_1d(grid: Grid, bandwidth: float, q: int = 6) -> np.ndarray:
    """``K[j, k]`` = average over cells j and k of the 1-D Gaussian kernel, (n, n); cached
    (it depends on the grid only). Read-only."""
    nodes, weights = np.polynomial.legendre.leggauss(q)
    nodes, weights = 0.5 * grid.h * nodes, 0.5 * weights
    sub = (grid.centres_1d().numpy()[:, None] + nodes[None, :]).reshape(-1)  # (n q,)
    k = np.exp(-((sub[:, None] - sub[None, :]) ** 2) / (2 * bandwidth**2))
    k = k.reshape(grid.n, q, grid.n, q)
    out = np.einsum("aibj,i,j->ab", k, weights, weights)
    out.setflags(write=False)
    return out


def mmd_to_grid_density(grid: Grid, rho: torch.Tensor, samples, bandwidth: float = 0.5) -> float:
    """MMD with the Gaussian kernel ``exp(-|x - y|^2 / (2 bw^2))`` between the empirical
    measure of ``samples`` (N, dim) and the piecewise-constant density ``rho`` on ``grid``
    (the biased V-statistic, so it is a distance; ``E MMD^2 = O(1/N)`` for i.i.d. samples).

    The kernel factorises over coordinates, so every density integral is a product of
    1-D cell integrals: exact (erf) against a point, Gauss-Legendre between two cells.
    """
    check_positive("bandwidth", bandwidth)
    rho_t = grid.check_density("rho", rho)
    p = (rho_t / rho_t.sum()).numpy()  # cell masses, sum 1
    x = _samples("samples", samples, grid.dim)
    n_s = x.shape[0]
    kcc = _cell_cell_gauss_1d(grid, bandwidth)
    if grid.dim == 1:
        a = _cell_gauss_1d(grid, x[:, 0], bandwidth)  # (N, n)
        cross = (a @ p).mean()
        self_d = p @ kcc @ p
    else:
        ax = _cell_gauss_1d(grid, x[:, 0], bandwidth)
        ay = _cell_gauss_1d(grid, x[:, 1], bandwidth)
        cross = ((ax @ p) * ay).sum(1).mean()
        self_d = float(((kcc @ p @ kcc.T) * p).sum())
    xt = torch.from_numpy(x)
    self_x = 0.0
    for start in range(0, n_s, 1024):  # row chunks, in-place: O(1024 N) memory
        chunk = xt[start:start + 1024]
        k = (chunk[:, None, 0] - xt[None, :, 0]).square_()  # (chunk, N) squared distances
        for j in range(1, xt.shape[1]):
            k += (chunk[:, None, j] - xt[None, :, j]).square_()
        self_x += float(k.mul_(-0.5 / bandwidth**2).exp_().sum())
    self_x /= n_s**2
    mmd2 = self_x - 2.0 * cross + self_d
    return float(math.sqrt(max(mmd2, 0.0)))


def loglog_slope(ns, values) -> tuple[float, float]:
    """Least-squares fit ``log(value) = slope * log(N) + intercept``; returns (slope,
    intercept). Needs at least two distinct ``N`` and positive values."""
    ns = np.asarray(ns, dtype=float)
    values = np.asarray(values, dtype=float)
    if ns.shape != values.shape or ns.ndim != 1:
        raise ValueError(f"ns and values must be 1-D of the same length, got {ns.shape} "
                         f"and {values.shape}")
    if np.unique(ns).size < 2:
        raise ValueError("the slope needs at least two distinct N")
    if (ns <= 0).any() or (values <= 0).any() or not np.isfinite(values).all():
        raise ValueError("ns and values must be positive and finite for a log-log fit")
    return loglog_fit(ns, values)

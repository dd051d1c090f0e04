"""Pair potentials and the Riesz s-energy of the particle system.

``g_s(r) = (|r|^2 + eps^2)^(-s/2)`` for ``s > 0`` (Coulomb: ``s = d - 2``) and
``g_0(r) = -1/2 log(|r|^2 + eps^2)`` (logarithmic). The system energy is

    W_{N,s}(Omega) = (1/N^2) sum_{i != j} g_s(omega_i - omega_j)

with closed-form gradient ``grad_i W = (4/N^2) sum_j g'(r2_ij) (omega_i - omega_j)`` where
``g'`` is the derivative in the squared distance ``r2``. :func:`riesz_energy_naive` is the
O(N^2) loop twin used by the tests.

Weighted particles (masses ``w`` (N,), sum 1): ``W_w = sum_{i != j} w_i w_j g(omega_i - omega_j)``
(uniform ``w = 1/N`` gives ``W_{N,s}``), ``grad_i W_w = 4 w_i sum_j w_j g'(r2_ij) (omega_i -
omega_j)`` and the first variation ``dW_w / dw_i = 2 sum_{j != i} w_j g(r2_ij)``
(:func:`riesz_weight_grad`). ``weights=None`` is the unweighted path, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._validation import check_choice, check_nonnegative, check_positive

__all__ = [
    "PairPotential",
    "POTENTIALS",
    "make_potential",
    "pairwise_sq_dists",
    "riesz_energy",
    "riesz_energy_naive",
    "riesz_grad",
    "riesz_weight_grad",
    "row_block",
    "sharded_riesz_energy_and_grad",
]


@dataclass(frozen=True)
class PairPotential:
    """A radial pair potential as a function of the squared distance ``r2``.

    Attributes
    ----------
    name : str
    s : float     Riesz exponent (0 = logarithmic)
    eps : float   softening length
    """

    name: str
    s: float
    eps: float

    def value(self, r2: torch.Tensor) -> torch.Tensor:
        """``g(r2)``, elementwise."""
        r2e = r2 + self.eps**2
        if self.s == 0:
            return -0.5 * torch.log(r2e)
        return r2e.pow(-0.5 * self.s)

    def dvalue(self, r2: torch.Tensor) -> torch.Tensor:
        """``dg/d(r2)``, elementwise (negative: the potential is repulsive)."""
        r2e = r2 + self.eps**2
        if self.s == 0:
            return -0.5 / r2e
        return -0.5 * self.s * r2e.pow(-0.5 * self.s - 1.0)


def _riesz(s: float = 1.0, eps: float = 1e-2, dim: int | None = None) -> PairPotential:
    check_positive("s", s)
    return PairPotential("riesz", float(s), float(eps))


def _coulomb(s: float | None = None, eps: float = 1e-2, dim: int | None = None) -> PairPotential:
    if dim is None:
        raise ValueError("the coulomb potential needs the particle dimension dim (s = dim - 2)")
    if dim < 2:
        raise ValueError(f"the coulomb potential needs dim >= 2 (s = dim - 2), got dim={dim}")
    return PairPotential("coulomb", float(dim - 2), float(eps))


def _log(s: float | None = None, eps: float = 1e-2, dim: int | None = None) -> PairPotential:
    return PairPotential("log", 0.0, float(eps))


POTENTIALS: dict[str, Callable[..., PairPotential]] = {
    "riesz": _riesz,
    "coulomb": _coulomb,
    "log": _log,
}


def make_potential(
    name: str = "riesz", *, s: float | None = None, eps: float = 1e-2, dim: int | None = None
) -> PairPotential:
    """Build a pair potential by name (``riesz`` with exponent ``s``, ``coulomb``, ``log``).

    ``s`` is only read by ``riesz`` (default 1); ``coulomb`` uses ``s = dim - 2``.
    """
    check_choice("potential", name, POTENTIALS)
    check_nonnegative("eps", eps)
    if s is not None:
        if name == "riesz":
            check_positive("s", s)
        else:
            check_nonnegative("s", s)
    kwargs = {"eps": eps, "dim": dim}
    if name == "riesz" and s is not None:
        kwargs["s"] = s
    pot = POTENTIALS[name](**kwargs)
    if pot.s == 0 and pot.eps == 0:
        pass  # log with no softening is allowed; coincident particles give inf
    return pot


def pairwise_sq_dists(omega: torch.Tensor) -> torch.Tensor:
    """``|omega_i - omega_j|^2``, shape ``(N, N)``, with an exact zero diagonal."""
    sq = (omega * omega).sum(1)
    r2 = (sq.unsqueeze(1) + sq.unsqueeze(0) - 2.0 * omega @ omega.T).clamp_min(0.0)
    return r2.fill_diagonal_(0.0)


def _check_weights(omega: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    if weights.shape != (omega.shape[0],):
        raise ValueError(f"weights must have shape ({omega.shape[0]},), got {tuple(weights.shape)}")
    return weights.to(omega.dtype)


def riesz_energy(omega: torch.Tensor, potential: PairPotential,
                 weights: torch.Tensor | None = None) -> torch.Tensor:
    """``W_{N,s}`` of particles ``omega`` (N, d): a scalar tensor.

    With masses ``weights`` (N,): ``sum_{i != j} w_i w_j g(omega_i - omega_j)``.
    """
    n = omega.shape[0]
    if n < 2:
        return omega.new_zeros(())
    off_diag = ~torch.eye(n, dtype=torch.bool, device=omega.device)
    g = potential.value(pairwise_sq_dists(omega))
    g = torch.where(off_diag, g, torch.zeros_like(g))
    if weights is not None:
        w = _check_weights(omega, weights)
        return w @ g @ w
    return g.sum() / n**2


def riesz_grad(omega: torch.Tensor, potential: PairPotential,
               weights: torch.Tensor | None = None) -> torch.Tensor:
    """Closed-form ``grad W_{N,s}``, shape ``(N, d)`` (with ``weights`` (N,): of ``W_w``)."""
    n = omega.shape[0]
    if n < 2:
        return torch.zeros_like(omega)
    dg = potential.dvalue(pairwise_sq_dists(omega)).fill_diagonal_(0.0)  # (N, N)
    if weights is not None:
        w = _check_weights(omega, weights)
        dgw = dg * w.unsqueeze(0)  # (N, N): g'(r2_ij) w_j
        return 4.0 * w.unsqueeze(1) * (omega * dgw.sum(1, keepdim=True) - dgw @ omega)
    return (4.0 / n**2) * (omega * dg.sum(1, keepdim=True) - dg @ omega)


def riesz_weight_grad(omega: torch.Tensor, potential: PairPotential,
                      weights: torch.Tensor) -> torch.Tensor:
    """First variation of ``W_w`` in the masses: ``2 sum_{j != i} w_j g(r2_ij)``, shape (N,)."""
    n = omega.shape[0]
    w = _check_weights(omega, weights)
    if n < 2:
        return torch.zeros_like(w)
    off_diag = ~torch.eye(n, dtype=torch.bool, device=omega.device)
    g = potential.value(pairwise_sq_dists(omega))
    g = torch.where(off_diag, g, torch.zeros_like(g))
    return 2.0 * g @ w


def row_block(n: int, rank: int, world_size: int) -> range:
    """Rows ``i`` of an ``N``-row pair sum owned by ``rank`` (balanced contiguous blocks; the
    blocks of all ranks partition ``range(n)``, empty when ``rank >= n``)."""
    check_positive("world_size", world_size, integer=True)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def sharded_riesz_energy_and_grad(
    omega: torch.Tensor,
    potential: PairPotential,
    rank: int,
    world_size: int,
    reduce: Callable[[list[torch.Tensor]], list[torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``W_{N,s}`` and its gradient with the pair sum split by rows across ranks.

    Rank ``r`` computes the rows ``i`` in its :func:`row_block` of
    ``W = (1/N^2) sum_{i != j} g(|w_i - w_j|^2)`` and the matching gradient rows
    ``grad_i W = (4/N^2) sum_j g'(r2_ij) (w_i - w_j)``; ``reduce`` (an all-reduce sum) adds the
    partial energies and the zero-padded gradients. Memory and time per rank are
    O(N^2 d / world_size). With ``world_size = 1`` and the identity ``reduce`` it equals
    :func:`riesz_energy` / :func:`riesz_grad`.

    Parameters
    ----------
    omega : Tensor, shape (N, d)   replicated particles (identical on every rank)

    Returns
    -------
    energy : Tensor, shape ()
    grad : Tensor, shape (N, d)
    """
    omega = omega.detach()
    n = omega.shape[0]
    if n < 2:
        return omega.new_zeros(()), torch.zeros_like(omega)
    rows = row_block(n, rank, world_size)
    w_rows = omega[rows.start:rows.stop]  # (R, d)
    sq = (omega * omega).sum(1)  # (N,)
    r2 = (sq[rows.start:rows.stop, None] + sq[None, :] - 2.0 * w_rows @ omega.T).clamp_min(0.0)
    self_pair = torch.zeros_like(r2, dtype=torch.bool)  # (R, N): the diagonal i == j
    self_pair[torch.arange(len(rows)), torch.arange(rows.start, rows.stop)] = True
    r2 = r2.masked_fill(self_pair, 0.0)
    g = potential.value(r2).masked_fill(self_pair, 0.0)
    dg = potential.dvalue(r2).masked_fill(self_pair, 0.0)  # (R, N)
    energy = g.sum() / n**2
    grad = torch.zeros_like(omega)
    grad[rows.start:rows.stop] = (4.0 / n**2) * (w_rows * dg.sum(1, keepdim=True) - dg @ omega)
    energy, grad = reduce([energy, grad])
    return energy, grad


def riesz_energy_naive(omega: torch.Tensor, potential: PairPotential,
                       weights: torch.Tensor | None = None) -> torch.Tensor:
    """The O(N^2) double-loop twin of :func:`riesz_energy` (tests only)."""
    n = omega.shape[0]
    total = omega.new_zeros(())
    for i in range(n):
        for j in range(n):
            if i != j:
                d = omega[i] - omega[j]
                r2 = (d * d).sum()
                if potential.s == 0:
                    g = -0.5 * torch.log(r2 + potential.eps**2)
                else:
                    g = (r2 + potential.eps**2) ** (-potential.s / 2)
                total = total + (g if weights is None else weights[i] * weights[j] * g)
    return total / n**2 if weights is None else total



"""The particle Hamiltonian ``H_N(Omega) = D(Omega) + lambda W_{N,s}(Omega)``.

``D`` is a data term (:mod:`coulomb_attention.energy.terms`: minus the label alignment, the
mean-field linear potential, a teacher-attention term, ...) and ``W_{N,s}`` the Riesz pair energy
of :mod:`coulomb_attention.energy.riesz`. They are added here and only here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .._validation import check_nonnegative, check_positive
from .riesz import (
    PairPotential,
    riesz_energy,
    riesz_grad,
    riesz_weight_grad,
    sharded_riesz_energy_and_grad,
)
from .terms import Comm, DataTerm

__all__ = ["Hamiltonian"]


@dataclass
class Hamiltonian:
    """``H(omega; batches) = data_term(omega; batches) + lam * W(omega)``.

    Parameters
    ----------
    data_term : a :class:`~coulomb_attention.energy.terms.DataTerm`
    potential : PairPotential or None (``None`` or ``lam = 0``: no repulsion)
    lam : float, repulsion strength lambda >= 0
    shard_pairs : with a multi-process ``comm``, split the O(N^2) pair sum by rows across ranks
        (same energy and gradient to round-off; pays off when ``N^2 d`` is comparable to the
        data term's cost)
    pair_energy : evaluate ``W`` for the returned energy; when False the gradient still holds
        the repulsion but the energy is the data term only and ``info["repulsion"]`` is NaN
        (saves one O(N^2) pass in long simulations)
    groups : G independent particle systems moved together (e.g. the particles of G attention
        heads): ``omega`` (N, d) is G blocks of ``N / G`` rows; the data term receives
        ``omega`` as (G, N / G, d) and the repulsion acts within each block only, as the mean
        over blocks ``(1 / G) sum_g W_{N/G,s}(omega_g)``. With a data term that is the mean of
        the G per-block terms, the force on each particle (``N grad_i H``) is then exactly the
        one of G separate runs of ``N / G`` particles.
    """

    data_term: DataTerm
    potential: PairPotential | None = None
    lam: float = 0.0
    shard_pairs: bool = True
    pair_energy: bool = True
    groups: int = 1

    def __post_init__(self) -> None:
        check_nonnegative("lam", self.lam)
        check_positive("groups", self.groups, integer=True)
        if not hasattr(self.data_term, "value_and_grad"):
            raise TypeError(f"data_term must have a value_and_grad method, got "
                            f"{type(self.data_term).__name__}")

    @property
    def has_repulsion(self) -> bool:
        return self.potential is not None and self.lam > 0

    def value_and_grad(
        self, omega: torch.Tensor, batches: Sequence = (), comm: Comm | None = None, *,
        weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """Energy (scalar), gradient (N, d) and the named parts (data-term info, ``repulsion``).

        ``batches`` is what the data term reads (a list of batches); ``comm`` makes the data
        statistics (and, with ``shard_pairs``, the pair sum) exact across processes.

        ``weights`` (N,), masses summing to 1 (Wasserstein-Fisher-Rao particles): the energy of
        the weighted measure, ``D_w + lam sum_{i != j} w_i w_j g(omega_i - omega_j)``; the
        gradient slot is then ``(grad_omega (N, d), grad_weights (N,))`` with
        ``grad_weights[i] = dH / dw_i`` (the first variation). One group only; the pair sum is
        not sharded.
        """
        if weights is not None:
            return self._weighted_value_and_grad(omega, weights, batches, comm)
        G = self.groups
        if G > 1:
            if omega.ndim != 2 or omega.shape[0] % G:
                raise ValueError(f"omega must have shape (N, d) with N divisible by groups={G}, "
                                 f"got {tuple(omega.shape)}")
            value, grad, info = self.data_term.value_and_grad(
                omega.view(G, omega.shape[0] // G, omega.shape[1]), batches, comm)
            grad = grad.reshape(omega.shape)
        else:
            value, grad, info = self.data_term.value_and_grad(omega, batches, comm)
        energy = value.to(omega.dtype)
        w = omega.new_zeros(())
        if self.has_repulsion and G > 1:  # within blocks, the mean over blocks (not sharded)
            blocks = omega.detach().view(G, -1, omega.shape[1])
            grad_w = torch.cat([riesz_grad(b, self.potential) for b in blocks]) / G
            w = sum(riesz_energy(b, self.potential) for b in blocks) / G
            grad = grad + self.lam * grad_w.to(grad.dtype)
            energy = energy + self.lam * w.to(omega.dtype)
        elif self.has_repulsion:
            om = omega.detach()
            if comm is not None and comm.world_size > 1 and self.shard_pairs:
                w, grad_w = sharded_riesz_energy_and_grad(om, self.potential, comm.rank,
                                                          comm.world_size, comm.reduce)
            else:
                grad_w = riesz_grad(om, self.potential)
                w = riesz_energy(om, self.potential) if self.pair_energy else \
                    omega.new_tensor(float("nan"))
            grad = grad + self.lam * grad_w.to(grad.dtype)
            if self.pair_energy or (comm is not None and comm.world_size > 1):
                energy = energy + self.lam * w.to(omega.dtype)
        return energy, grad, {**info, "repulsion": float(w)}

    def _weighted_value_and_grad(self, omega, weights, batches, comm):
        if self.groups != 1:
            raise ValueError(f"weighted particles need groups=1, got groups={self.groups}")
        if weights.shape != (omega.shape[0],):
            raise ValueError(f"weights must have shape ({omega.shape[0]},), got "
                             f"{tuple(weights.shape)}")
        value, (grad, grad_w), info = self.data_term.value_and_grad(
            omega, batches, comm, weights=weights)
        energy = value.to(omega.dtype)
        grad_w = grad_w.to(omega.dtype)
        w = omega.new_zeros(())
        if self.has_repulsion:
            om, mass = omega.detach(), weights.detach()
            w = riesz_energy(om, self.potential, mass)
            grad = grad + self.lam * riesz_grad(om, self.potential, mass).to(grad.dtype)
            grad_w = grad_w + self.lam * riesz_weight_grad(om, self.potential, mass)
            energy = energy + self.lam * w.to(omega.dtype)
        return energy, (grad, grad_w), {**info, "repulsion": float(w)}

    __call__ = value_and_grad

"""The particle Hamiltonian ``H_N(Omega) = D(Omega) + lambda W_{N,s}(Omega)``.

``D`` is a data term (:mod:`coulomb_attention.energy.terms`: minus the label alignment, the
mean-field linear potential, a teacher-attention term, ...) and ``W_{N,s}`` the Riesz pair energy
of :mod:`coulomb_attention.energy.riesz`. They are added here and only here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .._validation import check_nonnegative
from .riesz import PairPotential, riesz_energy, riesz_grad, sharded_riesz_energy_and_grad
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
    """

    data_term: DataTerm
    potential: PairPotential | None = None
    lam: float = 0.0
    shard_pairs: bool = True
    pair_energy: bool = True

    def __post_init__(self) -> None:
        check_nonnegative("lam", self.lam)
        if not hasattr(self.data_term, "value_and_grad"):
            raise TypeError(f"data_term must have a value_and_grad method, got "
                            f"{type(self.data_term).__name__}")

    @property
    def has_repulsion(self) -> bool:
        return self.potential is not None and self.lam > 0

    def value_and_grad(
        self, omega: torch.Tensor, batches: Sequence = (), comm: Comm | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """Energy (scalar), gradient (N, d) and the named parts (data-term info, ``repulsion``).

        ``batches`` is what the data term reads (a list of batches); ``comm`` makes the data
        statistics (and, with ``shard_pairs``, the pair sum) exact across processes.
        """
        value, grad, info = self.data_term.value_and_grad(omega, batches, comm)
        energy = value.to(omega.dtype)
        w = omega.new_zeros(())
        if self.has_repulsion:
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

    __call__ = value_and_grad

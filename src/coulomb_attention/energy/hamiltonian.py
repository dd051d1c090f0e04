"""The particle Hamiltonian ``H_N(Omega) = -A(Omega) + lambda W_{N,s}(Omega)``.

The data term (alignment) and the interaction (Riesz pair energy) are added here and only here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .._validation import check_nonnegative
from .alignment import alignment_value_and_grad
from .riesz import PairPotential, riesz_energy, riesz_grad

__all__ = ["Hamiltonian"]


@dataclass
class Hamiltonian:
    """``H(omega; batches) = -A(omega; batches) + lam * W(omega)``.

    Parameters
    ----------
    features : callable ``features(inputs, omega) -> Phi (B, N)``
    potential : PairPotential or None (``None`` or ``lam = 0``: no repulsion)
    lam : float, repulsion strength lambda >= 0
    center : centered alignment (default)
    reduce : cross-process sum for the data statistics (see ``alignment_value_and_grad``)
    """

    features: Callable
    potential: PairPotential | None = None
    lam: float = 0.0
    center: bool = True
    reduce: Callable | None = None

    def __post_init__(self) -> None:
        check_nonnegative("lam", self.lam)

    def value_and_grad(
        self, omega: torch.Tensor, batches: Iterable
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """Energy (scalar), gradient (N, d) and the parts ``{alignment, repulsion}``."""
        a, grad_a = alignment_value_and_grad(
            omega, batches, self.features, center=self.center, reduce=self.reduce
        )
        grad = -grad_a
        w = omega.new_zeros(())
        if self.potential is not None and self.lam > 0:
            w = riesz_energy(omega.detach(), self.potential)
            grad = grad + self.lam * riesz_grad(omega.detach(), self.potential)
        energy = -a.to(omega.dtype) + self.lam * w
        return energy, grad, {"alignment": float(a), "repulsion": float(w)}

    __call__ = value_and_grad

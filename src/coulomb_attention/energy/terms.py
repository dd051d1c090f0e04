"""Data terms of the Hamiltonian: objects with ``value_and_grad(omega, batches, comm)``.

A data term is the part of ``H_N`` that sees data. Each is built from additive statistics (sums
over examples), so it accumulates over mini-batches and, with a :class:`Comm`, all-reduces
across processes exactly. The interaction (pair potential) is added to it in one place,
:class:`coulomb_attention.energy.Hamiltonian`.

* :class:`LabelAlignment`: ``-A(Omega)``, minus the centered kernel-target alignment of the
  random-feature kernel with the labels (phase A, the estimators).
* :class:`LinearPotential`: ``(1/N) sum_i V(omega_i)``, the linear-in-mu data potential of the
  mean-field limit (docs/DESIGN.md, "Mean-field limit"); it sees no batches.
* ``coulomb_attention.energy.teacher``-style terms (attention distillation) follow the same
  protocol.

Every term returns ``(value (), grad (N, d), info)`` where ``value`` is its contribution to the
energy (lower is better) and ``info`` holds named floats for the trace.

Weighted particles (Wasserstein-Fisher-Rao, :mod:`coulomb_attention.dynamics.weighted`): a term
that accepts the keyword ``weights`` (masses (N,), ``w_i > 0``, sum 1) evaluates the energy of
the weighted empirical measure ``sum_i w_i delta_{omega_i}`` and returns
``(value, (grad_omega (N, d), grad_weights (N,)), info)``; ``grad_weights[i] = dH / dw_i`` is
the first variation at ``omega_i``. Uniform masses ``1 / N`` give the unweighted energy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from .alignment import alignment_value_and_grad

__all__ = ["Comm", "DataTerm", "LabelAlignment", "LinearPotential"]

Reduce = Callable[[list[torch.Tensor]], list[torch.Tensor]]


@dataclass(frozen=True)
class Comm:
    """The cross-process hook of the particle system (data parallelism).

    Attributes
    ----------
    reduce : sums a list of tensors over processes and returns the sums (``all_reduce``)
    rank, world_size : this process and the number of processes
    """

    reduce: Reduce
    rank: int = 0
    world_size: int = 1


@runtime_checkable
class DataTerm(Protocol):
    """``value_and_grad(omega (N, d), batches, comm) -> (value (), grad (N, d), info)``."""

    def value_and_grad(
        self, omega: torch.Tensor, batches: Sequence, comm: Comm | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]: ...


@dataclass
class LabelAlignment:
    """``-A(Omega)``: minus the kernel-target alignment of ``K = Phi Phi^T`` with ``Y Y^T``.

    Parameters
    ----------
    features : ``features(inputs, omega) -> Phi (B, N)``, any differentiable map (e.g. the
        masked sequence mean of a layer's features)
    center : centered alignment (Cortes et al.; default) or raw

    ``batches`` are ``(inputs, Y (B, C))`` pairs; the value is the exact alignment of all of
    them (streamed statistics, :func:`alignment_value_and_grad`), all-reduced with ``comm``.
    """

    features: Callable
    center: bool = True

    def value_and_grad(self, omega, batches, comm=None, *, weights=None):
        reduce = None if comm is None else comm.reduce
        if weights is not None:  # features scaled by sqrt(N w_i): K = sum_i w_i phi_i phi_i^T
            a, grad, grad_w = alignment_value_and_grad(
                omega, batches, self.features, center=self.center, reduce=reduce,
                weights=weights)
            return -a.to(omega.dtype), (-grad, -grad_w), {"alignment": float(a)}
        a, grad = alignment_value_and_grad(
            omega, batches, self.features, center=self.center, reduce=reduce,
        )
        return -a.to(omega.dtype), -grad, {"alignment": float(a)}


@dataclass
class LinearPotential:
    """``(1/N) sum_i V(omega_i)``, the linear data term of the mean-field limit.

    Parameters
    ----------
    potential : ``V(omega (N, d)) -> (N,)``, differentiable (e.g. a ``DataPotential``)

    With ``weights`` (N,) the value is ``sum_i w_i V(omega_i)``, its omega-gradient
    ``w_i grad V(omega_i)`` and its first variation in the masses ``V(omega_i)``.
    """

    potential: Callable[[torch.Tensor], torch.Tensor]

    def value_and_grad(self, omega, batches: Iterable | None = None, comm=None, *,
                       weights=None):
        if weights is not None:
            with torch.enable_grad():
                om = omega.detach().requires_grad_(True)
                v = self.potential(om)  # (N,)
                value = (weights.detach().to(v.dtype) * v).sum()
                (grad,) = torch.autograd.grad(value, om)
            value = value.detach()
            return value, (grad, v.detach()), {"data_term": float(value)}
        with torch.enable_grad():
            w = omega.detach().requires_grad_(True)
            value = self.potential(w).mean()
            (grad,) = torch.autograd.grad(value, w)
        value = value.detach()
        return value, grad, {"data_term": float(value)}

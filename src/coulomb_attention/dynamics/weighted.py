"""Weighted particles: Wasserstein-Fisher-Rao (WFR) dynamics with birth-death.

Each particle carries a mass ``w_i > 0`` (``sum_i w_i = 1``; uniform ``1/N`` is the
unweighted system); the energy ``H(omega, w)`` is that of the weighted empirical measure
``mu = sum_i w_i delta_{omega_i}`` (kernel ``sum_i w_i phi_i phi_i^T``, pair energy
``sum_{i != j} w_i w_j g(omega_i - omega_j)``; :class:`~coulomb_attention.energy.Hamiltonian`
with ``weights=``). One step moves positions and masses:

    transport  omega_i <- Proj_K( omega_i - eta grad_{omega_i} H / w_i + sqrt(2 eta / beta) xi_i )
    reaction   w_i <- w_i exp(-tau (v_i - sum_j w_j v_j)),  v_i = dH / dw_i,  then w <- w / sum w
    birth-death  a particle with w_i < w_min jumps to omega_j (+ jitter), j drawn with
               probability w_j among the others; i and j then share w_i + w_j equally

``(1 / w_i) grad_{omega_i} H`` is the gradient of the first variation ``dH/dmu`` at ``omega_i``
(at uniform masses it is the ``N grad_i H`` of :mod:`~coulomb_attention.dynamics.langevin`, and
with ``tau = 0`` and no deaths the step is the unweighted one, noise stream included). The
reaction is a mirror-descent (exponentiated-gradient) step of the Fisher-Rao flow
``d w_i / dt = -w_i (v_i - <v>_w)``; for a linear energy ``sum_i w_i V(omega_i)`` and no
transport it is exact: ``w_i(k) ∝ w_i(0) exp(-k tau V(omega_i))`` (while no mass reaches the
floor: a mass never falls below ``e^(log tiny + 50)`` times the heaviest, so it cannot underflow
to 0, where the transport's ``1 / w_i`` would be undefined; without birth-death a strong
reaction gets there). The reaction renormalises (total mass kept to rounding); birth-death
keeps the total mass exactly (up to rounding).

Background: conic particle gradient descent (Chizat 2019), neuron birth-death (Rotskoff,
Jelassi, Bruna & Vanden-Eijnden 2019), birth-death accelerated Langevin (Lu, Lu & Nolen 2019).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._validation import check_nonnegative, check_positive
from .langevin import NonFiniteEnergyError
from .transport import transport_step

__all__ = [
    "Reaction",
    "ReactionNormalizer",
    "WeightedState",
    "birth_death",
    "uniform_weights",
    "weighted_langevin",
]

WeightedEnergyGradFn = Callable[
    [torch.Tensor, torch.Tensor, object],
    tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], dict],
]


@dataclass(frozen=True)
class Reaction:
    """The mass (Fisher-Rao) part of a weighted run.

    Attributes
    ----------
    tau : float >= 0         reaction step (``0``: masses only change by birth-death); it
                             follows the shape of the step-size schedule (``tau_k = tau eta_k /
                             eta_0``)
    w_min : float >= 0       death threshold in units of ``1/N`` (``0.1``: ``w_i < 0.1 / N``)
    jitter : float >= 0      standard deviation of the jump's offset (particle units)
    normalize : bool         divide ``v - <v>_w`` by a running weighted RMS, so ``tau`` is the
                             RMS change of ``log w_i`` per step whatever the energy's scale
    transport : bool         ``False``: the positions stay put (no drift, no noise) and move
                             only by birth-death jumps: pure Fisher-Rao reweighting, the
                             fixed-position case that importance weighting belongs to
    """

    tau: float = 0.05
    w_min: float = 0.1
    jitter: float = 0.01
    normalize: bool = True
    transport: bool = True

    def __post_init__(self) -> None:
        check_nonnegative("tau", self.tau)
        check_nonnegative("w_min", self.w_min)
        check_nonnegative("jitter", self.jitter)
        if self.w_min >= 1:
            raise ValueError(f"w_min must be < 1 (units of 1/N), got {self.w_min}")
        for name in ("normalize", "transport"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")


@dataclass
class WeightedState:
    """Particles (N, d), masses (N,), the number of steps taken and the generator."""

    omega: torch.Tensor
    weights: torch.Tensor
    step: int
    generator: torch.Generator
    births: int = 0


class ReactionNormalizer:
    """Divides the first variation by a running weighted RMS of ``v - <v>_w``."""

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        self.sq: float | None = None

    def __call__(self, v: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        centred = v - (weights * v).sum()
        sq = float((weights * centred * centred).sum())
        self.sq = sq if self.sq is None else self.decay * self.sq + (1 - self.decay) * sq
        return v / math.sqrt(max(self.sq, 1e-300))


def uniform_weights(n: int, dtype=torch.float64, device=None) -> torch.Tensor:
    """Masses ``1/N``, shape (N,)."""
    return torch.full((n,), 1.0 / n, dtype=dtype, device=device)


def _check_weights(weights: torch.Tensor, n: int) -> torch.Tensor:
    if weights.shape != (n,):
        raise ValueError(f"weights must have shape ({n},), got {tuple(weights.shape)}")
    if not bool(torch.isfinite(weights).all()) or bool((weights <= 0).any()):
        raise ValueError("weights must be finite and > 0")
    total = float(weights.sum())
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"weights must sum to 1, got {total}")
    return weights / weights.sum()


def birth_death(
    omega: torch.Tensor,
    weights: torch.Tensor,
    w_min: float,
    generator: torch.Generator,
    jitter: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Move every particle lighter than ``w_min`` (absolute) onto a heavier one.

    In index order, particle ``i`` with ``w_i < w_min`` jumps to ``omega_j + jitter xi``
    with ``j`` drawn with probability proportional to ``w_j`` among the particles at or above
    the threshold; ``i`` and ``j`` then carry ``(w_i + w_j) / 2`` each (total mass kept).

    Parameters
    ----------
    omega : Tensor (N, d);  weights : Tensor (N,)

    Returns
    -------
    omega (N, d), weights (N,), number of births
    """
    light = torch.nonzero(weights < w_min).flatten().tolist()
    if not light or len(light) == weights.shape[0]:
        return omega, weights, 0
    omega, weights = omega.clone(), weights.clone()
    births = 0
    for i in light:
        if weights[i] >= w_min:  # already rescued by an earlier split
            continue
        donors = (weights >= w_min).to(weights.dtype) * weights
        j = int(torch.multinomial(donors, 1, generator=generator))
        share = 0.5 * (weights[i] + weights[j])
        weights[i] = share
        weights[j] = share
        offset = torch.randn(omega.shape[1], generator=generator, dtype=omega.dtype)
        omega[i] = omega[j] + jitter * offset
        births += 1
    return omega, weights, births


def weighted_langevin(
    energy_grad_fn: WeightedEnergyGradFn,
    projection: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    *,
    eta: float = 1e-2,
    beta: float = math.inf,
    tau: float = 0.05,
    w_min: float = 0.0,
    jitter: float = 0.0,
    max_drift: float | None = None,
    transport: bool = True,
):
    """Build ``(init_fn, step_fn)`` of the weighted (WFR) dynamics.

    Parameters
    ----------
    energy_grad_fn : ``(omega (N, d), weights (N,), batch) -> (energy, (grad_omega (N, d),
        grad_weights (N,)), info)``; ``grad_weights`` is the first variation ``dH / dw_i``
    projection : ``omega -> (projected omega, on-boundary mask (N,))``
    eta : transport step size > 0;  beta : inverse temperature (``inf``: no noise)
    tau : reaction step >= 0 (``0``: no reaction)
    w_min : death threshold in units of ``1/N`` (``0``: no birth-death)
    jitter : standard deviation of a newborn particle's offset
    max_drift : optional cap on the length of each particle's transport step
    transport : ``False``: no transport (no drift, no noise); positions change only by
        birth-death

    Returns
    -------
    init_fn(omega, generator, weights=None) -> WeightedState   (``None``: uniform masses)
    step_fn(state, batch=None, *, eta=None, beta=None, tau=None) -> (WeightedState, info)
    """
    check_positive("eta", eta)
    check_positive("beta", beta, allow_inf=True)
    check_nonnegative("tau", tau)
    check_nonnegative("w_min", w_min)
    check_nonnegative("jitter", jitter)
    if max_drift is not None:
        check_positive("max_drift", max_drift)

    def init_fn(omega: torch.Tensor, generator: torch.Generator,
                weights: torch.Tensor | None = None) -> WeightedState:
        if omega.ndim != 2:
            raise ValueError(f"omega must have shape (N, d), got {tuple(omega.shape)}")
        n = omega.shape[0]
        weights = (uniform_weights(n, omega.dtype, omega.device) if weights is None
                   else _check_weights(weights.detach().to(omega.dtype).clone(), n))
        omega, _ = projection(omega.detach().clone())
        return WeightedState(omega=omega, weights=weights, step=0, generator=generator)

    def step_fn(state: WeightedState, batch=None, *, eta: float | None = eta, beta=beta,
                tau: float | None = tau):
        eta_ = check_positive("eta", eta)
        beta_ = check_positive("beta", beta, allow_inf=True)
        tau_ = check_nonnegative("tau", tau)
        omega, w = state.omega, state.weights
        n = omega.shape[0]
        energy, (grad, v), info = energy_grad_fn(omega, w, batch)
        finite = bool(torch.isfinite(energy)) and bool(torch.isfinite(grad).all()) and \
            bool(torch.isfinite(v).all())
        if not finite:
            raise NonFiniteEnergyError(
                f"non-finite energy or gradient at weighted step {state.step} "
                f"(energy={float(energy)}); lower eta or tau, raise eps, or check the data")
        # transport: the gradient of the first variation, grad_i H / w_i
        if transport:
            new_omega, on_boundary = transport_step(omega, -eta_ * grad / w.unsqueeze(1),
                                                    projection, eta=eta_, beta=beta_,
                                                    generator=state.generator,
                                                    max_drift=max_drift)
        else:
            new_omega, on_boundary = projection(omega)
        # reaction: exponentiated-gradient step on the simplex
        new_w = w
        if tau_ > 0:
            log_w = w.log() - tau_ * (v - (w * v).sum())
            # floored so no mass underflows to exactly 0 (the transport divides by w_i):
            # at most e^(log tiny + 50) of the heaviest (float64 ~1e-286, float32 ~6e-17)
            floor = math.log(torch.finfo(log_w.dtype).tiny) + 50.0
            new_w = torch.exp((log_w - log_w.max()).clamp_min(floor))
            new_w = new_w / new_w.sum()
        births = 0
        if w_min > 0:
            new_omega, new_w, births = birth_death(new_omega, new_w, w_min / n,
                                                   state.generator, jitter)
            if births:
                new_omega, _ = projection(new_omega)
        info = dict(info)
        info.update(
            step=state.step,
            energy=float(energy),
            boundary_fraction=float(on_boundary.float().mean()),
            grad_norm=float(grad.norm()),
            eta=eta_,
            beta=beta_,
            tau=tau_,
            births=births,
            ess=float(1.0 / (new_w * new_w).sum()) / n,  # effective sample size / N
            mass=float(new_w.sum()),
        )
        new_state = WeightedState(new_omega, new_w, state.step + 1, state.generator,
                                  state.births + births)
        return new_state, info

    return init_fn, step_fn

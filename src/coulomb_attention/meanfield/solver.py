"""Finite-volume solver of the McKean-Vlasov equation on the projection box, as
``(init_fn, step_fn)`` (the same protocol as :func:`coulomb_attention.dynamics.projected_langevin`).

    d rho / dt = div( rho grad U[rho] ) + D Laplace(rho),   U[rho] = V + 2 lam (g_s * rho),
    D = 1 / beta,   zero flux through the faces of [-R, R]^dim,

the mean-field limit of ``omega_i <- Proj(omega_i - eta N grad_i H_N + sqrt(2 eta/beta) xi)``
with ``H_N = (1/N) sum_i V(omega_i) + lam W_{N,s}`` and time ``t = eta * steps``. It is the
Wasserstein gradient flow of

    F(rho) = int V rho + lam int int g_s rho rho + D int rho log rho.

Discretisation: cell-centred finite volumes. The flux through the face between cells L and R
(along one axis, ``z = (U_R - U_L) / D``) is Scharfetter-Gummel,

    J = (D / h) [ B(z) rho_L - B(-z) rho_R ],    B(z) = z / (e^z - 1),

which is exact for the discrete Gibbs state ``rho ~ exp(-U / D)`` and, for any ``D``, makes
``dF/dt <= 0`` for the semi-discrete scheme (``J`` has the sign opposite to the jump of
``U + D log rho``); ``upwind`` (first-order upwind drift + central diffusion) is the simpler
alternative, and the only one at ``beta = inf``. Boundary faces carry zero flux, so the
update is a sum of face differences and mass is conserved to round-off. Time stepping is
explicit Euler with the positivity (CFL) step ``dt <= cfl / max_i (outflow rate of cell i)``,
so ``rho`` stays >= 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .._validation import check_choice, check_nonnegative, check_positive
from .grid import Grid
from .potentials import GridInteraction

__all__ = [
    "FLUXES",
    "MeanFieldState",
    "bernoulli",
    "free_energy",
    "integrate",
    "mckean_vlasov",
]


def bernoulli(z: torch.Tensor) -> torch.Tensor:
    """``B(z) = z / (e^z - 1)`` with ``B(0) = 1``, stable for large ``|z|``."""
    small = z.abs() < 1e-6
    zs = torch.where(small, torch.ones_like(z), z)
    out = zs / torch.expm1(zs)
    return torch.where(small, 1.0 - 0.5 * z, out)


def _sg(d_u: torch.Tensor, diff: float, h: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Scharfetter-Gummel coefficients ``(a, b)`` with ``J = a rho_L - b rho_R``."""
    if diff == 0:
        return _upwind(d_u, diff, h)
    z = d_u / diff
    return (diff / h) * bernoulli(z), (diff / h) * bernoulli(-z)


def _upwind(d_u: torch.Tensor, diff: float, h: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Upwind drift ``v = -dU/h`` plus central diffusion: ``J = a rho_L - b rho_R``."""
    v = -d_u / h
    return v.clamp_min(0.0) + diff / h, (-v).clamp_min(0.0) + diff / h


FLUXES: dict[str, Callable[[torch.Tensor, float, float], tuple[torch.Tensor, torch.Tensor]]] = {
    "sg": _sg,
    "upwind": _upwind,
}


@dataclass
class MeanFieldState:
    """Density cell values ``rho`` (``grid.shape``), time ``t`` and steps taken."""

    rho: torch.Tensor
    t: float
    step: int


def _entropy(rho: torch.Tensor) -> torch.Tensor:
    return torch.where(rho > 0, rho * torch.log(rho.clamp_min(1e-300)), torch.zeros_like(rho))


def free_energy(
    grid: Grid,
    rho: torch.Tensor,
    v_grid: torch.Tensor,
    interaction: GridInteraction | None,
    lam: float,
    beta: float,
) -> dict[str, float]:
    """Discrete ``F(rho)`` and its three terms.

    ``potential = h^dim sum V rho``, ``interaction = lam h^dim sum rho (g*rho)``,
    ``entropy = (1/beta) h^dim sum rho log rho`` (0 at ``beta = inf``).

    Returns
    -------
    dict with float ``free_energy``, ``potential``, ``interaction``, ``entropy``.
    """
    vol = grid.cell_volume
    pot = float((v_grid * rho).sum() * vol)
    inter = 0.0
    if interaction is not None and lam != 0:
        inter = float(lam * (rho * interaction(rho)).sum() * vol)
    ent = 0.0 if math.isinf(beta) else float(_entropy(rho).sum() * vol / beta)
    return {"free_energy": pot + inter + ent, "potential": pot, "interaction": inter,
            "entropy": ent}


def _potential_on_grid(grid: Grid, potential) -> torch.Tensor:
    if isinstance(potential, torch.Tensor):
        v = potential.to(torch.float64)
        if tuple(v.shape) != grid.shape:
            raise ValueError(f"potential on the grid must have shape {grid.shape}, "
                             f"got {tuple(v.shape)}")
    elif callable(potential):
        with torch.no_grad():
            v = potential(grid.points(torch.float64)).reshape(grid.shape).to(torch.float64)
    else:
        raise TypeError("potential must be a callable omega (M, dim) -> (M,) or a tensor of "
                        f"the grid's shape, got {type(potential).__name__}")
    if not bool(torch.isfinite(v).all()):
        raise ValueError("the potential is not finite on the grid")
    return v


def mckean_vlasov(
    grid: Grid,
    potential,
    *,
    interaction: GridInteraction | None = None,
    lam: float = 0.0,
    beta: float = 1.0,
    flux: str = "sg",
    cfl: float = 0.5,
    track_free_energy: bool = True,
):
    """Build ``(init_fn, step_fn)`` for the McKean-Vlasov equation on ``grid``.

    Parameters
    ----------
    grid : Grid
    potential : callable ``omega (M, dim) -> V (M,)`` or tensor of ``grid.shape``
        The confining/data potential ``V`` (e.g. :class:`DataPotential`), evaluated at centres.
    interaction : GridInteraction, optional
        ``rho -> g_s * rho``; ``None`` (or ``lam = 0``): no interaction.
    lam : float >= 0
        Repulsion strength ``lambda``; the drift potential is ``V + 2 lam g_s * rho``.
    beta : float > 0 (``inf`` allowed)
        Inverse temperature, diffusion ``1/beta``.
    flux : ``"sg"`` (Scharfetter-Gummel, default) or ``"upwind"``
    cfl : float in (0, 1]
        Fraction of the positivity-limited explicit step.
    track_free_energy : bool
        Put ``F`` of the new state into each step's info (one more convolution per step).

    Returns
    -------
    init_fn(rho0) -> MeanFieldState
    step_fn(state, batch=None, *, dt=None, beta=None, until=None) -> (MeanFieldState, info)
        ``dt=None``: one CFL step (not past ``until`` when given); ``dt`` given: advance
        exactly ``dt`` in as many CFL-limited sub-steps as needed. ``info`` holds ``t``,
        ``dt``, ``n_substeps``, ``mass``, ``min_rho`` and (if tracked) the free energy terms.
    """
    if not isinstance(grid, Grid):
        raise TypeError(f"grid must be a Grid, got {type(grid).__name__}")
    check_nonnegative("lam", lam)
    check_positive("beta", beta, allow_inf=True)
    check_choice("flux", flux, FLUXES)
    check_positive("cfl", cfl)
    if cfl > 1:
        raise ValueError(f"cfl must be in (0, 1] to keep the density positive, got {cfl}")
    if interaction is not None and interaction.grid != grid:
        raise ValueError("interaction was built for a different grid")
    v_grid = _potential_on_grid(grid, potential)
    h, dim = grid.h, grid.dim
    default_beta = beta

    def drift_potential(rho: torch.Tensor) -> torch.Tensor:
        if interaction is None or lam == 0:
            return v_grid
        return v_grid + 2.0 * lam * interaction(rho)

    def rates(rho: torch.Tensor, diff: float):
        """Time derivative of rho and the largest outflow rate (for the CFL step)."""
        u = drift_potential(rho)
        drho = torch.zeros_like(rho)
        out_rate = torch.zeros_like(rho)
        for ax in range(dim):
            n = rho.shape[ax]
            rho_l, rho_r = rho.narrow(ax, 0, n - 1), rho.narrow(ax, 1, n - 1)
            d_u = u.narrow(ax, 1, n - 1) - u.narrow(ax, 0, n - 1)
            a, b = FLUXES[flux](d_u, diff, h)
            j = a * rho_l - b * rho_r  # flux through interior faces, + direction of axis
            pad = [0, 0] * dim
            pad[2 * (dim - 1 - ax)] = 1
            pad[2 * (dim - 1 - ax) + 1] = 1
            j_all = torch.nn.functional.pad(j, pad)  # zero flux on the two boundary faces
            drho = drho - (j_all.narrow(ax, 1, n) - j_all.narrow(ax, 0, n)) / h
            out_rate = out_rate + (torch.nn.functional.pad(a, pad).narrow(ax, 1, n)
                                   + torch.nn.functional.pad(b, pad).narrow(ax, 0, n)) / h
        return drho, float(out_rate.max())

    def init_fn(rho0) -> MeanFieldState:
        rho = grid.check_density("rho0", rho0)
        return MeanFieldState(rho=rho / grid.mass(rho), t=0.0, step=0)

    def step_fn(state: MeanFieldState, batch=None, *, dt: float | None = None,
                beta: float | None = None, until: float | None = None):
        beta_ = default_beta if beta is None else check_positive("beta", beta, allow_inf=True)
        diff = 0.0 if math.isinf(beta_) else 1.0 / beta_
        rho, t = state.rho, state.t
        if dt is not None:
            check_positive("dt", dt)
            remaining = float(dt)
        n_sub = 0
        used = 0.0
        while True:
            drho, max_rate = rates(rho, diff)
            dt_cfl = cfl / max_rate if max_rate > 0 else math.inf
            capped = False
            if dt is None:
                step = dt_cfl
                if until is not None and until - t <= step:
                    step, capped = until - t, True
                if not math.isfinite(step) or step <= 0:
                    raise ValueError("no finite time step: give dt (the density is at rest "
                                     "with no diffusion) or an `until` later than t")
            else:
                step = min(dt_cfl, remaining)
            rho = (rho + step * drho).clamp_min(0.0)  # clamp only removes round-off (-1e-18)
            t += step
            used += step
            n_sub += 1
            if dt is None:
                if capped:
                    t = float(until)
                break
            remaining -= step
            if remaining <= 1e-15 * max(1.0, abs(float(dt))):
                t = state.t + float(dt)
                break
        info = {"t": t, "dt": used, "n_substeps": n_sub, "beta": beta_,
                "mass": float(grid.mass(rho)), "min_rho": float(rho.min())}
        if track_free_energy:
            info.update(free_energy(grid, rho, v_grid, interaction, lam, beta_))
        return MeanFieldState(rho=rho, t=t, step=state.step + n_sub), info

    step_fn.v_grid = v_grid  # the data potential on the grid, for plots and Gibbs checks
    return init_fn, step_fn


def integrate(
    state: MeanFieldState,
    step_fn,
    times: Iterable[float],
    *,
    callback: Callable[[MeanFieldState, dict], None] | None = None,
) -> tuple[dict[float, MeanFieldState], list[dict]]:
    """Run CFL steps until each of ``times`` (ascending, >= state.t) is hit exactly.

    Returns
    -------
    snapshots : dict time -> MeanFieldState at that time
    trace : list of the info dicts of every step
    """
    times = sorted(float(t) for t in times)
    if times and times[0] < state.t - 1e-12:
        raise ValueError(f"times must be >= the current time {state.t}, got {times[0]}")
    snapshots: dict[float, MeanFieldState] = {}
    trace: list[dict] = []
    for target in times:
        while state.t < target - 1e-12 * max(1.0, target):
            state, info = step_fn(state, until=target)
            trace.append(info)
            if callback is not None:
                callback(state, info)
        snapshots[target] = state
    return snapshots, trace

"""McKean-Vlasov (mean-field) solver on a grid, its free energy, and the particle comparison.

``d rho/dt = div(rho grad(V + 2 lam g_s * rho)) + (1/beta) Laplace(rho)`` on ``[-R, R]^dim``
(dim 1 or 2) with no-flux faces: the N -> infinity limit of the projected Langevin dynamics
of ``H_N = (1/N) sum_i V(omega_i) + lam W_{N,s}`` at time ``t = eta * steps``.
"""

from .grid import Grid, gaussian_density, normalize, sample_density
from .particles import (
    loglog_slope,
    mmd_to_grid_density,
    particle_hamiltonian,
    w1_to_grid_density,
)
from .potentials import (
    DATA_FEATURES,
    DataPotential,
    GridInteraction,
    QuadraticPotential,
)
from .solver import (
    FLUXES,
    MeanFieldState,
    bernoulli,
    free_energy,
    integrate,
    mckean_vlasov,
)

__all__ = [
    "DATA_FEATURES",
    "FLUXES",
    "DataPotential",
    "Grid",
    "GridInteraction",
    "MeanFieldState",
    "QuadraticPotential",
    "bernoulli",
    "free_energy",
    "gaussian_density",
    "integrate",
    "loglog_slope",
    "mckean_vlasov",
    "mmd_to_grid_density",
    "normalize",
    "particle_hamiltonian",
    "sample_density",
    "w1_to_grid_density",
]

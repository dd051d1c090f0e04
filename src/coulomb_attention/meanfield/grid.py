"""The cell-centred grid of the projection domain ``[-R, R]^dim`` and densities on it.

A density is stored as cell values ``rho`` of shape ``(n,)`` (1-D) or ``(n, n)`` (2-D, index
order ``[i_x, i_y]``), piecewise constant on the cells, with mass ``sum(rho) * h^dim = 1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validation import as_float_tensor, check_positive

__all__ = ["Grid", "gaussian_density", "normalize", "sample_density"]


@dataclass(frozen=True)
class Grid:
    """A uniform cell-centred grid of ``[-half_width, half_width]^dim``.

    Attributes
    ----------
    dim : int              1 or 2
    half_width : float     R, half the side of the box (matches ``dynamics.Box(R)``)
    n : int                cells per dimension
    """

    dim: int
    half_width: float
    n: int

    def __post_init__(self) -> None:
        if self.dim not in (1, 2):
            raise ValueError(f"dim must be 1 or 2, got {self.dim!r}")
        check_positive("half_width", self.half_width)
        check_positive("n (cells per dimension)", self.n, integer=True)
        if self.n < 3:
            raise ValueError(f"the grid needs at least 3 cells per dimension, got {self.n}")

    @property
    def h(self) -> float:
        """Cell width ``2 R / n``."""
        return 2.0 * self.half_width / self.n

    @property
    def cell_volume(self) -> float:
        """``h^dim``."""
        return self.h**self.dim

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.n,) * self.dim

    def centres_1d(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Cell centres along one axis, shape ``(n,)``."""
        return -self.half_width + self.h * (torch.arange(self.n, dtype=dtype) + 0.5)

    def edges_1d(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Cell faces along one axis, shape ``(n + 1,)``."""
        return -self.half_width + self.h * torch.arange(self.n + 1, dtype=dtype)

    def points(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """All cell centres as particles-as-rows, shape ``(n**dim, dim)`` (C order of ``shape``)."""
        c = self.centres_1d(dtype)
        if self.dim == 1:
            return c.unsqueeze(1)
        gx, gy = torch.meshgrid(c, c, indexing="ij")
        return torch.stack([gx.reshape(-1), gy.reshape(-1)], dim=1)

    def mass(self, rho: torch.Tensor) -> torch.Tensor:
        """``sum(rho) h^dim`` (a scalar tensor)."""
        return rho.sum() * self.cell_volume

    def check_density(self, name: str, rho) -> torch.Tensor:
        """Validate a density array of this grid's shape; returns a float64 tensor."""
        rho = as_float_tensor(name, rho, ndim=self.dim, dtype=torch.float64)
        if tuple(rho.shape) != self.shape:
            raise ValueError(f"{name} must have shape {self.shape} for this grid, "
                             f"got {tuple(rho.shape)}")
        if bool((rho < 0).any()):
            raise ValueError(f"{name} has negative values (min {float(rho.min()):.3g})")
        if float(rho.sum()) <= 0:
            raise ValueError(f"{name} has zero mass")
        return rho


def normalize(grid: Grid, rho: torch.Tensor) -> torch.Tensor:
    """Rescale cell values to unit mass."""
    return rho / grid.mass(rho)


def gaussian_density(
    grid: Grid, mean, std: float, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Cell averages of ``N(mean, std^2 I)`` restricted to the box and renormalised.

    Cell averages are exact (differences of the normal CDF at the faces), so sampling from
    the piecewise-constant result (:func:`sample_density`) draws exactly from the PDE's
    initial condition.

    Returns
    -------
    rho : tensor of shape ``grid.shape``, unit mass.
    """
    check_positive("std", std)
    mean = as_float_tensor("mean", mean, ndim=(0, 1), dtype=torch.float64).reshape(-1)
    if mean.numel() == 1 and grid.dim == 2:
        mean = mean.expand(2)
    if mean.numel() != grid.dim:
        raise ValueError(f"mean must have {grid.dim} entries, got {mean.numel()}")
    edges = grid.edges_1d(torch.float64)
    probs = []
    for k in range(grid.dim):
        z = (edges - mean[k]) / (std * 2.0**0.5)
        cdf = 0.5 * (1.0 + torch.erf(z))
        probs.append(cdf[1:] - cdf[:-1])  # (n,)
    p = probs[0] if grid.dim == 1 else probs[0][:, None] * probs[1][None, :]
    return normalize(grid, p / grid.cell_volume).to(dtype)


def sample_density(
    grid: Grid, rho: torch.Tensor, n_samples: int, generator: torch.Generator
) -> torch.Tensor:
    """Exact samples from the piecewise-constant density ``rho``: a cell by its mass, then a
    uniform point in the cell.

    Returns
    -------
    omega : tensor of shape ``(n_samples, dim)``, float64.
    """
    n_samples = check_positive("n_samples", n_samples, integer=True)
    rho = grid.check_density("rho", rho)
    cells = torch.multinomial(rho.reshape(-1), n_samples, replacement=True, generator=generator)
    centres = grid.points(torch.float64)[cells]  # (n_samples, dim)
    jitter = torch.rand(n_samples, grid.dim, generator=generator, dtype=torch.float64) - 0.5
    return centres + grid.h * jitter

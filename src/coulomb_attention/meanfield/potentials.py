"""The two potentials of the McKean-Vlasov equation: the data potential ``V`` and the
interaction ``g_s * rho`` on the grid.

Data potential (docs/DESIGN.md, "Mean-field limit"): for a fixed dataset ``(x_a, y_a)``, a = 1..n,
with the *unnormalised* feature ``phi`` (no ``1/sqrt(N)``),

    V(omega) = -( (1/n) sum_a y_a phi(x_a; omega) )^2.

Features are the core maps times ``sqrt(M)`` (the core includes ``1/sqrt(M)`` for M rows):

* ``rff``:      ``phi(x; omega) = sqrt(2) cos(omega . x + b)`` with one fixed phase ``b``
  (default ``pi/4``, which breaks the ``omega -> -omega`` symmetry);
* ``positive``: ``phi(x; omega) = exp(omega . x - |x|^2/2)`` (FAVOR+).

Interaction: with ``rho`` piecewise constant on the cells, ``(g_s * rho)(c_i) = sum_j rho_j
int_{cell j} g_s(c_i - w) dw = h^dim sum_j Gbar(i - j) rho_j`` where ``Gbar(k)`` is the
average of ``g_s`` over the cell at offset ``k`` (Gauss-Legendre in each dimension, via the
core ``PairPotential.value``). The Toeplitz sum is an FFT convolution with zero padding;
:meth:`GridInteraction.dense_matrix` is its naive twin.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from .._validation import as_float_tensor, check_choice, check_positive
from ..energy import PairPotential
from ..features import positive as positive_map
from ..features import rff as rff_map
from .grid import Grid

__all__ = [
    "DATA_FEATURES",
    "DataPotential",
    "GridInteraction",
    "QuadraticPotential",
]


def _rff_unnormalised(x: torch.Tensor, omega: torch.Tensor, b: float) -> torch.Tensor:
    m = omega.shape[0]
    bias = torch.full((m,), float(b), dtype=omega.dtype)
    return math.sqrt(m) * rff_map(x, omega, bias)  # sqrt(2) cos(omega . x + b), (n, M)


def _positive_unnormalised(x: torch.Tensor, omega: torch.Tensor, b: float) -> torch.Tensor:
    return math.sqrt(omega.shape[0]) * positive_map(x, omega)  # exp(omega . x - |x|^2/2)


# name -> phi(x (n, d), omega (M, d), b) -> (n, M), unnormalised
DATA_FEATURES: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "rff": _rff_unnormalised,
    "positive": _positive_unnormalised,
}


@dataclass(frozen=True)
class DataPotential:
    """``V(omega) = -((1/n) sum_a y_a phi(x_a; omega))^2`` for a fixed dataset.

    Attributes
    ----------
    x : tensor (n, dim)
    y : tensor (n,)       real labels (e.g. +-1)
    feature : str         ``rff`` or ``positive`` (see :data:`DATA_FEATURES`)
    phase : float         the fixed ``b`` of ``rff`` (ignored by ``positive``)
    """

    x: torch.Tensor
    y: torch.Tensor
    feature: str = "rff"
    phase: float = math.pi / 4
    _phi: Callable = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_choice("feature", self.feature, DATA_FEATURES)
        x = as_float_tensor("x", self.x, ndim=2, dtype=torch.float64)
        y = as_float_tensor("y", self.y, ndim=1, dtype=torch.float64)
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"x has {x.shape[0]} rows but y has {y.shape[0]} entries")
        if not math.isfinite(self.phase):
            raise ValueError(f"phase must be finite, got {self.phase!r}")
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "y", y)
        object.__setattr__(self, "_phi", DATA_FEATURES[self.feature])

    @property
    def dim(self) -> int:
        return int(self.x.shape[1])

    def mean_feature(self, omega: torch.Tensor) -> torch.Tensor:
        """``m(omega) = (1/n) sum_a y_a phi(x_a; omega)``, shape ``(M,)`` for omega ``(M, dim)``."""
        if omega.ndim != 2 or omega.shape[1] != self.dim:
            raise ValueError(f"omega must have shape (M, {self.dim}), got {tuple(omega.shape)}")
        x = self.x.to(omega.dtype)
        y = self.y.to(omega.dtype)
        phi = self._phi(x, omega, self.phase)  # (n, M)
        return (y @ phi) / x.shape[0]

    def __call__(self, omega: torch.Tensor) -> torch.Tensor:
        """``V(omega)``, shape ``(M,)``; differentiable in ``omega``."""
        return -self.mean_feature(omega).square()


@dataclass(frozen=True)
class QuadraticPotential:
    """``V(omega) = (a/2) |omega - centre|^2`` (tests: the Gibbs density is explicit)."""

    a: float = 1.0
    centre: tuple[float, ...] = (0.0,)

    def __call__(self, omega: torch.Tensor) -> torch.Tensor:
        c = torch.as_tensor(self.centre, dtype=omega.dtype)
        return 0.5 * self.a * (omega - c).square().sum(1)


def _gauss_legendre(q: int, h: float) -> tuple[np.ndarray, np.ndarray]:
    nodes, weights = np.polynomial.legendre.leggauss(q)
    return 0.5 * h * nodes, 0.5 * weights  # nodes in [-h/2, h/2], weights sum to 1


class GridInteraction:
    """``rho -> (g * rho)`` at the cell centres for a pair potential on a :class:`Grid`.

    Parameters
    ----------
    grid : Grid
    pair : PairPotential     from :func:`coulomb_attention.energy.make_potential`
    quad_points : int        Gauss-Legendre points per dimension for the cell averages
        (more, up to 64, for the three neighbouring offsets when ``eps`` < cell width)
    """

    def __init__(self, grid: Grid, pair: PairPotential, quad_points: int = 8) -> None:
        if not isinstance(pair, PairPotential):
            raise TypeError(f"pair must be a PairPotential, got {type(pair).__name__}")
        quad_points = check_positive("quad_points", quad_points, integer=True)
        if pair.eps == 0:
            raise ValueError("the grid interaction needs a softened potential (eps > 0)")
        self.grid = grid
        self.pair = pair
        n, h, dim = grid.n, grid.h, grid.dim
        offsets = torch.arange(-(n - 1), n, dtype=torch.float64) * h  # (2n-1,)
        far = self._cell_average(offsets, quad_points)
        q_near = min(64, max(quad_points, math.ceil(8 * h / pair.eps)))
        near = self._cell_average(offsets[n - 2 : n + 1], q_near) if n >= 2 else None
        self.kernel = far  # (2n-1,)*dim, Gbar at offsets -(n-1)..(n-1)
        if near is not None:
            sl = (slice(n - 2, n + 1),) * dim
            self.kernel[sl] = near
        length = 2 * n
        circ = torch.zeros((length,) * dim, dtype=torch.float64)
        idx = torch.arange(-(n - 1), n) % length
        if dim == 1:
            circ[idx] = self.kernel
        else:
            circ[idx[:, None], idx[None, :]] = self.kernel
        self._length = length
        self._kernel_hat = torch.fft.rfftn(circ)

    def _cell_average(self, offsets: torch.Tensor, q: int) -> torch.Tensor:
        u, w = _gauss_legendre(q, self.grid.h)
        u = torch.as_tensor(u)
        w = torch.as_tensor(w)
        if self.grid.dim == 1:
            r2 = (offsets[:, None] + u[None, :]).square()  # (K, q)
            return self.pair.value(r2) @ w
        # 2-D: average over (u, v) of g(|(ox + u, oy + v)|^2)
        dx2 = (offsets[:, None] + u[None, :]).square()  # (K, q)
        r2 = dx2[:, None, :, None] + dx2[None, :, None, :]  # (K, K, q, q)
        return torch.einsum("abij,i,j->ab", self.pair.value(r2), w, w)

    def __call__(self, rho: torch.Tensor) -> torch.Tensor:
        """``(g * rho)(c_i)``, same shape as ``rho`` (``grid.shape``), float64."""
        n, dim = self.grid.n, self.grid.dim
        pad = [(0, self._length - n)] * dim
        flat_pad = [p for pair in reversed(pad) for p in pair]
        rho_pad = torch.nn.functional.pad(rho.to(torch.float64), flat_pad)
        conv = torch.fft.irfftn(torch.fft.rfftn(rho_pad) * self._kernel_hat,
                                s=rho_pad.shape)
        sl = (slice(0, n),) * dim
        return conv[sl] * self.grid.cell_volume

    def dense_matrix(self) -> torch.Tensor:
        """The naive twin: ``G`` of shape ``(n**dim, n**dim)`` with ``(g * rho).ravel() =
        G @ rho.ravel()`` (tests only; O(n^(2 dim)) memory)."""
        n, dim = self.grid.n, self.grid.dim
        idx = torch.arange(n)
        diff = idx[:, None] - idx[None, :] + (n - 1)  # (n, n) index into kernel
        if dim == 1:
            return self.kernel[diff] * self.grid.cell_volume
        # rows (i, j), cols (k, l): kernel[i - k, j - l]
        big = self.kernel[diff[:, None, :, None], diff[None, :, None, :]]  # (n, n, n, n)
        return big.reshape(n * n, n * n) * self.grid.cell_volume

"""Samplers of random-feature particles omega, rows of an ``(n_features, d)`` matrix."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .._validation import check_choice, check_positive

__all__ = ["gaussian", "orthogonal", "SAMPLERS", "get_sampler", "sample"]


def gaussian(
    n_features: int,
    dim: int,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """IID standard normal particles, shape ``(n_features, dim)``."""
    n_features = check_positive("n_features", n_features, integer=True)
    dim = check_positive("dim", dim, integer=True)
    return torch.randn(n_features, dim, generator=generator, dtype=dtype)


def orthogonal(
    n_features: int,
    dim: int,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Orthogonal random features (ORF / PORF), shape ``(n_features, dim)``.

    Rows come in blocks of ``dim`` mutually orthogonal directions (QR of a Gaussian matrix,
    sign-corrected so the directions are Haar distributed); each row is rescaled by an
    independent chi(dim) norm, so every row has the marginal law N(0, I) while rows within a
    block are exactly orthogonal (lower-variance kernel estimates).
    """
    n_features = check_positive("n_features", n_features, integer=True)
    dim = check_positive("dim", dim, integer=True)
    blocks = []
    for _ in range(math.ceil(n_features / dim)):
        g = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        q, r = torch.linalg.qr(g)
        q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)  # Haar: fix the QR sign ambiguity
        blocks.append(q.T)  # rows orthonormal
    directions = torch.cat(blocks, dim=0)[:n_features]  # (N, d)
    norms = torch.randn(n_features, dim, generator=generator, dtype=torch.float64).norm(dim=1)
    return (directions * norms.unsqueeze(1)).to(dtype)


SAMPLERS: dict[str, Callable[..., torch.Tensor]] = {
    "gaussian": gaussian,
    "orthogonal": orthogonal,
}


def get_sampler(name: str) -> Callable[..., torch.Tensor]:
    """Look up a sampler by name; unknown names raise ``ValueError`` listing valid ones."""
    return SAMPLERS[check_choice("sampler", name, SAMPLERS)]


def sample(
    name: str,
    n_features: int,
    dim: int,
    *,
    scale: float = 1.0,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Draw ``(n_features, dim)`` particles from sampler ``name``, multiplied by ``scale``.

    For the Gaussian kernel ``exp(-gamma |x - y|^2)`` with the ``rff`` map use
    ``scale = sqrt(2 * gamma)``.
    """
    check_positive("scale", scale)
    return get_sampler(name)(n_features, dim, generator=generator, dtype=dtype) * scale

"""Exact kernels: the limits the random-feature maps are unbiased for (test oracles)."""

from __future__ import annotations

import torch

__all__ = ["gaussian_kernel", "softmax_kernel"]


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor, gamma: float = 0.5) -> torch.Tensor:
    """``exp(-gamma |x_a - y_b|^2)``, shape ``(n_x, n_y)``; ``rff`` with omega ~ N(0, 2 gamma I)."""
    return torch.exp(-gamma * torch.cdist(x, y).pow(2))


def softmax_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``exp(x_a . y_b)``, shape ``(n_x, n_y)``; ``positive`` with omega ~ N(0, I)."""
    return torch.exp(x @ y.T)

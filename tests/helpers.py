"""Shared test helpers."""

from __future__ import annotations

import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error ``|a - b| / max(|b|, tiny)`` in the Frobenius norm."""
    a = a.detach().double()
    b = b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def finite_diff_grad(f, x: torch.Tensor, h: float = 1e-6) -> torch.Tensor:
    """Central finite-difference gradient of scalar ``f`` at ``x`` (float64)."""
    x = x.detach().double().clone()
    g = torch.zeros_like(x)
    flat, gflat = x.view(-1), g.view(-1)
    for i in range(flat.numel()):
        old = flat[i].item()
        flat[i] = old + h
        fp = float(f(x))
        flat[i] = old - h
        fm = float(f(x))
        flat[i] = old
        gflat[i] = (fp - fm) / (2 * h)
    return g

"""Euclidean projections onto convex compact sets, applied row-wise to particles."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._validation import check_choice, check_positive

__all__ = ["Ball", "Box", "PROJECTIONS", "make_projection"]


@dataclass(frozen=True)
class Ball:
    """The ball ``{w : |w| <= radius}``. ``__call__`` returns (projected, on_boundary mask)."""

    radius: float

    def __post_init__(self) -> None:
        check_positive("radius", self.radius)

    def __call__(self, omega: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        norms = omega.norm(dim=1, keepdim=True)  # (N, 1)
        outside = norms > self.radius
        scale = torch.where(outside, self.radius / norms.clamp_min(1e-30), torch.ones_like(norms))
        return omega * scale, outside.squeeze(1)

    def contains(self, omega: torch.Tensor, tol: float = 1e-5) -> torch.Tensor:
        return omega.norm(dim=1) <= self.radius * (1 + tol)


@dataclass(frozen=True)
class Box:
    """The box ``[-half_width, half_width]^d``."""

    half_width: float

    def __post_init__(self) -> None:
        check_positive("half_width", self.half_width)

    def __call__(self, omega: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.half_width
        outside = (omega.abs() > h).any(dim=1)
        return omega.clamp(-h, h), outside

    def contains(self, omega: torch.Tensor, tol: float = 1e-5) -> torch.Tensor:
        return (omega.abs() <= self.half_width * (1 + tol)).all(dim=1)


PROJECTIONS: dict[str, Callable[[float], Ball | Box]] = {"ball": Ball, "box": Box}


def make_projection(name: str, size: float) -> Ball | Box:
    """``ball`` of radius ``size`` or ``box`` of half-width ``size``."""
    return PROJECTIONS[check_choice("projection", name, PROJECTIONS)](size)

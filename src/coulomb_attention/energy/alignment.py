"""Kernel-target alignment from sufficient statistics (never an n x n matrix).

With ``Phi`` of shape ``(n, N)`` and label matrix ``Y`` of shape ``(n, C)``::

    <K, Y Y^T>_F = || Phi^T Y ||_F^2,   ||K||_F = || Phi^T Phi ||_F,   ||YY^T||_F = ||Y^T Y||_F
    A = <K, YY^T>_F / (||K||_F ||YY^T||_F)

Centered alignment (Cortes et al. 2012) centers the columns of ``Phi`` and ``Y`` over the
whole dataset; it is recovered exactly from the streamed sums
``n, sum Phi, sum Y, Phi^T Phi, Phi^T Y, Y^T Y``, which add across mini-batches and
processes (:class:`AlignmentStats`). :func:`alignment_value_and_grad` streams a dataset in
two passes and returns the exact full-data alignment and its gradient in ``omega``; its
``reduce`` hook (e.g. ``torch.distributed.all_reduce``) makes it exactly data-parallel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

__all__ = [
    "AlignmentStats",
    "alignment",
    "alignment_from_stats",
    "alignment_stats",
    "alignment_value_and_grad",
    "encode_labels",
]

STAT_DTYPE = torch.float64


@dataclass
class AlignmentStats:
    """Additive sufficient statistics of the alignment.

    Attributes
    ----------
    n : Tensor, shape ()
    sum_phi : Tensor, shape (N,)
    sum_y : Tensor, shape (C,)
    ptp : Tensor, shape (N, N)    ``Phi^T Phi``
    pty : Tensor, shape (N, C)    ``Phi^T Y``
    yty : Tensor, shape (C, C)    ``Y^T Y``
    """

    n: torch.Tensor
    sum_phi: torch.Tensor
    sum_y: torch.Tensor
    ptp: torch.Tensor
    pty: torch.Tensor
    yty: torch.Tensor

    def tensors(self) -> list[torch.Tensor]:
        return [getattr(self, f.name) for f in fields(self)]

    @classmethod
    def from_tensors(cls, tensors: Sequence[torch.Tensor]) -> AlignmentStats:
        return cls(*tensors)

    def __add__(self, other: AlignmentStats) -> AlignmentStats:
        pairs = zip(self.tensors(), other.tensors(), strict=True)
        return AlignmentStats.from_tensors([a + b for a, b in pairs])


def alignment_stats(phi: torch.Tensor, y: torch.Tensor) -> AlignmentStats:
    """Statistics of one batch: ``phi`` (B, N), ``y`` (B, C) -> :class:`AlignmentStats`."""
    if phi.ndim != 2 or y.ndim != 2 or phi.shape[0] != y.shape[0]:
        raise ValueError(
            f"phi must be (B, N) and y (B, C) with the same B, got {tuple(phi.shape)} "
            f"and {tuple(y.shape)}"
        )
    phi = phi.to(STAT_DTYPE)
    y = y.to(STAT_DTYPE)
    return AlignmentStats(
        n=torch.tensor(float(phi.shape[0]), dtype=STAT_DTYPE),
        sum_phi=phi.sum(0),
        sum_y=y.sum(0),
        ptp=phi.T @ phi,
        pty=phi.T @ y,
        yty=y.T @ y,
    )


def alignment_from_stats(stats: AlignmentStats, center: bool = True) -> torch.Tensor:
    """Alignment (a scalar tensor, differentiable in the statistics)."""
    ptp, pty, yty = stats.ptp, stats.pty, stats.yty
    if center:
        n = stats.n
        ptp = ptp - torch.outer(stats.sum_phi, stats.sum_phi) / n
        pty = pty - torch.outer(stats.sum_phi, stats.sum_y) / n
        yty = yty - torch.outer(stats.sum_y, stats.sum_y) / n
    num = (pty * pty).sum()
    den = torch.linalg.matrix_norm(ptp) * torch.linalg.matrix_norm(yty)
    tiny = torch.finfo(STAT_DTYPE).tiny
    if float(torch.linalg.matrix_norm(yty.detach())) <= 1e-12:
        raise ValueError("alignment needs labels of at least two classes (Y^T Y is zero)")
    return num / den.clamp_min(tiny)


def alignment(phi: torch.Tensor, y: torch.Tensor, center: bool = True) -> torch.Tensor:
    """Alignment of ``K = phi phi^T`` with ``y y^T``; ``phi`` (n, N), ``y`` (n, C)."""
    return alignment_from_stats(alignment_stats(phi, y), center=center)


def encode_labels(y, classes=None) -> tuple[torch.Tensor, np.ndarray]:
    """Label matrix for the alignment.

    Binary labels become one column of +-1; ``C > 2`` classes become one-hot columns.

    Returns
    -------
    Y : Tensor, shape (n, 1) or (n, C), float64
    classes : ndarray of the sorted class values
    """
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {y.shape}")
    if y.dtype.kind == "f" and not np.isfinite(y).all():
        raise ValueError(f"labels contain {int((~np.isfinite(y)).sum())} NaN or infinite value(s)")
    if classes is None:
        classes = np.unique(y)
    elif not np.isin(y, classes).all():
        bad = np.unique(y[~np.isin(y, classes)])
        raise ValueError(f"labels {bad[:5].tolist()} are not among the classes "
                         f"{np.asarray(classes).tolist()}")
    idx = np.searchsorted(classes, y)
    if len(classes) < 2:
        raise ValueError(f"need labels of at least 2 classes, got {len(classes)}: {classes}")
    if len(classes) == 2:
        Y = torch.from_numpy(2.0 * idx - 1.0).to(STAT_DTYPE).unsqueeze(1)
    else:
        Y = torch.nn.functional.one_hot(torch.from_numpy(idx), len(classes)).to(STAT_DTYPE)
    return Y, classes


Batch = tuple  # (inputs, Y): inputs as the features function expects, Y (B, C)


def _identity(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return tensors


def alignment_value_and_grad(
    omega: torch.Tensor,
    batches: Iterable[Batch],
    features: Callable[[object, torch.Tensor], torch.Tensor],
    *,
    center: bool = True,
    reduce: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact alignment of all ``batches`` and its gradient in ``omega`` (and ``weights``).

    Parameters
    ----------
    omega : Tensor, shape (N, d)
    batches : re-iterable of ``(inputs, Y)``; ``features(inputs, omega)`` -> (B, N)
    features : the feature function (any differentiable map, e.g. a masked sequence mean)
    center : centered alignment (default) or raw
    reduce : sums a list of tensors across processes (identity by default); applied to the
        statistics and to the gradient, which makes the result identical to one process
        seeing every batch.
    weights : optional Tensor, shape (N,), particle masses ``w_i > 0`` summing to 1
        (Wasserstein-Fisher-Rao particles). Column ``i`` of ``Phi`` is scaled by
        ``sqrt(N w_i)``, so the kernel is ``sum_i w_i phi_i phi_i^T`` (``Phi`` already holds
        the ``1 / sqrt(N)``) and uniform masses give the unweighted kernel. ``None`` (default):
        the unweighted path, unchanged.

    Returns
    -------
    value : Tensor, shape ()  (float64)
    grad : Tensor, shape (N, d)  (dtype of omega)
    grad_weights : Tensor, shape (N,)  (only when ``weights`` is given) ``dA / dw_i``, the
        first variation of the alignment in the masses
    """
    if weights is not None:
        if weights.shape != (omega.shape[0],):
            raise ValueError(f"weights must have shape ({omega.shape[0]},), got "
                             f"{tuple(weights.shape)}")
        n_particles = omega.shape[0]
        plain = features

        def features(inputs, om, _w=weights):  # (B, N) columns scaled by sqrt(N w_i)
            return plain(inputs, om) * (n_particles * _w).sqrt().to(om.dtype)

        w_leaf = weights.detach().requires_grad_(True)
    reduce = reduce or _identity
    batches = list(batches)
    if not batches:
        raise ValueError("no data: batches is empty")
    # Pass 1: statistics without graph.
    with torch.no_grad():
        stats = None
        for inputs, y in batches:
            s = alignment_stats(features(inputs, omega), y)
            stats = s if stats is None else stats + s
    leaves = [t.detach().requires_grad_(True) for t in reduce(stats.tensors())]
    with torch.enable_grad():
        value = alignment_from_stats(AlignmentStats.from_tensors(leaves), center=center)
        cotangents = torch.autograd.grad(value, leaves, allow_unused=True)
    cotangents = [
        torch.zeros_like(t) if c is None else c for t, c in zip(leaves, cotangents, strict=True)
    ]
    # Pass 2: pull the cotangents of the statistics back to omega, batch by batch.
    w = omega.detach().requires_grad_(True)
    grad = torch.zeros_like(w)
    if weights is None:
        with torch.enable_grad():
            for inputs, y in batches:
                local = alignment_stats(features(inputs, w), y).tensors()
                surrogate = sum((c * t).sum() for c, t in zip(cotangents, local, strict=True))
                (g,) = torch.autograd.grad(surrogate, w, allow_unused=True)
                if g is not None:
                    grad += g
        (grad,) = reduce([grad])
        return value.detach(), grad
    grad_w = torch.zeros_like(w_leaf)
    with torch.enable_grad():
        for inputs, y in batches:
            local = alignment_stats(features(inputs, w, w_leaf), y).tensors()
            surrogate = sum((c * t).sum() for c, t in zip(cotangents, local, strict=True))
            g, gw = torch.autograd.grad(surrogate, (w, w_leaf), allow_unused=True)
            if g is not None:
                grad += g
            if gw is not None:
                grad_w += gw
    grad, grad_w = reduce([grad, grad_w])
    return value.detach(), grad, grad_w.detach()

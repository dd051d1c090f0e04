"""Token-pair alignment: a data term for attention whose target is *which key a query reads*.

The sequence-level alignment (:class:`~coulomb_attention.energy.LabelAlignment`) aligns a
kernel between whole sequences with their labels. In a token-level task the target lives on
token pairs instead: for a query position ``t`` the position ``s*(t)`` that attention must
retrieve (MQAR: the value paired with the queried key; :func:`coulomb_attention.data.make_mqar`
returns it). The object aligned is the attention matrix the layer computes, row by row::

    k(t, s)  = mean_h phi(q_ht; Omega) . phi(k_hs; Omega)          (kernel of the layer)
    P(t, s)  = k(t, s) / sum_{s' valid} k(t, s')                    (attention weights)
    Y(t, s)  = 1 if s = s*(t) else 0                                (retrieval target)
    centered per row over its valid keys s (causal, real):  P~ = P - mean_s P,  Y~ likewise
    A(Omega) = <P~, Y~> / ( ||P~|| ||Y~|| )   (sums over all rows t of all sequences)

``A = 1`` exactly when every query puts all of its attention on its retrieval position. The
three sums ``<P~, Y~>``, ``||P~||^2``, ``||Y~||^2`` are sums over rows: they add across
mini-batches and processes, so the value is exact for any batching (a ``comm`` all-reduces
them) and the gradient is pulled back batch by batch, as in
:func:`~coulomb_attention.energy.alignment_value_and_grad`. As a data term the energy is
``-A`` (:class:`TokenPairAlignment`), moved by the same Hamiltonian (``+ lam W``) and driver
(:func:`coulomb_attention.dynamics.learn_particles`) as every other phase A.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["TokenPairAlignment", "token_pair_alignment_naive", "token_pair_stats"]

STAT_DTYPE = torch.float64

# inputs of one batch: q (B, H, R, d) query rows, k (B, H, S, d) keys,
# valid (B, R, S) bool (pairs that count: causal, real); target (B, R, S) float
Batch = tuple


def token_pair_stats(
    feature: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    omega: torch.Tensor,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    target: torch.Tensor,
    center: bool = True,
) -> torch.Tensor:
    """``[<P~, Y~>, ||P~||^2, ||Y~||^2]`` of one batch (float64, differentiable in omega).

    Parameters
    ----------
    feature : ``feature(u (..., d), omega (M, d)) -> (..., M)``, a positive feature map
    omega : Tensor (M, d)
    inputs : ``(q (B, H, R, d), k (B, H, S, d), valid (B, R, S) bool)``
    target : Tensor (B, R, S), the retrieval target of each query row (zero off ``valid``)
    center : center each row over its valid keys (default) or not
    """
    q, k, valid = inputs
    # features in float64: the unshifted exp-type maps reach exp(|omega|^2 / 2) (exp(288) for
    # particles on the ball of radius 3 sqrt(64)), which overflows float32 (NaN energies in
    # phase A) but not float64 (up to |omega| ~ 37)
    w = omega.to(STAT_DTYPE)
    phi_q = feature(q.to(STAT_DTYPE), w)  # (B, H, R, M)
    phi_k = feature(k.to(STAT_DTYPE), w)  # (B, H, S, M)
    kern = (phi_q @ phi_k.transpose(-1, -2)).mean(1)  # (B, R, S)
    w = valid.to(STAT_DTYPE)
    kern = kern * w
    p = kern / kern.sum(-1, keepdim=True).clamp_min(torch.finfo(STAT_DTYPE).tiny)
    y = target.to(STAT_DTYPE) * w
    if center:
        count = w.sum(-1, keepdim=True).clamp_min(1.0)
        p = (p - p.sum(-1, keepdim=True) / count) * w
        y = (y - y.sum(-1, keepdim=True) / count) * w
    return torch.stack([(p * y).sum(), (p * p).sum(), (y * y).sum()])


def _alignment(stats: torch.Tensor) -> torch.Tensor:
    py, pp, yy = stats.unbind()
    if float(yy.detach()) <= 0:
        raise ValueError("token-pair alignment needs rows whose target is not constant")
    return py / (pp * yy).sqrt().clamp_min(torch.finfo(STAT_DTYPE).tiny)


@dataclass
class TokenPairAlignment:
    """``-A(Omega)``: minus the alignment of the layer's attention matrix with the retrieval
    target (module doc). A data term of :class:`~coulomb_attention.energy.Hamiltonian`.

    Parameters
    ----------
    feature : ``feature(u, omega) -> (..., M)``, e.g. ``KernelAttention.feature``
    center : center each row over its valid keys (default)

    ``batches`` are ``((q (B, H, R, d), k (B, H, S, d), valid (B, R, S)), target (B, R, S))``.
    """

    feature: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    center: bool = True

    def value_and_grad(self, omega: torch.Tensor, batches: Sequence[Batch], comm=None):
        batches = list(batches)
        if not batches:
            raise ValueError("no data: batches is empty")
        reduce = (lambda ts: ts) if comm is None else comm.reduce
        with torch.no_grad():  # pass 1: the statistics
            stats = sum(token_pair_stats(self.feature, omega, x, y, self.center)
                        for x, y in batches)
        (stats,) = reduce([stats])
        leaf = stats.detach().requires_grad_(True)
        with torch.enable_grad():
            value = _alignment(leaf)
            (cot,) = torch.autograd.grad(value, leaf)
        w = omega.detach().requires_grad_(True)  # pass 2: pull back batch by batch
        grad = torch.zeros_like(w)
        with torch.enable_grad():
            for x, y in batches:
                s = token_pair_stats(self.feature, w, x, y, self.center)
                (g,) = torch.autograd.grad((cot * s).sum(), w)
                grad += g
        (grad,) = reduce([grad])
        a = value.detach()
        return -a.to(omega.dtype), -grad, {"alignment": float(a)}


def token_pair_alignment_naive(feature, omega, batches, center: bool = True) -> torch.Tensor:
    """The alignment ``A`` by explicit loops over sequences, query rows and keys (test twin;
    differentiable in ``omega``)."""
    py = pp = yy = torch.zeros((), dtype=STAT_DTYPE)
    for (q, k, valid), target in batches:
        B, H, R, _ = q.shape
        for b in range(B):
            for r in range(R):
                keys = [s for s in range(k.shape[2]) if bool(valid[b, r, s])]
                if not keys:
                    continue
                kern = torch.stack([
                    sum(feature(q[b, h, r], omega) @ feature(k[b, h, s], omega)
                        for h in range(H)) / H
                    for s in keys]).to(STAT_DTYPE)
                p = kern / kern.sum()
                y = torch.stack([target[b, r, s] for s in keys]).to(STAT_DTYPE)
                if center:
                    p, y = p - p.mean(), y - y.mean()
                py, pp, yy = py + (p * y).sum(), pp + (p * p).sum(), yy + (y * y).sum()
    return py / (pp * yy).sqrt()

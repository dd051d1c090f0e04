"""The teacher-attention data term: linear attention rows against softmax rows (distillation).

In a pretrained encoder the queries and keys of a layer are fixed, so the kernel is everything.
For one head (or a group of heads sharing particles), with scaled queries/keys ``q_t``, ``k_s``
(already multiplied by ``d_head**-0.25``, so ``q.k`` is the usual ``q.k / sqrt(d_head)``):

    p_ts = exp(q_t . k_s) / sum_s' exp(q_t . k_s')                          (teacher row)
    a_ts = phi(q_t; Omega) . phi(k_s; Omega) / sum_s' phi(q_t; Omega) . phi(k_s'; Omega)

and the data term is the mean, over the sampled query rows ``t`` of all sequences and heads of
the group, of the row KL divergence (the row cross-entropy minus the teacher's entropy, which
does not depend on ``Omega``: same gradient, zero at a perfect match):

    D(Omega) = (1 / #rows) sum_rows sum_s p_ts (log p_ts - log a_ts)
             + output_weight * (1 / (#rows d_head)) sum_rows | sum_s (a_ts - p_ts) v_s |^2

Causal layers (:class:`TeacherBatch` ``row_pos``): row ``t`` at sequence position ``pos_t``
sees the keys ``s <= pos_t`` only, in both rows. An explicit target (``target``, e.g. the
one-hot row of the key a query must retrieve) replaces the softmax row ``p``; with a one-hot
target the row KL is the cross-entropy ``-log a_{t s*}``.

The second (optional) part is the output MSE of LoLCATs-style attention transfer. Both parts
are sums over rows divided by a count, so they stream over chunks of sequences and all-reduce
across processes exactly (``comm.reduce`` of (sum KL, sum squared error, rows, gradient)).
``phi`` is any differentiable map ``phi(u (..., d), omega (M, d)) -> (..., M)`` with positive
values (FAVOR+, softmax features, softplus); the gradient in ``Omega`` is exact (autograd over
each chunk). The naive twin :func:`naive_teacher_value` loops over rows with the direct formula.

Weighted particles (masses ``w_i``, sum 1; :mod:`coulomb_attention.dynamics.weighted`): with
``weights=`` the features are scaled by ``sqrt(N w_i)`` (as in a weighted
:class:`~coulomb_attention.nn.KernelAttention`), i.e. ``K_ts = sum_i N w_i phi_i(q_t) phi_i(k_s)``,
and :meth:`TeacherAttention.value_and_grad` returns ``(value, (grad_omega, grad_weights), info)``
with ``grad_weights[i] = dD / dw_i`` (the first variation; autograd).
:func:`teacher_mass_gradient` is its closed form, a loop over rows (the test oracle):

    dD/dw_i = -(N / #rows) sum_rows phi_i(q_t) [ sum_s p_ts phi_i(k_s) / K_ts
                                                 - sum_s phi_i(k_s) / sum_s K_ts ]

(the KL part; the rows' targets sum to 1 over the keys they see). ``D`` is invariant to a common
factor on the masses, so ``sum_i w_i dD/dw_i = 0``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .terms import Comm

__all__ = ["EmbeddingTeacher", "TeacherAttention", "TeacherBatch", "WindowWeights",
           "naive_teacher_value", "per_head", "teacher_mass_gradient", "teacher_rows"]

FeatureFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class TeacherBatch:
    """Cached scaled queries/keys (and values) of one attention layer on a few sequences.

    Attributes
    ----------
    q : Tensor (B, H, R, dh)   sampled query rows (``KernelAttention.queries``)
    k : Tensor (B, H, S, dh)   every key position (``KernelAttention.keys``)
    key_mask : Tensor (B, S) bool   real keys
    row_mask : Tensor (B, R) bool   real sampled rows (a short sequence has fewer rows)
    v : Tensor (B, H, S, dh) or None   values, for the output MSE
    row_pos : LongTensor (B, R) or None   causal: the sequence position of each sampled row,
                                          which sees the keys ``s <= row_pos`` only
    target : Tensor (B, R, S) or None     target rows (probabilities over the keys, shared by
                                          the heads) replacing the softmax rows
    row_index : LongTensor (B, R) or None the sequence position of each sampled row (needed
                                          by a window)
    window : int                          the student is the sliding-window hybrid
                                          (:mod:`coulomb_attention.nn.ops.window`) with this
                                          ``W`` (0: pure linear); causal with ``row_pos``
    gamma : Tensor (H,) or None           its window weight per head
    window_linear : bool                  False: the window alone (no linear term)
    sinks : int                           causal window: the first ``sinks`` keys are exact
                                          too (attention sinks,
                                          :mod:`coulomb_attention.nn.ops.streaming`)
    """

    q: torch.Tensor
    k: torch.Tensor
    key_mask: torch.Tensor
    row_mask: torch.Tensor
    v: torch.Tensor | None = None
    row_pos: torch.Tensor | None = None
    target: torch.Tensor | None = None
    row_index: torch.Tensor | None = None
    window: int = 0
    gamma: torch.Tensor | None = None
    window_linear: bool = True
    sinks: int = 0

    def __post_init__(self) -> None:
        B, H, R, dh = self.q.shape
        if self.window:
            if self.row_index is None or tuple(self.row_index.shape) != (B, R):
                raise ValueError(f"a window needs row_index of shape ({B}, {R})")
            if self.gamma is None or tuple(self.gamma.shape) != (H,):
                raise ValueError(f"a window needs gamma of shape ({H},)")
        if self.k.ndim != 4 or self.k.shape[:2] != (B, H) or self.k.shape[3] != dh:
            raise ValueError(f"k must have shape (B, H, S, {dh}) with B={B}, H={H}, got "
                             f"{tuple(self.k.shape)}")
        S = self.k.shape[2]
        if tuple(self.key_mask.shape) != (B, S) or self.key_mask.dtype != torch.bool:
            raise ValueError(f"key_mask must be bool of shape ({B}, {S})")
        if tuple(self.row_mask.shape) != (B, R) or self.row_mask.dtype != torch.bool:
            raise ValueError(f"row_mask must be bool of shape ({B}, {R})")
        if self.v is not None and tuple(self.v.shape) != tuple(self.k.shape):
            raise ValueError(f"v must have the shape of k {tuple(self.k.shape)}, got "
                             f"{tuple(self.v.shape)}")
        if self.row_pos is not None and (tuple(self.row_pos.shape) != (B, R)
                                         or self.row_pos.dtype != torch.long):
            raise ValueError(f"row_pos must be a long tensor of shape ({B}, {R})")
        if self.target is not None and tuple(self.target.shape) != (B, R, S):
            raise ValueError(f"target must have shape ({B}, {R}, {S}), got "
                             f"{tuple(self.target.shape)}")

    def mask(self) -> torch.Tensor:
        """Keys each row sees: ``(B, 1, R, S)`` bool (real keys, and ``s <= row_pos`` when
        causal)."""
        m = self.key_mask[:, None, None, :]
        if self.row_pos is not None:
            s = torch.arange(self.k.shape[2], device=self.k.device)
            m = m & (s[None, None, None, :] <= self.row_pos[:, None, :, None])
        return m

    def window_mask(self) -> torch.Tensor:
        """Keys inside each row's window: ``(B, 1, R, S)`` bool (encoder: ``|s - t| <= W/2``;
        causal: ``t - W < s <= t``), real keys only."""
        s = torch.arange(self.k.shape[2], device=self.k.device)
        rel = s[None, None, :] - self.row_index[:, :, None]  # (B, R, S): s - t
        before, after = ((self.window - 1, 0) if self.row_pos is not None
                         else (self.window // 2, self.window // 2))
        inside = (rel >= -before) & (rel <= after)
        if self.sinks:
            inside = inside | (s < self.sinks)[None, None, :]
        return inside[:, None] & self.mask()

    def _window_fields(self, heads=slice(None)):
        return dict(row_index=self.row_index, window=self.window,
                    gamma=None if self.gamma is None else self.gamma[heads],
                    window_linear=self.window_linear, sinks=self.sinks)

    @property
    def n_rows(self) -> int:
        """Number of real (sequence, head, row) triples."""
        return int(self.row_mask.sum()) * self.q.shape[1]

    def heads(self, index: slice) -> TeacherBatch:
        """The same sequences restricted to the heads ``index`` (views, no copy)."""
        return TeacherBatch(self.q[:, index], self.k[:, index], self.key_mask, self.row_mask,
                            None if self.v is None else self.v[:, index], self.row_pos,
                            self.target, **self._window_fields(index))

    def sequences(self, index: slice) -> TeacherBatch:
        """The sequences ``index`` (views), trimmed to their longest real key."""
        km = self.key_mask[index]
        s = max(int(km.sum(1).max()), 1) if km.numel() else 1
        return TeacherBatch(self.q[index], self.k[index, :, :s], km[:, :s], self.row_mask[index],
                            None if self.v is None else self.v[index, :, :s],
                            None if self.row_pos is None else self.row_pos[index],
                            None if self.target is None else self.target[index, :, :s],
                            **{**self._window_fields(), "row_index": None
                               if self.row_index is None else self.row_index[index]})


def teacher_rows(batch: TeacherBatch, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Teacher log-probabilities ``log p_ts`` (B, H, R, S) (``-inf`` on keys a row does not
    see): the softmax rows, or the log of the batch's explicit ``target`` (every head)."""
    mask = batch.mask()  # (B, 1, R, S)
    if batch.target is not None:
        p = batch.target.to(dtype)[:, None].masked_fill(~mask, 0.0)
        return p.log().expand(-1, batch.q.shape[1], -1, -1)
    q, k = batch.q.to(dtype), batch.k.to(dtype)
    logits = (q @ k.transpose(-1, -2)).masked_fill(~mask, -math.inf)
    return torch.log_softmax(logits, dim=-1)


def _mass_scale(mass: torch.Tensor, heads: int) -> torch.Tensor:
    """``N w`` of masses (M,) or (G, M) as a factor on features (B, H, R, M): (1|H, 1, M)."""
    n = mass.shape[-1]
    if mass.ndim == 1:
        return (n * mass)[None, None, :]
    G = mass.shape[0]
    return (n * mass).repeat_interleave(heads // G, dim=0)[:, None, :]


def _chunk_sums(feature: FeatureFn, w: torch.Tensor, batch: TeacherBatch, output_weight: float,
                mass: torch.Tensor | None = None):
    """(sum of row KL, sum of squared output error, rows, differentiable loss) of one chunk;
    ``mass`` (M,) or (G, M): the query features are scaled by ``N w_i`` (the kernel of
    features scaled by ``sqrt(N w_i)`` on both sides)."""
    dtype = w.dtype
    with torch.no_grad():
        logp = teacher_rows(batch, dtype)  # (B, H, R, S)
        p = logp.exp()
    q, k = batch.q.to(dtype), batch.k.to(dtype)
    kmask = batch.mask()  # (B, 1, R, S): real (and, causal, earlier) keys of each row
    rmask = batch.row_mask[:, None, :].expand(-1, q.shape[1], -1)  # (B, H, R)
    phi_q = feature(q, w).to(dtype)  # (B, H, R, M)
    if mass is not None:
        phi_q = phi_q * _mass_scale(mass, q.shape[1])
    phi_k = feature(k, w).to(dtype) * batch.key_mask[:, None, :, None].to(dtype)  # (B, H, S, M)
    kern = (phi_q @ phi_k.transpose(-1, -2)).masked_fill(~kmask, 0.0)  # (B, H, R, S)
    if batch.window:  # the hybrid: gamma exp(q . k) inside the window, the kernel outside
        inside = batch.window_mask()  # (B, 1, R, S)
        gamma = batch.gamma.to(dtype)[None, :, None, None]
        win = gamma * torch.exp((q @ k.transpose(-1, -2)).masked_fill(~inside, -math.inf))
        kern = torch.where(inside, win, kern if batch.window_linear else torch.zeros_like(kern))
    tiny = torch.finfo(dtype).tiny
    log_a = kern.clamp_min(tiny).log() - kern.sum(-1, keepdim=True).clamp_min(tiny).log()
    valid = kmask & (p > 0)
    kl_rows = torch.where(valid, p * (logp - log_a), torch.zeros((), dtype=dtype)).sum(-1)
    kl_rows = kl_rows.masked_fill(~rmask, 0.0)  # (B, H, R)
    kl_sum = kl_rows.sum()
    loss = kl_sum
    se_sum = torch.zeros((), dtype=dtype)
    if batch.v is not None:
        a = log_a.exp().masked_fill(~kmask, 0.0)
        v = batch.v.to(dtype)
        diff = (a - p) @ v  # (B, H, R, dh)
        se_rows = diff.pow(2).sum(-1).masked_fill(~rmask, 0.0) / v.shape[-1]  # (B, H, R)
        se_sum = se_rows.sum()
        if output_weight > 0:
            loss = loss + output_weight * se_sum
    return kl_sum, se_sum, loss


@dataclass
class TeacherAttention:
    """Data term: mean row KL of linear attention to the softmax teacher (+ output MSE).

    Parameters
    ----------
    feature : ``phi(u (..., dh), omega (M, dh)) -> (..., M)``, positive values
        (e.g. ``KernelAttention.feature``)
    output_weight : weight of the output MSE in the value (0: KL only; the MSE is still
        reported when the batches hold values)
    chunk_elements : sequences are streamed in chunks of about this many ``(row, key, feature)``
        products per chunk (memory bound, no effect on the result)
    dtype : computation dtype (default float64: the exp-type features are not shifted)

    ``batches`` is a list of :class:`TeacherBatch`. Returns ``(value (), grad (M, dh), info)``
    with ``info = {"kl", "mse", "rows"}`` (means over all rows of all batches; ``mse`` NaN
    without values). Particles per head: ``omega`` (H, M, dh) with ``feature`` applied per
    head (:func:`per_head`); every head has the same rows, so the value is the mean of the
    per-head values.
    """

    feature: FeatureFn
    output_weight: float = 0.0
    chunk_elements: int = 2**22
    dtype: torch.dtype = torch.float64

    def __post_init__(self) -> None:
        if not callable(self.feature):
            raise TypeError("feature must be callable: phi(u, omega) -> (..., M)")
        if not (self.output_weight >= 0 and math.isfinite(self.output_weight)):
            raise ValueError(f"output_weight must be finite and >= 0, got {self.output_weight}")

    def sums(self, omega: torch.Tensor, batches: Sequence[TeacherBatch], *,
             grad: bool = True, weights: torch.Tensor | None = None):
        """Additive statistics ``[sum KL, sum squared error, rows]`` (3,) and the gradient of
        ``sum KL + output_weight * sum SE`` in omega (M, dh) (zeros with ``grad=False``);
        with ``weights`` (masses, shape ``omega.shape[:-1]``) also its gradient in the masses,
        as a third item."""
        w = omega.detach().to(self.dtype).requires_grad_(grad)
        mass = None
        if weights is not None:
            if tuple(weights.shape) != tuple(omega.shape[:-1]):
                raise ValueError(f"weights must have shape {tuple(omega.shape[:-1])}, got "
                                 f"{tuple(weights.shape)}")
            mass = weights.detach().to(self.dtype).requires_grad_(grad)
        stats = torch.zeros(3, dtype=self.dtype)
        g = torch.zeros_like(w)
        gm = None if mass is None else torch.zeros_like(mass)
        m = omega.shape[-2]
        for batch in batches:
            if not isinstance(batch, TeacherBatch):
                raise TypeError(f"batches must hold TeacherBatch items, got "
                                f"{type(batch).__name__}")
            B, H, R, _ = batch.q.shape
            S = batch.k.shape[2]
            per_seq = max(H * max(R, 1) * max(S, 1) * max(m, 1), 1)
            step = max(1, self.chunk_elements // per_seq)
            for start in range(0, B, step):
                part = batch.sequences(slice(start, start + step))
                if not bool(part.row_mask.any()):
                    continue
                with torch.set_grad_enabled(grad):
                    kl, se, loss = _chunk_sums(self.feature, w, part, self.output_weight, mass)
                    if grad and mass is None:
                        (gc,) = torch.autograd.grad(loss, w)
                        g += gc
                    elif grad:
                        gc, gmc = torch.autograd.grad(loss, [w, mass])
                        g += gc
                        gm += gmc
                stats += torch.stack([kl.detach(), se.detach(),
                                      torch.tensor(float(part.n_rows), dtype=self.dtype)])
        return (stats, g) if mass is None else (stats, g, gm)

    def value_and_grad(self, omega: torch.Tensor, batches: Sequence[TeacherBatch],
                       comm: Comm | None = None, *, weights: torch.Tensor | None = None):
        if weights is not None:
            stats, g, gm = self.sums(omega, batches, weights=weights)
            if comm is not None:
                stats, g, gm = comm.reduce([stats, g, gm])
            value, g, info = self._finish(omega, stats, g, batches)
            return value, (g, (gm / info["rows"]).to(omega.dtype)), info
        stats, g = self.sums(omega, batches)
        if comm is not None:
            stats, g = comm.reduce([stats, g])
        return self._finish(omega, stats, g, batches)

    def _finish(self, omega, stats, g, batches):
        rows = float(stats[2])
        if rows == 0:
            raise ValueError("no real query rows in the batches")
        has_v = any(b.v is not None for b in batches)
        kl, mse = stats[0] / rows, stats[1] / rows
        value = kl + self.output_weight * mse
        info = {"kl": float(kl), "mse": float(mse) if has_v else float("nan"), "rows": rows}
        return value.to(omega.dtype), (g / rows).to(omega.dtype), info

    __call__ = value_and_grad

    def evaluate(self, omega: torch.Tensor, batches: Sequence[TeacherBatch],
                 comm: Comm | None = None, *,
                 weights: torch.Tensor | None = None) -> dict[str, float]:
        """``{"kl", "mse", "rows"}`` without the gradient (no autograd graph); ``weights``:
        the masses of weighted particles (shape ``omega.shape[:-1]``)."""
        stats = self.sums(omega, batches, grad=False, weights=weights)[0]
        if comm is not None:
            (stats,) = comm.reduce([stats])
        rows = float(stats[2])
        if rows == 0:
            raise ValueError("no real query rows in the batches")
        has_v = any(b.v is not None for b in batches)
        return {"kl": float(stats[0] / rows),
                "mse": float(stats[1] / rows) if has_v else float("nan"), "rows": rows}


@dataclass
class EmbeddingTeacher:
    """Data term of the joint (end-to-end) refinement: the student's sentence embeddings
    against the teacher's,

        D(Omega) = (1 / n) sum_sentences (1 - cos(e(x; Omega), e_teacher(x)))

    where ``e(x; Omega)`` runs the whole converted encoder with the particles ``Omega`` of all
    its layers (every other weight fixed), so the layers' particles can correct each other's
    errors instead of each copying its own softmax rows. A mean over sentences (O(1) whatever
    their number), a sum divided by a count (exact across processes with ``comm``).

    Parameters
    ----------
    embed : ``embed(omega, inputs) -> (B, D)`` the student embeddings with particles ``omega``
        (differentiable in ``omega``; any shape the caller's particle layout uses)

    ``batches`` are ``(inputs, target (B, D))`` pairs. Returns ``(value (), grad (shape of
    omega), info)`` with ``info = {"cos", "sentences"}`` (mean cosine).
    """

    embed: Callable[[torch.Tensor, object], torch.Tensor]

    def __post_init__(self) -> None:
        if not callable(self.embed):
            raise TypeError("embed must be callable: embed(omega, inputs) -> (B, D)")

    def sums(self, omega: torch.Tensor, batches: Sequence, *, grad: bool = True):
        """``[sum of (1 - cos), sentences]`` (2,) float64 and the gradient of the sum."""
        w = omega.detach().requires_grad_(grad)
        stats = torch.zeros(2, dtype=torch.float64)
        g = torch.zeros_like(w)
        for inputs, target in batches:
            with torch.set_grad_enabled(grad):
                e = self.embed(w, inputs)
                if e.ndim != 2 or tuple(e.shape) != tuple(target.shape):
                    raise ValueError(f"embeddings of shape {tuple(e.shape)} do not match the "
                                     f"targets' {tuple(target.shape)}")
                loss = (1 - torch.nn.functional.cosine_similarity(
                    e, target.to(e), dim=-1)).sum()
                if grad:
                    (gc,) = torch.autograd.grad(loss, w)
                    g += gc
            stats += torch.tensor([float(loss.detach()), float(e.shape[0])], dtype=torch.float64)
        return stats, g

    def value_and_grad(self, omega: torch.Tensor, batches: Sequence, comm: Comm | None = None):
        stats, g = self.sums(omega, batches)
        if comm is not None:
            stats, g = comm.reduce([stats, g])
        n = float(stats[1])
        if n == 0:
            raise ValueError("no sentences in the batches")
        value = stats[0] / n
        return value.to(omega.dtype), (g / n).to(omega.dtype), {"cos": float(1 - value),
                                                                 "sentences": n}

    __call__ = value_and_grad

    def evaluate(self, omega: torch.Tensor, batches: Sequence,
                 comm: Comm | None = None) -> dict[str, float]:
        """``{"cos", "sentences"}`` without the gradient."""
        stats, _ = self.sums(omega, batches, grad=False)
        if comm is not None:
            (stats,) = comm.reduce([stats])
        n = float(stats[1])
        if n == 0:
            raise ValueError("no sentences in the batches")
        return {"cos": float(1 - stats[0] / n), "sentences": n}


@dataclass
class WindowWeights:
    """The window weights of a hybrid student as the variable of a data term: ``value_and_grad
    (logits (H,), batches)`` is ``term``'s value with fixed particles ``omega`` and the window
    weight ``sigmoid(logits)`` per head in every batch (which must carry a window), and its
    gradient in the logits (for :func:`coulomb_attention.dynamics.adam_fit`)."""

    term: TeacherAttention
    omega: torch.Tensor

    def value_and_grad(self, logits: torch.Tensor, batches: Sequence[TeacherBatch],
                       comm: Comm | None = None):
        import dataclasses

        dtype = self.term.dtype
        x = logits.detach().to(dtype).requires_grad_(True)
        w = self.omega.detach().to(dtype)
        stats = torch.zeros(3, dtype=dtype)
        grad = torch.zeros_like(x)
        for batch in batches:
            if not batch.window:
                raise ValueError("window weights need batches with a window")
            part = dataclasses.replace(batch, gamma=torch.sigmoid(x))
            kl, se, loss = _chunk_sums(self.term.feature, w, part, self.term.output_weight)
            (g,) = torch.autograd.grad(loss, x)
            grad += g
            stats += torch.stack([kl.detach(), se.detach(),
                                  torch.tensor(float(part.n_rows), dtype=dtype)])
        if comm is not None:
            stats, grad = comm.reduce([stats, grad])
        return self.term._finish(logits, stats, grad, batches)


def per_head(feature: FeatureFn) -> FeatureFn:
    """``feature`` with one omega per head group: ``phi(u (B, H, L, dh), omega (G, M, dh)) ->
    (B, H, L, M)``, heads ``g H/G .. (g+1) H/G - 1`` using ``omega[g]`` (G = H: one omega per
    head); vectorised over the groups (``torch.vmap``, no Python loop)."""
    def phi(u: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
        B, H, L, dh = u.shape
        G = omega.shape[0]
        if H % G:
            raise ValueError(f"{H} heads cannot be split into {G} groups")
        x = u.reshape(B, G, (H // G) * L, dh)
        out = torch.vmap(feature, in_dims=(1, 0), out_dims=1)(x, omega)
        return out.reshape(B, H, L, out.shape[-1])
    return phi


def _visible(b: TeacherBatch, i: int, t: int) -> list[int]:
    last = b.k.shape[2] - 1 if b.row_pos is None else int(b.row_pos[i, t])
    return [s for s in range(b.k.shape[2]) if bool(b.key_mask[i, s]) and s <= last]


def _row_target(b: TeacherBatch, i: int, h: int, t: int, keys: list[int]) -> torch.Tensor:
    kk = b.k[i, h, keys].double()
    return (torch.softmax(kk @ b.q[i, h, t].double(), 0) if b.target is None
            else b.target[i, t, keys].double())


def teacher_mass_gradient(feature: FeatureFn, omega: torch.Tensor, weights: torch.Tensor,
                          batches: Sequence[TeacherBatch]) -> torch.Tensor:
    """Closed form of ``dD / dw_i`` (the KL part; module doc) by a loop over rows, float64:
    the oracle of :meth:`TeacherAttention.value_and_grad`'s ``grad_weights``.
    ``omega`` (N, dh), ``weights`` (N,); returns (N,)."""
    om, w = omega.double(), weights.double()
    n = om.shape[0]
    grad = torch.zeros(n, dtype=torch.float64)
    rows = 0
    for b in batches:
        B, H, R, _ = b.q.shape
        for i in range(B):
            for h in range(H):
                for t in range(R):
                    if not bool(b.row_mask[i, t]):
                        continue
                    keys = _visible(b, i, t)
                    p = _row_target(b, i, h, t, keys)
                    fq = feature(b.q[i, h, t].double()[None], om)[0].double()  # (N,)
                    fk = feature(b.k[i, h, keys].double(), om).double()  # (S', N)
                    kern = fk @ (n * w * fq)  # (S',)
                    on = p > 0
                    first = (p[on, None] * fk[on] / kern[on, None]).sum(0)
                    second = fk.sum(0) / kern.sum()
                    grad -= n * fq * (first - second)
                    rows += 1
    return grad / rows


def naive_teacher_value(feature: FeatureFn, omega: torch.Tensor, batches: Sequence[TeacherBatch],
                        output_weight: float = 0.0,
                        weights: torch.Tensor | None = None) -> tuple[float, float]:
    """Naive twin: ``(mean row KL, mean output MSE)`` by a loop over rows, float64;
    ``weights`` (N,): features scaled by ``sqrt(N w_i)``."""
    om = omega.double()
    scale = None if weights is None else (om.shape[0] * weights.double()).sqrt()
    kl_sum = se_sum = 0.0
    rows = 0
    for b in batches:
        B, H, R, dh = b.q.shape
        for i in range(B):
            for h in range(H):
                for t in range(R):
                    if not bool(b.row_mask[i, t]):
                        continue
                    last = b.k.shape[2] - 1 if b.row_pos is None else int(b.row_pos[i, t])
                    keys = [s for s in range(b.k.shape[2])
                            if bool(b.key_mask[i, s]) and s <= last]
                    kk = b.k[i, h, keys].double()  # (S', dh)
                    qt = b.q[i, h, t].double()
                    p = (torch.softmax(kk @ qt, 0) if b.target is None
                         else b.target[i, t, keys].double())
                    fq = feature(qt[None], om)[0].double()
                    if scale is not None:
                        fq = fq * scale * scale
                    kern = torch.stack([fq @ feature(kk[j][None], om)[0].double()
                                        for j in range(len(keys))])
                    a = kern / kern.sum()
                    on = p > 0
                    kl_sum += float((p[on] * (p[on].log() - a[on].log())).sum())
                    if b.v is not None:
                        vv = b.v[i, h, keys].double()
                        se_sum += float(((a - p) @ vv).pow(2).sum()) / dh
                    rows += 1
    return kl_sum / rows, se_sum / rows

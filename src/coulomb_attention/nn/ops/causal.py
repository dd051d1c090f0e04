"""Causal linear attention and causal FAVOR+, chunked and recurrent (stateful) forms.

Both ops run one scan (:func:`_scan`) over blocks of positions: a running state
``sum_{s < t0} phi_k[s] [v_s, 1]^T`` (M x (e+1)) for the earlier blocks plus the masked (c, c)
kernel inside the block. The state is an argument and a result (flash-linear-attention's
convention): ``initial_state`` continues a sequence, ``output_final_state=True`` returns
``(out, final_state)``, so a prefill hands its state to token-by-token decoding
(:func:`causal_linear_step`, :func:`causal_favor_step`: the same scan on one position). The
naive twin of the recurrence is :func:`.reference.naive_recurrent_attention`.

Grouped-query attention: keys and values may have fewer heads than the queries (``Hk``
dividing ``H``; query head ``h`` reads key head ``h // (H / Hk)``). The state then has ``Hk``
heads: one per key/value group, whatever the number of query heads.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .checks import (
    _TINY,
    _check_4d,
    _check_omega,
    _chunk_size,
    _chunks,
    _compute_dtype,
    _no_autocast,
    _safe,
    check_key_mask,
    held_bytes,
)
from .favor import _favor_logits, use_quadratic
from .quadratic import favor_attention_quadratic

__all__ = ["LinearState", "causal_linear_attention", "causal_favor_attention",
           "causal_linear_step", "causal_favor_step"]


# Cap (in log units) on how far below its shift a key feature's prefix max may lie and still
# set a row's query shift: query features stay <= exp(60) ~ 1e26 (finite in float32, also in
# the masked upper triangle of a block).
_ROW_CAP = 60.0


class LinearState(NamedTuple):
    """The state of causal linear attention after a prefix of keys (a constant size).

    Attributes
    ----------
    kv : torch.Tensor, shape (B, Hk, M, e + 1)
        ``sum_s phi_k[s] [v_s, 1]^T`` over the keys seen so far (the last column is the
        normaliser ``sum_s phi_k[s]``); FAVOR+: with key feature ``m`` scaled by
        ``exp(-shift_m)``.
    shift : torch.Tensor of shape (B, Hk, M), or None
        FAVOR+ only: ``c_m``, the running max over the keys seen of key logit ``m`` (``-inf``
        before the first real key); ``None`` for maps without a shift.
    """

    kv: torch.Tensor
    shift: torch.Tensor | None

    def nbytes(self) -> int:
        """Bytes held by the state (its tensors' storages, :func:`.checks.held_bytes`)."""
        return held_bytes(*self)


def _check_gqa(q, k, v, key_mask, q_name="q", k_name="k") -> int:
    """Shapes of the causal ops: q (B, H, L, d), k (B, Hk, L, d), v (B, Hk, L, e), ``Hk``
    dividing ``H``; returns the group size ``H // Hk``."""
    _check_4d(q_name, q)
    _check_4d(k_name, k)
    _check_4d("v", v)
    B, H, L, _ = q.shape
    if k.shape[0] != B or k.shape[:3] != v.shape[:3] or k.shape[1] == 0 or H % k.shape[1]:
        raise ValueError(
            f"inconsistent shapes: {q_name} {tuple(q.shape)}, {k_name} {tuple(k.shape)}, "
            f"v {tuple(v.shape)} (need {q_name} (B,H,L,*), {k_name} (B,Hk,L,*), v (B,Hk,L,e) "
            "with Hk dividing H)")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{q_name} and {k_name} must have the same last dimension, "
                         f"got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[2] != L:
        raise ValueError(f"causal attention needs as many queries as keys, got {L} and "
                         f"{k.shape[2]}")
    check_key_mask(key_mask, B, L)
    return H // k.shape[1]


def _check_state(state, B, hk, M, e, favor: bool, dt) -> LinearState:
    """``state`` (a :class:`LinearState` or a pair) checked against the op's shapes."""
    if not isinstance(state, tuple) or len(state) != 2:
        raise TypeError(f"initial_state must be a LinearState (kv, shift), got "
                        f"{type(state).__name__}")
    kv, shift = state
    if not isinstance(kv, torch.Tensor) or tuple(kv.shape) != (B, hk, M, e + 1):
        got = tuple(kv.shape) if isinstance(kv, torch.Tensor) else type(kv).__name__
        raise ValueError(f"initial_state.kv must have shape {(B, hk, M, e + 1)}, got {got}")
    if favor and (not isinstance(shift, torch.Tensor) or tuple(shift.shape) != (B, hk, M)):
        raise ValueError(f"initial_state.shift must be a tensor of shape {(B, hk, M)} for "
                         "FAVOR+ (the running key max)")
    if not favor and shift is not None:
        raise ValueError("initial_state.shift must be None for precomputed features")
    return LinearState(kv.to(dt), None if shift is None else shift.to(dt))


def _exp_rows(x, rel):
    """Query features ``exp(x - s_t)``, ``x = b + c`` (the key shift added back), with the row
    shift ``s_t = max_m (x_m + max(rel_m, -_ROW_CAP))`` (cancels in the ratio), ``rel = p - c
    <= 0`` the prefix max of key feature m up to row t relative to its shift. The feature that
    attains ``s_t`` has a key at or before t with feature ``exp(rel_m)``, so the row's
    normaliser is >= 1 (unless its best feature is capped: all of its keys so far are >
    _ROW_CAP below the block's), and every query feature is <= exp(_ROW_CAP), finite in
    float32. Returns the features and ``s_t``."""
    top = (x + rel.clamp_min(-_ROW_CAP)).amax(-1, keepdim=True).detach()
    top = _safe(top)
    return torch.exp(x - top), top


def _scan(pq, pk, v1, chunk, kv, c=None):
    """The scan shared by the causal ops, on grouped heads.

    ``pq`` (B, Hk, G, L, M) query features (FAVOR+: query logits); ``pk`` (B, Hk, 1, L, M)
    key features (FAVOR+: key logits, ``-inf`` at padded keys); ``v1`` (B, Hk, 1, L, e + 1)
    ``[v, 1]`` times the key mask; ``kv`` (B, Hk, 1, M, e + 1) the state before position 0;
    ``c`` (B, Hk, 1, 1, M) the running key max (FAVOR+) or ``None`` (features: no shift).

    FAVOR+: each key feature m is shifted by the running max ``c_m`` of its logit over the
    real keys up to the end of the current block (the state of earlier blocks is rescaled by
    ``exp(c_old - c_new)`` when it grows), each query feature by ``+c_m`` and then the row
    shift of :func:`_exp_rows`. So no exponent is positive and a key feature underflows only
    when it is ~87 (float32) below the largest one of the same block and feature.

    Returns ``n`` (B, Hk, G, L, e + 1), the unnormalised ``[numerator, denominator]`` of each
    row in units of ``exp(-log_row)``; ``log_row`` (B, Hk, G, L, 1) (FAVOR+: the row shift,
    else ``None``: units 1); and the final ``kv`` and ``c``.
    """
    L = pq.shape[-2]
    if L == 1 and not (pq.requires_grad or pk.requires_grad or v1.requires_grad):
        return _scan_one(pq, pk, v1, kv, c)
    outs, logs = [], []
    for t0, t1 in _chunks(L, chunk):
        fq, fk = pq[..., t0:t1, :], pk[..., t0:t1, :]
        if c is not None:  # fk are key logits, fq query logits: shift, then exponentiate
            # prefix max of each key feature up to row t (earlier blocks: c; this block:
            # cummax), for the query shift: a feature's block max may come from a key *after*
            # t, and shifting by it alone can leave a row's normaliser tiny (its backward then
            # overflowed: NaN gradients in training)
            p = torch.maximum(c, torch.cummax(fk, dim=-2).values).detach()  # (B, Hk, 1, c, M)
            c_new = torch.maximum(c, fk.amax(-2, keepdim=True)).detach()
            kv = kv * torch.exp(c - _safe(c_new)).transpose(-1, -2)
            c = c_new
            fk = torch.exp(fk - _safe(c))
            fq, top = _exp_rows(fq + c, p - _safe(c))
            logs.append(top)
        tri = torch.ones(t1 - t0, t1 - t0, dtype=torch.bool, device=v1.device).tril()
        a = (fq @ fk.transpose(-1, -2)).masked_fill(~tri, 0.0)  # (B, Hk, G, c, c), s <= t
        outs.append(fq @ kv + a @ v1[..., t0:t1, :])  # (B, Hk, G, c, e + 1)
        kv = kv + fk.transpose(-1, -2) @ v1[..., t0:t1, :]
    log_row = torch.cat(logs, dim=-2) if logs else None
    return torch.cat(outs, dim=-2), log_row, kv, c


def _scan_one(pq, pk, v1, kv, c):
    """:func:`_scan` at one position (a decoding step), in the fewest ops: the key enters the
    state first (one ``addcmul``) and the query reads the new state (``s <= t``). FAVOR+: the
    running max takes the key's logits, and the prefix max up to the row is ``c_new`` itself,
    so the row shift is :func:`_exp_rows` with ``rel = c_new - _safe(c_new)``. Same arguments
    and results as :func:`_scan`, with any leading shape (the decoding steps pass the grouped
    (B, Hk, G, M) queries, (B, Hk, 1, M) keys); ``pk`` None: no key enters. Taken only when no
    input needs a gradient (the block scan detaches its shifts for the backward, this one has
    none)."""
    log_row = None
    if c is not None:
        if pk is not None:
            c_new = torch.maximum(c, pk)  # (..., 1, M)
            safe = _safe(c_new)
            kv = kv * torch.exp(c - safe).transpose(-1, -2)
            pk = torch.exp(pk - safe)
            c = c_new
        else:
            safe = _safe(c)
        pq, log_row = _exp_rows(pq + c, c - safe)
    if pk is not None:
        kv = torch.addcmul(kv, pk.transpose(-1, -2), v1)  # (..., M, e + 1)
    return pq @ kv, log_row, kv, c


def _favor_token(qg, k, v, omega, kv, c):
    """A FAVOR+ decoding step (:func:`_scan_one` on the logits) from the scaled grouped queries
    ``qg`` (B, Hk, G, d) and the key ``k`` (B, Hk, 1, d) with value ``v`` (``k`` None: no key
    enters) with ``omega`` (1 or Hk, M, d), the state ``kv`` (B, Hk, M, e + 1) in units
    ``exp(-c)`` and the running key max ``c`` (B, Hk, 1, M). Returns ``n`` (B, Hk, G, e + 1) in
    units ``exp(-log_row)``, ``log_row`` (the features' ``1 / sqrt(M)`` each included), the
    new ``kv`` and ``c``."""
    omt = omega.transpose(-1, -2).unsqueeze(0)  # (1, 1 or Hk, d, M)
    a = v1 = None
    if k is not None:
        a = k @ omt - 0.5 * (k * k).sum(-1, keepdim=True)  # key logits (B, Hk, 1, M)
        v1 = _with_one(v)
    b = qg @ omt - 0.5 * (qg * qg).sum(-1, keepdim=True)  # query logits (B, Hk, G, M)
    n, log_row, kv, c = _scan_one(b, a, v1, kv, c)
    return n, log_row - math.log(omega.shape[1]), kv, c


def _with_one(v: torch.Tensor) -> torch.Tensor:
    """``[v, 1]``: the value and the normaliser's column."""
    return torch.nn.functional.pad(v, (0, 1), value=1.0)


def _token_path(L, initial_state, key_mask, *tensors) -> bool:
    """Whether a call of the causal ops is a plain decoding step (:func:`_scan_one` on the
    grouped heads, :func:`_favor_token`): one position after a state, no padding, no
    gradient."""
    return (L == 1 and initial_state is not None and key_mask is None
            and not any(t.requires_grad for t in tensors))


def _normalise(n: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator`` of :func:`_scan`'s rows (0 for a row without keys)."""
    den = n[..., -1:]
    return torch.where(den > 0, n[..., :-1] / den.clamp_min(_TINY), 0.0)


def _grouped(pq, pk, v, key_mask, dt):
    """Queries (B, H, L, M) -> (B, Hk, G, L, M); keys -> (B, Hk, 1, L, M); ``[v, 1]`` masked."""
    B, H, L, _ = pq.shape
    hk = pk.shape[1]
    v1 = _with_one(v.to(dt))
    if key_mask is not None:
        v1 = v1 * key_mask[:, None, :, None].to(dt)  # padded keys: no value, no weight
    return pq.reshape(B, hk, H // hk, L, -1), pk.unsqueeze(2), v1.unsqueeze(2)


def _ungroup(out: torch.Tensor) -> torch.Tensor:
    B, hk, G, L, e = out.shape
    return out.reshape(B, hk * G, L, e)


def causal_linear_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    *,
    chunk_size: int | None = None,
    initial_state: LinearState | None = None,
    output_final_state: bool = False,
):
    """Causal linear attention: position t attends to the real keys s <= t (and to the keys
    summarised in ``initial_state``).

    ``out_t = phi_q[t] . S_t / phi_q[t] . z_t`` with ``S_t = sum_{s<=t} phi_k[s] v_s^T`` and
    ``z_t = sum_{s<=t} phi_k[s]``, in blocks of ``chunk_size`` positions (default 128): time
    O(L (M e + c (M + e))), memory kept for the backward O(L (c + M) + (L / c) M e). A position
    with no real key at or before it gets output 0. Twins: :func:`naive_linear_attention`
    with ``causal=True`` (quadratic) and :func:`naive_recurrent_attention` (token by token).

    Parameters
    ----------
    phi_q : torch.Tensor, shape (B, H, L, M), non-negative
    phi_k : torch.Tensor, shape (B, Hk, L, M), non-negative (``Hk`` divides ``H``: grouped
        queries share their group's keys)
    v : torch.Tensor, shape (B, Hk, L, e)
    key_mask : torch.Tensor of bool, shape (B, L), optional
    chunk_size : int, optional
    initial_state : LinearState, optional
        The state after the keys before position 0 (``shift`` None).
    output_final_state : bool
        Also return the state after the last position.

    Returns
    -------
    torch.Tensor, shape (B, H, L, e), dtype of ``v``; with ``output_final_state``
    ``(out, LinearState)`` (state in float32, or float64 for float64 inputs).
    """
    _check_gqa(phi_q, phi_k, v, key_mask, "phi_q", "phi_k")
    chunk = _chunk_size(chunk_size, 128)
    dt = _compute_dtype(v)
    B, hk, M, e = phi_k.shape[0], phi_k.shape[1], phi_k.shape[-1], v.shape[-1]
    if phi_q.shape[-1] != M:
        raise ValueError(f"phi_q and phi_k must have the same number of features, got "
                         f"{phi_q.shape[-1]} and {M}")
    with _no_autocast(v):
        kv = (v.new_zeros(B, hk, M, e + 1, dtype=dt) if initial_state is None
              else _check_state(initial_state, B, hk, M, e, False, dt).kv)
        if _token_path(phi_q.shape[2], initial_state, key_mask, phi_q, phi_k, v):
            G = phi_q.shape[1] // hk
            n, _, kv, _ = _scan_one(phi_q.to(dt).reshape(B, hk, G, M), phi_k.to(dt),
                                    _with_one(v.to(dt)), kv, None)
            out = _normalise(n).reshape(B, hk * G, 1, e).to(v.dtype)
            return (out, LinearState(kv, None)) if output_final_state else out
        pq, pk, v1 = _grouped(phi_q.to(dt), phi_k.to(dt), v, key_mask, dt)
        n, _, kv, _ = _scan(pq, pk, v1, chunk, kv.unsqueeze(2))
        out = _ungroup(_normalise(n)).to(v.dtype)
    if output_final_state:
        return out, LinearState(kv.squeeze(2), None)
    return out


def favor_scan(q, k, v, omega, key_mask=None, *, chunk_size=None, initial_state=None):
    """The unnormalised scan of causal FAVOR+ (the hybrid's linear branch builds on it).

    Arguments as :func:`causal_favor_attention` (float32/float64 inputs, no autocast). Returns
    ``n`` (B, Hk, G, L, e + 1) the rows' ``[numerator, denominator]`` with the unshifted
    features ``exp(u . w - |u|^2 / 2) / sqrt(M)`` in units of ``exp(-log_row)``, ``log_row``
    (B, Hk, G, L, 1), and the final :class:`LinearState`.
    """
    B, hk, L, _ = k.shape
    M, e, dt = omega.shape[1], v.shape[-1], q.dtype
    if omega.shape[0] not in (1, hk):
        raise ValueError(f"omega must have shape (1 or {hk}, n_features, {q.shape[-1]}): one "
                         f"particle set per key/value head, got {tuple(omega.shape)}")
    if initial_state is None:
        kv = v.new_zeros(B, hk, M, e + 1, dtype=dt)
        c = v.new_full((B, hk, M), -math.inf, dtype=dt)
    else:
        kv, c = _check_state(initial_state, B, hk, M, e, True, dt)
    om_q = omega.repeat_interleave(q.shape[1] // hk, 0) if omega.shape[0] > 1 else omega
    b, a = _favor_logits(q, om_q), _favor_logits(k, omega)  # (B, H, L, M), (B, Hk, L, M)
    if key_mask is not None:
        a = a.masked_fill(~key_mask[:, None, :, None], -math.inf)
    pq, pk, v1 = _grouped(b, a, v, key_mask, dt)
    n, log_row, kv, c = _scan(pq, pk, v1, _chunk_size(chunk_size, 128), kv.unsqueeze(2),
                              c[:, :, None, None, :])
    # the features' 1/sqrt(M) each: the products carry 1/M
    return n, log_row - math.log(M), LinearState(kv.squeeze(2), c[:, :, 0, 0, :])


def causal_favor_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    omega: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    *,
    chunk_size: int | None = None,
    order: str = "auto",
    initial_state: LinearState | None = None,
    output_final_state: bool = False,
):
    """Causal FAVOR+ attention (prefix sums in blocks, as :func:`causal_linear_attention`).

    The features are ``exp(a)`` with ``a = log_positive(x, w)`` (the core map), stabilised
    by shifts that cancel exactly (:func:`_scan`): each key feature by its running max, kept
    in the state as it grows (:class:`LinearState` ``shift``), each query row by its own
    shift. Memory O(L M) (the logits are materialised; not the fused path). Twins:
    :func:`naive_favor_attention` with ``causal=True``, :func:`naive_recurrent_attention`.

    ``order`` as in :func:`.favor.favor_attention`: at short sequences (``"auto"``) the
    quadratic order (:mod:`.quadratic`, the kernel matrix kept for ``s <= t``) computes the
    same result in one batched pass; its key shift is per feature over the whole sequence, so
    where a row's normaliser would underflow (large norms shrinking along the sequence) the
    call falls back to the blocks above. A call with a state (in or out) always runs the
    blocks.

    Parameters
    ----------
    q : torch.Tensor, shape (B, H, L, d)
    k : torch.Tensor, shape (B, Hk, L, d), ``Hk`` dividing ``H``
    v : torch.Tensor, shape (B, Hk, L, e)
    omega : torch.Tensor, shape (1 or Hk, M, d)
    key_mask, chunk_size, initial_state, output_final_state
        As :func:`causal_linear_attention` (the state's ``shift`` is the running key max).
    """
    _check_gqa(q, k, v, key_mask)
    _check_omega(omega, k.shape[1], q.shape[-1])
    chunk = _chunk_size(chunk_size, 128)
    dt = _compute_dtype(v)
    stateful = initial_state is not None or output_final_state
    grouped = q.shape[1] != k.shape[1]
    quadratic = not (stateful or grouped) and use_quadratic(
        order, q.shape[2], k.shape[2], omega.shape[1], v.shape[-1], q.shape[0] * q.shape[1],
        causal=True)
    with _no_autocast(v):
        om = omega.to(dt)
        if _token_path(q.shape[2], initial_state, key_mask, q, k, v, om):
            B, hk, _, d = k.shape
            kv, c = _check_state(initial_state, B, hk, om.shape[1], v.shape[-1], True, dt)
            G = q.shape[1] // hk
            n, _, kv, c = _favor_token(q.to(dt).reshape(B, hk, G, d), k.to(dt), v.to(dt), om, kv,
                                       c.unsqueeze(2))
            out = _normalise(n).reshape(B, hk * G, 1, v.shape[-1]).to(v.dtype)
            state = LinearState(kv, c.squeeze(2))
            return (out, state) if output_final_state else out
        if quadratic:
            out = favor_attention_quadratic(q.to(dt), k.to(dt), v.to(dt), om, key_mask,
                                            causal=True)
            if out is not None:
                return out.to(v.dtype)
        n, _, state = favor_scan(q.to(dt), k.to(dt), v, om, key_mask, chunk_size=chunk,
                                 initial_state=initial_state)
        out = _ungroup(_normalise(n)).to(v.dtype)
    return (out, state) if output_final_state else out


def causal_linear_step(phi_q, phi_k, v, state=None):
    """One decoding step of :func:`causal_linear_attention`: ``phi_q`` (B, H, 1, M),
    ``phi_k`` (B, Hk, 1, M), ``v`` (B, Hk, 1, e), ``state`` the state after the earlier
    positions (``None``: the first). Returns ``(out (B, H, 1, e), new_state)``."""
    return causal_linear_attention(phi_q, phi_k, v, initial_state=state,
                                   output_final_state=True)


def causal_favor_step(q, k, v, omega, state=None):
    """One decoding step of :func:`causal_favor_attention` (arguments with ``L = 1``); the
    running key max grows exactly as in the chunked form. Returns ``(out, new_state)``."""
    return causal_favor_attention(q, k, v, omega, initial_state=state, output_final_state=True)

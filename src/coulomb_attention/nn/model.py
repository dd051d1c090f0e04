"""A small Transformer encoder classifier whose attention is a :class:`KernelAttention`.

Structure (names chosen so BERT-style checkpoints map onto it with a flat rename, see
:func:`coulomb_attention.nn.families.bert.bert_key_map`)::

    embeddings.word_embeddings      (vocab, E)       E = embedding_dim (default D)
    embeddings.word_proj            Linear(E, D)     only when E != D (e.g. a pretrained table)
    embeddings.position_embeddings  (max_len, D)     learned absolute positions
    embeddings.token_type_embeddings (types, D)      only when type_vocab_size > 0
    embeddings.norm                 LayerNorm(D)     only when post_norm (BERT applies it)
    blocks.{i}.attn_norm            LayerNorm(D)
    blocks.{i}.attn                 KernelAttention (q_proj, k_proj, v_proj, out_proj; omega)
    blocks.{i}.mlp_norm             LayerNorm(D)
    blocks.{i}.mlp.fc1 / mlp.fc2    Linear(D, F) -> GELU -> Linear(F, D)
    final_norm                      LayerNorm(D)     pre-norm only
    head                            Linear(D, num_labels)

Pre-norm block (default)::

    x = x + drop(attn(attn_norm(x), mask))
    x = x + drop(mlp(mlp_norm(x)))

Post-norm block (``post_norm=True``, BERT)::

    x = attn_norm(x + drop(attn(x, mask)))
    x = mlp_norm(x + drop(mlp(x)))

Pooling is the masked mean of the last hidden states (padding never counts) or the first
(``[CLS]``) token. Padding does not change the logits: keys are masked inside the attention
and the pooling ignores padded positions.

The particles ``omega`` of each attention layer are buffers: an optimiser never sees them,
and they change only through ``KernelAttention.load_features_`` / ``redraw_``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .._validation import check_choice, check_nonnegative, check_positive
from .attention import ATTENTION_FEATURES, KernelAttention

__all__ = ["ModelConfig", "TransformerClassifier", "POOLINGS"]

POOLINGS = ("mean", "cls")


@dataclass(frozen=True)
class ModelConfig:
    """Configuration of :class:`TransformerClassifier`.

    Attributes
    ----------
    vocab_size : int             size of the token embedding table
    embedding_dim : int or None  width E of the token table; ``None``: D. ``E != D`` adds a
                                 learned projection (factorised embeddings, or a pretrained
                                 table of another width)
    num_labels : int             number of classes
    dim : int                    model width D
    layers : int                 number of encoder blocks
    heads : int                  attention heads (D must be divisible by heads)
    mlp_dim : int                hidden width of the MLP
    max_len : int                number of learned positions (longer inputs raise)
    attention : str              one of ``ATTENTION_FEATURES``
    n_features : int             random features per head (ignored by elu/softmax)
    tie_qk : bool or None        tie W_q = W_k; ``None``: True for ``softmax_feat`` only
    share_features : bool        one omega per layer (True) or one per head
    dropout : float              dropout on embeddings, residual branches and the MLP
    attn_dropout : float         dropout inside the attention module
    pooling : str                ``mean`` (masked) or ``cls``
    post_norm : bool             BERT-style post-norm blocks (default pre-norm)
    type_vocab_size : int        token-type embeddings (0: none)
    layer_norm_eps : float
    pad_id : int                 padding token id (its embedding is zero-initialised)
    """

    vocab_size: int = 8000
    num_labels: int = 2
    dim: int = 128
    layers: int = 2
    heads: int = 4
    mlp_dim: int = 256
    max_len: int = 128
    attention: str = "favor"
    n_features: int = 64
    tie_qk: bool | None = None
    share_features: bool = True
    dropout: float = 0.1
    attn_dropout: float = 0.0
    pooling: str = "mean"
    post_norm: bool = False
    type_vocab_size: int = 0
    layer_norm_eps: float = 1e-5
    pad_id: int = 0
    embedding_dim: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "num_labels", "dim", "layers", "heads", "mlp_dim", "max_len",
                     "n_features"):
            check_positive(name, getattr(self, name), integer=True)
        check_choice("attention", self.attention, ATTENTION_FEATURES)
        check_choice("pooling", self.pooling, POOLINGS)
        if self.dim % self.heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by heads ({self.heads})")
        for name in ("dropout", "attn_dropout"):
            p = check_nonnegative(name, getattr(self, name))
            if p >= 1:
                raise ValueError(f"{name} must be in [0, 1), got {p}")
        check_nonnegative("type_vocab_size", self.type_vocab_size)
        if self.embedding_dim is not None:
            check_positive("embedding_dim", self.embedding_dim, integer=True)
        check_positive("layer_norm_eps", self.layer_norm_eps)
        if self.num_labels < 2:
            raise ValueError(f"num_labels must be >= 2, got {self.num_labels}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"pad_id {self.pad_id} outside the vocabulary [0, {self.vocab_size})")
        if self.tie_qk is None:  # resolved here so the stored config is explicit
            object.__setattr__(self, "tie_qk", self.attention == "softmax_feat")


class Embeddings(nn.Module):
    """Token + learned position (+ token-type) embeddings; LayerNorm only for post-norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        e = config.embedding_dim or config.dim
        self.word_embeddings = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_id)
        self.word_proj = nn.Linear(e, config.dim, bias=False) if e != config.dim else None
        self.position_embeddings = nn.Embedding(config.max_len, config.dim)
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, config.dim) if config.type_vocab_size else None
        )
        self.norm = (nn.LayerNorm(config.dim, eps=config.layer_norm_eps)
                     if config.post_norm else None)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, input_ids: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        t = input_ids.shape[1]
        pos = torch.arange(t, device=input_ids.device)
        x = self.word_embeddings(input_ids)
        if self.word_proj is not None:
            x = self.word_proj(x)
        x = x + self.position_embeddings(pos)[None]  # (B, T, D)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.token_type_embeddings(token_type_ids)
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)


class MLP(nn.Module):
    """``fc2(dropout(gelu(fc1(x))))``."""

    def __init__(self, dim: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(nn.functional.gelu(self.fc1(x))))


class Block(nn.Module):
    """One encoder block (pre-norm by default, post-norm if configured)."""

    def __init__(self, config: ModelConfig, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.post_norm = config.post_norm
        self.attn_norm = nn.LayerNorm(config.dim, eps=config.layer_norm_eps)
        self.attn = KernelAttention(
            config.dim,
            config.heads,
            feature_map=config.attention,
            n_features=config.n_features,
            tie_qk=config.tie_qk,
            dropout=config.attn_dropout,
            share_features=config.share_features,
            generator=generator,
        )
        self.mlp_norm = nn.LayerNorm(config.dim, eps=config.layer_norm_eps)
        self.mlp = MLP(config.dim, config.mlp_dim, config.dropout)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if self.post_norm:
            x = self.attn_norm(x + self.dropout(self.attn(x, mask)))
            return self.mlp_norm(x + self.dropout(self.mlp(x)))
        x = x + self.dropout(self.attn(self.attn_norm(x), mask))
        return x + self.dropout(self.mlp(self.mlp_norm(x)))


class TransformerClassifier(nn.Module):
    """Encoder + pooling + linear head.

    Parameters
    ----------
    config : ModelConfig
    generator : torch.Generator, optional
        Draws the initial weights and the particles; ``None`` uses torch's default generator
        (pass one for reproducible models).

    ``forward(input_ids (B, T) long, attention_mask (B, T) bool, token_type_ids=None)``
    returns logits of shape ``(B, num_labels)``.
    """

    def __init__(self, config: ModelConfig, generator: torch.Generator | None = None) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        self.config = config
        self.embeddings = Embeddings(config)
        self.blocks = nn.ModuleList(Block(config, generator) for _ in range(config.layers))
        self.final_norm = (None if config.post_norm
                           else nn.LayerNorm(config.dim, eps=config.layer_norm_eps))
        self.head = nn.Linear(config.dim, config.num_labels)
        self._init_weights(generator)

    @torch.no_grad()
    def _init_weights(self, generator: torch.Generator | None) -> None:
        # BERT-style: N(0, 0.02) weights, zero biases, unit LayerNorm; omega untouched.
        for module in self.modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * 0.02)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.Embedding):
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * 0.02)
                if module.padding_idx is not None:
                    module.weight[module.padding_idx].zero_()
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()

    @property
    def attention_layers(self) -> list[KernelAttention]:
        """The attention module of each block, in order."""
        return [block.attn for block in self.blocks]

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Last hidden states, shape ``(B, T, D)`` (after the final LayerNorm)."""
        if input_ids.ndim != 2 or input_ids.dtype not in (torch.long, torch.int):
            raise ValueError(
                f"input_ids must be an integer tensor of shape (B, T), got "
                f"{input_ids.dtype} {tuple(input_ids.shape)}"
            )
        if input_ids.shape[1] > self.config.max_len:
            raise ValueError(
                f"sequence length {input_ids.shape[1]} exceeds max_len {self.config.max_len}"
            )
        if attention_mask is not None:
            if attention_mask.shape != input_ids.shape:
                raise ValueError(
                    f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
                    f"{tuple(input_ids.shape)}"
                )
            attention_mask = attention_mask.bool()
        x = self.embeddings(input_ids, token_type_ids)
        for block in self.blocks:
            x = block(x, attention_mask)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x

    def pool(self, h: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """``(B, T, D) -> (B, D)``: masked mean or the first token."""
        if self.config.pooling == "cls":
            return h[:, 0]
        if attention_mask is None:
            return h.mean(1)
        w = attention_mask.to(h.dtype).unsqueeze(-1)  # (B, T, 1)
        return (h * w).sum(1) / w.sum(1).clamp_min(1.0)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        h = self.encode(input_ids, attention_mask, token_type_ids)
        return self.head(self.pool(h, attention_mask))


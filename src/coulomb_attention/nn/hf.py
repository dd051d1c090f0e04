"""Hugging Face interop: put converted kernel attention into a ``transformers`` BertModel.

:func:`kernelize_bert_` replaces, in place, the self-attention of every layer of a
``transformers`` BERT model by :class:`KernelSelfAttention`, which keeps the model's own
query/key/value projections and computes ``phi(q) . phi(k)``-normalised attention with the
particles of a converted encoder (:func:`coulomb_attention.nn.families.bert.load_pretrained_encoder`
of a ``coulomb-attention convert`` checkpoint). The rest of the HF model (embeddings, output
projections, LayerNorms, feed-forward blocks, pooler) is untouched, so its
``last_hidden_state`` equals the project's own encoder. ``transformers`` is optional: this module
imports nothing from it.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import KernelAttention

__all__ = ["KernelSelfAttention", "kernelize_bert_"]


class KernelSelfAttention(nn.Module):
    """Drop-in for ``transformers``' ``BertSelfAttention``: same ``query``/``key``/``value``
    modules, attention computed by a :class:`KernelAttention`'s :meth:`~KernelAttention.attend`
    (its particles ``omega``; its own projections are not used).

    ``forward(hidden_states (B, T, D), attention_mask=None, ...) -> (context (B, T, D), None)``;
    the mask may be HF's additive float mask (0 = attend) or a boolean one (True = attend), of
    shape (B, 1, 1|T, S) or (B, S).
    """

    def __init__(self, hf_self_attention: nn.Module, kernel: KernelAttention) -> None:
        super().__init__()
        self.query = hf_self_attention.query
        self.key = hf_self_attention.key
        self.value = hf_self_attention.value
        self.kernel = kernel
        self.heads, self.head_dim = kernel.heads, kernel.head_dim

    @staticmethod
    def key_mask(mask: torch.Tensor | None, batch: int, length: int) -> torch.Tensor | None:
        """Boolean key mask (B, S) from an HF attention mask (None: every key is real)."""
        if mask is None:
            return None
        m = mask.reshape(batch, -1, mask.shape[-1])[:, 0, :length]  # first query row
        if m.dtype == torch.bool:
            return m
        return m > torch.finfo(m.dtype).min / 2 if m.is_floating_point() else m != 0

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                *args, **kwargs):
        B, T, _ = hidden_states.shape

        def split(t):
            return t.view(B, T, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, dh)

        scale = self.head_dim ** -0.25
        q, k = split(self.query(hidden_states)) * scale, split(self.key(hidden_states)) * scale
        v = split(self.value(hidden_states))
        mask = self.key_mask(attention_mask, B, T)
        if mask is not None and bool(mask.all()):
            mask = None
        out = self.kernel.attend(q, k, v, mask)  # (B, H, T, dh)
        return out.transpose(1, 2).reshape(B, T, self.heads * self.head_dim), None


def kernelize_bert_(hf_model: nn.Module, converted: nn.Module) -> nn.Module:
    """Replace every self-attention of ``hf_model`` (a ``transformers`` ``BertModel`` or a
    model with a ``.bert``) by :class:`KernelSelfAttention` with the kernel and particles of
    ``converted`` (a :class:`~coulomb_attention.nn.families.bert.PretrainedClassifier`). Returns
    ``hf_model``. The two must have the same number of layers, width and heads."""
    bert = getattr(hf_model, "bert", hf_model)
    layers = getattr(getattr(bert, "encoder", None), "layer", None)
    if layers is None:
        raise ValueError("not a BERT model: no encoder.layer")
    kernels = list(converted.attention_layers)
    if len(layers) != len(kernels):
        raise ValueError(f"{len(layers)} HF layers but {len(kernels)} converted layers")
    for hf_layer, kernel in zip(layers, kernels, strict=True):
        attn = hf_layer.attention.self
        if attn.query.out_features != kernel.dim or attn.num_attention_heads != kernel.heads:
            raise ValueError("HF model and converted encoder differ in width or heads")
        hf_layer.attention.self = KernelSelfAttention(attn, kernel)
    return hf_model

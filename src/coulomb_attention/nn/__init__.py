"""Attention layers: linear-attention ops with naive twins, and the KernelAttention module."""

from . import functional
from .attention import ATTENTION_FEATURES, AttentionFeature, KernelAttention
from .functional import (
    favor_attention,
    linear_attention,
    naive_favor_attention,
    naive_linear_attention,
    softmax_attention,
)

__all__ = [
    "ATTENTION_FEATURES",
    "AttentionFeature",
    "KernelAttention",
    "favor_attention",
    "functional",
    "linear_attention",
    "naive_favor_attention",
    "naive_linear_attention",
    "softmax_attention",
]

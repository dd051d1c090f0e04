"""Attention layers (linear-attention ops with naive twins, KernelAttention) and the classifier."""

from . import functional
from .attention import ATTENTION_FEATURES, AttentionFeature, KernelAttention, trainable_omega
from .families.bert import bert_key_map
from .functional import (
    favor_attention,
    linear_attention,
    naive_favor_attention,
    naive_linear_attention,
    softmax_attention,
)
from .model import ModelConfig, TransformerClassifier

__all__ = [
    "ATTENTION_FEATURES",
    "AttentionFeature",
    "KernelAttention",
    "ModelConfig",
    "TransformerClassifier",
    "bert_key_map",
    "favor_attention",
    "functional",
    "linear_attention",
    "naive_favor_attention",
    "naive_linear_attention",
    "softmax_attention",
    "trainable_omega",
]

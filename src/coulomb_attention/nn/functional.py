"""Attention ops (re-exported from :mod:`coulomb_attention.nn.ops`, where each idea lives in
its own module): FAVOR+ with the order picked by cost, linear attention from features, causal
modes, the naive twins and exact softmax attention."""

from .ops import (
    LINEAR_OVERHEAD,
    QUADRATIC_COST_RATIO,
    causal_favor_attention,
    causal_linear_attention,
    check_key_mask,
    clear_workspace,
    default_chunk_size,
    favor_attention,
    favor_features,
    linear_attention,
    naive_favor_attention,
    naive_linear_attention,
    quadratic_is_cheaper,
    softmax_attention,
)

__all__ = [
    "LINEAR_OVERHEAD",
    "QUADRATIC_COST_RATIO",
    "causal_favor_attention",
    "causal_linear_attention",
    "check_key_mask",
    "clear_workspace",
    "default_chunk_size",
    "favor_attention",
    "favor_features",
    "linear_attention",
    "naive_favor_attention",
    "naive_linear_attention",
    "quadratic_is_cheaper",
    "softmax_attention",
]

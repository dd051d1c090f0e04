"""Attention ops as pure tensor functions, one module per idea, each fast op with a naive twin.

- :mod:`.checks`: input validation, compute dtype, autocast guard;
- :mod:`.linear`: :func:`linear_attention` from precomputed features;
- :mod:`.reference`: the naive quadratic twins and exact softmax attention;
- :mod:`.favor`: the FAVOR+ feature map and :func:`favor_attention`, which picks the
  association order by cost;
- :mod:`.quadratic`: FAVOR+ in one batched pass: the quadratic order (shortest sequences)
  and the unchunked linear order (short and medium sequences);
- :mod:`.fused`: FAVOR+ in the linear order, fused and chunked (long sequences);
- :mod:`.workspace`: the thread-local scratch buffers of the fused path;
- :mod:`.causal`: causal linear attention and causal FAVOR+, chunked and recurrent (a state
  in and out, one-token steps, grouped queries);
- :mod:`.window`: sliding-window softmax plus linear attention over the rest (the hybrid);
- :mod:`.streaming`: the causal hybrid with attention sinks, chunked and recurrent (decoding).
"""

from .causal import (
    LinearState,
    causal_favor_attention,
    causal_favor_step,
    causal_linear_attention,
    causal_linear_step,
)
from .checks import check_key_mask
from .favor import (
    LINEAR_OVERHEAD,
    QUADRATIC_COST_RATIO,
    UNCHUNKED_COST_RATIO,
    UNCHUNKED_MAX_FEATURES,
    default_chunk_size,
    favor_attention,
    favor_attention_blocked,
    favor_features,
    linear_is_unchunked,
    quadratic_is_cheaper,
    use_blocked_inference,
)
from .linear import linear_attention
from .reference import (
    naive_favor_attention,
    naive_linear_attention,
    naive_recurrent_attention,
    softmax_attention,
)
from .streaming import HybridState, naive_streaming_attention, streaming_attention
from .window import naive_window_attention, window_attention, window_masks
from .workspace import clear_workspace

__all__ = [
    "LINEAR_OVERHEAD",
    "QUADRATIC_COST_RATIO",
    "UNCHUNKED_COST_RATIO",
    "UNCHUNKED_MAX_FEATURES",
    "LinearState",
    "causal_favor_attention",
    "causal_favor_step",
    "causal_linear_attention",
    "causal_linear_step",
    "check_key_mask",
    "clear_workspace",
    "default_chunk_size",
    "favor_attention",
    "favor_attention_blocked",
    "favor_features",
    "linear_attention",
    "linear_is_unchunked",
    "naive_favor_attention",
    "naive_linear_attention",
    "naive_recurrent_attention",
    "quadratic_is_cheaper",
    "softmax_attention",
    "use_blocked_inference",
    "naive_window_attention",
    "HybridState",
    "naive_streaming_attention",
    "streaming_attention",
    "window_attention",
    "window_masks",
]

"""Configuration of a BERT encoder with kernel (linear) attention, written by coulomb-attention.

Self-contained remote code for ``transformers`` (``trust_remote_code=True``): it imports only
``transformers``. The BERT fields keep their ``BertConfig`` meaning; three fields describe the
attention kernel:

    feature_map     favor | porf_softplus | softmax_feat | hedgehog | elu
    n_features      particles M per head group (hedgehog: even; elu: 0, no particles)
    share_features  one particle set per layer (True) or one per head (False)
    window          the sliding-window hybrid's W (0: pure linear attention)
    window_linear   False: the window alone (no linear term)
"""

from __future__ import annotations

try:  # transformers >= 5 spells it PreTrainedConfig; 4.x only PretrainedConfig
    from transformers import PreTrainedConfig as _BaseConfig
except ImportError:  # pragma: no cover - older transformers
    from transformers import PretrainedConfig as _BaseConfig

FEATURE_MAPS = ("favor", "porf_softplus", "softmax_feat", "hedgehog", "elu")


class CoulombBertConfig(_BaseConfig):
    """BERT configuration plus the kernel of its attention (see the module docstring)."""

    model_type = "coulomb_bert"

    def __init__(
        self,
        vocab_size: int = 30522,
        hidden_size: int = 384,
        num_hidden_layers: int = 6,
        num_attention_heads: int = 12,
        intermediate_size: int = 1536,
        hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.1,
        max_position_embeddings: int = 512,
        type_vocab_size: int = 2,
        layer_norm_eps: float = 1e-12,
        pad_token_id: int = 0,
        feature_map: str = "favor",
        n_features: int = 64,
        share_features: bool = False,
        window: int = 0,
        window_linear: bool = True,
        **kwargs,
    ) -> None:
        if int(window) < 0 or int(window) % 2:
            raise ValueError(f"window must be an even integer >= 0, got {window!r}")
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map must be one of {', '.join(FEATURE_MAPS)}, got "
                             f"{feature_map!r}")
        if feature_map == "hedgehog" and int(n_features) % 2:
            raise ValueError(f"feature_map 'hedgehog' needs an even n_features, got "
                             f"{n_features}")
        if hidden_act != "gelu":
            raise ValueError(f"hidden_act must be 'gelu' (exact), got {hidden_act!r}")
        if hidden_size % num_attention_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by "
                             f"num_attention_heads {num_attention_heads}")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.layer_norm_eps = layer_norm_eps
        self.feature_map = feature_map
        self.n_features = int(n_features)
        self.share_features = bool(share_features)
        self.window = int(window)
        self.window_linear = bool(window_linear)
        super().__init__(pad_token_id=pad_token_id, **kwargs)

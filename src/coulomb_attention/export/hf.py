"""A converted encoder as a Hugging Face model directory (transformers + sentence-transformers).

:func:`export_hf_directory` writes, from a converted checkpoint (``coulomb-attention convert``'s
``OUT/checkpoint/``) or a loaded :class:`~coulomb_attention.nn.families.bert.PretrainedClassifier`::

    config.json                     BERT fields + model_type coulomb_bert, the kernel, auto_map
    configuration_coulomb_bert.py   remote code (imports torch and transformers only)
    modeling_coulomb_bert.py
    model.safetensors               BERT tensor names + encoder.layer.{i}.attention.self.omega
    vocab.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json
    modules.json, sentence_bert_config.json, config_sentence_transformers.json,
    1_Pooling/config.json (mean), 2_Normalize/
    README.md                       model card

so that ``transformers.AutoModel.from_pretrained(DIR, trust_remote_code=True)`` and
``sentence_transformers.SentenceTransformer(DIR, trust_remote_code=True)`` load it without this
package, and the directory still loads with
:func:`coulomb_attention.nn.families.bert.load_pretrained_encoder` (same tensor names, the kernel
section kept). The remote code computes the attention with the plain linear-order formula of
:mod:`coulomb_attention.nn.ops` (same maps, scalings, shifts and padding; on the CPU without
autograd block by block, one head and a few sequences at a time), so its pooled, normalised
embeddings equal :func:`coulomb_attention.convert.embed` to float32 rounding.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ..convert.artifact import Artifact
from ..names import ATTENTION_MAPS
from ..nn.families.bert import KERNEL_KEY, check_vocabulary, resolve_checkpoint_dir

__all__ = [
    "EXPORTABLE_MAPS",
    "REMOTE_CODE",
    "ROWS",
    "export_hf_directory",
    "model_card",
    "remote_names",
    "row_of",
]


def remote_names(filename: str, name: str) -> tuple[str, ...]:
    """The tuple of strings the remote-code file ``filename`` (in this folder) assigns to
    ``name``, read from its source: the remote code runs without this package, so its list of
    the maps it implements is a copy, and this reads that copy instead of writing a third."""
    import ast

    path = Path(__file__).with_name(filename)
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise RuntimeError(f"{filename} assigns no {name}")


#: Feature maps the remote code implements, in the registry's order
#: (:data:`coulomb_attention.features.MAPS`): today every attention map. A new map of the
#: registry is exportable once the remote code implements it (its function in
#: ``modeling_coulomb_bert.py``, its name in ``configuration_coulomb_bert.FEATURE_MAPS``); until
#: then the export refuses it by name. Exact ``softmax`` (the original model, export that
#: instead) and ``none`` (a control) are refused.
EXPORTABLE_MAPS = tuple(m for m in ATTENTION_MAPS
                        if m in remote_names("configuration_coulomb_bert.py", "FEATURE_MAPS"))
#: Remote-code files copied into every export (from this package's folder).
REMOTE_CODE = ("configuration_coulomb_bert.py", "modeling_coulomb_bert.py")
_AUTO_MAP = {"AutoConfig": "configuration_coulomb_bert.CoulombBertConfig",
             "AutoModel": "modeling_coulomb_bert.CoulombBertModel"}
_SPECIAL = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
            "cls_token": "[CLS]", "mask_token": "[MASK]"}
#: Hub names of the packaged encoders (:data:`coulomb_attention.nn.families.bert.PRETRAINED`),
#: for the card.
HUB_NAMES = {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}
_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize",
     "type": "sentence_transformers.models.Normalize"},
]


def _load(source):
    """(model, source directory or None) of a checkpoint path or a loaded encoder."""
    from ..nn.families.bert import PretrainedClassifier, load_pretrained_encoder

    if isinstance(source, PretrainedClassifier):
        return source, (Path(source.source) if source.source else None)
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"source must be a checkpoint directory or a PretrainedClassifier, got "
                        f"{type(source).__name__}")
    from ..nn.families.bert import read_bert_config

    directory = resolve_checkpoint_dir(source)
    bert = read_bert_config(directory)
    if KERNEL_KEY not in bert:
        raise ValueError(f"{directory}: not a converted checkpoint (config.json has no "
                         f"{KERNEL_KEY!r} section); convert it first: coulomb-attention convert "
                         f"--encoder {directory} --out DIR")
    return load_pretrained_encoder(directory), directory


def _hf_config(model) -> dict[str, Any]:
    cfg = model.config
    weighted = [i for i, layer in enumerate(model.attention_layers)
                if getattr(layer, "mass", None) is not None]
    if weighted:
        raise ValueError(f"layers {weighted} have weighted particles (masses): the remote code "
                         "does not implement them, so the export would silently drop them; "
                         "export an unweighted checkpoint")
    # the map the layers compute with (a layer switched to another map, e.g. Hedgehog's by
    # nn.attention.use_hedgehog_map_, counts, not the model's configured attention)
    maps = sorted({layer.feature_map for layer in model.attention_layers})
    if len(maps) != 1:
        raise ValueError(f"the layers use different feature maps ({', '.join(maps)}); the "
                         "remote code takes one map for all layers")
    fmap = maps[0]
    if fmap not in EXPORTABLE_MAPS:
        raise ValueError(f"attention {fmap!r} cannot be exported (the remote code implements "
                         f"{', '.join(EXPORTABLE_MAPS)})")
    n_features = int(model.attention_layers[0].n_features)  # 0 for elu (no particles)
    windows = {(layer.window, layer.window_linear) for layer in model.attention_layers}
    if len(windows) != 1:
        raise ValueError("the layers have different windows; the remote code takes one")
    window, window_linear = windows.pop()
    out = {k: v for k, v in model.bert_config.items()
           if k not in ("auto_map", "architectures", "_name_or_path", "transformers_version",
                        KERNEL_KEY)}
    out.update({"model_type": "coulomb_bert", "architectures": ["CoulombBertModel"],
                "auto_map": dict(_AUTO_MAP), "feature_map": fmap,
                "n_features": n_features, "share_features": bool(cfg.share_features)})
    if window:  # the sliding-window hybrid (absent: pure linear, as before)
        out.update({"window": int(window), "window_linear": bool(window_linear)})
    return out


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _lowercase(src: Path | None) -> bool:
    tc = src / "tokenizer_config.json" if src is not None else None
    if tc is not None and tc.is_file():
        return bool(json.loads(tc.read_text(encoding="utf-8")).get("do_lower_case", True))
    return True


def _max_seq_length(src: Path | None, max_positions: int) -> int:
    """The source's sentence-transformers ``max_seq_length`` (all-MiniLM-L6-v2: 256), else the
    position table's size."""
    sb = src / "sentence_bert_config.json" if src is not None else None
    if sb is not None and sb.is_file():
        value = json.loads(sb.read_text(encoding="utf-8")).get("max_seq_length")
        if isinstance(value, int) and 0 < value <= max_positions:
            return value
    return int(max_positions)


def _source_of_vocab(model, directory: Path | None) -> Path:
    for cand in (directory, Path(model.source) if model.source else None):
        if cand is not None and (cand / "vocab.txt").is_file():
            return cand
    raise FileNotFoundError("no vocab.txt next to the converted encoder (its source directory "
                            f"{model.source!r})")


def _tokenizer_files(out: Path, vocab_dir: Path, lowercase: bool, max_len: int) -> None:
    from ..data import Tokenizer

    tok = Tokenizer.from_vocab(vocab_dir / "vocab.txt", lowercase=lowercase)
    (out / "tokenizer.json").write_text(tok._tok.to_str(), encoding="utf-8")
    _write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "BertTokenizer", "do_lower_case": lowercase, "do_basic_tokenize": True,
        "tokenize_chinese_chars": True, "strip_accents": None, "model_max_length": max_len,
        "clean_up_tokenization_spaces": True, **_SPECIAL})
    _write_json(out / "special_tokens_map.json", dict(_SPECIAL))


def _sentence_transformers_files(out: Path, dim: int, max_seq_length: int) -> None:
    _write_json(out / "modules.json", _MODULES)
    _write_json(out / "sentence_bert_config.json",
                {"max_seq_length": max_seq_length, "do_lower_case": False})
    _write_json(out / "config_sentence_transformers.json",
                {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"})
    (out / "1_Pooling").mkdir()
    _write_json(out / "1_Pooling" / "config.json", {
        "word_embedding_dimension": dim, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False})
    (out / "2_Normalize").mkdir()


def export_hf_directory(
    source,
    out_dir: str | os.PathLike,
    *,
    result: dict[str, Any] | str | os.PathLike | None = None,
    speed: list[dict[str, Any]] | None = None,
    base_model: str | None = None,
) -> Path:
    """Write a Hugging Face model directory of a converted encoder (see the module docstring).

    Parameters
    ----------
    source : path or PretrainedClassifier
        A converted checkpoint directory (``config.json`` with the kernel section,
        ``model.safetensors`` with the particles, ``vocab.txt``) or a loaded converted encoder.
    out_dir : path
        Written whole into ``out_dir.partial`` and then moved into place (an existing export
        there is replaced; any other non-empty directory is refused).
    result : dict or path, optional
        ``result.json`` of the conversion, for the model card (default: ``result.json`` beside
        the checkpoint directory, when present).
    speed : list of dict, optional
        Rows of :func:`coulomb_attention.bench.encoder_speed.encoder_speed` for the card.
    base_model : str, optional
        Name of the original encoder on the card (default: the conversion's ``encoder``).

    Returns
    -------
    Path
        ``out_dir``.

    Raises
    ------
    ValueError
        Not a converted checkpoint, a map the remote code lacks, tampered particles (wrong
        shape, NaN), a corrupt ``model.safetensors``, a vocabulary whose size differs from the
        embedding rows.
    FileNotFoundError
        A missing directory, ``config.json`` or ``vocab.txt``.
    """
    from ..nn.families.bert import save_pretrained_encoder

    model, directory = _load(source)
    hf_cfg = _hf_config(model)
    vocab_dir = _source_of_vocab(model, directory)
    check_vocabulary(vocab_dir, int(model.config.vocab_size))
    saved_kernel = {}
    if directory is not None and (directory / "config.json").is_file():
        saved_kernel = json.loads((directory / "config.json").read_text(encoding="utf-8")).get(
            KERNEL_KEY, {})
    finished = saved_kernel.get("variant") == "particles+lowrank"
    if result is None and directory is not None:
        # convert's OUT/checkpoint (the pure-linear or hybrid row) or OUT/lowrank/checkpoint
        home = Artifact.of_checkpoint(directory, lowrank=finished)
        if home.has_result():
            result = home.result_path
    if isinstance(result, (str, os.PathLike)):
        result = json.loads(Path(result).read_text(encoding="utf-8"))
    if finished and result and "lowrank" in result:  # the finished row's own numbers
        result = {**result, **{k: v for k, v in result["lowrank"].items()
                               if k in ("fidelity", "probe")}, "lowrank": result["lowrank"]}
    row = row_of(hf_cfg, finished)

    out = Path(out_dir)
    if out.is_dir() and any(out.iterdir()) and not (out / "modeling_coulomb_bert.py").is_file():
        raise ValueError(f"{out} is a non-empty directory that is not an export; choose another")
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    save_pretrained_encoder(model, tmp, vocab_from=vocab_dir)  # weights, particles, vocab.txt
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        (tmp / name).unlink(missing_ok=True)
    kernel = json.loads((tmp / "config.json").read_text(encoding="utf-8"))[KERNEL_KEY]
    if directory is not None:  # keep how the particles were made (variant, seed, budget)
        saved = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        kernel = {**saved.get(KERNEL_KEY, {}), **kernel}
    _write_json(tmp / "config.json", {**hf_cfg, KERNEL_KEY: kernel})
    here = Path(__file__).resolve().parent
    for name in REMOTE_CODE:
        shutil.copyfile(here / name, tmp / name)
    max_pos = int(model.config.max_len)
    _tokenizer_files(tmp, vocab_dir, _lowercase(vocab_dir), max_pos)
    _sentence_transformers_files(tmp, int(model.config.dim), _max_seq_length(vocab_dir, max_pos))
    if base_model is None:
        base_model = (result or {}).get("config", {}).get("encoder") or str(model.source or "?")
        base_model = HUB_NAMES.get(str(base_model).lower(), base_model)
    card = model_card(hf_cfg, result=result, speed=speed, base_model=base_model, row=row)
    (tmp / "README.md").write_text(card, encoding="utf-8")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


# ---------------------------------------------------------------------------- model card


#: The rows of a conversion an export can hold (the card and ``convert``'s output name it).
ROWS = {"linear": "pure linear: only the particles of the attention kernel were learned",
        "hybrid": "sliding-window hybrid: softmax over a window plus the particles' linear "
                  "term (its own row, never mixed with the pure-linear one)",
        "window": "window alone: softmax over a window, no linear term (the ablation of the "
                  "hybrid's linear branch)",
        "lowrank": "low-rank finished: after the particles, LoRA adapters trained and merged "
                   "into the projections (its own row, never mixed with the pure-linear one)"}


def row_of(hf_cfg: dict[str, Any], finished: bool = False) -> str:
    """The :data:`ROWS` key of an export's configuration (``finished``: the low-rank
    finished checkpoint)."""
    if finished:
        return "lowrank"
    if hf_cfg.get("window"):
        return "hybrid" if hf_cfg.get("window_linear", True) else "window"
    return "linear"



def speed_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The speed rows as a Markdown table (sentences per second, batch as measured)."""
    lines = ["| tokens | converted (sent/s) | original (sent/s) | converted / original |",
             "|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['length']} | {r['converted_sps']:.1f} | {r['original_sps']:.1f} | "
                     f"{r['converted_sps'] / r['original_sps']:.2f} |")
    return lines


def model_card(hf_cfg: dict[str, Any], *, result: dict[str, Any] | None = None,
               speed: list[dict[str, Any]] | None = None, base_model: str = "unknown",
               row: str | None = None) -> str:
    """``README.md`` of an export: what it is, the numbers of its conversion, how to load it."""
    fmap, m = hf_cfg["feature_map"], hf_cfg["n_features"]
    per = "per layer" if hf_cfg["share_features"] else "per head"
    lines = [
        "---", "library_name: sentence-transformers",
        "tags: [sentence-transformers, feature-extraction, linear-attention, coulomb-attention]",
        "---", "",
        "# Linear-attention conversion of " + base_model, "",
        f"`{base_model}` with every softmax attention replaced by kernel (linear) attention "
        f"`phi(q) . phi(k)`: feature map `{fmap}`, M = {m} learned particles {per} "
        f"({hf_cfg['num_hidden_layers']} layers, {hf_cfg['num_attention_heads']} heads, width "
        f"{hf_cfg['hidden_size']}). Every other weight is the original's; the particles were "
        "distilled from the original's attention by coulomb-attention (`coulomb-attention "
        "convert`). Attention costs O(L M) per head instead of O(L^2).", "",
        f"**Row:** {ROWS[row or row_of(hf_cfg)]}.", "",
        *([f"This is the **sliding-window hybrid** row (LoLCATs eq. 7): softmax over the "
           f"{hf_cfg['window'] // 2} tokens on each side of a query "
           + ("plus the particles' linear term over the other tokens, one shared "
              "denominator, the window weighted per head by a learned weight; O(L (W + M)) "
              "per head." if hf_cfg.get("window_linear", True) else
              "alone (no linear term: the ablation of the linear branch)."), ""]
          if hf_cfg.get("window") else []),
        "## Load it", "",
        "Needs `torch`, `transformers` and (for the second form) `sentence-transformers`; the",
        "model code is in this directory (`modeling_coulomb_bert.py`), hence "
        "`trust_remote_code=True`.", "",
        "```python",
        "from sentence_transformers import SentenceTransformer",
        "model = SentenceTransformer(DIR, trust_remote_code=True)",
        "emb = model.encode([\"A sentence\", \"Another one\"])  # mean pooled, L2-normalised",
        "",
        "from transformers import AutoModel, AutoTokenizer",
        "tok = AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)",
        "enc = AutoModel.from_pretrained(DIR, trust_remote_code=True).eval()",
        "batch = tok([\"A sentence\"], padding=True, return_tensors=\"pt\")",
        "hidden = enc(**batch).last_hidden_state  # mean-pool over batch['attention_mask']",
        "```", "",
    ]
    if result:
        cfg = result.get("config", {})
        d = cfg.get("distill", {})
        lines += ["## Conversion", "",
                  f"- variant `{cfg.get('variant')}`, seed {cfg.get('seed')}, "
                  f"{result.get('n_sentences', '?')} unlabelled sentences "
                  f"(max {cfg.get('max_length')} tokens)",
                  f"- training budget: {d.get('steps')} steps per layer and head "
                  f"({d.get('n_examples')} sentences, {d.get('holdout')} held out), joint "
                  f"refinement {d.get('refine_steps')} steps on {d.get('refine_examples')} "
                  f"sentences; distillation took {result.get('distill_s', 0):.0f} s on CPU", ""]
        fid = result.get("fidelity")
        if fid:
            lines += ["## Fidelity to the original", "",
                      f"On {fid['n']} held-out sentences: cosine of the sentence embeddings to "
                      f"the original's mean {fid['cos_mean']:.4f}, 5th percentile "
                      f"{fid['cos_p5']:.4f}; Spearman correlation of the pairwise cosines "
                      f"{fid['spearman']:.4f}.", ""]
        probe = result.get("probe")
        if probe:
            lines += ["Logistic-regression probe on the frozen embeddings:", "",
                      "| task | accuracy | ECE | n train | n eval |", "|---|---:|---:|---:|---:|"]
            lines += [f"| {t} | {p['accuracy']:.4f} | {p['ece']:.4f} | {p['n_train']} | "
                      f"{p['n_eval']} |" for t, p in probe.items()]
            lines.append("")
    if speed:
        s0 = speed[0]
        lines += ["## Speed", "",
                  f"Sentences per second at batch {s0.get('batch_size', 32)}, every sentence "
                  f"padded to the length shown; {s0.get('device', 'cpu')}, "
                  f"{s0.get('threads', '?')} thread(s), median of {s0.get('repeats', '?')} "
                  "interleaved repeats; the original is loaded by sentence-transformers.", "",
                  *speed_markdown(speed), ""]
    return "\n".join(lines)

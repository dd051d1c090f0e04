"""One conversion, end to end: load the encoder twice (the softmax teacher and the student with
``feature_map`` and fresh per-head particles), distil the student's particles layer by layer
(:func:`coulomb_attention.convert.distill.distill_attention`, the resume point saved after
every layer, so an interrupted run resumes), refine them jointly, write the converted
checkpoint, optionally finish it with low-rank adapters
(:func:`coulomb_attention.convert.finish.finish_lowrank`, its own row and checkpoint), then
measure it (:mod:`coulomb_attention.convert.evaluate`). The directory's files are
:class:`coulomb_attention.convert.artifact.Artifact`'s.

:func:`convert_encoder` returns the result dict; :func:`cached_conversion` is the conversion
of a cache (reused when finished) as a :class:`Conversion`, the converted encoder in memory,
which is how a training run's phase A receives it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..data.registry import data_source
from .artifact import Artifact
from .config import ConvertConfig, config_json, config_of_result, conversion_key
from .data import (
    encode_texts,
    load_sentences,
    position_cap,
    read_sentence_file,
    sentences_for_documents,
    training_documents,
)
from .distill import distill_attention, embedding_data, refine_encoder
from .evaluate import check_doc_lengths, evaluate_encoder, held_out
from .finish import finish_lowrank

__all__ = ["Conversion", "cached_conversion", "convert_encoder", "load_conversion"]


def _save_progress(art: Artifact, model, next_layer: int, records, gen_state,
                   config: dict | None = None, stages: dict | None = None) -> None:
    omegas = {f"layer{i}": layer.omega
              for i, layer in enumerate(model.attention_layers) if layer.has_features}
    omegas.update({f"window{i}": layer.window_logit
                   for i, layer in enumerate(model.attention_layers) if layer.window})
    art.save_state(omegas, gen_state, {"next_layer": next_layer, "records": records,
                                       "config": config,
                                       **({"stages": stages} if stages else {})})


def _load_progress(art: Artifact, model, config: dict | None = None) -> dict[str, Any] | None:
    saved = art.load_state()
    if saved is None:
        return None
    prog, omegas, gen_state = saved
    if config is not None and prog.get("config") != config:
        raise ValueError(f"{art.root} holds an unfinished conversion with another "
                         "configuration; use another --out or delete it")
    for i, layer in enumerate(model.attention_layers):
        if f"layer{i}" in omegas:
            layer.load_features_(omegas[f"layer{i}"])
        if f"window{i}" in omegas and layer.window:
            with torch.no_grad():
                layer.window_logit.copy_(omegas[f"window{i}"])
    return {"next_layer": prog["next_layer"], "records": prog["records"],
            "generator_state": gen_state, "stages": prog.get("stages", {})}


def convert_encoder(
    config: ConvertConfig,
    out: str | os.PathLike,
    *,
    data_dir=None,
    progress: bool = False,
    log: Callable[[str], None] = print,
    evaluate: bool = True,
) -> dict[str, Any]:
    """Run one conversion into ``out`` (resuming a previous interrupted run there).

    Writes ``out/checkpoint/`` (the converted encoder; with ``variant="hedgehog"`` its layers
    name the baseline map, restored on loading), ``out/records.jsonl`` and ``out/result.json``;
    ``out/state/`` holds the per-layer progress while the run is unfinished. Returns the result.
    """
    return _convert(config, out, data_dir=data_dir, progress=progress, log=log,
                    evaluate=evaluate)[0]


def _convert(config: ConvertConfig, out, *, data_dir, progress, log, evaluate):
    """:func:`convert_encoder`; returns ``(result, converted model, records)``."""
    from ..nn.families.bert import (
        check_vocabulary,
        load_pretrained_encoder,
        load_pretrained_tokenizer,
        read_bert_config,
        resolve_checkpoint_dir,
        save_pretrained_encoder,
    )

    art = Artifact(out)
    art.root.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    directory = resolve_checkpoint_dir(config.encoder)  # unknown encoder: one-line error
    bert = read_bert_config(directory)  # unsupported architecture: one-line error
    check_vocabulary(directory, int(bert["vocab_size"]))  # another model's tokenizer
    tok = load_pretrained_tokenizer(directory)
    teacher = load_pretrained_encoder(directory, "softmax")
    if config.variant == "softmax":
        model = teacher
    else:
        model = load_pretrained_encoder(directory, config.feature_map, config.n_features,
                                        share_features=False, generator=config.seed)
    # before the conversion, not after it
    check_doc_lengths(config.doc_lengths, int(bert["max_position_embeddings"]))
    if config.window:
        if config.window > int(bert["max_position_embeddings"]):
            raise ValueError(f"window {config.window} is larger than the model's "
                             f"{bert['max_position_embeddings']} positions")
        for layer in model.attention_layers:
            layer.set_window_(config.window, linear=config.window_linear)
    finish_cfg = config.finish
    if finish_cfg is not None and finish_cfg.rank > model.config.dim:
        raise ValueError(f"LoRA rank must be at most the projections' width "
                         f"{model.config.dim}, got {finish_cfg.rank}")
    dc = config.distill
    pool = max(dc.n_examples, dc.refine_examples if dc.refine_steps else 0) + dc.holdout
    if config.fit_documents > int(bert["max_position_embeddings"]):
        raise ValueError(f"documents of {config.fit_documents} tokens exceed the model's "
                         f"{bert['max_position_embeddings']} positions")
    if config.sentences_file:
        sentences = read_sentence_file(config.sentences_file)
    else:  # documents: ``pool`` counts documents, so enough sentences to fill them
        n = sentences_for_documents(pool, config.fit_documents) if config.fit_documents \
            else pool
        sentences = load_sentences(config.tasks, "train", data_dir, n, config.seed,
                                   pairs=dc.pairs)
    records: list[dict] = []
    refine: dict | None = None
    distill_s = 0.0
    stages: dict[str, Any] = {}  # finished stages after the layers (kernel, finish): resume
    data = None  # the end-to-end stages' batches, shared by the refinement and the finishing
    documents = None  # with fit_documents: what the training documents are
    trains = config.variant in ("particles", "hedgehog") and config.window_linear
    if trains:
        if config.fit_documents:
            ids, mask, documents = training_documents(tok, sentences, config.fit_documents,
                                                      pool, 10_000 + config.seed)
            log(f"fitting on {len(ids)} documents of {config.fit_documents} tokens "
                f"({documents['texts_per_document']:.1f} texts each)")
        else:
            ids, mask = encode_texts(tok, sentences, position_cap(model, config.max_length))
        dcfg = config.distill
        if config.variant == "hedgehog":
            dcfg = dataclasses.replace(dcfg, method="hedgehog")
        stamp = config_json(config)
        resume = (_load_progress(art, model, stamp) if config.variant == "particles"
                  else None)
        stages = dict(resume["stages"]) if resume is not None else {}
        if resume is not None:
            log("resuming after the kernel stage" if "kernel" in stages
                else f"resuming at layer {resume['next_layer']}")
        if "kernel" in stages:
            records, refine = resume["records"], stages["kernel"]["refine"]
            distill_s = stages["kernel"]["distill_s"]
        else:
            t0 = time.perf_counter()
            gen = torch.Generator().manual_seed(config.seed)
            records = distill_attention(
                model, ids, mask, dcfg, generator=gen, progress=progress, resume=resume,
                window_fit=config.window_fit,
                on_layer_done=(lambda nl, rec, gs: _save_progress(art, model, nl, rec, gs, stamp))
                if config.variant == "particles" else None)
            # time_s is the layer's time, on each of its head-group records
            distill_s = time.perf_counter() - t0 + (
                sum({r["layer"]: r["time_s"] for r in resume["records"]}.values()) if resume
                else 0.0)
            # with finish.with_particles the particles move with the adapters instead
            if dcfg.refine_steps and not (finish_cfg is not None and finish_cfg.with_particles):
                t0 = time.perf_counter()
                if finish_cfg is not None:
                    data = embedding_data(teacher, ids, mask, dcfg,
                                          torch.Generator().manual_seed(config.seed))
                refine = refine_encoder(model, teacher, ids, mask, dcfg,
                                        generator=torch.Generator().manual_seed(config.seed),
                                        progress=progress, data=data,
                                        window_fit=config.window_fit)
                distill_s += time.perf_counter() - t0
            if config.variant == "particles":
                stages["kernel"] = {"refine": refine, "distill_s": distill_s}
                _save_progress(art, model, len(model.attention_layers), records,
                               gen.get_state(), stamp, stages)
    if config.variant in ("particles", "vanilla", "hedgehog"):
        save_pretrained_encoder(model, art.checkpoint, vocab_from=directory,
                                extra={"variant": config.variant, "seed": config.seed,
                                       "distill": dataclasses.asdict(config.distill)
                                       if trains else None})
    finished, finish_rec = None, None
    if finish_cfg is not None:
        finished, finish_rec = _finish_stage(config, model, teacher, ids, mask, data, art,
                                             directory, stages, records, progress)
    art.write_records(records)
    result: dict[str, Any] = {"config": config_json(config), "encoder_dir": str(directory),
                              "data": data_source(data_dir),  # samples / dir / hf
                              "n_sentences": len(sentences), "distill_s": distill_s,
                              "refine": refine}
    if documents is not None:
        result["fit_documents"] = documents
    if finish_rec is not None:
        result["lowrank"] = {"finish": finish_rec, "checkpoint": art.relative_lowrank_checkpoint(),
                             "conversion_s": distill_s + finish_rec["time_s"]}
    if evaluate:
        t0 = time.perf_counter()
        held = held_out(teacher, tok, config, data_dir)
        result.update(evaluate_encoder(model, teacher, tok, config, data_dir, held=held))
        result["eval_s"] = time.perf_counter() - t0  # with the held-out sentences' time
        if finished is not None:  # its own row, never mixed with the pure-linear one
            result["lowrank"].update(evaluate_encoder(finished, teacher, tok, config, data_dir,
                                                      documents=False, held=held,
                                                      teacher_probe=False))  # one is enough
    result["total_s"] = time.perf_counter() - t_start
    art.write_result(result)
    art.clear_state()
    return result, model, records


def _finish_stage(config, model, teacher, ids, mask, data, art: Artifact, directory, stages,
                  records, progress):
    """The low-rank finishing of a copy of the converted ``model`` into
    ``out/lowrank/checkpoint`` (reused when a resumed run already finished it)."""
    import copy

    from ..nn.families.bert import load_pretrained_encoder, save_pretrained_encoder

    ckpt = art.lowrank_checkpoint
    if "finish" in stages and art.checkpoint_complete(lowrank=True):
        return load_pretrained_encoder(ckpt), stages["finish"]
    finished = copy.deepcopy(model)
    rec = finish_lowrank(finished, teacher, ids, mask, config.distill, config.finish,
                         generator=torch.Generator().manual_seed(config.seed), data=data,
                         progress=progress)
    save_pretrained_encoder(finished, ckpt, vocab_from=directory,
                            extra={"variant": "particles+lowrank", "seed": config.seed,
                                   "distill": dataclasses.asdict(config.distill),
                                   "finish": config_json(config.finish),
                                   "trained_params": rec["trained_params"]})
    stages["finish"] = rec
    gen = torch.Generator().manual_seed(config.seed)  # the state is not used after the layers
    _save_progress(art, model, len(model.attention_layers), records, gen.get_state(),
                   config_json(config), stages)
    return finished, rec


@dataclass
class Conversion:
    """A finished conversion: the converted encoder in memory and what its directory holds.

    Attributes
    ----------
    model : PretrainedClassifier   the converted encoder (eval mode)
    config : ConvertConfig
    directory : Path               where its files are (:class:`Artifact`)
    result : dict                  ``result.json``'s content
    records : list of dict         ``records.jsonl``'s rows
    """

    model: Any
    config: ConvertConfig
    directory: Path
    result: dict[str, Any]
    records: list[dict[str, Any]]

    @property
    def time_s(self) -> float:
        """The kernel stage's seconds (layer-wise distillation and refinement)."""
        return float(self.result.get("distill_s", 0.0))


def load_conversion(directory: str | os.PathLike) -> Conversion:
    """The finished conversion in ``directory`` (its checkpoint loaded)."""
    from ..nn.families.bert import load_pretrained_encoder

    art = Artifact(directory)
    if not art.is_finished():
        raise FileNotFoundError(f"{art.root} is not a finished conversion (no result.json or "
                                "checkpoint/config.json)")
    result = art.read_result()
    return Conversion(load_pretrained_encoder(art.checkpoint), config_of_result(result["config"]),
                      art.root, result, art.read_records())


def cached_conversion(config: ConvertConfig, cache_dir: str | os.PathLike, *, data_dir=None,
                      progress: bool = False, log: Callable[[str], None] = print) -> Conversion:
    """Conversion ``config`` under ``cache_dir`` (directory :func:`conversion_key`), made by
    :func:`convert_encoder` (without the fidelity/probe evaluation) if it is not there yet and
    reused otherwise; an interrupted conversion resumes. Returns the :class:`Conversion` (a
    fresh one's model is the converted encoder itself, never reloaded)."""
    art = Artifact(Path(cache_dir) / conversion_key(config))
    if art.is_finished():
        saved = art.read_result()
        if saved.get("config") != config_json(config):  # a hash collision or an edited file
            raise ValueError(f"{art.root} holds another conversion; delete it")
        log(f"conversion reused: {art.root}")
        return load_conversion(art.root)
    log(f"converting ({config.feature_map}, {config.variant}, M={config.n_features}, seed "
        f"{config.seed}) into {art.root}")
    result, model, records = _convert(config, art.root, data_dir=data_dir, progress=progress,
                                      log=log, evaluate=False)
    return Conversion(model, config, art.root, result, records)

"""How close a converted encoder is to its teacher, without and with labels.

* fidelity without labels (:func:`embedding_fidelity`): cosine of the converted sentence
  embeddings (mean pooled, L2-normalised) to the teacher's on held-out sentences (mean, 5th
  percentile) and the Spearman correlation of teacher vs converted pairwise cosines; the same
  on held-out pseudo-documents (:func:`document_fidelity`) with, for a window, the teacher's
  attention mass inside it (:func:`window_mass`);
* downstream at CPU cost (:func:`probe_metrics`, :func:`run_probes`): a logistic-regression
  probe on the frozen embeddings (SST-2, Rotten Tomatoes), accuracy / ECE / log-loss, for the
  converted encoder and, the same way, for its teacher (``teacher_probe``).

:func:`evaluate_conversion` measures a finished conversion directory again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..data.registry import data_source
from ..progress import Ticker
from .artifact import Artifact
from .config import EVAL_FIELDS, ConvertConfig, config_of_result
from .data import load_sentences, position_cap

__all__ = ["check_doc_lengths", "document_fidelity", "embed", "embedding_fidelity",
           "evaluate_conversion", "evaluate_encoder", "held_out", "probe_features",
           "probe_metrics", "run_probes", "window_mass"]


@torch.no_grad()
def embed(model, tokenizer, texts: Sequence, max_length: int = 64,
          batch_size: int = 64) -> torch.Tensor:
    """Sentence embeddings ``(n, D)`` (masked mean, L2-normalised) of ``texts`` (str or pairs).

    Texts are processed sorted by length (less padding); the result is in input order. Texts
    are truncated at ``max_length`` tokens or the model's positions, whichever is fewer."""
    max_length = position_cap(model, max_length)
    order = sorted(range(len(texts)), key=lambda i: len(str(texts[i])))
    out = [None] * len(texts)
    tick = Ticker(f"embedding {len(texts)} texts", total=len(texts))  # lines mode: every 30 s
    for start in range(0, len(order), batch_size):
        tick.update(start)
        idx = order[start:start + batch_size]
        batch = [texts[i] if isinstance(texts[i], tuple) else (texts[i],) for i in idx]
        ids, mask = tokenizer.encode_batch(batch, max_length=max_length)[:2]
        t = max(int(mask.sum(1).max()), 1)
        e = model.sentence_embedding(ids[:, :t], mask[:, :t])
        for j, i in enumerate(idx):
            out[i] = e[j]
    return torch.stack(out).float()


def _rank(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(len(x), dtype=np.float64)
    return ranks  # ties are measure-zero for continuous cosines


def embedding_fidelity(teacher: torch.Tensor, student: torch.Tensor) -> dict[str, float]:
    """Agreement of two sets of L2-normalised embeddings ``(n, D)`` of the same sentences.

    Returns ``cos_mean``, ``cos_p5`` (5th percentile), ``cos_min`` of the per-sentence cosine,
    and ``spearman``: the rank correlation of the teacher's pairwise cosines with the
    converted ones over all ``n (n - 1) / 2`` sentence pairs.
    """
    if teacher.shape != student.shape or teacher.ndim != 2:
        raise ValueError(f"embeddings must have the same shape (n, D), got "
                         f"{tuple(teacher.shape)} and {tuple(student.shape)}")
    t, s = teacher.double(), student.double()
    cos = (torch.nn.functional.normalize(t, dim=1) * torch.nn.functional.normalize(s, dim=1)
           ).sum(1).numpy()
    iu = np.triu_indices(t.shape[0], k=1)
    pt, ps = (t @ t.T).numpy()[iu], (s @ s.T).numpy()[iu]
    rho = float(np.corrcoef(_rank(pt), _rank(ps))[0, 1]) if len(pt) > 1 else float("nan")
    return {"cos_mean": float(cos.mean()), "cos_p5": float(np.percentile(cos, 5)),
            "cos_min": float(cos.min()), "spearman": rho, "n": int(t.shape[0])}


@torch.no_grad()
def window_mass(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, window: int,
                batch_size: int = 8) -> list[float]:
    """Per layer, the share of a softmax model's attention mass inside the window (``|s - t| <=
    window / 2``, the hybrid's ``N(t)``; causal layers: the ``window`` most recent keys), mean
    over heads and real query rows. How much a window alone could carry."""
    from ..nn.ops.window import window_masks
    from .capture import layer_inputs

    mask = attention_mask.bool()
    chunks = [(input_ids[i:i + batch_size], mask[i:i + batch_size])
              for i in range(0, len(input_ids), batch_size)]
    out = []
    for li, layer in enumerate(model.attention_layers):
        total, rows = 0.0, 0
        for (h, _), (_, m) in zip(layer_inputs(model, li, chunks), chunks, strict=True):
            logits = layer.queries(h).double() @ layer.keys(h).double().transpose(-1, -2)
            inside, rest = window_masks(h.shape[1], window, layer.causal)
            visible = m[:, None, None, :] & (inside | rest)[None, None]  # causal: s <= t
            p = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
            share = (p * inside[None, None]).sum(-1)  # (B, H, T)
            total += float((share * m[:, None, :]).sum())
            rows += int(m.sum()) * share.shape[1]
        out.append(total / rows)
    return out


def check_doc_lengths(lengths, positions: int) -> None:
    too_long = [n for n in lengths if n > positions]
    if too_long:
        raise ValueError(f"pseudo-documents of {too_long} tokens exceed the model's {positions} "
                         "positions")


def document_fidelity(teacher, model, tokenizer, config: ConvertConfig, data_dir=None
                      ) -> dict[str, Any]:
    """The fidelity (:func:`embedding_fidelity`) on held-out pseudo-documents of every
    ``config.doc_lengths`` (:func:`coulomb_attention.data.documents.pseudo_documents` of
    ``config.doc_task``'s evaluation texts; seed ``20_000 + config.seed``) and, with a window,
    the teacher's attention mass inside it (:func:`window_mass`)."""
    from ..data.documents import document_texts, pseudo_documents

    check_doc_lengths(config.doc_lengths, int(teacher.config.max_len))
    texts = document_texts(config.doc_task, data_dir)
    out: dict[str, Any] = {"task": config.doc_task, "n": config.doc_count, "lengths": {}}
    for length in config.doc_lengths:
        ids, mask, info = pseudo_documents(tokenizer, texts, length, config.doc_count,
                                           20_000 + config.seed)
        bs = max(1, min(config.batch_size, 4096 // length))

        def emb(m, ids=ids, mask=mask, bs=bs, length=length):
            tick = Ticker(f"{length}-token documents", total=len(ids))  # lines: every 30 s
            parts = []
            with torch.no_grad():
                for i in range(0, len(ids), bs):
                    tick.update(i)
                    parts.append(m.sentence_embedding(ids[i:i + bs], mask[i:i + bs]))
            return torch.cat(parts).float()

        row = {**embedding_fidelity(emb(teacher), emb(model)), **info}
        if config.window:
            per_layer = window_mass(teacher, ids, mask, config.window, bs)
            row["window_mass"] = {"per_layer": per_layer,
                                  "mean": sum(per_layer) / len(per_layer)}
        out["lengths"][str(length)] = row
    return out


def probe_features(emb: torch.Tensor, pair: bool) -> np.ndarray:
    """Probe inputs: the embedding, or for a pair ``[u, v, |u - v|, u * v]`` (emb (n, 2, D))."""
    if not pair:
        return emb.numpy()
    u, v = emb[:, 0], emb[:, 1]
    return torch.cat([u, v, (u - v).abs(), u * v], 1).numpy()


def probe_metrics(x_train: np.ndarray, y_train: np.ndarray, x_eval: np.ndarray,
                  y_eval: np.ndarray, c: float = 1.0) -> dict[str, float]:
    """Logistic-regression probe (L2, ``C=c``) on frozen features: accuracy, MCC, ECE (15
    bins), log-loss, Brier on the evaluation set (:mod:`coulomb_attention.metrics`)."""
    from sklearn.linear_model import LogisticRegression

    from ..metrics import classification_metrics

    clf = LogisticRegression(C=c, max_iter=2000)
    clf.fit(x_train, y_train)
    return classification_metrics(clf.predict_proba(x_eval), y_eval)


def _task_embeddings(model, tok, task, split, data_dir, limit, seed, cfg):
    from ..data import get_task, load_task

    spec = get_task(task)
    ex = load_task(task, split, data_dir, limit=limit or None, random_state=seed)
    if spec.is_pair:
        flat = [s for pair in ex.texts for s in pair]
        emb = embed(model, tok, flat, cfg.max_length, cfg.batch_size).view(len(ex), 2, -1)
    else:
        emb = embed(model, tok, [t[0] for t in ex.texts], cfg.max_length, cfg.batch_size)
    return probe_features(emb, spec.is_pair), ex.labels


def run_probes(model, tok, cfg: ConvertConfig, data_dir) -> dict[str, dict[str, float]]:
    """The probe of every ``cfg.probe_tasks`` task (train subset -> evaluation split)."""
    from ..data import get_task

    out = {}
    for task in cfg.probe_tasks:
        spec = get_task(task)
        xt, yt = _task_embeddings(model, tok, task, spec.train_split, data_dir, cfg.probe_train,
                                  0, cfg)
        xe, ye = _task_embeddings(model, tok, task, spec.eval_split, data_dir, cfg.probe_eval,
                                  0, cfg)
        out[task] = {**probe_metrics(xt, yt, xe, ye, cfg.probe_c), "n_train": len(yt),
                     "n_eval": len(ye)}
    return out


def held_out(teacher, tokenizer, config: ConvertConfig, data_dir=None
             ) -> tuple[list[str], torch.Tensor]:
    """``config.eval_sentences`` held-out sentences (evaluation splits, seed ``10_000 +
    config.seed``) and the teacher's embeddings of them."""
    held = load_sentences(("sst2", "rotten_tomatoes", "qqp") if config.sentences_file
                          else config.tasks, "eval", data_dir, config.eval_sentences,
                          10_000 + config.seed)
    return held, embed(teacher, tokenizer, held, config.max_length, config.batch_size)


def evaluate_encoder(model, teacher, tokenizer, config: ConvertConfig, data_dir=None, *,
                     documents: bool = True, held=None, teacher_probe: bool = True
                     ) -> dict[str, Any]:
    """``fidelity`` on the held-out sentences (:func:`held_out`; pass its result as ``held``
    to share it between rows), ``probe`` of ``config.probe_tasks``, with ``teacher_probe``
    the teacher's probe on the same examples (not when ``model`` is the teacher), with
    ``documents`` and ``config.doc_lengths`` the pseudo-documents' (:func:`document_fidelity`),
    and ``eval_s``."""
    t0 = time.perf_counter()
    sentences, target = held if held is not None else held_out(teacher, tokenizer, config,
                                                               data_dir)
    out: dict[str, Any] = {"fidelity": embedding_fidelity(
        target, embed(model, tokenizer, sentences, config.max_length, config.batch_size))}
    out["probe"] = run_probes(model, tokenizer, config, data_dir)
    if teacher_probe and config.probe_tasks and model is not teacher:
        out["teacher_probe"] = run_probes(teacher, tokenizer, config, data_dir)
    if documents and config.doc_lengths:
        out["documents"] = document_fidelity(teacher, model, tokenizer, config, data_dir)
    out["eval_s"] = time.perf_counter() - t0
    return out


def evaluate_conversion(directory: str | os.PathLike, changes: dict[str, Any] | None = None, *,
                        data_dir=None) -> dict[str, Any]:
    """Measure a finished conversion again (its ``checkpoint/``; nothing is trained) with the
    evaluation fields :data:`EVAL_FIELDS` changed by ``changes``; the new ``fidelity``,
    ``probe``, ``teacher_probe``, ``documents`` and the ``evaluation`` settings replace the old
    ones in ``result.json`` (its ``config`` stays the conversion's: a cache still recognises
    it)."""
    from ..nn.families.bert import load_pretrained_encoder, load_pretrained_tokenizer

    art = Artifact(directory)
    d = art.root
    res = art.read_result() if art.has_result() else {}
    if not res or (res["config"]["variant"] != "softmax" and not art.checkpoint_complete()):
        raise FileNotFoundError(f"{d} holds no finished conversion (result.json and "
                                "checkpoint/)")
    bad = sorted(set(changes or {}) - set(EVAL_FIELDS))
    if bad:
        raise ValueError(f"only the evaluation can change without converting again, not "
                         f"{', '.join(bad)}")
    config = dataclasses.replace(config_of_result(res["config"]), **(changes or {}))
    teacher = load_pretrained_encoder(res["encoder_dir"], "softmax")
    model = (teacher if config.variant == "softmax"
             else load_pretrained_encoder(art.checkpoint))
    tok = load_pretrained_tokenizer(res["encoder_dir"])
    for key in ("fidelity", "probe", "teacher_probe", "documents"):
        res.pop(key, None)
    res.update(evaluate_encoder(model, teacher, tok, config, data_dir))
    settings = json.loads(json.dumps(dataclasses.asdict(config), default=list))
    res["evaluation"] = {k: settings[k] for k in EVAL_FIELDS}
    res["evaluation"]["data"] = data_source(data_dir)  # the data of this measurement
    art.write_result(res)
    return res


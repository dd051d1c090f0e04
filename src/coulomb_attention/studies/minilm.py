"""The pretrained-encoder comparison: every variant of all-MiniLM-L6-v2 (or a BERT directory)
on every task and seed through the one run pipeline (``coulomb-attention minilm compare``).

A variant is ``ATTENTION:KERNEL``; KERNEL says how the features are obtained:

============= ============================================================================
vanilla       fresh fixed features (a new draw per seed); ``softmax:vanilla`` is the original
teacher       phase A = the conversion (``coulomb-attention convert``: layer-wise row KL to the
              encoder's own softmax attention, then the joint refinement), cached per
              (encoder, map, M, seed) and reused by every task; phase B fine-tunes the rest
labels        phase A = the paper's literal label alignment (kernel-target alignment +
              repulsion)
adam          the reviewer's ablation of ``teacher``: the same conversion (same parameters,
              data, objective and steps) fitted by plain Adam, no repulsion and no noise
              (``distill.method = "adam"``), then the same fine-tuning
teacher_pairs ``teacher`` whose conversion sees a pair task's (QQP's) training pairs whole,
              ``[CLS] a [SEP] b [SEP]`` (``convert --pairs``), not each question on its own
hedgehog      Hedgehog's baseline (Zhang et al. 2024): its map ``[softmax(W x), softmax(-W x)]``
              with tied ``W`` fitted by Adam on the same conversion objective
              (``hedgehog:hedgehog``; ``hedgehog:teacher`` is the method's particles,
              untied, on the same map)
============= ============================================================================

Runs are seed-major (every variant of seed 0, then seed 1, ...) so an interrupted study
already holds complete pairs. Each run writes ``OUT/<task>-<attention>-<kernel>-s<seed>/``
(a finished run with the same configuration is reused, an unfinished one resumes);
``OUT/results.jsonl`` (one row per finished run, rewritten after each) is what the report
(:mod:`coulomb_attention.reports.minilm`) reads.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..config import to_dict
from ..names import MINILM_VARIANTS
from ..results import atomic_write_text, is_done
from ..train.run import RESOLVED_KEYS, RunConfig, checkpoint_config
from ..train.run import run as run_pipeline

__all__ = ["KERNELS", "VARIANTS", "compare", "parse_variant", "row_of", "table"]

#: KERNEL of a variant -> run config overrides (the variant vocabulary of this study)
KERNELS: dict[str, dict[str, Any]] = {
    "vanilla": {"kernel": "vanilla"},
    "teacher": {"kernel": "learned", "objective": "teacher"},
    "labels": {"kernel": "learned", "objective": "labels"},
    "adam": {"kernel": "learned", "objective": "teacher", "distill": {"method": "adam"}},
    "teacher_pairs": {"kernel": "learned", "objective": "teacher", "distill": {"pairs": True}},
    "hedgehog": {"kernel": "learned", "objective": "teacher", "distill": {"method": "hedgehog"}},
}
#: names of earlier versions of this study
ALIASES = {"softmax_align": "teacher", "learned": "labels"}

#: the default comparison, in table order: the paper's variants of a pretrained encoder
#: (the vocabulary's, :data:`coulomb_attention.names.MINILM_VARIANTS`)
VARIANTS: tuple[tuple[str, str], ...] = MINILM_VARIANTS
_KEYS = ("accuracy", "mcc", "f1", "ece", "log_loss", "brier")


def parse_variant(attention: str, kernel: str) -> dict[str, Any]:
    """Run config overrides of variant ``attention:kernel`` (see :data:`KERNELS`)."""
    kernel = ALIASES.get(kernel, kernel)
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r} in variant {attention}:{kernel}; valid: "
                         f"{', '.join(KERNELS)}")
    if kernel == "hedgehog":
        if attention != "hedgehog":
            raise ValueError(f"the Hedgehog baseline is the variant hedgehog:hedgehog, not "
                             f"{attention}:hedgehog")
        return {"attention": "hedgehog", **json.loads(json.dumps(KERNELS[kernel]))}
    if attention == "softmax" and kernel != "vanilla":
        raise ValueError("softmax attention has no features to learn: softmax:vanilla")
    return {"attention": attention, **json.loads(json.dumps(KERNELS[kernel]))}


def row_of(task: str, variant: str, m: dict[str, Any]) -> dict[str, Any]:
    """One result row (of ``OUT/results.jsonl``) from a run's ``metrics.json``."""
    t = m["timings"]
    robust = m.get("robust") or {}
    corrupt = [v["accuracy"] for k, v in robust.items() if k != "advglue"]
    conv = m.get("conversion") or {}
    return {"task": task, "variant": variant, "seed": m["seed"],
            **{k: m[k] for k in _KEYS},
            "advglue_accuracy": (robust.get("advglue") or {}).get("accuracy"),
            "corrupted_accuracy": sum(corrupt) / len(corrupt) if corrupt else None,
            "robust": robust,
            "phase_a_s": t.get("phase_a_s", 0.0), "phase_b_s": t["phase_b_s"],
            "probe_s": t.get("probe_s", 0.0), "eval_s": t.get("eval_s", 0.0),
            "total_s": t.get("total_s", 0.0),
            "ms_per_example": 1e3 * t["inference_s_per_example"],
            "n_train": m["n_train"], "n_eval": m["n_eval"], "eval_split": m["eval_split"],
            "eval_description": m.get("eval_description", ""),
            "conversion_dir": conv.get("dir"), "torch_threads": m.get("torch_threads"),
            "data": m.get("data"),  # data.data_source (None: a run from before the field)
            "config": m["config"]}


def table(rows: list[dict]) -> str:
    """Markdown table of result rows, one line per run (accuracy gap to softmax, same seed)."""
    soft = {(r["task"], r.get("seed", 0)): r["accuracy"] for r in rows
            if r["variant"] == "softmax:vanilla"}
    lines = ["| task | variant | seed | accuracy | vs softmax (pts) | ECE | log-loss | Brier | "
             "phase A s | phase B s | eval ms/ex |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        key = (r["task"], r.get("seed", 0))
        gap = f"{100 * (r['accuracy'] - soft[key]):+.1f}" if key in soft else ""
        lines.append(f"| {r['task']} | {r['variant']} | {r.get('seed', 0)} | "
                     f"{r['accuracy']:.4f} | {gap} | {r['ece']:.4f} | {r['log_loss']:.4f} | "
                     f"{r['brier']:.4f} | {r['phase_a_s']:.0f} | {r['phase_b_s']:.0f} | "
                     f"{r['ms_per_example']:.2f} |")
    return "\n".join(lines) + "\n"


def compare(tasks: Sequence[str], variants: Sequence[tuple[str, str]],
            make_config: Callable[[dict], RunConfig], out: str | Path, runtime, *,
            seeds: Sequence[int] = (0,), data_dir=None, convert_cache: str | Path | None = None,
            log=print) -> list[dict]:
    """Run (or reuse) every seed x task x variant; ``make_config(base)`` lays the caller's
    config file and flags over ``base`` (task, seed and :func:`parse_variant`'s overrides).
    The teacher and hedgehog variants convert (once per map, M and seed, in
    ``convert_cache``, default ``OUT/convert_cache``) before they fine-tune."""
    out = Path(out)
    cache = Path(convert_cache) if convert_cache is not None else out / "convert_cache"
    rows: list[dict] = []
    for seed in seeds:
        for task in tasks:
            for attention, kernel in variants:
                cfg = make_config({"task": task, "seed": int(seed),
                                   **parse_variant(attention, kernel)})
                run_dir = out / f"{task}-{attention}-{kernel}-s{cfg.seed}"
                if is_done(run_dir, to_dict(cfg), ignore=RESOLVED_KEYS,
                           normalize=checkpoint_config):
                    m = json.loads((run_dir / "metrics.json").read_text())
                    log(f"[{task}/{attention}:{kernel}/s{cfg.seed}] reused {run_dir}")
                else:
                    m = run_pipeline(cfg, run_dir, runtime, data_dir=data_dir, resume="auto",
                                     convert_cache=cache, log=log)
                rows.append(row_of(task, f"{attention}:{kernel}", m))
                if runtime.is_main:
                    _write_rows(out, rows)
    return rows


def _write_rows(out: Path, rows: list[dict]) -> None:
    """``results.jsonl`` (every row so far, keeping rows of earlier invocations that this one
    did not run) and ``table.md``."""
    def key(r):
        return r["task"], r["variant"], r.get("seed", 0)

    mine = {key(r) for r in rows}
    earlier = []
    path = out / "results.jsonl"
    if path.is_file():
        with contextlib.suppress(ValueError):
            earlier = [r for r in (json.loads(line) for line in
                                   path.read_text(encoding="utf-8").splitlines() if line)
                       if key(r) not in mine]
    every = earlier + rows
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in every))
    atomic_write_text(out / "table.md", table(every))

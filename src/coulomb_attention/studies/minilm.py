"""The MiniLM comparison: every (attention, kernel) variant of a pretrained encoder on every
task through the one run pipeline (``coulomb-attention minilm compare``).

Configs in (``make_config(base)`` per task and variant), rows out (:func:`compare`), which also
writes ``OUT/<task>-<attention>-<kernel>-s<seed>/`` (finished runs with the same configuration
are reused), ``OUT/results.jsonl`` and ``OUT/table.md`` (:func:`table`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from ..config import to_dict
from ..results import append_jsonl, atomic_write_text, is_done
from ..train.run import RESOLVED_KEYS, RunConfig, checkpoint_config
from ..train.run import run as run_pipeline

__all__ = ["VARIANTS", "compare", "parse_variant", "table"]

#: (attention, kernel) pairs of ``compare``, in table order
VARIANTS: tuple[tuple[str, str], ...] = (
    ("softmax", "vanilla"),
    ("favor", "vanilla"),
    ("favor", "learned"),
    ("favor", "softmax_align"),
    ("porf_softplus", "vanilla"),
    ("porf_softplus", "learned"),
)
_KEYS = ("accuracy", "mcc", "f1", "ece", "log_loss", "brier")


def parse_variant(attention: str, kernel: str) -> dict:
    """Config overrides of one variant (``softmax_align``: learned kernel, teacher objective)."""
    if kernel == "softmax_align":
        return {"attention": attention, "kernel": "learned", "objective": "teacher"}
    return {"attention": attention, "kernel": kernel}


def table(rows: list[dict]) -> str:
    """Markdown table of result rows (accuracy gap to softmax per task)."""
    soft = {r["task"]: r["accuracy"] for r in rows if r["variant"] == "softmax:vanilla"}
    lines = ["| task | variant | accuracy | vs softmax (pts) | ECE | log-loss | Brier | "
             "phase A s | phase B s | eval ms/ex |", "|---|---|---:|---:|---:|---:|---:|---:|"
             "---:|---:|"]
    for r in rows:
        gap = f"{100 * (r['accuracy'] - soft[r['task']]):+.1f}" if r["task"] in soft else ""
        lines.append(f"| {r['task']} | {r['variant']} | {r['accuracy']:.4f} | {gap} | "
                     f"{r['ece']:.4f} | {r['log_loss']:.4f} | {r['brier']:.4f} | "
                     f"{r['phase_a_s']:.0f} | {r['phase_b_s']:.0f} | {r['ms_per_example']:.2f} |")
    return "\n".join(lines) + "\n"


def compare(tasks: Sequence[str], variants: Sequence[tuple[str, str]],
            make_config: Callable[[dict], RunConfig], out: str | Path, runtime, *,
            data_dir=None, log=print) -> list[dict]:
    """Run (or reuse) every task x variant; ``make_config(base)`` lays the caller's config
    file and flags over ``base`` (task and :func:`parse_variant`'s overrides)."""
    out = Path(out)
    rows = []
    for task in tasks:
        for attention, kernel in variants:
            cfg = make_config({"task": task, **parse_variant(attention, kernel)})
            run_dir = out / f"{task}-{attention}-{kernel}-s{cfg.seed}"
            if is_done(run_dir, to_dict(cfg), ignore=RESOLVED_KEYS,
                       normalize=checkpoint_config):
                m = json.loads((run_dir / "metrics.json").read_text())
                log(f"[{task}/{attention}/{kernel}] reused {run_dir}")
            else:
                m = run_pipeline(cfg, run_dir, runtime, data_dir=data_dir, resume="auto")
            t = m["timings"]
            rows.append({"task": task, "variant": f"{attention}:{kernel}",
                         **{k: m[k] for k in _KEYS}, "phase_a_s": t.get("phase_a_s", 0.0),
                         "phase_b_s": t["phase_b_s"],
                         "ms_per_example": 1e3 * t["inference_s_per_example"],
                         "config": m["config"]})
            if runtime.is_main:
                append_jsonl(out / "results.jsonl", rows[-1])
    if runtime.is_main:
        atomic_write_text(out / "table.md", table(rows))
    return rows

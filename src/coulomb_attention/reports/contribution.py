"""The attention contribution of a task: exact softmax attention minus the no-mixing control.

If a task is solved as well without any token mixing (``attention="none"``: each token
attends only to itself) as with softmax attention, the task does not exercise attention, and
no comparison of attention kernels on it can say anything about kernels. This module turns
result rows into that verdict; the report prints it per task.
"""

from __future__ import annotations

import math
from collections import defaultdict

from ..stats import paired_difference

__all__ = ["attention_contribution"]


def attention_contribution(rows: list[dict], metric: str = "accuracy",
                           reference: str = "softmax", control: str = "none") -> list[dict]:
    """Per task: ``reference`` minus ``control`` (paired over seeds), mean and 95% t-interval.

    Parameters
    ----------
    rows : result rows (``metrics.json`` of ``train``), each with ``task``, ``attention``,
        ``seed`` and ``metric``; rows with a ``kernel`` other than ``vanilla`` are ignored
        (neither softmax nor the control has particles)
    metric : the compared metric (higher is better)
    reference, control : the attention variants compared

    Returns
    -------
    list of dict, one per task that has both variants, sorted by task: ``task``, ``metric``,
    ``n_pairs`` (seeds with both runs), ``seeds``, ``reference_mean``, ``control_mean``,
    ``diff_mean``, ``diff_low``, ``diff_high`` (95% paired t-interval; NaN with fewer than 2
    pairs) and ``can_rank_kernels``: True only when the interval lies above 0 (attention
    helps beyond seed noise); False when it contains 0 (or lies below it) or cannot be
    computed.
    """
    by: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for r in rows:
        if r.get("kernel", "vanilla") != "vanilla" or r.get("attention") not in (reference,
                                                                                 control):
            continue
        if metric not in r:
            raise ValueError(f"a {r['attention']} row of task {r.get('task')!r} has no "
                             f"{metric!r}")
        key = (r["task"], r["attention"])
        seed = int(r["seed"])
        if seed in by[key]:
            raise ValueError(f"two {r['attention']} rows for task {r['task']!r}, seed {seed}")
        by[key][seed] = float(r[metric])
    out = []
    for task in sorted({t for t, _ in by}):
        ref, ctl = by.get((task, reference), {}), by.get((task, control), {})
        seeds = sorted(set(ref) & set(ctl))
        if not seeds:
            continue
        mean, lo, hi, n = paired_difference([ref[s] for s in seeds], [ctl[s] for s in seeds])
        out.append({
            "task": task, "metric": metric, "n_pairs": n, "seeds": seeds,
            "reference_mean": sum(ref[s] for s in seeds) / n,
            "control_mean": sum(ctl[s] for s in seeds) / n,
            "diff_mean": mean, "diff_low": lo, "diff_high": hi,
            "can_rank_kernels": bool(not math.isnan(lo) and lo > 0),
        })
    return out

"""The demo study: fixed versus learned random features on one synthetic task.

The task (:func:`coulomb_attention.data.synthetic.make_demo_task`): XOR of two hidden
informative directions in ``d`` dimensions (``d - 2`` pure noise), label noise on the training
half. Each method maps the standardized inputs to N features followed by scikit-learn's
``LogisticRegression``: RandomFeatures, ImportanceFeatures and ParticleFeatures at N = 64 and
256, and ``sklearn.kernel_approximation.RBFSampler`` at 256 (same ``gamma = 1/d``).

Config in (:class:`DemoConfig`), records out (:func:`run_demo`); :func:`run_study` writes
``results.json`` (accuracies, fit times, the particle traces, the config), ``results.md`` (the
table) and ``demo.png`` (:func:`coulomb_attention.reports.demo.plot`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..data.synthetic import make_demo_task
from ..results import atomic_write_text

__all__ = ["DemoConfig", "run_demo", "run_study"]


@dataclass(frozen=True)
class DemoConfig:
    """``n`` training (= test) points in ``d`` dimensions, training label noise ``noise``."""

    n: int = 2000
    d: int = 20
    noise: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n < 10:
            raise ValueError(f"--n must be >= 10, got {self.n}")
        if not 0.0 <= self.noise < 0.5:
            raise ValueError(f"--noise must be in [0, 0.5), got {self.noise}")
        if self.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {self.seed}")


def _methods(seed: int, d: int) -> dict:
    from sklearn.kernel_approximation import RBFSampler

    from ..estimators import ImportanceFeatures, ParticleFeatures, RandomFeatures

    out = {}
    for n_feat in (64, 256):
        out[f"RandomFeatures({n_feat})"] = RandomFeatures(n_feat, random_state=seed)
        out[f"ImportanceFeatures({n_feat})"] = ImportanceFeatures(n_feat, random_state=seed)
        out[f"ParticleFeatures({n_feat})"] = ParticleFeatures(n_feat, random_state=seed)
    out["RBFSampler(256)"] = RBFSampler(gamma=1.0 / d, n_components=256, random_state=seed)
    return out


def run_demo(cfg: DemoConfig, log: Callable[[str], None] | None = print) -> tuple[list, dict]:
    """Fit every method; returns the rows (one per method) and the particle traces."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from ..estimators import ParticleFeatures

    X, y = make_demo_task(cfg.n, cfg.d, cfg.noise, cfg.seed)
    Xtr, ytr, Xte, yte = X[: cfg.n], y[: cfg.n], X[cfg.n :], y[cfg.n :]
    rows, traces = [], {}
    log = log or (lambda _m: None)
    log(f"task: XOR of 2 hidden directions in d={cfg.d}, n_train={cfg.n}, noise={cfg.noise}")
    log(f"{'method':<24} {'N':>4} {'test acc':>9} {'train acc':>10} {'fit s':>7}")
    for name, est in _methods(cfg.seed, cfg.d).items():
        pipe = make_pipeline(StandardScaler(), est, LogisticRegression(max_iter=2000))
        t0 = time.perf_counter()
        pipe.fit(Xtr, ytr)
        fit_s = time.perf_counter() - t0
        row = {
            "method": name,
            "n_components": int(est.n_components),
            "test_accuracy": float(pipe.score(Xte, yte)),
            "train_accuracy": float(pipe.score(Xtr, ytr)),
            "fit_seconds": fit_s,
        }
        if isinstance(est, ParticleFeatures):
            row["initial_alignment"] = est.initial_alignment_
            row["final_alignment"] = est.alignment_
            traces[name] = est.history_
        rows.append(row)
        log(f"{name:<24} {row['n_components']:>4} {row['test_accuracy']:>9.3f} "
            f"{row['train_accuracy']:>10.3f} {fit_s:>7.2f}")
    return rows, traces


def run_study(cfg: DemoConfig, out: Path, *, config: dict | None = None, plots: bool = True,
              log: Callable[[str], None] | None = print) -> dict:
    """:func:`run_demo`, then ``results.json``, ``results.md`` and ``demo.png`` under ``out``;
    ``config`` (default: ``cfg``'s fields) is what ``results.json`` records as the config."""
    from ..estimators import ParticleFeatures

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows, traces = run_demo(cfg, log)
    result = {
        "config": config if config is not None else vars(cfg),
        "particle_defaults": {k: str(v) for k, v in ParticleFeatures().get_params().items()},
        "results": rows,
        "traces": traces,
    }
    atomic_write_text(out / "results.json", json.dumps(result, indent=1))
    md = "| method | N | test accuracy | train accuracy | fit s |\n|---|---|---|---|---|\n"
    for r in rows:
        md += (f"| {r['method']} | {r['n_components']} | {r['test_accuracy']:.3f} | "
               f"{r['train_accuracy']:.3f} | {r['fit_seconds']:.2f} |\n")
    atomic_write_text(out / "results.md", md)
    if plots:
        from ..reports.demo import plot

        plot(out / "results.json", out / "demo.png")
    return result

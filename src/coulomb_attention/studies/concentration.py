"""The concentration study: spread across seeds of the learned kernel vs N and beta.

The large-deviation claim (``docs/DESIGN.md``, "Concentration"): the Gibbs measure of the particle
system concentrates its empirical measure around the minimiser of the free energy, so the
learned kernel ``k_Omega`` concentrates around ``k_{rho*}`` as ``N`` or ``beta`` grows. We
measure it on one fixed dataset (the ``spectral`` synthetic task, one data seed) with
``ParticleFeatures``: for each setting, ``n_seeds`` fits that differ only in their
``random_state`` (initial particles, rff phases, mini-batch order and Langevin noise), the
kernel matrices ``K_s = Phi_s Phi_s^T`` on a fixed probe set (``n_probe`` test points), and

    spread = mean_{s < t} ||K_s - K_t||_F / mean_s ||K_s||_F.

Two sweeps: ``N`` over ``budgets`` at ``beta = beta_for_n``, and ``beta`` over ``betas`` at
``N = n_for_beta``. Log-log slopes are least-squares fits of ``log spread`` on ``log N`` and
``log beta``. Fixed Gaussian random features (``RandomFeatures``, the same seeds) give the
Monte-Carlo reference, whose spread decays like ``N^(-1/2)``.

``beta`` is ``ParticleFeatures``' inverse temperature: with its default ``normalize=True`` the
noise per step is ``sqrt(2 eta / beta)`` in units of the initial particle scale ``r0``.

Config in (:class:`ConcentrationConfig`), records out (:func:`run_concentration`);
:func:`run_study` writes ``concentration.json`` (config, rows, slopes), ``concentration.md``
and ``concentration.png`` (:mod:`coulomb_attention.reports.concentration`) under ``out``.
``seeds`` (optional) names the fits' ``random_state`` values; by default they are
``0 .. n_seeds - 1``.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..config import to_dict
from ..results import atomic_write_text
from ..stats import loglog_slope

__all__ = [
    "ConcentrationConfig",
    "QUICK",
    "kernel_spread",
    "fit_kernel",
    "run_concentration",
    "run_study",
    "to_markdown",
]


@dataclass(frozen=True)
class ConcentrationConfig:
    """Settings of the concentration study (stored in ``concentration.json``)."""

    task: str = "spectral"
    data_seed: int = 0
    n_train: int = 500
    n_probe: int = 200
    d: int = 10
    budgets: tuple[int, ...] = (16, 32, 64, 128, 256)
    beta_for_n: float = 1000.0
    betas: tuple[float, ...] = (10.0, 100.0, 1000.0, 10000.0, 100000.0)
    n_for_beta: int = 64
    n_seeds: int = 5
    particles: dict = field(default_factory=dict)
    seeds: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        from ..data.synthetic import TASKS

        if self.seeds is not None:
            seeds = tuple(self.seeds)
            if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds) or \
                    len(set(seeds)) != len(seeds):
                raise ValueError(f"seeds must be distinct integers >= 0, got {self.seeds!r}")
            object.__setattr__(self, "seeds", seeds)
            object.__setattr__(self, "n_seeds", len(seeds))

        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; valid: {', '.join(sorted(TASKS))}")
        for name in ("budgets", "betas"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
            if not getattr(self, name):
                raise ValueError(f"{name} is empty")
        for n in self.budgets:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"budgets must be positive integers, got {n!r}")
        for b in (*self.betas, self.beta_for_n):
            if not isinstance(b, (int, float)) or not (b > 0) or math.isnan(b):
                raise ValueError(f"betas must be > 0 (inf allowed for beta_for_n), got {b!r}")
        for b in self.betas:
            if math.isinf(b):
                raise ValueError("betas must be finite (a log-log slope is fitted over them)")
        for name in ("n_train", "n_probe", "d", "n_for_beta"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if isinstance(self.n_seeds, bool) or not isinstance(self.n_seeds, int) or self.n_seeds < 2:
            raise ValueError(f"n_seeds must be an integer >= 2 (a spread needs pairs), "
                             f"got {self.n_seeds!r}")
        if not isinstance(self.particles, dict):
            raise TypeError("particles must be a dict of ParticleFeatures arguments")
        for key in ("n_components", "beta", "random_state"):
            if key in self.particles:
                raise ValueError(f"particles must not set {key!r}: the sweep sets it")


QUICK: dict = {
    "n_train": 300,
    "n_probe": 100,
    "budgets": [16, 32, 64],
    "betas": [10.0, 100.0, 1000.0],
    "n_for_beta": 32,
    "n_seeds": 3,
    "particles": {"n_steps": 40},
}


def kernel_spread(kernels: np.ndarray) -> tuple[float, float]:
    """Spread of kernel matrices across seeds.

    Parameters
    ----------
    kernels : ndarray (S, P, P), S >= 2 kernel matrices on the same probe set

    Returns
    -------
    spread : float  mean pairwise Frobenius distance / mean Frobenius norm
    mean_norm : float  mean Frobenius norm
    """
    kernels = np.asarray(kernels, dtype=float)
    if kernels.ndim != 3 or kernels.shape[0] < 2 or kernels.shape[1] != kernels.shape[2]:
        raise ValueError(f"kernels must have shape (S >= 2, P, P), got {kernels.shape}")
    norms = np.linalg.norm(kernels, axis=(1, 2))
    dists = [np.linalg.norm(kernels[a] - kernels[b]) for a, b in
             itertools.combinations(range(kernels.shape[0]), 2)]
    mean_norm = float(norms.mean())
    return float(np.mean(dists) / mean_norm), mean_norm


def _data(cfg: ConcentrationConfig):
    from ..data.synthetic import make_task

    task = make_task(cfg.task, cfg.n_train, cfg.n_probe, cfg.d, 0.0, random_state=cfg.data_seed)
    return task.X_train, task.y_train, task.X_test  # the probe set: n_probe test points


def fit_kernel(cfg: ConcentrationConfig, kind: str, n: int, beta: float, seed: int):
    """Kernel matrix (n_probe, n_probe) on the probe set of one fit, and its fit time.

    ``kind`` is ``"particles"`` (ParticleFeatures with ``cfg.particles``) or ``"fixed"``
    (RandomFeatures, the Monte-Carlo reference; ``beta`` is ignored).
    """
    from .. import estimators

    X, y, P = _data(cfg)
    t0 = time.perf_counter()
    if kind == "particles":
        est = estimators.ParticleFeatures(
            n_components=n, beta=beta, random_state=seed, **cfg.particles
        ).fit(X, y)
    elif kind == "fixed":
        est = estimators.RandomFeatures(n_components=n, random_state=seed).fit(X)
    else:
        raise ValueError(f"unknown kind {kind!r}; valid: fixed, particles")
    phi = est.transform(P)  # (P, N)
    return phi @ phi.T, time.perf_counter() - t0


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _job(args):
    cfg, kind, n, beta, seed = args
    return fit_kernel(cfg, kind, n, beta, seed)


def run_concentration(cfg: ConcentrationConfig, jobs: int = 1, threads: int = 1) -> dict:
    """Run both sweeps; returns ``{"config", "rows", "slopes"}`` (JSON-ready).

    Each row: ``sweep`` (``N`` or ``beta``), ``kind`` (``particles``/``fixed``), ``N``,
    ``beta``, ``spread``, ``mean_norm``, ``n_seeds``, ``fit_s`` (mean per fit).
    """
    settings = []
    for n in cfg.budgets:
        settings.append(("N", "particles", n, cfg.beta_for_n))
        settings.append(("N", "fixed", n, None))
    for b in cfg.betas:
        settings.append(("beta", "particles", cfg.n_for_beta, b))
    seeds = cfg.seeds if cfg.seeds is not None else range(cfg.n_seeds)
    tasks = [(cfg, kind, n, beta, s) for (_, kind, n, beta) in settings for s in seeds]
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs, initializer=_init_worker, initargs=(threads,)) as pool:
            results = list(pool.map(_job, tasks))
    else:
        results = [_job(t) for t in tasks]
    rows = []
    for i, (sweep, kind, n, beta) in enumerate(settings):
        chunk = results[i * cfg.n_seeds : (i + 1) * cfg.n_seeds]
        spread, norm = kernel_spread(np.stack([k for k, _ in chunk]))
        rows.append({
            "sweep": sweep, "kind": kind, "N": n, "beta": beta, "spread": spread,
            "mean_norm": norm, "n_seeds": cfg.n_seeds,
            "fit_s": float(np.mean([t for _, t in chunk])),
        })
    slopes = {}
    for kind in ("particles", "fixed"):
        rs = [r for r in rows if r["sweep"] == "N" and r["kind"] == kind]
        slopes[f"{kind}_vs_N"] = loglog_slope([r["N"] for r in rs], [r["spread"] for r in rs])
    rs = [r for r in rows if r["sweep"] == "beta"]
    slopes["particles_vs_beta"] = loglog_slope([r["beta"] for r in rs],
                                               [r["spread"] for r in rs])
    return {"config": to_dict(cfg), "rows": rows, "slopes": slopes}


def to_markdown(res: dict) -> str:
    cfg = res["config"]
    s = res["slopes"]
    lines = [
        "# Concentration of the learned kernel across seeds",
        "",
        f"Task {cfg['task']} (data seed {cfg['data_seed']}, n_train={cfg['n_train']}, "
        f"d={cfg['d']}), probe set of {cfg['n_probe']} test points, {cfg['n_seeds']} seeds per "
        f"setting; ParticleFeatures arguments {cfg['particles'] or '(defaults)'}. "
        "spread = mean pairwise ||K_s - K_t||_F / mean ||K_s||_F.",
        "",
        f"## Spread vs N (particles at beta={cfg['beta_for_n']:g}; fixed rff reference)",
        "",
        "| N | particles | fixed rff | particle fit (s) |",
        "|---|---|---|---|",
    ]
    by = {(r["sweep"], r["kind"], r["N"]): r for r in res["rows"] if r["sweep"] == "N"}
    for n in cfg["budgets"]:
        p, f = by.get(("N", "particles", n)), by.get(("N", "fixed", n))
        lines.append(f"| {n} | {p['spread']:.4f} | {f['spread']:.4f} | {p['fit_s']:.2f} |")
    lines += [
        "",
        f"log-log slope: particles {s['particles_vs_N']:+.3f}, fixed rff "
        f"{s['fixed_vs_N']:+.3f} (Monte Carlo: -0.5)",
        "",
        f"## Spread vs beta (particles at N={cfg['n_for_beta']})",
        "",
        "| beta | particles | particle fit (s) |",
        "|---|---|---|",
    ]
    for r in res["rows"]:
        if r["sweep"] == "beta":
            lines.append(f"| {r['beta']:g} | {r['spread']:.4f} | {r['fit_s']:.2f} |")
    lines += ["", f"log-log slope vs beta: {s['particles_vs_beta']:+.3f}", ""]
    return "\n".join(lines)



def run_study(cfg: ConcentrationConfig, out: Path, *, jobs: int = 1, threads: int = 1,
              plots: bool = True) -> dict:
    """Run both sweeps and write ``concentration.json``, ``.md`` (and ``.png``) under ``out``;
    returns the result (with ``wall_s`` and the Markdown as ``markdown``)."""
    if jobs < 1 or threads < 1:
        raise ValueError(f"--jobs and --threads must be >= 1, got {jobs}, {threads}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res = run_concentration(cfg, jobs=jobs, threads=threads)
    res["wall_s"] = time.perf_counter() - t0
    atomic_write_text(out / "concentration.json", json.dumps(res, indent=1))
    md = to_markdown(res) + f"\nWall time: {res['wall_s']:.1f} s (jobs={jobs}).\n"
    atomic_write_text(out / "concentration.md", md)
    if plots:
        from ..reports.concentration import plot

        plot(res, out / "concentration.png")
    return {**res, "markdown": md}

"""The synthetic study: fixed versus learned random features on synthetic tasks.

For every task family x label-noise level x budget N x method x seed, fit a feature
estimator from :mod:`coulomb_attention.estimators` on the training set, train the same
downstream classifier (``LogisticRegression(C=logreg_C)``) on its features and record the test
accuracy. The exact kernel SVM (``SVC(kernel="rbf", gamma="scale")``) is the full-kernel
reference (it has no budget, its rows have ``N = null``).

Methods (:data:`METHODS`):

- ``rff``            fixed Gaussian random Fourier features (``RandomFeatures``)
- ``orf``            fixed orthogonal random features (``RandomFeatures(sampler="orthogonal")``)
- ``importance``     Sinha & Duchi importance-reweighted features (``ImportanceFeatures``)
- ``particles_lam0`` learned particles without repulsion (``ParticleFeatures(lam=0)``)
- ``particles``      learned particles with Riesz/Coulomb repulsion (``ParticleFeatures``)
- ``svm``            exact kernel SVM

Outputs under ``out`` (:func:`run_study`):

- ``results.jsonl``  one line per run (resolved config, run key, seed, metrics, timings),
  appended and fsync'ed as runs finish; ``--resume`` skips the keys already there.
- ``summary.csv``, ``summary.md``: mean and std over seeds per task/noise/method/N.
- ``claims.md`` (also printed): the paper's claims as PASS/FAIL with numbers.
- ``acc_vs_budget.png``, ``retained.png``, ``particles_spectral.png`` (+ the
  ``particles_spectral.npz`` it is drawn from), drawn by :mod:`coulomb_attention.reports.synthetic`.

Config in (:class:`SyntheticConfig`), records out (:func:`run_grid` rows; :func:`run_study`
writes every file above). The command ``coulomb-attention synthetic`` only builds the config.
The tasks live in :mod:`coulomb_attention.data.synthetic`.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..config import to_dict
from ..data.synthetic import TASKS, make_task, spectral_hit_fraction
from ..names import SYNTHETIC_METHODS
from ..results import append_jsonl, atomic_write_text, read_jsonl, run_key

__all__ = [
    "METHODS",
    "RF_METHODS",
    "SyntheticConfig",
    "QUICK",
    "RunSpec",
    "config_hash",
    "run_study",
    "run_grid",
    "run_one",
    "grid",
    "load_rows",
    "summarize",
    "evaluate_claims",
    "claims_markdown",
    "particle_diagnostic",
]

METHODS: tuple[str, ...] = SYNTHETIC_METHODS
RF_METHODS: tuple[str, ...] = METHODS[:-1]
FIXED_METHODS: tuple[str, ...] = ("rff", "orf")


@dataclass(frozen=True)
class SyntheticConfig:
    """The resolved configuration of a synthetic grid (stored with every result row).

    ``particles`` holds keyword arguments of ``ParticleFeatures`` for the ``particles``
    method; ``particles_lam0`` uses the same arguments with ``lam = 0``. ``importance`` holds
    keyword arguments of ``ImportanceFeatures``.
    """

    tasks: tuple[str, ...] = ("anisotropic", "xor", "radial", "spectral")
    noise_levels: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3)
    budgets: tuple[int, ...] = (16, 32, 64, 128, 256)
    methods: tuple[str, ...] = METHODS
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    n_train: int = 1000
    n_test: int = 1000
    d: int = 10
    logreg_C: float = 100.0
    logreg_max_iter: int = 5000
    svm_C: float = 1.0
    feature_map: str = "rff"
    particles: dict = field(default_factory=dict)
    importance: dict = field(default_factory=dict)
    diagnostic_budget: int = 64

    def __post_init__(self) -> None:
        for name in ("tasks", "noise_levels", "budgets", "methods", "seeds"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
                raise TypeError(f"{name} must be a list, got {value!r}")
            object.__setattr__(self, name, tuple(value))
            if not getattr(self, name):
                raise ValueError(f"{name} is empty")
        for t in self.tasks:
            if t not in TASKS:
                raise ValueError(f"unknown task {t!r}; valid: {', '.join(sorted(TASKS))}")
        for m in self.methods:
            if m not in METHODS:
                raise ValueError(f"unknown method {m!r}; valid: {', '.join(METHODS)}")
        for p in self.noise_levels:
            if not (0.0 <= float(p) < 0.5):
                raise ValueError(f"noise levels must be in [0, 0.5), got {p}")
        for n in self.budgets:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"budgets must be positive integers, got {n!r}")
        for s in self.seeds:
            if isinstance(s, bool) or not isinstance(s, int) or s < 0:
                raise ValueError(f"seeds must be integers >= 0, got {s!r}")
        for name in ("n_train", "n_test", "d", "logreg_max_iter", "diagnostic_budget"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name in ("logreg_C", "svm_C"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive number, got {v!r}")
        for name in ("particles", "importance"):
            if not isinstance(getattr(self, name), dict):
                raise TypeError(f"{name} must be a dict of estimator arguments")
        from ..estimators import ParticleFeatures

        # fail now, not after part of the grid has run (unknown keys raise TypeError)
        ParticleFeatures(**self.particles)._check_params()


# The reduced grid of --quick (< 3 min on 2 cores).
QUICK: dict = {
    "tasks": ["xor", "spectral"],
    "noise_levels": [0.0, 0.2],
    "budgets": [16, 32, 64, 256],
    "seeds": [0, 1, 2],
    "n_train": 500,
    "n_test": 500,
    "particles": {"n_steps": 60},
}


@dataclass(frozen=True)
class RunSpec:
    """One cell of the grid: ``n_components`` is ``None`` for the SVM."""

    task: str
    noise: float
    method: str
    n_components: int | None
    seed: int

    @property
    def key(self) -> str:
        return f"{self.task}|{self.noise:g}|{self.method}|{self.n_components}|{self.seed}"


def grid(cfg: SyntheticConfig) -> list[RunSpec]:
    """All runs of ``cfg`` in a deterministic, seed-major order (SVM once per
    task/noise/seed)."""
    specs = []
    for seed in cfg.seeds:  # seed-major: an interrupted grid holds complete seeds
        for task in cfg.tasks:
            for noise in cfg.noise_levels:
                for method in cfg.methods:
                    if method == "svm":
                        specs.append(RunSpec(task, float(noise), method, None, seed))
                    else:
                        for n in cfg.budgets:
                            specs.append(RunSpec(task, float(noise), method, int(n), seed))
    return specs


def estimator_defaults() -> dict:
    """Default parameters of the estimators (part of the config hash, so that ``--resume``
    never mixes rows of an estimator whose defaults have changed)."""
    from .. import estimators

    out = {}
    for cls in (estimators.RandomFeatures, estimators.ImportanceFeatures,
                estimators.ParticleFeatures):
        params = cls().get_params()
        params.pop("random_state", None)
        out[cls.__name__] = {k: repr(v) for k, v in sorted(params.items())}
    return out


def config_hash(cfg: SyntheticConfig) -> str:
    """Hash of the settings a single run depends on (not the grid's extent), including the
    estimators' default parameters."""
    d = to_dict(cfg)
    for k in ("tasks", "noise_levels", "budgets", "methods", "seeds", "diagnostic_budget"):
        d.pop(k)
    d["estimator_defaults"] = estimator_defaults()
    return hashlib.sha1(run_key(d).encode()).hexdigest()[:12]


def method_kwargs(cfg: SyntheticConfig, method: str) -> dict:
    """Keyword arguments of the estimator behind ``method`` (resolved; stored per row)."""
    if method == "rff":
        return {"feature_map": cfg.feature_map, "sampler": "gaussian"}
    if method == "orf":
        return {"feature_map": cfg.feature_map, "sampler": "orthogonal"}
    if method == "importance":
        return {"feature_map": cfg.feature_map, **cfg.importance}
    if method == "particles":
        return {"feature_map": cfg.feature_map, **cfg.particles}
    if method == "particles_lam0":
        return {"feature_map": cfg.feature_map, **cfg.particles, "lam": 0.0}
    if method == "svm":
        return {"kernel": "rbf", "gamma": "scale", "C": cfg.svm_C}
    raise ValueError(f"unknown method {method!r}; valid: {', '.join(METHODS)}")


def make_estimator(method: str, n_components: int, random_state: int, kwargs: dict):
    """The feature transformer of ``method`` (imported lazily from the estimators module)."""
    from .. import estimators

    if method in ("rff", "orf"):
        return estimators.RandomFeatures(
            n_components=n_components, random_state=random_state, **kwargs
        )
    if method == "importance":
        return estimators.ImportanceFeatures(
            n_components=n_components, random_state=random_state, **kwargs
        )
    if method in ("particles", "particles_lam0"):
        return estimators.ParticleFeatures(
            n_components=n_components, random_state=random_state, **kwargs
        )
    raise ValueError(f"method {method!r} has no feature estimator")


def _centered_alignment(Z: np.ndarray, y: np.ndarray) -> float:
    """Centered kernel-target alignment of ``Z Z^T`` (``Z`` (n, N)) with the +-1 labels: the
    energy's own statistic (:func:`coulomb_attention.energy.alignment`), not a copy."""
    import torch

    from ..energy.alignment import alignment, encode_labels

    Y, _ = encode_labels(y)
    return float(alignment(torch.from_numpy(np.asarray(Z, dtype=np.float64)), Y))


def _omega_stats(omega: np.ndarray, meta: dict) -> dict:
    """Diagnostics of the particles: share of |omega|^2 on the informative dims and, for the
    spectral task, the fraction of particles near a ground-truth frequency +-f_k."""
    k = meta["n_informative"]
    sq = omega**2
    out = {"informative_energy": float(sq[:, :k].sum() / max(sq.sum(), 1e-300))}
    if "frequencies" in meta:
        out["spectral_hit_fraction"] = spectral_hit_fraction(omega, meta["frequencies"])
    return out


def run_one(cfg: SyntheticConfig, spec: RunSpec) -> dict:
    """Fit and score one run; returns the JSON-ready result row."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import SVC

    t_start = time.perf_counter()
    cpu_start = time.process_time()  # this process's CPU time (torch threads included)
    task = make_task(spec.task, cfg.n_train, cfg.n_test, cfg.d, spec.noise, random_state=spec.seed)
    meta = task.metadata
    kwargs = method_kwargs(cfg, spec.method)
    metrics: dict = {}
    timings: dict = {}
    if spec.method == "svm":
        t0 = time.perf_counter()
        clf = SVC(**kwargs).fit(task.X_train, task.y_train)
        timings["fit_s"] = time.perf_counter() - t0
        metrics["train_accuracy"] = float(clf.score(task.X_train, task.y_train))
        metrics["test_accuracy"] = float(clf.score(task.X_test, task.y_test))
        metrics["n_support"] = int(clf.n_support_.sum())
    else:
        est = make_estimator(spec.method, spec.n_components, spec.seed, kwargs)
        t0 = time.perf_counter()
        est.fit(task.X_train, task.y_train)
        params = {k: v for k, v in est.get_params().items() if k != "random_state"}
        resolved = {k: (v if isinstance(v, (str, int, bool)) or v is None else float(v))
                    for k, v in params.items()}
        Z_train = est.transform(task.X_train)
        timings["features_fit_s"] = time.perf_counter() - t0
        Z_test = est.transform(task.X_test)
        t0 = time.perf_counter()
        clf = LogisticRegression(C=cfg.logreg_C, max_iter=cfg.logreg_max_iter)
        clf.fit(Z_train, task.y_train)
        timings["classifier_fit_s"] = time.perf_counter() - t0
        metrics["train_accuracy"] = float(clf.score(Z_train, task.y_train))
        metrics["test_accuracy"] = float(clf.score(Z_test, task.y_test))
        metrics["train_alignment"] = _centered_alignment(Z_train, task.y_train)
        metrics.update(_omega_stats(np.asarray(est.omega_, dtype=float), meta))
        history = getattr(est, "history_", None)
        if history:
            last = history[-1]
            for name in ("alignment", "repulsion", "boundary_fraction", "energy"):
                if name in last:
                    metrics[f"final_{name}"] = float(last[name])
            metrics["n_steps"] = len(history)
    else_params = {} if spec.method == "svm" else resolved
    timings["total_s"] = time.perf_counter() - t_start
    timings["cpu_s"] = time.process_time() - cpu_start
    return {
        "estimator_params": else_params,
        "key": spec.key,
        "config_hash": config_hash(cfg),
        **dataclasses.asdict(spec),
        "estimator_kwargs": kwargs,
        "metrics": metrics,
        "timings": timings,
        "config": to_dict(cfg),
        "n_flipped": meta["n_flipped"],
    }


# ----------------------------------------------------------------------------- result file


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def run_grid(
    cfg: SyntheticConfig,
    out: Path,
    *,
    resume: bool = False,
    jobs: int = 1,
    threads: int = 1,
    log: Callable[[str], None] | None = print,
) -> list[dict]:
    """Run the grid of ``cfg`` and append rows to ``out/results.jsonl``.

    With ``resume=True`` runs whose key (and config hash) is already in the file are skipped;
    without it an existing file is an error (no silent mixing). Returns all rows of the
    current configuration.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.jsonl"
    h = config_hash(cfg)
    if path.exists() and path.stat().st_size > 0 and not resume:
        raise ValueError(f"{path} exists; pass --resume to continue it or choose another --out")
    existing = read_jsonl(path, repair=True)
    done = {r["key"] for r in existing if r.get("config_hash") == h}
    todo = [s for s in grid(cfg) if s.key not in done]
    n_total = len(grid(cfg))
    if log:
        log(f"{n_total} runs in the grid, {n_total - len(todo)} already done, {len(todo)} to run")
    t0 = time.perf_counter()
    finished = 0

    def report(row: dict) -> None:
        nonlocal finished
        append_jsonl(path, row)
        finished += 1
        if log and (finished % 25 == 0 or finished == len(todo)):
            log(f"  {finished}/{len(todo)} runs, {time.perf_counter() - t0:.0f} s")

    if jobs <= 1 or len(todo) <= 1:
        for spec in todo:
            report(run_one(cfg, spec))
    else:
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(
            max_workers=jobs, initializer=_init_worker, initargs=(threads,)
        ) as pool:
            futures = [pool.submit(run_one, cfg, s) for s in todo]
            for fut in as_completed(futures):
                report(fut.result())
    rows = [r for r in read_jsonl(path) if r.get("config_hash") == h]
    wanted = {s.key for s in grid(cfg)}
    return [r for r in rows if r["key"] in wanted]


# ----------------------------------------------------------------------------- summaries


def _acc_table(rows: list[dict]) -> dict:
    """``(task, noise, method, N) -> {seed: accuracy}``."""
    table: dict = defaultdict(dict)
    for r in rows:
        table[(r["task"], r["noise"], r["method"], r["n_components"])][r["seed"]] = r["metrics"][
            "test_accuracy"
        ]
    return table


def summarize(rows: list[dict]) -> list[dict]:
    """Mean/std over seeds per ``(task, noise, method, N)``."""
    groups: dict = defaultdict(list)
    for r in rows:
        groups[(r["task"], r["noise"], r["method"], r["n_components"])].append(r)
    out = []
    for (task, noise, method, n), rs in groups.items():
        acc = np.array([r["metrics"]["test_accuracy"] for r in rs])
        t = np.array([r["timings"]["total_s"] for r in rs])
        align = [r["metrics"].get("train_alignment") for r in rs]
        align = np.array([a for a in align if a is not None])
        hit = [r["metrics"].get("spectral_hit_fraction") for r in rs]
        hit = np.array([a for a in hit if a is not None])
        out.append(
            {
                "task": task,
                "noise": noise,
                "method": method,
                "N": n,
                "n_seeds": len(rs),
                "acc_mean": float(acc.mean()),
                "acc_std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                "alignment_mean": float(align.mean()) if len(align) else None,
                "spectral_hit_mean": float(hit.mean()) if len(hit) else None,
                "time_mean_s": float(t.mean()),
            }
        )
    order = {m: i for i, m in enumerate(METHODS)}
    out.sort(key=lambda s: (s["task"], s["noise"], order[s["method"]], s["N"] or 0))
    return out


def write_summary(summary: list[dict], out: Path, cfg: SyntheticConfig) -> None:
    """``summary.csv`` and ``summary.md`` (one table per task and noise level)."""
    with open(out / "summary.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(summary[0]))
        w.writeheader()
        w.writerows(summary)
    budgets = sorted({s["N"] for s in summary if s["N"] is not None})
    lines = [
        "# Synthetic benchmark: test accuracy (mean +- std over seeds)",
        "",
        f"Downstream classifier: LogisticRegression(C={cfg.logreg_C}); reference: SVC(rbf, "
        f'gamma="scale", C={cfg.svm_C}). n_train={cfg.n_train}, n_test={cfg.n_test}, '
        f"d={cfg.d}, seeds={list(cfg.seeds)}. Label noise flips training labels only.",
        "",
    ]
    cells = sorted({(s["task"], s["noise"]) for s in summary})
    idx = {(s["task"], s["noise"], s["method"], s["N"]): s for s in summary}
    for task, noise in cells:
        lines += [f"## {task}, label noise {noise:.0%}", ""]
        lines.append("| method | " + " | ".join(f"N={n}" for n in budgets) + " |")
        lines.append("|---" * (len(budgets) + 1) + "|")
        for m in METHODS:
            if m == "svm":
                s = idx.get((task, noise, m, None))
                if s:
                    txt = f"{s['acc_mean']:.3f} +- {s['acc_std']:.3f}"
                    lines.append(f"| svm (exact kernel) | {txt} (no budget) |" + " |" * (
                        len(budgets) - 1))
                continue
            cells_m = [idx.get((task, noise, m, n)) for n in budgets]
            if not any(cells_m):
                continue
            txt = [f"{s['acc_mean']:.3f} +- {s['acc_std']:.3f}" if s else "" for s in cells_m]
            lines.append(f"| {m} | " + " | ".join(txt) + " |")
        lines.append("")
    atomic_write_text(out / "summary.md", "\n".join(lines))


# ----------------------------------------------------------------------------- claims


def _cell_means(table: dict, method: str, n, cells) -> np.ndarray | None:
    """(n_cells, n_seeds) accuracies of ``method`` at budget ``n``; None if incomplete."""
    mats = []
    for task, noise in cells:
        d = table.get((task, noise, method, n))
        if not d:
            return None
        mats.append(d)
    seeds = sorted(set.intersection(*(set(d) for d in mats)))
    if not seeds:
        return None
    return np.array([[d[s] for s in seeds] for d in mats])


def evaluate_claims(rows: list[dict], particles: str = "particles") -> dict:
    """The paper's claims, measured on ``rows``; see ``claims.md`` for the wording.

    Every number is averaged over all (task, noise) cells present; paired differences are
    formed per seed (same data and feature seed) before the std over seeds is taken.
    """
    table = _acc_table(rows)
    cells = sorted({(r["task"], r["noise"]) for r in rows})
    budgets = sorted({r["n_components"] for r in rows if r["n_components"] is not None})
    res: dict = {"cells": [list(c) for c in cells], "budgets": budgets, "claims": []}

    def acc(method, n):
        return _cell_means(table, method, n, cells)

    # C1 / C2: retained fraction acc(64)/acc(256), per cell (mean over seeds first).
    retained: dict = {}
    for m in RF_METHODS:
        a64, a256 = acc(m, 64), acc(m, 256)
        if a64 is None or a256 is None:
            continue
        r = a64.mean(1) / a256.mean(1)  # (cells,)
        above = (a64.mean(1) - 0.5) / np.maximum(a256.mean(1) - 0.5, 1e-9)
        retained[m] = {
            "per_cell": r.tolist(),
            "mean": float(r.mean()),
            "min": float(r.min()),
            "above_chance_mean": float(above.mean()),
            "n_cells_ge_0.9": int((r >= 0.9).sum()),
        }
    res["retained"] = retained
    n_cells = len(cells)
    if particles in retained:
        r = retained[particles]
        res["claims"].append(
            {
                "id": "C1",
                "claim": "learned particles (lam>0) at N=64 keep >= 90% of their N=256 test "
                "accuracy in every task/noise cell",
                "measured": f"acc64/acc256: mean {r['mean']:.3f}, min {r['min']:.3f}, "
                f"{r['n_cells_ge_0.9']}/{n_cells} cells >= 0.90; above chance "
                f"(acc-0.5) ratio mean {r['above_chance_mean']:.3f}",
                "pass": bool(r["min"] >= 0.9),
            }
        )
    else:
        res["claims"].append(_na("C1", "N=64 and N=256 both needed in the grid"))
    fixed = [m for m in FIXED_METHODS if m in retained]
    if particles in retained and fixed:
        rp = retained[particles]
        parts, ok = [], True
        for m in fixed:
            rm = retained[m]
            n_worse = int(np.sum(np.array(rm["per_cell"]) < np.array(rp["per_cell"])))
            parts.append(
                f"{m} {rm['mean']:.3f} (above chance {rm['above_chance_mean']:.3f}; lower than "
                f"particles in {n_worse}/{n_cells} cells)"
            )
            ok &= rm["mean"] < rp["mean"]
        res["claims"].append(
            {
                "id": "C2",
                "claim": "fixed features degrade more sharply: their mean retained fraction "
                "acc64/acc256 is lower than the particles'",
                "measured": f"particles {rp['mean']:.3f} vs " + "; ".join(parts),
                "pass": bool(ok),
            }
        )
    else:
        res["claims"].append(_na("C2", "N=64/256 for particles and a fixed method needed"))

    # C3: gap(N) = acc(particles) - acc(fixed), per budget, paired by seed.
    gaps: dict = {}
    for m in FIXED_METHODS:
        g = {}
        for n in budgets:
            ap, af = acc(particles, n), acc(m, n)
            if ap is None or af is None:
                continue
            k = min(ap.shape[1], af.shape[1])
            per_seed = (ap[:, :k] - af[:, :k]).mean(0)  # averaged over cells, (seeds,)
            g[n] = {
                "mean": float(per_seed.mean()),
                "std": float(per_seed.std(ddof=1)) if k > 1 else 0.0,
                "n_seeds": int(k),
            }
        if g:
            gaps[m] = g
    res["gaps"] = gaps
    if "rff" in gaps and len(gaps["rff"]) >= 2:
        g = gaps["rff"]
        ns = sorted(g)
        vals = np.array([g[n]["mean"] for n in ns])
        slope = float(np.polyfit(np.log2(ns), vals, 1)[0])
        mono = bool(np.all(np.diff(vals) <= 0))
        txt = ", ".join(f"N={n}: {g[n]['mean']:+.3f}+-{g[n]['std']:.3f}" for n in ns)
        res["gap_slope_per_doubling"] = slope
        res["claims"].append(
            {
                "id": "C3",
                "claim": "the gap acc(particles) - acc(rff) is larger at the smallest budget than "
                f"at the largest (N={ns[0]} vs N={ns[-1]}) and its least-squares slope against "
                "log2 N is negative",
                "measured": f"{txt}; slope {slope:+.4f} per doubling; monotone non-increasing: "
                f"{'yes' if mono else 'no'}",
                "pass": bool(vals[0] > vals[-1] and slope < 0),
            }
        )
    else:
        res["claims"].append(_na("C3", "particles and rff at >= 2 budgets needed"))

    # C4: repulsion helps at small budgets.
    rep = {}
    for n in (16, 32):
        ap, a0 = acc(particles, n), acc("particles_lam0", n)
        if ap is None or a0 is None:
            continue
        k = min(ap.shape[1], a0.shape[1])
        per_seed = (ap[:, :k] - a0[:, :k]).mean(0)
        se = float(per_seed.std(ddof=1) / math.sqrt(k)) if k > 1 else float("nan")
        rep[n] = {"mean": float(per_seed.mean()), "se": se, "n_seeds": int(k)}
    res["repulsion"] = rep
    if len(rep) == 2:
        txt = "; ".join(
            f"N={n}: {v['mean']:+.4f} (se {v['se']:.4f}, {_significance(v['mean'], v['se'])})"
            for n, v in rep.items()
        )
        res["claims"].append(
            {
                "id": "C4",
                "claim": "repulsion helps at small budgets: mean acc(lam>0) - acc(lam=0) > 0 at "
                "both N=16 and N=32",
                "measured": txt,
                "pass": bool(all(v["mean"] > 0 for v in rep.values())),
            }
        )
    else:
        res["claims"].append(_na("C4", "N=16 and N=32 for particles and particles_lam0 needed"))
    return res


def _significance(mean: float, se: float) -> str:
    if mean > 2 * se:
        return "above +2 se"
    if mean < -2 * se:
        return "below -2 se"
    return "within 2 se"


def _na(cid: str, why: str) -> dict:
    return {"id": cid, "claim": "", "measured": f"not measured: {why}", "pass": None}


def claims_markdown(res: dict, title: str = "Claims") -> str:
    lines = [
        f"# {title}",
        "",
        f"Averaged over {len(res['cells'])} task/noise cells: "
        + ", ".join(f"{t}@{n:.0%}" for t, n in res["cells"])
        + ". Paired differences are per seed; +- is the std over seeds (se: standard error).",
        "Binary tasks have a 50% chance floor, which inflates accuracy ratios; the 'above "
        "chance' ratio (acc64-0.5)/(acc256-0.5) is reported next to it.",
        "",
        "| id | verdict | claim tested | measured |",
        "|---|---|---|---|",
    ]
    for c in res["claims"]:
        verdict = "N/A" if c["pass"] is None else ("PASS" if c["pass"] else "FAIL")
        lines.append(f"| {c['id']} | {verdict} | {c['claim']} | {c['measured']} |")
    if res.get("retained"):
        lines += ["", "## Retained fraction acc(64)/acc(256) per method", "",
                  "| method | mean | min | above chance | cells >= 0.90 |", "|---|---|---|---|---|"]
        for m, r in res["retained"].items():
            lines.append(
                f"| {m} | {r['mean']:.3f} | {r['min']:.3f} | {r['above_chance_mean']:.3f} | "
                f"{r['n_cells_ge_0.9']}/{len(res['cells'])} |"
            )
    if res.get("gaps"):
        budgets = sorted({n for g in res["gaps"].values() for n in g})
        lines += ["", "## Gap acc(particles) - acc(fixed) per budget (mean +- std over seeds)",
                  "", "| fixed | " + " | ".join(f"N={n}" for n in budgets) + " |",
                  "|---" * (len(budgets) + 1) + "|"]
        for m, g in res["gaps"].items():
            lines.append(f"| {m} | " + " | ".join(
                f"{g[n]['mean']:+.3f} +- {g[n]['std']:.3f}" if n in g else "" for n in budgets
            ) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- diagnostics


def particle_diagnostic(cfg: SyntheticConfig, out: Path, seed: int = 0) -> Path:
    """Fit the particle methods on the spectral task (noise 0) at ``cfg.diagnostic_budget``;
    save the initial and learned particles with the ground truth to ``particles_spectral.npz``.

    The initial particles are the estimator's ``omega_init_`` when it exposes one; else they
    are ``RandomFeatures(random_state=seed).omega_``, which is the fit's own initial draw:
    both estimators draw omega, then the phases, from the same generator in the same order.
    The phases of a learned fit have moved, so the check compares ``RandomFeatures``' phases
    with those of a one-step fit with fixed phases (``learn_bias=False``, same draw); the npz
    records the outcome in ``init_source`` and the plot prints it.
    """
    from .. import estimators

    n = cfg.diagnostic_budget
    task = make_task("spectral", cfg.n_train, cfg.n_test, cfg.d, 0.0, random_state=seed)
    arrays = {
        "frequencies": task.metadata["frequencies"],
        "X_train": task.X_train,
        "y_train": task.y_train,
    }
    init_source = "unknown"
    for method in ("particles", "particles_lam0"):
        kwargs = method_kwargs(cfg, method)
        est = make_estimator(method, n, seed, kwargs)
        est.fit(task.X_train, task.y_train)
        arrays[f"{method}_final"] = np.asarray(est.omega_, float)
        init = getattr(est, "omega_init_", None)
        if init is not None:
            init_source = "the fit's own (omega_init_)"
        else:
            rf = estimators.RandomFeatures(
                n_components=n, feature_map=cfg.feature_map, random_state=seed,
                sampler=getattr(est, "sampler", "gaussian"),
            ).fit(task.X_train)
            init = rf.omega_
            fixed = make_estimator(method, n, seed, {**kwargs, "learn_bias": False, "n_steps": 1})
            fixed.fit(task.X_train, task.y_train)
            same = fixed.bias_ is not None and np.array_equal(rf.bias_, fixed.bias_)
            init_source = (
                "the fit's own draw (= RandomFeatures(random_state); phases checked equal)"
                if same else "a RandomFeatures draw (same law, another sample)"
            )
        arrays[f"{method}_init"] = np.asarray(init, float)
    rf = estimators.RandomFeatures(n_components=n, feature_map=cfg.feature_map, random_state=seed)
    arrays["rff"] = np.asarray(rf.fit(task.X_train).omega_, float)
    path = out / "particles_spectral.npz"
    np.savez(path, init_source=np.array(init_source), budget=np.array(n), **arrays)
    return path


# ----------------------------------------------------------------------------- the study


def load_rows(cfg: SyntheticConfig, out: Path) -> list[dict]:
    """The rows of ``cfg``'s grid already in ``out/results.jsonl`` (for a report only)."""
    path = Path(out) / "results.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"--report-only needs {path}")
    wanted = {s.key for s in grid(cfg)}
    h = config_hash(cfg)
    rows = [r for r in read_jsonl(path) if r.get("config_hash") == h and r["key"] in wanted]
    if not rows:
        raise ValueError(f"no rows of this configuration in {path}")
    return rows


def run_study(cfg: SyntheticConfig, out: Path, *, resume: bool = False, jobs: int = 1,
              threads: int = 1, report_only: bool = False, plots: bool = True,
              log: Callable[[str], None] = print) -> dict:
    """Run (or, with ``report_only``, only report) the grid of ``cfg`` under ``out``.

    Writes ``results.jsonl``, ``summary.csv``/``.md``, ``claims.md``/``.json`` and, with
    ``plots``, the PNGs. Returns ``{"rows", "summary", "claims", "claims_md", "grid_s"}``.
    """
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    if threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    out = Path(out)
    t0 = time.perf_counter()
    if report_only:
        rows = load_rows(cfg, out)
        log(f"{len(rows)} of {len(grid(cfg))} runs of the grid found in {out / 'results.jsonl'}")
    else:
        rows = run_grid(cfg, out, resume=resume, jobs=jobs, threads=threads, log=log)
    grid_s = time.perf_counter() - t0
    summary = summarize(rows)
    write_summary(summary, out, cfg)
    res = evaluate_claims(rows)
    res["grid_wall_s"] = grid_s
    res["config"] = to_dict(cfg)
    md = claims_markdown(res, "Claims of the paper, measured on the synthetic grid")
    cpu = sum(r["timings"].get("cpu_s", float("nan")) for r in rows)
    how = "report only, no runs" if report_only else f"jobs={jobs}"
    md += (f"\nGrid wall time this invocation: {grid_s:.1f} s ({how}); "
           f"CPU time of all {len(rows)} rows: {cpu:.1f} s (load-independent cost; "
           f"/ 2 = wall time on an idle 2-core machine with --jobs 2).\n")
    atomic_write_text(out / "claims.md", md)
    atomic_write_text(out / "claims.json", json.dumps(res, indent=1, default=float))
    if plots:
        from ..reports.synthetic import plot_accuracy, plot_particles, plot_retained

        plot_accuracy(summary, out / "acc_vs_budget.png")
        plot_retained(res, out / "retained.png")
        if {"particles", "particles_lam0"} <= set(cfg.methods):
            npz = particle_diagnostic(cfg, out)
            plot_particles(npz, out / "particles_spectral.png")
    return {"rows": rows, "summary": summary, "claims": res, "claims_md": md, "grid_s": grid_s}

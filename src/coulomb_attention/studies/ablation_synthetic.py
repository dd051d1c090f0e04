"""The synthetic arena of the ablation study (issue 24): kernels for logistic regression.

Each run fits one random-feature map on a synthetic binary task (the makers of
:mod:`coulomb_attention.data.synthetic`, d = 10, 2 informative dimensions, 10% of
the training labels flipped, a clean held-out test set of 2,000 rows), then a logistic
regression (scikit-learn's default, C = 1) on its features; the score is the held-out
accuracy. Two pre-declared regimes: low data (``n = 200`` training rows) and normal
(``n = 2000``). A setting is ``"<task>-d<d>-n<n>"``, e.g. ``"xor-d10-n200"``; the data depend
on the setting and the seed only, so every variant of a (setting, seed) sees the same rows,
and every learned variant starts from the same particles (the fixed map's draw for that seed).

Variants (:data:`VARIANTS`; ``params`` hold what differs from the estimator defaults; a
missing ``beta`` means ``inf``, no noise):

========== ===================================================================================
fixed      ``RandomFeatures(M)``: the map's own draw, not trained
importance ``ImportanceFeatures(M)``: Sinha & Duchi, pool 10 M, chi-square weights, resampled
gradient   ``ParticleFeatures(M, optimizer="adam", lam=0)``: projected Adam on the same
           alignment, same steps and schedule, no noise, no repulsion; with params
           ``{"optimizer": "drift"}``: the Langevin drift alone (``lam = 0``, ``beta = inf``,
           normalised projected gradient descent), which separates the optimiser from the
           physics in ``coulomb - gradient``
langevin   ``ParticleFeatures(M, lam=0, beta=...)``: noise only
coulomb    ``ParticleFeatures(M, lam=..., beta=...)``: repulsion (``lam = 0.01``, no noise, is
           the estimator's default), a small sweep around it
weighted   ``ParticleFeatures(M, weighted=True, tau=...)``: Wasserstein-Fisher-Rao masses and
           birth-death on top of the default (``lam = 0.01``, no noise); with
           ``"transport": False`` the masses only (positions move by birth-death jumps alone),
           the like-for-like comparison with importance weighting
========== ===================================================================================

Every learned variant uses ParticleFeatures' defaults otherwise (rff map, 150 steps, cosine
step size 0.05 -> 0.005 per particle in units of the initial RMS norm, learned phases, full
batch at n = 200 and batches of 512 at n = 2000).
"""

from __future__ import annotations

import math
import re
import time

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression

from ..data.synthetic import TASKS, make_task
from ..dynamics import subsample_trace
from ..dynamics.diagnostics import particle_diagnostics
from ..dynamics.variants import estimator_kwargs, particle_overrides
from ..estimators import ImportanceFeatures, ParticleFeatures, RandomFeatures

__all__ = [
    "ARENA",
    "D",
    "N_TEST",
    "NOISE",
    "QUICK_TASKS",
    "REGIMES",
    "TASKS_USED",
    "VARIANTS",
    "make_estimator",
    "plan",
    "run",
    "setting_data",
]

ARENA = "synthetic"
D = 10  # input dimension (2 informative + 8 noise dimensions)
NOISE = 0.1  # share of flipped training labels (the test labels are clean)
N_TEST = 2000
REGIMES = (200, 2000)  # training rows: the pre-declared low-data regime and a normal one
TASKS_USED = ("xor", "checkerboard", "spectral")
QUICK_TASKS = TASKS_USED
FULL_FEATURES = (8, 16, 32, 64, 128)
QUICK_FEATURES = (16, 64)
TRACE_POINTS = 50

# variant -> the params of its runs (full plan); the first entry is the quick plan's
VARIANTS: dict[str, list[dict]] = {
    "fixed": [{}],
    "importance": [{}],
    "gradient": [{}, {"optimizer": "drift"}],
    "langevin": [{"beta": 1e3}, {"beta": 1e2}],
    "coulomb": [{"lam": 0.01}, {"lam": 0.1}, {"lam": 0.01, "beta": 1e3}, {"lam": 0.1, "beta": 1e3}],
    "weighted": [{"lam": 0.01, "tau": 0.05}, {"lam": 0.01, "tau": 0.2},
                 {"lam": 0.01, "tau": 0.05, "transport": False},
                 {"lam": 0.01, "tau": 0.2, "transport": False}],
}
_ALLOWED = {"fixed": set(), "importance": set(), "gradient": {"optimizer"}, "langevin": {"beta"},
            "coulomb": {"lam", "beta"}, "weighted": {"lam", "beta", "tau", "transport"}}
_SETTING = re.compile(r"^(?P<task>[a-z]+)-d(?P<d>\d+)-n(?P<n>\d+)$")


def setting_data(setting: str, seed: int):
    """The task of ``setting`` (``"<task>-d<d>-n<n>"``) for ``seed``:
    ``(X_train (n, d), y_train (n,), X_test (N_TEST, d), y_test (N_TEST,))``."""
    m = _SETTING.match(setting)
    if m is None or m["task"] not in TASKS:
        raise ValueError(f"unknown synthetic setting {setting!r}: expected '<task>-d<d>-n<n>' "
                         f"with task in {', '.join(TASKS)}")
    task = make_task(m["task"], int(m["n"]), N_TEST, int(m["d"]), NOISE, random_state=int(seed))
    return task.X_train, task.y_train, task.X_test, task.y_test


def plan(quick: bool, seeds: list[int], features: list[int] | None) -> list[dict]:
    """Run specs in order: settings, then feature counts, seeds and variants.

    Full: tasks :data:`TASKS_USED` x regimes :data:`REGIMES`, every params entry of
    :data:`VARIANTS`, ``M`` in 8 16 32 64 128. Quick: the same settings, the first
    params entry of each variant, ``M`` in 16 64 (about a minute per seed on one core).
    """
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds is empty")
    feats = list(QUICK_FEATURES if quick else FULL_FEATURES) if features is None else \
        [int(m) for m in features]
    if any(m < 2 for m in feats):
        raise ValueError(f"feature counts must be >= 2, got {feats}")
    tasks = QUICK_TASKS if quick else TASKS_USED
    specs = []
    for task in tasks:
        for n in REGIMES:
            setting = f"{task}-d{D}-n{n}"
            for M in feats:
                for seed in seeds:
                    for variant, entries in VARIANTS.items():
                        for params in entries[:1] if quick else entries:
                            specs.append({"arena": ARENA, "setting": setting, "variant": variant,
                                          "params": dict(params), "M": M, "seed": seed})
    return specs


#: the arena's params defaults (over the vocabulary's, dynamics.variants): no noise, the
#: estimator's default repulsion and the weighted variant's reaction step
_DEFAULTS = {"coulomb": {"lam": 0.01, "beta": 0.0},
             "weighted": {"lam": 0.01, "beta": 0.0, "tau": 0.05}}


def make_estimator(variant: str, params: dict, M: int, seed: int):
    """The unfitted feature map of a variant (see the module table): the fixed maps, or
    ``ParticleFeatures`` with the vocabulary's particle fit (:mod:`coulomb_attention.dynamics.
    variants`) in the estimator's names; ``optimizer: drift`` (gradient) and ``transport``
    (weighted) are this arena's own params."""
    if variant not in _ALLOWED:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(_ALLOWED)}")
    unknown = set(params) - _ALLOWED[variant]
    if unknown:
        raise ValueError(f"variant {variant!r} takes params {sorted(_ALLOWED[variant])}, got "
                         f"{sorted(unknown)}")
    if variant == "langevin" and "beta" not in params:
        raise ValueError("the langevin variant needs a finite beta in params")
    M, seed = int(M), int(seed)
    if variant == "fixed":
        return RandomFeatures(M, random_state=seed)
    if variant == "importance":
        return ImportanceFeatures(M, random_state=seed)
    p = {**_DEFAULTS.get(variant, {}), **params}
    over = particle_overrides(variant, {k: v for k, v in p.items()
                                        if k not in ("optimizer", "transport")})
    opt = p.get("optimizer", "adam")
    if opt not in ("adam", "drift"):
        raise ValueError(f"the gradient variant's optimizer is 'adam' or 'drift', got {opt!r}")
    if opt == "drift":  # the Langevin driver's normalised drift, no noise, no repulsion
        over["method"] = "langevin"
    extra = {"transport": bool(p["transport"])} if "transport" in p else {}
    return ParticleFeatures(M, **estimator_kwargs(over), **extra, random_state=seed)


def _finite(x: float) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def run(spec: dict) -> dict:
    """Fit the spec's map and a logistic regression; the record (see the contract)."""
    t0 = time.perf_counter()
    X_tr, y_tr, X_te, y_te = setting_data(spec["setting"], spec["seed"])
    est = make_estimator(spec["variant"], dict(spec.get("params", {})), int(spec["M"]),
                         int(spec["seed"]))
    est.fit(X_tr, y_tr)
    F_tr, F_te = est.transform(X_tr), est.transform(X_te)
    clf = LogisticRegression(max_iter=5000).fit(F_tr, y_tr)
    omega = torch.from_numpy(est.omega_ / est.particle_scale_)  # in units of the draw, N(0, I)
    diagnostics = particle_diagnostics(omega, torch.from_numpy(F_te))
    history = getattr(est, "history_", [])
    record = dict(spec)
    record.update(
        metric="accuracy",
        score=float(clf.score(F_te, y_te)),
        score_train=float(clf.score(F_tr, y_tr)),
        alignment_test=float(est.score(X_te, y_te)),
        diagnostics={k: _finite(v) for k, v in diagnostics.items()},
        energy_trace=subsample_trace(history, TRACE_POINTS),
        time_s=time.perf_counter() - t0,
    )
    if isinstance(est, ParticleFeatures):
        record["alignment_train"] = float(est.alignment_)
        record["alignment_train_initial"] = float(est.initial_alignment_)
    if getattr(est, "weights_", None) is not None and isinstance(est, ParticleFeatures):
        w = np.asarray(est.weights_)
        record["weights"] = {"ess_share": float(1.0 / (w * w).sum() / w.size),
                             "max_share": float(w.max() * w.size),
                             "births": int(est.n_births_)}
    return record

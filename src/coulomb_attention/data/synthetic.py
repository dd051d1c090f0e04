"""Synthetic classification tasks: the random-feature benchmark's families, the demo's task
and the hidden-direction tasks of the estimator check (the one home of synthetic data).

Every generator is a pure function of its arguments (randomness comes from ``random_state``)
and returns a :class:`SyntheticTask`: standardized ``X_train (n_train, d)``, ``y_train``,
``X_test (n_test, d)``, ``y_test`` and a metadata dict. The label depends only on the first
``n_informative`` coordinates (the informative subspace, always dims ``0..n_informative-1``);
the other ``d - n_informative`` coordinates are pure noise. Label noise flips exactly
``round(noise * n_train)`` training labels (chosen uniformly without replacement); the test
labels are clean, so test accuracy measures how well the clean rule is recovered.

Inputs are standardized with the training mean and standard deviation (the test set uses the
same statistics). Families:

| name        | informative rule (in raw coordinates z)                              |
|-------------|----------------------------------------------------------------------|
| anisotropic | ``z0 + 0.3 (z1^2 - 1) > 0`` with z1 4x wider than z0 before scaling   |
| xor         | ``z0 z1 > 0`` (XOR / 2x2 checkerboard)                               |
| checkerboard| ``sin(a z0) sin(a z1) > 0`` (finer checkerboard, ``a = pi/1.5``)      |
| radial      | ``|z_inf|^2 > chi2 median`` (two concentric classes)                 |
| spectral    | ``sum_k cos(f_k . z_inf + phi_k) > 0`` with known frequency vectors   |

For ``spectral`` the metadata holds the ground-truth frequencies expressed in the
*standardized* coordinates the estimators see (``frequencies``, shape ``(K, d)``, zero on
the noise dims): with ``x = (z - mu) / s`` the rule is ``sum_k cos(f'_k . x + phi'_k)`` with
``f'_k = f_k * s`` and ``phi'_k = phi_k + f_k . mu``, so a random-feature particle ``omega``
of the ``rff`` map ``cos(omega . x + b)`` matches component ``k`` when ``omega = +- f'_k``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .._validation import check_choice, check_positive

__all__ = [
    "SyntheticTask",
    "TASKS",
    "NOISE_LEVELS",
    "make_task",
    "make_anisotropic",
    "make_xor",
    "make_checkerboard",
    "make_radial",
    "make_spectral",
    "flip_labels",
    "SPECTRAL_FREQUENCIES",
    "spectral_hit_fraction",
    "make_demo_task",
    "HIDDEN_KINDS",
    "make_hidden_task",
    "make_meanfield_dataset",
]

NOISE_LEVELS: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3)

# Ground-truth frequency vectors of the spectral task in the 2 informative raw coordinates.
SPECTRAL_FREQUENCIES = np.array([[2.0, 0.5], [-0.6, 1.8], [1.2, -1.4]])


@dataclass
class SyntheticTask:
    """One generated dataset.

    Attributes
    ----------
    X_train : ndarray (n_train, d), float64, standardized
    y_train : ndarray (n_train,), int64 in {0, 1}, with label noise
    X_test : ndarray (n_test, d), float64, standardized with the training statistics
    y_test : ndarray (n_test,), int64 in {0, 1}, clean
    metadata : dict (name, d, n_informative, noise, flipped indices, clean train labels, ...)
    """

    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    metadata: dict = field(default_factory=dict)

    def astuple(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """``(X_train, y_train, X_test, y_test, metadata)``."""
        return self.X_train, self.y_train, self.X_test, self.y_test, self.metadata


def _rng(random_state) -> np.random.Generator:
    if isinstance(random_state, np.random.Generator):
        return random_state
    if random_state is None or (
        isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool)
    ):
        if random_state is not None and random_state < 0:
            raise ValueError(f"random_state must be >= 0, got {random_state}")
        return np.random.default_rng(random_state)
    raise TypeError(
        f"random_state must be None, an int or a numpy Generator, got {type(random_state).__name__}"
    )


def _check_args(n_train, n_test, d, n_informative, noise) -> tuple[int, int, int, int, float]:
    n_train = check_positive("n_train", n_train, integer=True)
    n_test = check_positive("n_test", n_test, integer=True)
    d = check_positive("d", d, integer=True)
    n_informative = check_positive("n_informative", n_informative, integer=True)
    if n_informative > d:
        raise ValueError(f"n_informative={n_informative} exceeds d={d}")
    if isinstance(noise, bool) or not isinstance(noise, (int, float, np.floating)):
        raise TypeError(f"noise must be a number in [0, 0.5), got {noise!r}")
    if not (0.0 <= float(noise) < 0.5):
        raise ValueError(f"noise must be in [0, 0.5) (fraction of flipped labels), got {noise}")
    return n_train, n_test, d, n_informative, float(noise)


def flip_labels(y: np.ndarray, fraction: float, rng: np.random.Generator):
    """Flip exactly ``round(fraction * len(y))`` binary labels chosen without replacement.

    Returns
    -------
    y_noisy : ndarray (n,), int64
    flipped : ndarray (k,), int64 sorted indices of the flipped labels
    """
    y = np.asarray(y, dtype=np.int64)
    k = int(round(fraction * len(y)))
    flipped = np.sort(rng.choice(len(y), size=k, replace=False)) if k else np.zeros(0, np.int64)
    y_noisy = y.copy()
    y_noisy[flipped] = 1 - y_noisy[flipped]
    return y_noisy, flipped.astype(np.int64)


def _finish(
    name: str,
    z_train: np.ndarray,
    z_test: np.ndarray,
    rule: Callable[[np.ndarray], np.ndarray],
    noise: float,
    n_informative: int,
    rng: np.random.Generator,
    extra: dict | None = None,
    transform_meta: Callable[[np.ndarray, np.ndarray], dict] | None = None,
) -> SyntheticTask:
    y_train_clean = rule(z_train).astype(np.int64)
    y_test = rule(z_test).astype(np.int64)
    y_train, flipped = flip_labels(y_train_clean, noise, rng)
    mu = z_train.mean(0)
    s = z_train.std(0)
    s = np.where(s > 0, s, 1.0)
    X_train = (z_train - mu) / s
    X_test = (z_test - mu) / s
    meta = {
        "task": name,
        "d": int(z_train.shape[1]),
        "n_informative": int(n_informative),
        "informative_dims": list(range(n_informative)),
        "noise": float(noise),
        "n_flipped": int(len(flipped)),
        "flipped": flipped,
        "y_train_clean": y_train_clean,
        "mean": mu,
        "scale": s,
        "class_balance_train": float(y_train_clean.mean()),
    }
    if extra:
        meta.update(extra)
    if transform_meta is not None:
        meta.update(transform_meta(mu, s))
    return SyntheticTask(X_train, y_train, X_test, y_test, meta)


def _gauss(rng, n, d, scales=None) -> np.ndarray:
    z = rng.standard_normal((n, d))
    if scales is not None:
        z = z * scales
    return z


def _noise_scales(rng: np.random.Generator, d: int, n_informative: int) -> np.ndarray:
    """Raw per-dimension scales: noise dims get random scales in [0.5, 3] (standardization
    removes them, but they make the raw data anisotropic)."""
    scales = np.ones(d)
    scales[n_informative:] = rng.uniform(0.5, 3.0, size=d - n_informative)
    return scales


def make_anisotropic(
    n_train: int = 1000,
    n_test: int = 1000,
    d: int = 10,
    noise: float = 0.0,
    *,
    n_informative: int = 2,
    random_state=None,
) -> SyntheticTask:
    """Linear-ish boundary ``z0 + 0.3 (z1^2 - 1) > 0`` in a wide, anisotropic raw space."""
    n_train, n_test, d, n_informative, noise = _check_args(n_train, n_test, d, n_informative, noise)
    if n_informative < 2:
        raise ValueError("anisotropic needs n_informative >= 2")
    rng = _rng(random_state)
    scales = _noise_scales(rng, d, n_informative)
    scales[1] = 4.0  # z1 4x wider than z0 before standardization
    z_tr, z_te = _gauss(rng, n_train, d, scales), _gauss(rng, n_test, d, scales)

    def rule(z):
        return (z[:, 0] + 0.3 * ((z[:, 1] / 4.0) ** 2 - 1.0)) > 0

    return _finish("anisotropic", z_tr, z_te, rule, noise, n_informative, rng)


def make_xor(
    n_train: int = 1000,
    n_test: int = 1000,
    d: int = 10,
    noise: float = 0.0,
    *,
    n_informative: int = 2,
    random_state=None,
) -> SyntheticTask:
    """XOR: ``z0 z1 > 0`` (a 2x2 checkerboard in the informative plane)."""
    n_train, n_test, d, n_informative, noise = _check_args(n_train, n_test, d, n_informative, noise)
    if n_informative < 2:
        raise ValueError("xor needs n_informative >= 2")
    rng = _rng(random_state)
    scales = _noise_scales(rng, d, n_informative)
    z_tr, z_te = _gauss(rng, n_train, d, scales), _gauss(rng, n_test, d, scales)
    return _finish("xor", z_tr, z_te, lambda z: z[:, 0] * z[:, 1] > 0, noise, n_informative, rng)


def make_checkerboard(
    n_train: int = 1000,
    n_test: int = 1000,
    d: int = 10,
    noise: float = 0.0,
    *,
    n_informative: int = 2,
    random_state=None,
) -> SyntheticTask:
    """Checkerboard ``sin(a z0) sin(a z1) > 0`` with cells of side 1.5 (``a = pi / 1.5``)."""
    n_train, n_test, d, n_informative, noise = _check_args(n_train, n_test, d, n_informative, noise)
    if n_informative < 2:
        raise ValueError("checkerboard needs n_informative >= 2")
    rng = _rng(random_state)
    scales = _noise_scales(rng, d, n_informative)
    z_tr, z_te = _gauss(rng, n_train, d, scales), _gauss(rng, n_test, d, scales)
    a = math.pi / 1.5

    def rule(z):
        return np.sin(a * z[:, 0]) * np.sin(a * z[:, 1]) > 0

    return _finish("checkerboard", z_tr, z_te, rule, noise, n_informative, rng)


def make_radial(
    n_train: int = 1000,
    n_test: int = 1000,
    d: int = 10,
    noise: float = 0.0,
    *,
    n_informative: int = 2,
    random_state=None,
) -> SyntheticTask:
    """Concentric classes: ``|z_inf|^2 > median of chi2(n_informative)`` (balanced)."""
    from scipy.special import gammaincinv  # lighter than scipy.stats

    n_train, n_test, d, n_informative, noise = _check_args(n_train, n_test, d, n_informative, noise)
    rng = _rng(random_state)
    scales = _noise_scales(rng, d, n_informative)
    z_tr, z_te = _gauss(rng, n_train, d, scales), _gauss(rng, n_test, d, scales)
    r2 = float(2.0 * gammaincinv(n_informative / 2.0, 0.5))  # median of chi2(n_informative)

    def rule(z):
        return (z[:, :n_informative] ** 2).sum(1) > r2

    return _finish(
        "radial", z_tr, z_te, rule, noise, n_informative, rng, extra={"radius": math.sqrt(r2)}
    )


def make_spectral(
    n_train: int = 1000,
    n_test: int = 1000,
    d: int = 10,
    noise: float = 0.0,
    *,
    frequencies: np.ndarray | None = None,
    random_state=None,
) -> SyntheticTask:
    """Known spectrum: ``sum_k cos(f_k . z_inf + phi_k) > 0``.

    ``frequencies`` (K, n_informative) default to :data:`SPECTRAL_FREQUENCIES` (K = 3 in the
    plane); the phases ``phi_k`` are drawn from ``random_state``. The metadata holds
    ``frequencies`` (K, d) and ``phases`` (K,) in the standardized coordinates, and the raw
    ``frequencies_raw`` (K, n_informative).
    """
    f_raw = np.asarray(SPECTRAL_FREQUENCIES if frequencies is None else frequencies, float)
    if f_raw.ndim != 2 or f_raw.shape[0] < 1:
        raise ValueError(f"frequencies must have shape (K, n_informative), got {f_raw.shape}")
    n_informative = f_raw.shape[1]
    n_train, n_test, d, n_informative, noise = _check_args(n_train, n_test, d, n_informative, noise)
    rng = _rng(random_state)
    phases = rng.uniform(0, 2 * math.pi, size=f_raw.shape[0])
    scales = _noise_scales(rng, d, n_informative)
    z_tr, z_te = _gauss(rng, n_train, d, scales), _gauss(rng, n_test, d, scales)

    def rule(z):
        return (np.cos(z[:, :n_informative] @ f_raw.T + phases)).sum(1) > 0

    def to_standardized(mu, s):
        f_std = np.zeros((f_raw.shape[0], d))
        f_std[:, :n_informative] = f_raw * s[:n_informative]
        ph_std = phases + f_raw @ mu[:n_informative]
        return {"frequencies": f_std, "phases": ph_std}

    return _finish(
        "spectral",
        z_tr,
        z_te,
        rule,
        noise,
        n_informative,
        rng,
        extra={"frequencies_raw": f_raw, "phases_raw": phases},
        transform_meta=to_standardized,
    )


TASKS: dict[str, Callable[..., SyntheticTask]] = {
    "anisotropic": make_anisotropic,
    "xor": make_xor,
    "checkerboard": make_checkerboard,
    "radial": make_radial,
    "spectral": make_spectral,
}


def make_task(
    name: str,
    n_train: int = 1000,
    n_test: int = 1000,
    d: int = 10,
    noise: float = 0.0,
    *,
    random_state=None,
) -> SyntheticTask:
    """Generate task ``name`` (one of :data:`TASKS`); unknown names raise ``ValueError``."""
    return TASKS[check_choice("task", name, TASKS)](
        n_train, n_test, d, noise, random_state=random_state
    )


# ------------------------------------------------- hidden-direction tasks (estimator check)

HIDDEN_KINDS = ("linear", "xor", "checker", "radial", "sine", "multiclass")


def make_hidden_task(kind: str, n: int, d: int, k: int, noise: float, seed: int):
    """Synthetic binary/multi-class task: ``k`` informative dims hidden by a random rotation
    of the first ``k`` coordinates, ``d - k`` pure-noise dims, label noise ``noise``.

    linear: anisotropic linear-ish (decaying weights + a mild quadratic term);
    xor: sign(z0 z1); checker: 3x3 checkerboard on z0, z1; radial: |z|^2 above its median
    (concentric spheres); sine: sign(sin(3 z . u)) along a random direction u;
    multiclass: 3 angular sectors of (z0, z1).
    """
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, d))
    zi = z[:, :k]
    if kind == "linear":
        w = 2.0 ** -np.arange(k)
        f = zi @ w + 0.3 * (zi[:, 0] ** 2 - 1)
        y = (f > 0).astype(int)
    elif kind == "xor":
        y = (zi[:, 0] * zi[:, 1] > 0).astype(int)
    elif kind == "checker":
        y = ((np.floor(zi[:, 0] / 0.8) + np.floor(zi[:, 1] / 0.8)) % 2).astype(int)
    elif kind == "radial":
        r2 = (zi**2).sum(1)
        y = (r2 > np.median(r2)).astype(int)
    elif kind == "sine":
        u = rng.standard_normal(k)
        u /= np.linalg.norm(u)
        y = (np.sin(3.0 * zi @ u) > 0).astype(int)
    elif kind == "multiclass":
        ang = np.arctan2(zi[:, 1], zi[:, 0])
        y = np.digitize(ang, [-np.pi / 3, np.pi / 3]).astype(int)
    else:
        raise ValueError(f"unknown task kind {kind!r}; valid: {', '.join(HIDDEN_KINDS)}")
    flip = rng.random(n) < noise
    n_cls = int(y.max()) + 1
    y = np.where(flip, (y + rng.integers(1, n_cls, n)) % n_cls, y)
    # hide the informative coordinates: rotate them among themselves, scale features unevenly
    q, _ = np.linalg.qr(rng.standard_normal((k, k)))
    X = z.copy()
    X[:, :k] = zi @ q
    X = X * rng.uniform(0.5, 2.0, d)  # unequal raw scales (the pipeline standardizes)
    perm = rng.permutation(d)
    return X[:, perm], y


def spectral_hit_fraction(omega: np.ndarray, frequencies: np.ndarray, rel: float = 0.25) -> float:
    """Fraction of particles (rows of ``omega`` (N, d)) within ``rel * min_k |f_k|`` of some
    ``+- f_k`` (rows of ``frequencies`` (K, d), the spectral task's ground truth), distance
    measured in all d dims."""
    f = np.concatenate([frequencies, -frequencies])  # (2K, d)
    radius = rel * float(np.linalg.norm(frequencies, axis=1).min())
    dist = np.linalg.norm(omega[:, None, :] - f[None, :, :], axis=2).min(1)
    return float((dist <= radius).mean())


# ----------------------------------------------------------------------- the demo's task


def make_demo_task(n: int, d: int, noise: float, seed: int):
    """XOR of two hidden directions plus ``d - 2`` noise dimensions.

    Returns ``X`` (2n, d) (raw, unequal coordinate scales) and ``y`` (2n,) in {0, 1}; the first
    ``n`` rows are for training (with ``noise`` label flips), the last ``n`` for testing (clean).
    """
    if d < 2:
        raise ValueError(f"the demo task needs d >= 2, got d={d}")
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((2 * n, d))
    y = (z[:, 0] * z[:, 1] > 0).astype(np.int64)
    flip = rng.random(2 * n) < noise
    flip[n:] = False
    y = np.where(flip, 1 - y, y)
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))  # hide the informative directions
    X = (z @ q.T) * rng.uniform(0.5, 2.0, d)
    return X, y


# ----------------------------------------------------------------------- the mean-field study


def make_meanfield_dataset(dim: int, n_samples: int = 8, *, random_state=0):
    """A small fixed synthetic dataset in ``R^dim`` for the mean-field study's data potential:
    ``x ~ N(0, I)``, ``y = sign(sin(2 x_1))`` (an oscillating labelling, so ``V`` has several
    wells).

    Returns
    -------
    x : tensor of shape ``(n_samples, dim)``, float64
    y : tensor of shape ``(n_samples,)``, float64 in {-1, +1}
    """
    import torch

    from .._validation import torch_generator

    if dim not in (1, 2):
        raise ValueError(f"dim must be 1 or 2, got {dim!r}")
    n_samples = check_positive("n_samples", n_samples, integer=True)
    g = torch_generator(random_state)
    x = torch.randn(n_samples, dim, generator=g, dtype=torch.float64)
    y = torch.where(torch.sin(2.0 * x[:, 0]) >= 0, 1.0, -1.0).to(torch.float64)
    return x, y

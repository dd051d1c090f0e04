"""scikit-learn transformers: fixed, importance-weighted and particle-learned random features.

All three map ``X`` of shape ``(n, d)`` to ``Phi`` of shape ``(n, n_components)`` (float64),
scaled so that the approximate kernel is ``Phi(x) @ Phi(y).T`` (the ``1/sqrt(N)`` is inside).

- :class:`RandomFeatures`: particles drawn once from the sampler (the fixed baseline; with
  ``sampler="orthogonal"`` these are orthogonal random features).
- :class:`ImportanceFeatures`: Sinha & Duchi (2016), "Learning Kernels with Random Features":
  a larger pool is drawn, each pool feature is scored by its (centered) alignment with the
  labels, the pool weights ``q`` maximise ``sum_m q_m score_m`` under the chi-square constraint
  ``D_chi2(q || uniform) <= rho``, and ``n_components`` features are resampled from ``q``.
- :class:`ParticleFeatures`: the particles follow the core projected Langevin dynamics of the
  core Hamiltonian ``H = -A + lam W_{N,s}`` (centered kernel-target alignment ``A`` on
  mini-batches, Riesz/Coulomb/log repulsion ``W``); ``weighted=True`` gives them masses
  (Wasserstein-Fisher-Rao transport + reaction + birth-death), ``optimizer="adam"`` replaces
  the dynamics by projected Adam (the plain-optimiser ablation).

Scales. ``gamma="scale"`` is ``1 / (n_features_in * X.var())`` as in ``sklearn.svm.SVC``. For
``feature_map="rff"`` the particles are ``omega ~ N(0, 2 gamma I)`` acting on raw ``x``
(kernel ``exp(-gamma |x - y|^2)``). The other maps (``positive``, ``softplus``, ``softmax``)
see ``x * sqrt(2 gamma)`` (``input_scale_``) with particles drawn from ``N(0, I)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.multiclass import type_of_target
from sklearn.utils.validation import check_is_fitted, validate_data

from ._validation import check_choice, check_nonnegative, check_positive, torch_generator
from .dynamics import (
    SCHEDULES,
    LangevinSchedule,
    Reaction,
    learn_particles,
    make_projection,
)
from .energy import (
    POTENTIALS,
    Hamiltonian,
    LabelAlignment,
    alignment,
    encode_labels,
    make_potential,
)
from .features import FEATURE_MAPS, SAMPLERS, draw_bias, feature_fn, sample

# the estimator's optimisers: the dynamics' methods that move plain (untied) particles
OPTIMIZERS = ("langevin", "adam")

__all__ = [
    "RandomFeatures",
    "ImportanceFeatures",
    "ParticleFeatures",
    "chi2_divergence",
    "chi2_weights",
]

DTYPE = torch.float64
PROJECTION_NAMES = ("ball", "box")


# ----------------------------------------------------------------------------- helpers


def _resolve_gamma(gamma, X: np.ndarray) -> float:
    if isinstance(gamma, str):
        check_choice("gamma", gamma, ("scale",))
        var = float(X.var())
        return 1.0 / (X.shape[1] * var) if var > 0 else 1.0
    return float(check_positive("gamma", gamma))


def _label_matrix(y) -> tuple[torch.Tensor, np.ndarray]:
    """Label matrix ``Y`` (n, C) for the alignment and the classes.

    Classification targets go through the core :func:`encode_labels` (binary: one +-1 column;
    multi-class: one-hot). Continuous targets become one standardized column.
    """
    y = np.asarray(y)
    kind = type_of_target(y, input_name="y", raise_unknown=True)
    if kind == "continuous":
        yf = y.astype(np.float64)
        std = float(yf.std())
        if std == 0:
            raise ValueError("y is constant: need labels of at least 2 classes (got 1 class)")
        return torch.from_numpy((yf - yf.mean()) / std).to(DTYPE).unsqueeze(1), np.array([])
    if kind not in ("binary", "multiclass"):
        raise ValueError(
            f"Unknown label type: unsupported target type {kind!r}; y must be 1-D class labels"
        )
    classes = np.unique(y)
    if len(classes) < 2:
        raise ValueError(
            f"need labels of at least 2 classes to align features, got 1 class ({classes[0]!r})"
        )
    return encode_labels(y, classes)


def _phi(feature_map: str, x: torch.Tensor, omega: torch.Tensor, bias) -> torch.Tensor:
    """Features through the core maps, shape (n, N)."""
    return feature_fn(feature_map, bias)(x, omega)


def chi2_divergence(q) -> float:
    """``D_chi2(q || uniform) = (1/M) sum_m (M q_m - 1)^2`` for weights ``q`` of shape (M,)."""
    q = np.asarray(q, dtype=np.float64)
    m = q.shape[0]
    return float(np.mean((m * q - 1.0) ** 2))


def _project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection of ``v`` (M,) onto the probability simplex."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    k = np.arange(1, v.shape[0] + 1)
    rho = np.nonzero(u - css / k > 0)[0][-1]
    return np.maximum(v - css[rho] / (rho + 1.0), 0.0)


def chi2_weights(scores, rho: float, *, tol: float = 1e-10, max_iter: int = 200) -> np.ndarray:
    """Solve ``max_q <q, scores>`` s.t. ``q`` in the simplex and ``D_chi2(q || 1/M) <= rho``.

    Sinha & Duchi (2016), eq. (4): the Lagrangian stationarity condition gives
    ``q(lam) = Proj_simplex(1/M + scores / (lam M))``, whose divergence decreases in the dual
    variable ``lam``; bisection on ``log lam`` finds the ``lam`` where the constraint is tight.
    If the unconstrained maximiser (uniform on the arg-max set) is feasible it is returned.

    Parameters
    ----------
    scores : array-like, shape (M,)
    rho : float > 0

    Returns
    -------
    q : ndarray, shape (M,), ``q >= 0``, ``sum q = 1``, ``chi2_divergence(q) <= rho (1 + tol)``
    """
    v = np.asarray(scores, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"scores must be a non-empty 1-D array, got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError("scores contain NaN or infinite values")
    rho = float(check_positive("rho", rho))
    m = v.shape[0]
    top = np.isclose(v, v.max(), rtol=1e-12, atol=0.0)
    q_top = top / top.sum()
    if chi2_divergence(q_top) <= rho or np.ptp(v) == 0:
        return q_top if np.ptp(v) > 0 else np.full(m, 1.0 / m)
    v = (v - v.mean()) / np.ptp(v)  # shift/scale invariant problem; well-conditioned lam range

    def q_of(lam: float) -> np.ndarray:
        return _project_simplex(1.0 / m + v / (lam * m))

    lo, hi = -30.0, 30.0  # log lam: D(q(e^lo)) > rho >= D(q(e^hi)) (q(e^30) ~ uniform)
    for _ in range(max_iter):
        mid = 0.5 * (lo + hi)
        if chi2_divergence(q_of(math.exp(mid))) > rho:
            lo = mid
        else:
            hi = mid
        if hi - lo < tol:
            break
    return q_of(math.exp(hi))


# ----------------------------------------------------------------------------- base


class _BaseRandomFeatures(TransformerMixin, BaseEstimator):
    """Shared validation, particle drawing and ``transform``."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True  # the learned estimators need labels; all accept y
        tags.transformer_tags.preserves_dtype = ["float64"]
        return tags

    # -- validation ---------------------------------------------------------
    def _check_common(self) -> None:
        check_positive("n_components", self.n_components, integer=True)
        check_choice("feature_map", self.feature_map, FEATURE_MAPS)
        check_choice("sampler", self.sampler, SAMPLERS)
        if not isinstance(self.gamma, str):
            check_positive("gamma", self.gamma)

    def _validate_xy(self, X, y):
        X, y = validate_data(self, X, y, dtype=np.float64, ensure_min_samples=1)
        return X, y

    # -- particles ----------------------------------------------------------
    def _init_scales(self, X: np.ndarray) -> None:
        self.gamma_ = _resolve_gamma(self.gamma, X)
        s = math.sqrt(2.0 * self.gamma_)
        # rff: omega ~ N(0, 2 gamma I) on raw x; other maps: omega ~ N(0, I) on x sqrt(2 gamma)
        self.input_scale_ = 1.0 if self.feature_map == "rff" else s
        self.particle_scale_ = s if self.feature_map == "rff" else 1.0

    def _draw(self, n: int, d: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        omega = sample(self.sampler, n, d, scale=self.particle_scale_, generator=gen, dtype=DTYPE)
        bias = draw_bias(n, generator=gen, dtype=DTYPE)
        return omega, bias

    def _set_particles(self, omega: torch.Tensor, bias: torch.Tensor) -> None:
        self.omega_ = omega.detach().cpu().numpy().astype(np.float64)  # (N, d)
        self.bias_ = bias.detach().cpu().numpy().astype(np.float64) if bias is not None else None
        self.n_components_ = int(self.omega_.shape[0])

    def _features(self, X: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float64)) * self.input_scale_
        omega = torch.from_numpy(self.omega_)
        bias = torch.from_numpy(self.bias_) if self.feature_map == "rff" else None
        with torch.no_grad():
            phi = _phi(self.feature_map, x, omega, bias)
        return phi.numpy().astype(np.float64, copy=False)

    def transform(self, X):
        """Map ``X`` (n, d) to features (n, n_components), float64."""
        check_is_fitted(self, "omega_")
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return self._features(X)

    def score(self, X, y) -> float:
        """Centered kernel-target alignment of the features on ``(X, y)`` (higher is better)."""
        check_is_fitted(self, "omega_")
        X, y = validate_data(self, X, y, dtype=np.float64, reset=False)
        Y, _ = _label_matrix(y)
        return float(alignment(torch.from_numpy(self._features(X)), Y, center=True))


# ----------------------------------------------------------------------------- fixed


class RandomFeatures(_BaseRandomFeatures):
    """Fixed random features (the baseline): particles drawn once, never learned.

    Parameters
    ----------
    n_components : int, default=256
        Number of features N.
    feature_map : {"rff", "positive", "softplus", "softmax"}, default="rff"
    sampler : {"gaussian", "orthogonal"}, default="gaussian"
        ``"orthogonal"`` gives orthogonal random features (ORF).
    gamma : "scale" or float > 0, default="scale"
        Kernel width: rff approximates ``exp(-gamma |x - y|^2)``;
        ``"scale"`` is ``1 / (n_features_in * X.var())``.
    random_state : None, int, numpy RandomState/Generator or torch.Generator

    Attributes
    ----------
    omega_ : ndarray (N, d)
    bias_ : ndarray (N,)  phases of the rff map (drawn for every map, used by rff only)
    gamma_ : float
    input_scale_ : float  inputs are multiplied by this before the map
    n_features_in_ : int
    """

    def __init__(
        self,
        n_components: int = 256,
        feature_map: str = "rff",
        sampler: str = "gaussian",
        gamma="scale",
        random_state=None,
    ):
        self.n_components = n_components
        self.feature_map = feature_map
        self.sampler = sampler
        self.gamma = gamma
        self.random_state = random_state

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = False  # labels are ignored
        return tags

    def fit(self, X, y=None):
        """Draw the particles; ``y`` is ignored. Returns ``self``."""
        self._check_common()
        X = validate_data(self, X, dtype=np.float64)
        self._init_scales(X)
        gen = torch_generator(self.random_state)
        self._set_particles(*self._draw(int(self.n_components), X.shape[1], gen))
        return self


# ----------------------------------------------------------------------------- importance


class ImportanceFeatures(_BaseRandomFeatures):
    """Importance-weighted random features (Sinha & Duchi, 2016).

    A pool of ``pool_size`` random features is drawn; feature ``m`` gets the alignment score
    ``score_m = || Phi_m^T Y ||^2 / n^2`` with ``Phi_m`` and ``Y`` centered over the training
    set (for binary +-1 labels, uncentered, this is the paper's ``(sum_i y_i phi_m(x_i))^2``).
    The pool weights ``q`` maximise ``sum_m q_m score_m`` subject to ``q`` in the simplex and
    ``D_chi2(q || uniform) <= rho`` (:func:`chi2_weights`); then ``n_components`` features are
    resampled i.i.d. from ``q`` (the paper's resampling variant).

    Parameters
    ----------
    n_components : int, default=256
    feature_map, sampler, gamma, random_state : as :class:`RandomFeatures`
    pool_size : int or None, default=None
        Size M of the pool; ``None`` means ``10 * n_components``.
    rho : float > 0, default=None
        Chi-square radius; ``None`` means ``pool_size / n_components - 1`` (the divergence of
        the uniform law on ``n_components`` pool features).
    center : bool, default=True
        Center features and labels in the scores.
    max_samples : int, default=5000
        Scores are computed on at most this many training rows (a random subset).

    Attributes
    ----------
    omega_, bias_, gamma_, input_scale_ : as :class:`RandomFeatures`
    weights_ : ndarray (pool_size,)  the optimal pool weights q
    scores_ : ndarray (pool_size,)
    pool_indices_ : ndarray (n_components,)  the resampled pool rows
    rho_ : float
    """

    def __init__(
        self,
        n_components: int = 256,
        feature_map: str = "rff",
        sampler: str = "gaussian",
        gamma="scale",
        pool_size=None,
        rho=None,
        center: bool = True,
        max_samples: int = 5000,
        random_state=None,
    ):
        self.n_components = n_components
        self.feature_map = feature_map
        self.sampler = sampler
        self.gamma = gamma
        self.pool_size = pool_size
        self.rho = rho
        self.center = center
        self.max_samples = max_samples
        self.random_state = random_state

    def fit(self, X, y):
        """Draw the pool, weight it by alignment, resample. Returns ``self``."""
        self._check_common()
        n_comp = int(self.n_components)
        pool = 10 * n_comp if self.pool_size is None else self.pool_size
        pool = int(check_positive("pool_size", pool, integer=True))
        rho = pool / n_comp - 1.0 if self.rho is None else self.rho
        rho = float(check_positive("rho", rho)) if self.rho is not None else max(rho, 1e-3)
        max_samples = int(check_positive("max_samples", self.max_samples, integer=True))
        X, y = self._validate_xy(X, y)
        Y, _ = _label_matrix(y)
        self._init_scales(X)
        gen = torch_generator(self.random_state)
        omega, bias = self._draw(pool, X.shape[1], gen)

        if X.shape[0] > max_samples:
            rows = torch.randperm(X.shape[0], generator=gen)[:max_samples].numpy()
            X, Y = X[rows], Y[rows]
        x = torch.from_numpy(X) * self.input_scale_
        with torch.no_grad():
            phi = _phi(self.feature_map, x, omega, bias if self.feature_map == "rff" else None)
        phi = phi.to(DTYPE) * math.sqrt(pool)  # undo 1/sqrt(M): per-feature values
        Yc = Y
        if self.center:
            phi = phi - phi.mean(0, keepdim=True)
            Yc = Y - Y.mean(0, keepdim=True)
        n = X.shape[0]
        scores = ((phi.T @ Yc) ** 2).sum(1) / n**2  # (M,)
        q = chi2_weights(scores.numpy(), rho)
        idx = torch.multinomial(torch.from_numpy(q), n_comp, replacement=True, generator=gen)
        self.scores_ = scores.numpy()
        self.weights_ = q
        self.rho_ = rho
        self.pool_indices_ = idx.numpy()
        self._set_particles(omega[idx], bias[idx])
        return self


# ----------------------------------------------------------------------------- particles


class ParticleFeatures(_BaseRandomFeatures):
    """Random features learned as interacting particles (projected Langevin on ``H``).

    ``fit(X, y)`` starts from the sampler (Gaussian, the ``gamma`` kernel) and runs
    ``n_steps`` steps of the core projected Langevin dynamics on the core Hamiltonian

        H(Omega) = -A(Omega) + lam_eff * W_{N,s}(Omega)

    with ``A`` the centered kernel-target alignment on a mini-batch of ``batch_size`` rows per
    step (labels from :func:`coulomb_attention.energy.encode_labels`: +-1 or one-hot) and ``W``
    the pair energy of ``potential``.

    Units. The dynamics runs on dimensionless particles ``u = omega / r0`` where ``r0`` is the
    RMS norm of the initial particles (``sqrt(2 gamma d)`` for rff), so ``radius``, ``eps``,
    ``max_drift`` and the repulsion are scale free: the same defaults serve any ``d`` and any
    input scale. With ``normalize=True`` (default) the energy gradient is divided by a running
    RMS of its per-particle norm, so ``eta`` is the per-step RMS particle displacement in units
    of ``r0`` (Adam-like scalar preconditioning; the noise ``sqrt(2 eta / beta)`` then has the
    same units). With ``normalize=False``, ``eta`` is passed to the core step as is.

    Parameters
    ----------
    n_components : int, default=256
    feature_map : {"rff", "positive", "softplus", "softmax"}, default="rff"
    sampler : {"gaussian", "orthogonal"}, default="gaussian"  initial particles
    gamma : "scale" or float > 0, default="scale"
    n_steps : int, default=150
    eta : float > 0, default=0.05
        Step size (see Units).
    eta_schedule : {"constant", "cosine", "geometric"}, default="cosine"
    eta_end : float > 0 or None, default=None  final step size (``None``: ``eta / 10``)
    beta : float > 0 or inf, default=inf
        Inverse temperature at the end of the run (``inf``: projected gradient descent).
    beta_schedule : {"constant", "geometric"}, default="constant"
    beta_start : float > 0 or None, default=None  first inverse temperature of a geometric
        schedule (both ends must be finite)
    lam : float >= 0, default=0.01
        Repulsion strength (``0``: no repulsion, the ablation).
    potential : {"riesz", "coulomb", "log"}, default="riesz"
    s : float >= 0, default=1.0  Riesz exponent (ignored by coulomb, s = d - 2, and log)
    eps : float >= 0, default=0.05  softening length (units of r0)
    projection : {"ball", "box"}, default="ball"
    radius : float > 0, default=3.0
        Ball radius in units of r0 (box: half-width ``radius / sqrt(d)`` in units of r0,
        i.e. ``radius`` standard deviations of the initial coordinates).
    batch_size : int, default=512  rows per step (all rows if fewer)
    center : bool, default=True  centered alignment
    max_drift : float > 0 or None, default=0.5  cap on one particle's drift per step (units of r0)
    normalize : bool, default=True  gradient normalisation (see Units)
    learn_bias : bool, default=True
        Also learn the rff phases ``b`` (an extra particle coordinate acting on a constant
        input; the projection wraps it into ``[-pi, pi)``); ignored by the other maps.
        Measured better than fixed phases on most tasks of the tuning family
        (docs/estimators.md).
    validation_fraction : float in [0, 1), default=0.0
        If > 0 (and both splits have >= 50 rows), hold out this fraction of the rows and keep
        the iterate (checked every ``eval_every`` steps, the initial particles included) with
        the best validation alignment. Off by default: on the tuning family the held-out
        alignment was too noisy to select well and the lost rows cost accuracy.
    eval_every : int, default=10
    optimizer : {"langevin", "adam"}, default="langevin"
        ``"adam"``: projected Adam on the same Hamiltonian and schedule (``eta`` is the
        per-particle step, Adam's ``lr = eta / sqrt(d)``), no noise (needs ``beta=inf``):
        the "plain gradient descent" ablation.
    weighted : bool, default=False
        Weighted particles (Wasserstein-Fisher-Rao, :mod:`coulomb_attention.dynamics.weighted`):
        each particle carries a mass ``w_i`` (kernel ``sum_i w_i phi_i phi_i^T``); positions
        follow the Langevin transport, masses the Fisher-Rao reaction
        ``w_i <- w_i exp(-tau (v_i - <v>_w))`` (``v_i = dH/dw_i``), and a particle lighter than
        ``w_min / N`` jumps onto a heavy one (drawn by mass), sharing its mass. ``transform``
        scales feature ``i`` by ``sqrt(N w_i)`` (uniform masses: the unweighted features).
        Compared with :class:`ImportanceFeatures` (Sinha & Duchi): importance weighting is the
        fixed-position special case (no transport, one reaction step from uniform with a
        chi-square instead of an entropic constraint, then resampling); here positions and
        masses move together and birth-death resamples along the way.
    tau : float >= 0, default=0.05
        Reaction step (weighted only): with the running normalisation of ``v``, the RMS change
        of ``log w_i`` per step; it follows the shape of the ``eta`` schedule.
    w_min : float in [0, 1), default=0.1
        Death threshold in units of ``1 / N`` (weighted only; ``0``: no birth-death).
    transport : bool, default=True
        Weighted only: ``False`` keeps the positions at their draw (they move only by
        birth-death jumps onto heavy particles): pure Fisher-Rao reweighting, the
        fixed-position case of which :class:`ImportanceFeatures` is a one-shot version.
    random_state : None, int, numpy RandomState/Generator or torch.Generator

    Attributes
    ----------
    omega_ : ndarray (N, d)
    bias_ : ndarray (N,)
    weights_ : ndarray (N,) or None  the masses (``weighted=True``; sum 1), else ``None``
    n_births_ : int  birth-death events of a weighted fit (0 otherwise)
    gamma_, input_scale_ : as :class:`RandomFeatures`
    scale_ : float  r0, the unit of the dynamics
    history_ : list of dict, one per step: energy, alignment, repulsion, boundary_fraction,
        grad_norm, eta, beta
    initial_alignment_, alignment_ : float  centered alignment on the (sub-sampled, at most
        4096 rows) training rows before and after learning
    best_step_ : int  the step whose particles were kept (``n_steps`` without validation)
    val_alignment_ : float or None  the best validation alignment
    """

    def __init__(
        self,
        n_components: int = 256,
        feature_map: str = "rff",
        sampler: str = "gaussian",
        gamma="scale",
        n_steps: int = 150,
        eta: float = 0.05,
        eta_schedule: str = "cosine",
        eta_end=None,
        beta: float = math.inf,
        beta_schedule: str = "constant",
        beta_start=None,
        lam: float = 0.01,
        potential: str = "riesz",
        s: float = 1.0,
        eps: float = 0.05,
        projection: str = "ball",
        radius: float = 3.0,
        batch_size: int = 512,
        center: bool = True,
        max_drift=0.5,
        normalize: bool = True,
        learn_bias: bool = True,
        validation_fraction: float = 0.0,
        eval_every: int = 10,
        optimizer: str = "langevin",
        weighted: bool = False,
        tau: float = 0.05,
        w_min: float = 0.1,
        transport: bool = True,
        random_state=None,
    ):
        self.n_components = n_components
        self.feature_map = feature_map
        self.sampler = sampler
        self.gamma = gamma
        self.n_steps = n_steps
        self.eta = eta
        self.eta_schedule = eta_schedule
        self.eta_end = eta_end
        self.beta = beta
        self.beta_schedule = beta_schedule
        self.beta_start = beta_start
        self.lam = lam
        self.potential = potential
        self.s = s
        self.eps = eps
        self.projection = projection
        self.radius = radius
        self.batch_size = batch_size
        self.center = center
        self.max_drift = max_drift
        self.normalize = normalize
        self.learn_bias = learn_bias
        self.validation_fraction = validation_fraction
        self.eval_every = eval_every
        self.optimizer = optimizer
        self.weighted = weighted
        self.tau = tau
        self.w_min = w_min
        self.transport = transport
        self.random_state = random_state

    # -- validation ---------------------------------------------------------
    def _check_params(self) -> dict:
        self._check_common()
        p = {}
        p["n_steps"] = int(check_positive("n_steps", self.n_steps, integer=True))
        p["eta"] = float(check_positive("eta", self.eta))
        check_choice("eta_schedule", self.eta_schedule, SCHEDULES)
        p["eta_end"] = (
            p["eta"] / 10.0
            if self.eta_end is None
            else float(check_positive("eta_end", self.eta_end))
        )
        p["beta"] = float(check_positive("beta", self.beta, allow_inf=True))
        check_choice("beta_schedule", self.beta_schedule, ("constant", "geometric"))
        if self.beta_schedule == "geometric":
            if self.beta_start is None:
                raise ValueError("beta_schedule='geometric' needs beta_start")
            p["beta_start"] = float(check_positive("beta_start", self.beta_start))
            if math.isinf(p["beta"]):
                raise ValueError("beta_schedule='geometric' needs a finite beta")
        elif self.beta_start is not None:
            check_positive("beta_start", self.beta_start, allow_inf=True)
        p["lam"] = float(check_nonnegative("lam", self.lam))
        check_choice("potential", self.potential, POTENTIALS)
        p["s"] = float(check_nonnegative("s", self.s))
        if self.potential == "riesz" and p["s"] == 0:
            raise ValueError("s must be > 0 for potential='riesz' (use potential='log' for s=0)")
        p["eps"] = float(check_nonnegative("eps", self.eps))
        check_choice("projection", self.projection, PROJECTION_NAMES)
        p["radius"] = float(check_positive("radius", self.radius))
        p["batch_size"] = int(check_positive("batch_size", self.batch_size, integer=True))
        p["max_drift"] = (
            None if self.max_drift is None else float(check_positive("max_drift", self.max_drift))
        )
        p["validation_fraction"] = float(
            check_nonnegative("validation_fraction", self.validation_fraction)
        )
        if p["validation_fraction"] >= 1:
            raise ValueError(
                f"validation_fraction must be in [0, 1), got {self.validation_fraction!r}"
            )
        p["eval_every"] = int(check_positive("eval_every", self.eval_every, integer=True))
        for name in ("center", "normalize", "learn_bias", "weighted", "transport"):
            if not isinstance(getattr(self, name), bool | np.bool_):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        if self.optimizer == "adam":
            if self.weighted:
                raise ValueError("optimizer='adam' moves unweighted particles: set weighted=False")
            if math.isfinite(p["beta"]) or self.beta_schedule != "constant":
                raise ValueError("optimizer='adam' has no noise: it needs beta=inf and "
                                 "beta_schedule='constant'")
        if not self.transport and not self.weighted:
            raise ValueError("transport=False needs weighted=True (only masses would be left)")
        p["tau"] = float(check_nonnegative("tau", self.tau))
        p["w_min"] = float(check_nonnegative("w_min", self.w_min))
        if p["w_min"] >= 1:
            raise ValueError(f"w_min must be in [0, 1) (units of 1/N), got {self.w_min!r}")
        return p

    # -- fit ----------------------------------------------------------------
    def fit(self, X, y):
        """Learn the particles on ``(X, y)``. Returns ``self``."""
        p = self._check_params()
        X, y = self._validate_xy(X, y)
        Y, _ = _label_matrix(y)
        n, d = X.shape
        self._init_scales(X)
        gen = torch_generator(self.random_state)
        omega0, bias = self._draw(int(self.n_components), d, gen)
        r0 = self.particle_scale_ * math.sqrt(d)  # RMS norm of the initial particles
        self.scale_ = r0
        x_all = torch.from_numpy(X) * self.input_scale_  # (n, d)

        # Dimensionless particles u = omega / r0; with learn_bias the phases are an extra
        # coordinate of the particle (scaled by 1 / r0 as well, x gets a constant 1 column);
        # the projection then acts on the omega part and wraps the phase into [-pi, pi).
        fmap = self.feature_map
        learn_bias = self.learn_bias and fmap == "rff"  # only rff has phases
        if learn_bias:
            x_all = torch.cat([x_all, torch.ones(n, 1, dtype=DTYPE)], dim=1)
            u0 = torch.cat([omega0, bias.unsqueeze(1)], dim=1) / r0
            zero = torch.zeros(omega0.shape[0], dtype=DTYPE)

            def features(x, u):
                return _phi(fmap, x, u * r0, zero)
        else:
            u0 = omega0 / r0
            b = bias if fmap == "rff" else None

            def features(x, u):
                return _phi(fmap, x, u * r0, b)

        pot = None
        if p["lam"] > 0:
            pot = make_potential(
                self.potential,
                s=p["s"] if self.potential == "riesz" else None,
                eps=p["eps"],
                dim=d,
            )
        ham = Hamiltonian(LabelAlignment(features, center=self.center), pot, lam=p["lam"])
        size = p["radius"]
        if self.projection == "box":  # half-width: radius standard deviations per coordinate
            size = p["radius"] / math.sqrt(d)
        proj = make_projection(self.projection, size)
        if learn_bias:
            proj = _PhaseWrap(proj, d, r0)
        schedule = LangevinSchedule(
            steps=p["n_steps"], eta=p["eta"], eta_end=p["eta_end"],
            eta_schedule=self.eta_schedule, beta=p["beta"], beta_start=p.get("beta_start"),
            beta_schedule=self.beta_schedule, max_drift=p["max_drift"])

        # Hold out a validation split; the iterate with the best validation alignment is kept
        # (step 0, the initial particles, included), which guards against over-fitting.
        perm = torch.randperm(n, generator=gen)
        n_val = int(round(p["validation_fraction"] * n))
        use_val = n_val >= 50 and n - n_val >= 50
        if use_val:
            val_idx, tr_idx = perm[:n_val], perm[n_val:]
            use_val = _n_classes(Y[val_idx]) >= 2 and _n_classes(Y[tr_idx]) >= 2
        if not use_val:
            val_idx, tr_idx = perm[:0], perm
        x_tr, Y_tr = x_all[tr_idx], Y[tr_idx]
        bs = min(max(p["batch_size"], 2), x_tr.shape[0])
        batches = _minibatches(x_tr, Y_tr, bs, gen)
        probe = tr_idx[: min(tr_idx.shape[0], 4096)]

        n_part = u0.shape[0]

        def align_on(idx, u, w=None) -> float:
            with torch.no_grad():
                phi = features(x_all[idx], u)
                if w is not None:
                    phi = phi * (n_part * w).sqrt()
                return float(alignment(phi, Y[idx], center=self.center))

        a0 = align_on(probe, u0)
        every = p["eval_every"]
        best = {"val": align_on(val_idx, u0) if use_val else -math.inf, "u": None, "step": 0,
                "w": None}

        def callback(state, info) -> None:
            k = state.step
            if use_val and (k % every == 0 or k == p["n_steps"]):
                w = getattr(state, "weights", None)
                val = align_on(val_idx, state.omega, w)
                info["val_alignment"] = val
                if val > best["val"]:
                    best.update(val=val, u=state.omega.clone(), step=k,
                                w=None if w is None else w.clone())

        best["u"], _ = proj(u0.clone())
        reaction = (Reaction(tau=p["tau"], w_min=p["w_min"], transport=bool(self.transport))
                    if self.weighted else None)
        if reaction is not None:
            best["w"] = torch.full((n_part,), 1.0 / n_part, dtype=DTYPE)
        # Adam's learning rate: eta is the per-particle step, lr = eta / sqrt(d)
        lr = p["eta"] / math.sqrt(u0.shape[1]) if self.optimizer == "adam" else None
        result = learn_particles(ham, u0, schedule, batches, projection=proj, generator=gen,
                                 normalize_drift=self.normalize, callbacks=[callback],
                                 method=self.optimizer, reaction=reaction, lr=lr)
        state, trace = result.state, result.trace
        u = best["u"] if use_val else state.omega
        w = best["w"] if use_val else result.weights
        self.best_step_ = best["step"] if use_val else p["n_steps"]
        self.val_alignment_ = best["val"] if use_val else None
        a1 = align_on(probe, u, w)
        self.weights_ = None if w is None else w.numpy().astype(np.float64)
        self.n_births_ = int(getattr(state, "births", 0))
        full = u * r0
        if learn_bias:
            self._set_particles(full[:, :d], torch.remainder(full[:, d], 2 * math.pi))
        else:
            self._set_particles(full, bias)
        keys = (
            "energy",
            "alignment",
            "repulsion",
            "boundary_fraction",
            "grad_norm",
            "eta",
            "beta",
            "val_alignment",
            "tau",
            "births",
            "ess",
            "lr",
        )
        self.history_ = [{k: float(t[k]) for k in keys if k in t} for t in trace]
        self.initial_alignment_ = a0
        self.alignment_ = a1
        return self


    def _features(self, X: np.ndarray) -> np.ndarray:
        phi = super()._features(X)
        if getattr(self, "weights_", None) is not None:  # feature i scaled by sqrt(N w_i)
            phi = phi * np.sqrt(self.weights_.shape[0] * self.weights_)
        return phi


def _n_classes(Y: torch.Tensor) -> int:
    """Number of distinct label rows (classes) in ``Y`` (n, C)."""
    return int(torch.unique(Y, dim=0).shape[0])


class _PhaseWrap:
    """Projection of ``(omega, phase)`` particles: the core projection on the first ``d``
    coordinates, the phase coordinate (``b / r0``) wrapped into ``[-pi, pi) / r0``."""

    def __init__(self, projection, d: int, r0: float):
        self.projection, self.d, self.r0 = projection, d, r0

    def __call__(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w, on_boundary = self.projection(u[:, : self.d])
        b = torch.remainder(u[:, self.d :] * self.r0 + math.pi, 2 * math.pi) - math.pi
        return torch.cat([w, b / self.r0], dim=1), on_boundary


def _minibatches(x: torch.Tensor, Y: torch.Tensor, batch_size: int, gen: torch.Generator):
    """Endless mini-batches ``(x (B, d), Y (B, C))``: reshuffled epochs, drop the remainder.

    A batch whose labels are all one class carries no alignment (its centered ``Y^T Y`` is 0)
    and is skipped; ``Y`` holds at least two classes and ``batch_size >= 2``, so every epoch
    has a positive chance of a usable batch.
    """
    n = x.shape[0]
    while True:
        perm = torch.randperm(n, generator=gen)
        for start in range(0, n - batch_size + 1, batch_size):
            idx = perm[start : start + batch_size]
            if _n_classes(Y[idx]) < 2:
                continue
            yield x[idx], Y[idx]

"""Tests of the scikit-learn estimators (fixed, importance-weighted, particle-learned)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.utils.estimator_checks import parametrize_with_checks

from coulomb_attention.estimators import (
    ImportanceFeatures,
    ParticleFeatures,
    RandomFeatures,
    chi2_divergence,
    chi2_weights,
)


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny tensors: intra-op threads only add contention on a shared 2-core machine.
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


FAST = [
    RandomFeatures(n_components=16),
    ImportanceFeatures(n_components=16, pool_size=64),
    ParticleFeatures(n_components=16, n_steps=5, batch_size=64),
    ParticleFeatures(n_components=8, n_steps=3, feature_map="positive", beta=100.0),
    ParticleFeatures(n_components=8, n_steps=3, weighted=True, tau=0.5, w_min=0.5),
    ParticleFeatures(n_components=8, n_steps=3, optimizer="adam", lam=0.0),
]


@parametrize_with_checks(FAST)
def test_sklearn_compatible(estimator, check):
    """Each sklearn estimator check raises AssertionError/ValueError on a contract violation."""
    check(estimator)


def xor_task(n=800, d=10, seed=0):
    """XOR of the signs of 2 informative coordinates, d - 2 noise coordinates."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    y = (X[:, 0] * X[:, 1] > 0).astype(int)
    return X, y


@pytest.mark.parametrize("fmap", ["rff", "positive", "softplus", "softmax"])
@pytest.mark.parametrize("cls", [RandomFeatures, ImportanceFeatures, ParticleFeatures])
def test_pipeline_shapes_and_maps(cls, fmap):
    X, y = xor_task(n=200, d=4)
    kw = {"n_steps": 5} if cls is ParticleFeatures else {}
    est = cls(n_components=12, feature_map=fmap, random_state=0, **kw)
    pipe = make_pipeline(est, LogisticRegression(max_iter=500)).fit(X, y)
    phi = pipe[0].transform(X)
    assert phi.shape == (200, 12) and phi.dtype == np.float64
    assert np.isfinite(phi).all()
    assert pipe[0].omega_.shape == (12, 4)
    assert 0.0 <= pipe.score(X, y) <= 1.0


def test_random_features_rff_is_unbiased_gaussian_kernel():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((30, 3))
    est = RandomFeatures(n_components=20000, gamma=0.3, random_state=0).fit(X)
    phi = est.transform(X)
    exact = np.exp(-0.3 * ((X[:, None] - X[None]) ** 2).sum(-1))
    assert np.abs(phi @ phi.T - exact).max() < 0.05
    assert est.gamma_ == 0.3
    # gamma="scale" is 1 / (d * X.var())
    assert math.isclose(RandomFeatures(4).fit(X).gamma_, 1.0 / (3 * X.var()))


@pytest.mark.parametrize("cls", [RandomFeatures, ImportanceFeatures, ParticleFeatures])
def test_deterministic_given_random_state(cls):
    X, y = xor_task(n=300, d=5)
    kw = {"n_steps": 10} if cls is ParticleFeatures else {}
    a = cls(n_components=16, random_state=3, **kw).fit(X, y)
    b = cls(n_components=16, random_state=3, **kw).fit(X, y)
    c = cls(n_components=16, random_state=4, **kw).fit(X, y)
    np.testing.assert_array_equal(a.omega_, b.omega_)
    np.testing.assert_array_equal(a.transform(X), b.transform(X))
    assert not np.array_equal(a.omega_, c.omega_)


def test_learning_increases_alignment_and_history():
    X, y = xor_task(n=600, d=6)
    est = ParticleFeatures(n_components=32, n_steps=60, random_state=0).fit(X, y)
    assert len(est.history_) == 60
    for key in ("energy", "alignment", "repulsion", "boundary_fraction"):
        assert all(math.isfinite(h[key]) for h in est.history_)
    first = np.mean([h["alignment"] for h in est.history_[:5]])
    last = np.mean([h["alignment"] for h in est.history_[-5:]])
    assert last > first + 0.1
    assert est.alignment_ > est.initial_alignment_ + 0.1
    # the score method is the centered alignment on the given data
    fixed = RandomFeatures(n_components=32, random_state=0).fit(X, y)
    assert est.score(X, y) > fixed.score(X, y) + 0.1


def test_weighted_particle_features_scale_features_by_their_masses():
    X, y = xor_task(n=400, d=6)
    est = ParticleFeatures(16, n_steps=60, weighted=True, tau=0.2, random_state=0).fit(X, y)
    w = est.weights_
    assert w.shape == (16,) and abs(w.sum() - 1.0) < 1e-12 and (w > 0).all()
    assert w.max() / w.min() > 2.0  # the masses moved
    masses = est.weights_
    est.weights_ = None  # the positions alone
    plain = est.transform(X)
    est.weights_ = masses
    np.testing.assert_allclose(est.transform(X), plain * np.sqrt(16 * masses), rtol=1e-12)
    assert est.alignment_ > est.initial_alignment_ + 0.1
    assert all("ess" in h and "births" in h for h in est.history_)
    # unweighted fits keep weights_ None and the old features
    assert ParticleFeatures(16, n_steps=5, random_state=0).fit(X, y).weights_ is None
    with pytest.raises(ValueError, match="adam"):
        ParticleFeatures(8, optimizer="adam", weighted=True).fit(X, y)
    with pytest.raises(ValueError, match="w_min"):
        ParticleFeatures(8, weighted=True, w_min=2.0).fit(X, y)
    with pytest.raises(ValueError, match="transport"):
        ParticleFeatures(8, transport=False).fit(X, y)
    # masses only: the positions stay at the draw unless a particle died and jumped
    still = ParticleFeatures(16, n_steps=30, weighted=True, transport=False, w_min=0.0,
                             random_state=0).fit(X, y)
    start = RandomFeatures(16, random_state=0).fit(X, y)
    np.testing.assert_allclose(still.omega_, start.omega_, rtol=1e-12, atol=1e-14)
    assert still.weights_.max() / still.weights_.min() > 1.5


def test_multiclass_and_string_labels():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 3))
    y = np.array(["a", "b", "c"])[np.digitize(X[:, 0], [-0.5, 0.5])]
    est = ParticleFeatures(n_components=16, n_steps=20, random_state=0).fit(X, y)
    assert est.alignment_ > est.initial_alignment_
    pipe = make_pipeline(ImportanceFeatures(16, random_state=0), LogisticRegression())
    assert pipe.fit(X, y).score(X, y) > 0.5


def test_particles_beat_fixed_features_at_equal_n():
    X, y = xor_task(n=1200, d=10, seed=0)
    Xtr, ytr, Xte, yte = X[:600], y[:600], X[600:], y[600:]
    accs = {}
    for name, est in [
        ("fixed", RandomFeatures(n_components=32, random_state=0)),
        ("particles", ParticleFeatures(n_components=32, random_state=0)),
    ]:
        pipe = make_pipeline(est, LogisticRegression(max_iter=1000)).fit(Xtr, ytr)
        accs[name] = pipe.score(Xte, yte)
    assert accs["particles"] > accs["fixed"] + 0.1, accs


def test_chi2_weights_satisfy_constraint_and_improve_objective():
    rng = np.random.default_rng(0)
    scores = rng.exponential(size=500)
    for rho in (0.1, 1.0, 10.0):
        q = chi2_weights(scores, rho)
        assert q.min() >= 0 and math.isclose(q.sum(), 1.0, rel_tol=1e-9)
        assert chi2_divergence(q) <= rho * (1 + 1e-6)
        assert chi2_divergence(q) >= rho * (1 - 1e-3)  # the constraint is active
        assert q @ scores > scores.mean()
    # a larger radius can only improve the objective
    assert chi2_weights(scores, 10.0) @ scores > chi2_weights(scores, 1.0) @ scores
    # huge radius: all mass on the arg-max
    assert chi2_weights(scores, 1e6)[np.argmax(scores)] == 1.0

    X, y = xor_task(n=400, d=4)
    est = ImportanceFeatures(n_components=16, pool_size=160, rho=2.0, random_state=0).fit(X, y)
    assert est.weights_.shape == (160,)
    assert chi2_divergence(est.weights_) <= 2.0 * (1 + 1e-6)
    assert np.all(est.weights_[est.pool_indices_] > 0)  # resampled only from the support


BAD = [
    (dict(n_components=0), ValueError, "n_components"),
    (dict(n_components=2.5), ValueError, "n_components"),
    (dict(feature_map="nope"), ValueError, "rff"),
    (dict(sampler="nope"), ValueError, "gaussian"),
    (dict(gamma=-1.0), ValueError, "gamma"),
    (dict(gamma="auto"), ValueError, "scale"),
]
BAD_PARTICLES = [
    (dict(beta=0.0), ValueError, "beta"),
    (dict(beta=-1.0), ValueError, "beta"),
    (dict(radius=0.0), ValueError, "radius"),
    (dict(s=-1.0), ValueError, "s must"),
    (dict(potential="gravity"), ValueError, "coulomb"),
    (dict(projection="sphere"), ValueError, "ball"),
    (dict(lam=-0.1), ValueError, "lam"),
    (dict(eta=0.0), ValueError, "eta"),
    (dict(n_steps=0), ValueError, "n_steps"),
    (dict(eta_schedule="linear"), ValueError, "cosine"),
    (dict(beta_schedule="geometric"), ValueError, "beta_start"),
    (dict(validation_fraction=1.0), ValueError, "validation_fraction"),
    (dict(eval_every=0), ValueError, "eval_every"),
    (dict(center="yes"), TypeError, "center"),
]


@pytest.mark.parametrize(
    "cls,params,exc,match",
    [(c, *b) for c in (RandomFeatures, ImportanceFeatures, ParticleFeatures) for b in BAD]
    + [(ParticleFeatures, *b) for b in BAD_PARTICLES]
    + [(ImportanceFeatures, dict(rho=0.0), ValueError, "rho")],
)
def test_bad_parameters_raise(cls, params, exc, match):
    X, y = xor_task(n=50, d=3)
    with pytest.raises(exc, match=match):
        cls(**params).fit(X, y)


@pytest.mark.parametrize("cls", [ImportanceFeatures, ParticleFeatures])
def test_bad_inputs_raise(cls):
    X, y = xor_task(n=50, d=3)
    est = cls(n_components=4, **({"n_steps": 2} if cls is ParticleFeatures else {}))
    with pytest.raises(ValueError, match="class"):
        est.fit(X, np.zeros(50))
    Xn = X.copy()
    Xn[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        est.fit(Xn, y)
    Xi = X.copy()
    Xi[0, 0] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        est.fit(Xi, y)
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        est.fit(X, y[:-1])
    with pytest.raises(ValueError, match="2D array"):
        est.fit(X[:, 0], y)
    with pytest.raises(ValueError, match="y"):
        est.fit(X, None)
    est.fit(X, y)
    with pytest.raises(ValueError, match="features"):
        est.transform(X[:, :2])


def test_projection_options_keep_particles_inside():
    X, y = xor_task(n=300, d=4)
    ball = ParticleFeatures(16, n_steps=30, radius=1.2, eta=0.2, random_state=0).fit(X, y)
    assert np.linalg.norm(ball.omega_, axis=1).max() <= 1.2 * ball.scale_ * (1 + 1e-6)
    assert ((ball.bias_ >= 0) & (ball.bias_ < 2 * math.pi)).all()
    box = ParticleFeatures(16, n_steps=30, projection="box", radius=2.0, random_state=0)
    box.fit(X, y)
    assert np.abs(box.omega_).max() <= 2.0 / math.sqrt(4) * box.scale_ * (1 + 1e-6)
    fixed = ParticleFeatures(16, n_steps=10, learn_bias=False, random_state=0).fit(X, y)
    np.testing.assert_array_equal(fixed.bias_, RandomFeatures(16, random_state=0).fit(X).bias_)


def test_validation_selection_keeps_a_visited_iterate():
    X, y = xor_task(n=600, d=4)
    est = ParticleFeatures(16, n_steps=30, validation_fraction=0.25, random_state=0).fit(X, y)
    val = [h["val_alignment"] for h in est.history_ if "val_alignment" in h]
    assert len(val) == 3 and 0 <= est.best_step_ <= 30
    assert est.val_alignment_ >= max(val) - 1e-12


def test_bench_and_demo_helpers():
    from coulomb_attention.bench.langevin import time_step
    from coulomb_attention.data.synthetic import make_demo_task

    assert time_step(N=8, n=64, d=3, repeats=1, dtype=torch.float32) > 0
    X, y = make_demo_task(50, 5, 0.0, 0)
    assert X.shape == (100, 5) and set(np.unique(y)) == {0, 1}
    with pytest.raises(ValueError, match="d >= 2"):
        make_demo_task(50, 1, 0.0, 0)


def test_single_class_minibatches_are_skipped_not_fatal():
    # found by hypothesis (tests/test_reliability_properties.py): 30 alternating labels in
    # batches of 8 can draw a batch of one class, whose centered alignment is undefined
    import numpy as np

    rng = np.random.default_rng(11680)
    X = rng.standard_normal((30, 1))
    est = ParticleFeatures(9, feature_map="rff", n_steps=3, batch_size=8, random_state=11680)
    est.fit(X, np.arange(30) % 2)
    assert est.omega_.shape == (9, 1) and np.isfinite(est.omega_).all()
    assert len(est.history_) == 3 and all(np.isfinite(h["energy"]) for h in est.history_)

"""Synthetic tasks (coulomb_attention.data.synthetic): shapes, label noise, determinism, the
spectral task's ground truth."""

from __future__ import annotations

import numpy as np
import pytest

from coulomb_attention.data.synthetic import (
    SPECTRAL_FREQUENCIES,
    TASKS,
    flip_labels,
    make_spectral,
    make_task,
    spectral_hit_fraction,
)

# ----------------------------------------------------------------------------- generators


@pytest.mark.parametrize("name", sorted(TASKS))
def test_generator_shapes_standardized_and_binary(name):
    t = make_task(name, n_train=300, n_test=200, d=9, noise=0.0, random_state=1)
    assert t.X_train.shape == (300, 9) and t.X_test.shape == (200, 9)
    assert t.y_train.shape == (300,) and t.y_test.shape == (200,)
    assert t.X_train.dtype == np.float64 and t.y_train.dtype == np.int64
    assert set(np.unique(t.y_train)) == {0, 1} and set(np.unique(t.y_test)) == {0, 1}
    np.testing.assert_allclose(t.X_train.mean(0), 0.0, atol=1e-10)
    np.testing.assert_allclose(t.X_train.std(0), 1.0, atol=1e-10)
    assert t.metadata["d"] == 9 and t.metadata["n_informative"] == 2
    # not degenerate: both classes reasonably frequent
    assert 0.2 < t.y_test.mean() < 0.8


@pytest.mark.parametrize("noise", [0.0, 0.1, 0.2, 0.3])
def test_label_noise_flips_exactly_that_fraction_of_training_labels(noise):
    t = make_task("xor", n_train=500, n_test=300, d=8, noise=noise, random_state=3)
    clean = t.metadata["y_train_clean"]
    flipped = t.y_train != clean
    assert flipped.sum() == round(noise * 500) == t.metadata["n_flipped"]
    np.testing.assert_array_equal(np.flatnonzero(flipped), t.metadata["flipped"])
    # test labels are clean: the rule applied to the raw inputs
    raw = t.X_test * t.metadata["scale"] + t.metadata["mean"]
    np.testing.assert_array_equal(t.y_test, (raw[:, 0] * raw[:, 1] > 0).astype(int))


def test_flip_labels_rounding_and_validation():
    y = np.zeros(7, dtype=int)
    y2, idx = flip_labels(y, 0.3, np.random.default_rng(0))
    assert y2.sum() == 2 and len(idx) == 2  # round(2.1)
    with pytest.raises(ValueError, match="noise"):
        make_task("xor", 10, 10, 8, noise=0.5)
    with pytest.raises(ValueError, match="valid: anisotropic"):
        make_task("spiral", 10, 10, 8)
    with pytest.raises(ValueError, match="n_informative"):
        make_task("xor", 10, 10, d=1)


def test_generators_are_deterministic_in_random_state():
    a = make_task("radial", 100, 50, 8, 0.2, random_state=7)
    b = make_task("radial", 100, 50, 8, 0.2, random_state=7)
    c = make_task("radial", 100, 50, 8, 0.2, random_state=8)
    for x, y in zip(a.astuple()[:4], b.astuple()[:4], strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.X_train, c.X_train)
    assert not np.array_equal(a.metadata["flipped"], c.metadata["flipped"])


def test_spectral_task_frequencies_reproduce_the_labels():
    t = make_spectral(400, 300, d=10, noise=0.2, random_state=5)
    f, ph = t.metadata["frequencies"], t.metadata["phases"]
    assert f.shape == (len(SPECTRAL_FREQUENCIES), 10)
    assert np.all(f[:, 2:] == 0)  # zero on the noise dims
    # standardized frequencies = raw frequencies times the raw scale of the informative dims
    np.testing.assert_allclose(f[:, :2], SPECTRAL_FREQUENCIES * t.metadata["scale"][:2])
    rule = lambda X: (np.cos(X @ f.T + ph).sum(1) > 0).astype(int)  # noqa: E731
    np.testing.assert_array_equal(rule(t.X_test), t.y_test)
    np.testing.assert_array_equal(rule(t.X_train), t.metadata["y_train_clean"])
    # particles at +-f_k are hits, a Gaussian cloud at the kernel's scale mostly is not
    assert spectral_hit_fraction(np.concatenate([f, -f]), f) == 1.0
    cloud = np.random.default_rng(0).normal(0, np.sqrt(2 / 10), size=(500, 10))
    assert spectral_hit_fraction(cloud, f) < 0.05

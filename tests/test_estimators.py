"""Tests of the scikit-learn estimators (fixed, importance-weighted, particle-learned)."""

from __future__ import annotations

import math

import numpy as np
import pytest
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

FAST = [
    RandomFeatures(n_components=16),
    RandomFeatures(n_components=16, sampler="orthogonal", feature_map="softplus"),
    ImportanceFeatures(n_components=16, pool_size=64),
    ParticleFeatures(n_components=16, n_steps=5, batch_size=64),
    ParticleFeatures(n_components=8, n_steps=3, feature_map="positive", beta=100.0),
]


@parametrize_with_checks(FAST)
def test_sklearn_compatible(estimator, check):
    check(estimator)

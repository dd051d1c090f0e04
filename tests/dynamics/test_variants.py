"""The ablation's variant vocabulary (dynamics.variants): one table, read by every arena."""

from __future__ import annotations

import dataclasses
import math

import pytest

from coulomb_attention.dynamics import ParticleConfig
from coulomb_attention.dynamics.variants import VARIANTS, estimator_kwargs, particle_overrides
from coulomb_attention.reports.ablation import VARIANTS as REPORT_NAMES


def test_every_override_is_a_particle_config_field_and_builds_a_config():
    fields = {f.name for f in dataclasses.fields(ParticleConfig)}
    for name, v in VARIANTS.items():
        if v.overrides is None:
            continue
        assert set(v.overrides) <= fields and set(v.params) <= fields, name
        extra = {"lam": 0.5} if name == "coulomb" else {}
        ParticleConfig(**particle_overrides(name, extra))  # valid values


def test_the_report_shows_the_vocabulary_in_its_order():
    assert REPORT_NAMES == tuple(VARIANTS)


def test_what_each_variant_means():
    assert particle_overrides("fixed", {}) is None
    assert particle_overrides("gradient", {"lr": 0.1}) == {"method": "adam", "lam": 0.0,
                                                          "beta": 0.0, "lr": 0.1}
    assert particle_overrides("langevin", {"beta": 1e3, "lam": 0.0}) == {
        "method": "langevin", "lam": 0.0, "beta": 1e3}  # lam 0 is the variant's own value
    assert particle_overrides("coulomb", {"lam": 1.0, "beta": 1e6, "map": "hedgehog"}) == {
        "method": "langevin", "lam": 1.0, "beta": 1e6}  # "map" is the arena's
    assert particle_overrides("hedgehog", {})["method"] == "hedgehog"


@pytest.mark.parametrize(("variant", "params", "match"), [
    ("nope", {}, "unknown variant 'nope'"),
    ("coulomb", {"beta": 1e6}, "lam > 0"),
    ("langevin", {"lam": 0.1}, "takes params"),  # repulsion is the coulomb variant
    ("gradient", {"tau": 0.1}, "takes params"),
])
def test_bad_variants_and_params_are_refused(variant, params, match):
    with pytest.raises(ValueError, match=match):
        particle_overrides(variant, params)


def test_estimator_names():
    assert estimator_kwargs(particle_overrides("gradient", {})) == {
        "optimizer": "adam", "lam": 0.0, "beta": math.inf}
    assert estimator_kwargs(particle_overrides("weighted", {"lam": 0.01, "tau": 0.05})) == {
        "optimizer": "langevin", "weighted": True, "lam": 0.01, "tau": 0.05}
    with pytest.raises(ValueError, match="Hedgehog"):
        estimator_kwargs(particle_overrides("hedgehog", {}))

import dataclasses
import math

import pytest
import torch

from coulomb_attention.convert.distill import DistillConfig
from coulomb_attention.convert.driver import langevin_setup
from coulomb_attention.dynamics import LangevinSchedule, ParticleConfig
from coulomb_attention.train.phases import AlignConfig
from coulomb_attention.train.recall_teacher import RecallFitConfig


def test_schedule_and_projection_follow_the_fields():
    cfg = ParticleConfig(steps=7, eta=0.2, eta_end=0.02, beta=1e3, radius=2.0, max_drift=0.0)
    sched = cfg.schedule()
    assert isinstance(sched, LangevinSchedule)
    assert (sched.steps, sched.eta, sched.eta_end, sched.beta) == (7, 0.2, 0.02, 1e3)
    assert sched.eta_schedule == "cosine" and sched.max_drift is None  # 0 reads as no cap
    eta = sched.eta_fn()
    assert eta(0) == pytest.approx(0.2) and eta(6) < eta(0)
    proj = cfg.projection(16)  # ball of radius 2 * sqrt(16) = 8
    out, on_boundary = proj(torch.tensor([[100.0] + [0.0] * 15, [1.0] + [0.0] * 15]))
    assert out[0].norm() == pytest.approx(8.0) and on_boundary.tolist() == [True, False]
    assert out[1].norm() == pytest.approx(1.0)


@pytest.mark.parametrize("field,value", [("steps", 0), ("eta", 0.0), ("radius", -1.0),
                                         ("lam", -0.1), ("beta", -1.0)])
def test_bad_values_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        ParticleConfig(**{field: value})


@pytest.mark.parametrize("cls", [AlignConfig, DistillConfig, RecallFitConfig])
def test_every_learner_config_is_a_particle_config(cls):
    cfg = cls()
    assert isinstance(cfg, ParticleConfig)
    shared = {f.name for f in dataclasses.fields(ParticleConfig)}
    assert shared <= {f.name for f in dataclasses.fields(cls)}
    # the shared validation runs for every learner
    with pytest.raises(ValueError, match="eta"):
        cls(eta=0.0)
    with pytest.raises(ValueError, match="potential"):
        cls(potential="gravity")


def test_langevin_setup_builds_the_configured_system():
    cfg = AlignConfig(lam=0.3, potential="coulomb", radius=1.5, steps=11)
    potential, projection, schedule = langevin_setup(cfg, dh=9)
    assert potential is not None and schedule == cfg.schedule()
    omega = torch.full((2, 9), 10.0)
    assert projection(omega)[0].norm(dim=1).tolist() == pytest.approx([1.5 * math.sqrt(9)] * 2)
    assert langevin_setup(dataclasses.replace(cfg, lam=0.0), dh=9)[0] is None


NEW_FIELDS = ("method", "lr", "tau", "w_min", "normalize_drift")


def test_configs_stored_before_the_method_fields_still_load_and_keep_their_keys():
    from coulomb_attention.config import from_dict, to_dict
    from coulomb_attention.studies.recall import run_key
    from coulomb_attention.train import recall as lib
    from coulomb_attention.train.run import RunConfig, checkpoint_config

    def old(d):  # align as written before ParticleConfig held how particles move
        return {**d, "align": {k: v for k, v in d["align"].items() if k not in NEW_FIELDS}}

    recall = to_dict(from_dict(lib.RecallRunConfig, {"kernel": "learned",
                                                     "model": {"attention": "favor"}}))
    assert run_key(recall) == run_key(old(recall))
    assert from_dict(lib.RecallRunConfig, old(recall)) == from_dict(lib.RecallRunConfig, recall)
    changed = to_dict(from_dict(lib.RecallRunConfig, {**recall, "align": {
        **recall["align"], "normalize_drift": True}}))
    assert run_key(changed) != run_key(recall)
    run = to_dict(RunConfig())
    assert checkpoint_config(run) == checkpoint_config(old(run))
    assert from_dict(RunConfig, old(run)) == from_dict(RunConfig, run)


def test_a_learner_may_allow_fewer_methods_and_override_defaults():
    with pytest.raises(ValueError, match="method"):
        AlignConfig(method="adam")  # label alignment moves particles by Langevin only
    assert RecallFitConfig().lr == 0.03 and DistillConfig().lr == ParticleConfig().lr
    for cls in (DistillConfig, RecallFitConfig):
        assert cls(method="hedgehog").method == "hedgehog"
        with pytest.raises(ValueError, match="w_min"):
            cls(w_min=1.5)

import dataclasses
import math

import pytest
import torch

from coulomb_attention.dynamics import LangevinSchedule, ParticleConfig
from coulomb_attention.train.distill import DistillConfig
from coulomb_attention.train.phases import AlignConfig, langevin_setup
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

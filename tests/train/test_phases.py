"""Phase A checkpoints after every layer and resumes exactly (issue 7: crashes lose nothing)."""

from __future__ import annotations

import copy

import pytest
import torch

from coulomb_attention.train.checkpoint import load_phase_a_partial as _load_phase_a_partial
from coulomb_attention.train.checkpoint import save_phase_a_partial as _save_phase_a_partial
from coulomb_attention.train.loop import TrainConfig, fit
from coulomb_attention.train.phases import AlignConfig, align_features
from test_train import synthetic_set, tiny_model


class Killed(Exception):
    pass


def _omegas(model):
    return [layer.omega.clone() for layer in model.attention_layers]


def test_phase_a_resumed_after_a_layer_equals_uninterrupted(tmp_path):
    data = synthetic_set(n=128)
    warm = tiny_model("favor", layers=2)
    fit(warm, data, TrainConfig(epochs=1, batch_size=16, lr=3e-3), seed=0)
    cfg = AlignConfig(n_examples=64, holdout=32, batch_size=32, steps=5, beta=1e3, lam=0.1)

    full = copy.deepcopy(warm)
    records = align_features(full, data, cfg, generator=torch.Generator().manual_seed(7))

    # Killed right after layer 0 was aligned and checkpointed.
    killed = copy.deepcopy(warm)

    def checkpoint_then_die(next_layer, recs, gen_state):
        _save_phase_a_partial(tmp_path, killed, next_layer, recs, gen_state, time_s=1.0)
        raise Killed

    with pytest.raises(Killed):
        align_features(killed, data, cfg, generator=torch.Generator().manual_seed(7),
                       on_layer_done=checkpoint_then_die)

    resumed = copy.deepcopy(warm)  # a fresh process: warm-up weights, then the checkpoint
    partial = _load_phase_a_partial(tmp_path, resumed)
    assert partial["next_layer"] == 1 and partial.pop("time_s") == 1.0
    assert torch.equal(resumed.attention_layers[0].omega, full.attention_layers[0].omega)
    assert not torch.equal(resumed.attention_layers[1].omega, full.attention_layers[1].omega)
    resumed_records = align_features(resumed, data, cfg,
                                     generator=torch.Generator().manual_seed(7), resume=partial)
    for a, b in zip(_omegas(resumed), _omegas(full), strict=True):
        assert torch.equal(a, b)
    strip = [{k: v for k, v in r.items() if k != "time_s"} for r in records]
    assert [{k: v for k, v in r.items() if k != "time_s"} for r in resumed_records] == strip


def test_corrupt_phase_a_checkpoint_names_the_file(tmp_path):
    (tmp_path / "partial.json").write_text('{"dir": "layer-001", "next_')
    with pytest.raises(ValueError, match="partial.json"):
        _load_phase_a_partial(tmp_path, tiny_model("favor"))
    assert _load_phase_a_partial(tmp_path / "absent", tiny_model("favor")) is None


def test_run_phase_a_resumes_where_the_checkpoint_left_off():
    from coulomb_attention.convert.driver import run_phase_a

    def make_fit(log):
        def fit_layer(li):
            log.append(li)
            draw = float(torch.rand(1, generator=gen))  # consumes the run's generator
            return [] if li == 1 else [{"layer": li, "draw": draw}]
        return fit_layer

    gen = torch.Generator().manual_seed(3)
    checkpoints, full_log = [], []
    full = run_phase_a(range(4), make_fit(full_log), generator=gen,
                       on_layer_done=lambda nl, rec, gs: checkpoints.append(
                           (nl, [dict(r) for r in rec], gs.clone())))
    assert full_log == [0, 1, 2, 3] and [c[0] for c in checkpoints] == [1, 2, 3, 4]
    assert [r["layer"] for r in full] == [0, 2, 3]  # a skipped layer adds no record
    assert all(r["time_s"] >= 0 for r in full)
    # resume after layer 1 (the second checkpoint): layers 0-1 are not fitted again and the
    # generator continues, so the records equal the uninterrupted run's
    nl, rec, gs = checkpoints[1]
    gen = torch.Generator().manual_seed(99)
    resumed_log = []
    resumed = run_phase_a(range(4), make_fit(resumed_log), generator=gen,
                          resume={"next_layer": nl, "records": rec, "generator_state": gs})
    assert resumed_log == [2, 3]
    assert [(r["layer"], r["draw"]) for r in resumed] == [(r["layer"], r["draw"]) for r in full]
    with pytest.raises(ValueError, match="generator"):
        run_phase_a(range(2), make_fit([]), resume={"next_layer": 1, "records": [],
                                                    "generator_state": gs})

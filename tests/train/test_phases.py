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

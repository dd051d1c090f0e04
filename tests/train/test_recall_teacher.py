"""The teacher route of associative recall: causal teacher rows (value and gradient against
the naive twin), the fit lowers the held-out row KL, the fixed baseline shares the teacher's
weights, the teacher is cached, bad configs raise."""

from __future__ import annotations

import pytest
import torch

from coulomb_attention import features
from coulomb_attention.config import from_dict
from coulomb_attention.data.mqar import MQARConfig, make_mqar
from coulomb_attention.energy import TeacherAttention, TeacherBatch, naive_teacher_value
from coulomb_attention.train import recall as lib
from coulomb_attention.train.recall_teacher import (
    RecallFitConfig,
    fit_recall_omega,
    load_teacher_weights_,
    teacher_batches,
)
from helpers import finite_diff_grad

TINY = {"task": {"vocab_size": 16, "n_pairs": 2, "seq_len": 12, "n_queries": 2},
        "model": {"vocab_size": 16, "max_len": 12, "dim": 16, "heads": 2, "mlp_dim": 16,
                  "attention": "favor", "n_features": 8, "share_features": False},
        "train": {"epochs": 1, "batch_size": 16, "lr": 1e-3},
        "teacher_train": {"epochs": 2, "batch_size": 16},
        "n_train": 96, "n_eval": 32, "init": "teacher",
        "fit": {"n_examples": 48, "holdout": 24, "batch_size": 16, "steps": 25}}


def _cfg(**over):
    base = {k: (dict(v) if isinstance(v, dict) else v) for k, v in TINY.items()}
    for k, v in over.items():
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) else v
    return from_dict(lib.RecallRunConfig, base)


def _causal_batch(gen, target=False, B=3, H=2, R=4, S=6, dh=4):
    q = torch.randn(B, H, R, dh, generator=gen, dtype=torch.float64) * 0.6
    k = torch.randn(B, H, S, dh, generator=gen, dtype=torch.float64) * 0.6
    row_pos = torch.randint(0, S, (B, R), generator=gen)
    key_mask = torch.ones(B, S, dtype=torch.bool)
    key_mask[1, 5:] = False
    row_pos[1] = row_pos[1].clamp_max(4)
    tgt = None
    if target:  # one-hot rows on a visible key
        pick = (torch.rand(B, R, generator=gen) * (row_pos + 1)).long()
        tgt = torch.nn.functional.one_hot(pick, S).double()
    return TeacherBatch(q, k, key_mask, torch.ones(B, R, dtype=torch.bool), row_pos=row_pos,
                        target=tgt)


@pytest.mark.parametrize("target", [False, True])
def test_causal_rows_match_the_naive_twin_and_finite_differences(target):
    gen = torch.Generator().manual_seed(0)
    batches = [_causal_batch(gen, target), _causal_batch(gen, target, B=2, S=5)]
    omega = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    term = TeacherAttention(features.positive, chunk_elements=40)
    value, grad, info = term.value_and_grad(omega, batches)
    kl, _ = naive_teacher_value(features.positive, omega, batches)
    assert abs(info["kl"] - kl) < 1e-10 * max(1.0, kl) and kl > 0
    fd = finite_diff_grad(lambda w: term.value_and_grad(w, batches)[0], omega)
    assert float((grad - fd).norm() / fd.norm()) < 1e-6
    # causality matters: the same rows seeing every key give another value
    full = [TeacherBatch(b.q, b.k, b.key_mask, b.row_mask, target=None if not target else
                         torch.nn.functional.one_hot(b.target.argmax(-1), b.k.shape[2]).double())
            for b in batches]
    assert abs(term.evaluate(omega, full)["kl"] - info["kl"]) > 1e-3


def test_a_one_hot_target_gives_the_cross_entropy_of_the_target_key():
    gen = torch.Generator().manual_seed(1)
    b = _causal_batch(gen, target=True, B=2, H=1)
    omega = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    phi_q, phi_k = features.positive(b.q, omega), features.positive(b.k, omega)
    kern = (phi_q @ phi_k.transpose(-1, -2)).masked_fill(~b.mask(), 0.0)  # (B, 1, R, S)
    a = kern / kern.sum(-1, keepdim=True)
    ce = -(a[:, 0] * b.target).sum(-1).log().mean()
    assert abs(TeacherAttention(features.positive).evaluate(omega, [b])["kl"] - float(ce)) < 1e-10


@pytest.mark.parametrize("objective,method", [("teacher", "langevin"), ("teacher", "adam"),
                                              ("teacher_query", "adam"),
                                              ("indicator", "adam"), ("teacher", "hedgehog")])
def test_the_fit_lowers_the_held_out_row_kl(objective, method):
    # lam 0: the data term alone (at this tiny size, KL 0.06, the default lam 10 dominates)
    cfg = _cfg(objective=objective, kernel="learned",
               fit={"method": method, "steps": 30, "lr": 0.05, "eta": 1.0, "lam": 0.0})
    train = make_mqar(cfg.task, cfg.n_train, torch.Generator().manual_seed(0))
    hold = make_mqar(cfg.task, 24, torch.Generator().manual_seed(1))
    state, _ = lib.train_teacher(cfg, train, hold)
    model = lib._new_model(cfg.model, 0)
    load_teacher_weights_(model, state)
    omega0 = model.attention_layers[-1].omega.clone()
    rec = fit_recall_omega(model, train, hold, objective, cfg.fit,
                           torch.Generator().manual_seed(2))
    assert rec["holdout_kl_after"] < 0.9 * rec["holdout_kl_before"], rec
    assert rec["kl_after"] < rec["kl_before"]
    assert not torch.equal(model.attention_layers[-1].omega, omega0)
    assert 2 <= len(rec["energy_trace"]) <= 50
    assert set(rec["energy_trace"][0]) == {"step", "energy", "data", "repulsion"}
    if method == "hedgehog":  # omega = [W; -W]
        om = model.attention_layers[-1].omega
        assert model.attention_layers[-1].feature_map == "hedgehog"
        assert torch.equal(om[:, 4:], -om[:, :4])


def test_the_weighted_fit_moves_masses_that_the_layer_then_uses():
    cfg = _cfg(objective="indicator", kernel="learned",
               fit={"method": "weighted", "steps": 30, "eta": 1.0, "tau": 0.2, "lam": 1.0})
    train = make_mqar(cfg.task, cfg.n_train, torch.Generator().manual_seed(0))
    hold = make_mqar(cfg.task, 24, torch.Generator().manual_seed(1))
    state, _ = lib.train_teacher(cfg, train, hold)
    model = lib._new_model(cfg.model, 0)
    load_teacher_weights_(model, state)
    layer = model.attention_layers[-1]
    rec = fit_recall_omega(model, train, hold, "indicator", cfg.fit,
                           torch.Generator().manual_seed(2))
    assert rec["method"] == "weighted" and rec["holdout_kl_after"] < rec["holdout_kl_before"]
    mass = layer.mass
    assert mass is not None and mass.shape == (2, 8)  # one mass per head group and particle
    assert torch.allclose(mass.sum(-1), torch.ones(2, dtype=mass.dtype), atol=1e-6)
    assert float(mass.max() / mass.min()) > 1.2 and 0 < rec["ess"] < 1
    # the record's KL is the objective of the layer as it now attends (masses included)
    hold_b = teacher_batches(model, len(model.attention_layers) - 1, hold, "indicator",
                             cfg.fit.batch_size)
    from coulomb_attention.energy import per_head

    term = TeacherAttention(per_head(layer.feature))
    kl_w = term.evaluate(layer.omega.double(), hold_b, weights=mass.double())["kl"]
    kl_u = term.evaluate(layer.omega.double(), hold_b)["kl"]
    assert abs(kl_w - rec["holdout_kl_after"]) < 1e-5 and abs(kl_u - kl_w) > 1e-4
    # the masses are part of the model's state (checkpoints) and stay put in phase B
    assert any(k.endswith(".mass") for k in model.state_dict())
    lib.fit(lib._ChannelFirst(model), train, cfg.train, seed=0)
    assert torch.equal(layer.mass, mass)


def test_query_rows_sit_at_the_query_positions_with_the_retrieval_target():
    cfg = _cfg()
    data = make_mqar(cfg.task, 8, torch.Generator().manual_seed(3))
    model = lib._new_model(cfg.model, 0)
    (b,) = teacher_batches(model, 0, data, "indicator", 8)
    assert torch.equal(b.row_pos, (data.retrieve >= 0).nonzero()[:, 1].view(8, -1))
    assert torch.equal(b.target.argmax(-1), data.retrieve.gather(1, b.row_pos))
    (full,) = teacher_batches(model, 0, data, "teacher", 8)
    assert full.q.shape[2] == 12 and full.target is None
    assert torch.equal(full.row_pos[0], torch.arange(12))


def test_fixed_and_learned_start_phase_b_from_the_same_teacher(tmp_path, monkeypatch):
    snaps = {}
    real_fit = lib.fit

    def spy(net, data, config, **kw):
        if kw.get("desc") == "phase B":
            snaps[len(snaps)] = {k: v.clone() for k, v in net.model.state_dict().items()}
        return real_fit(net, data, config, **kw)

    monkeypatch.setattr(lib, "fit", spy)
    fixed = lib.run_recall(_cfg(kernel="vanilla"), teacher_dir=tmp_path)
    learned = lib.run_recall(_cfg(kernel="learned", objective="teacher"), teacher_dir=tmp_path)
    assert not fixed["teacher"]["cached"] and learned["teacher"]["cached"]  # trained once
    other_m = lib.run_recall(_cfg(model={"n_features": 4}, kernel="vanilla"),
                             teacher_dir=tmp_path)
    assert other_m["teacher"]["cached"]  # one teacher per seed whatever M
    from safetensors.torch import load_file

    teacher = load_file(fixed["teacher"]["path"])
    omega_keys = {k for k in snaps[0] if k.endswith(".omega")}
    assert omega_keys
    for k in snaps[0]:
        if k in omega_keys:
            continue
        assert torch.equal(snaps[0][k], teacher[k]) and torch.equal(snaps[1][k], teacher[k]), k
    fresh = lib._new_model(_cfg().model, 0).state_dict()
    for k in omega_keys:  # fixed keeps the draw; the learned omega moved from the same draw
        assert torch.equal(snaps[0][k], fresh[k])
        assert not torch.equal(snaps[1][k], fresh[k])
    assert fixed["swap_accuracy"] == learned["swap_accuracy"]
    assert fixed["route"] == "teacher" and learned["route"] == "teacher+teacher+langevin"
    assert 0 <= learned["accuracy"] <= 1 and "fit_accuracy" in learned
    assert set(learned["diagnostics"]) >= {"nn_min", "nn_median", "collapsed_share",
                                           "effective_rank"}


def test_bad_teacher_route_configs_raise():
    with pytest.raises(ValueError, match="init='teacher'"):
        _cfg(init="warmup", objective="teacher")
    with pytest.raises(ValueError, match="objective"):
        _cfg(objective="nope")
    with pytest.raises(ValueError, match="hedgehog"):
        _cfg(fit={"method": "hedgehog"})  # with the token_pair objective
    with pytest.raises(ValueError, match="weighted"):
        _cfg(fit={"method": "weighted"})
    with pytest.raises(ValueError, match="w_min"):
        RecallFitConfig(method="weighted", w_min=1.5)
    with pytest.raises(ValueError, match="method"):
        RecallFitConfig(method="sgd")
    model = lib._new_model(_cfg().model, 0)
    with pytest.raises(ValueError, match="teacher weights"):
        load_teacher_weights_(model, {"embed.weight": torch.zeros(16, 16)})


def test_the_token_pair_path_keeps_its_resume_key():
    from coulomb_attention.config import to_dict
    from coulomb_attention.studies.recall import run_key as _key

    cfg = to_dict(from_dict(lib.RecallRunConfig, {"kernel": "learned",
                                                  "model": {"attention": "favor"}}))
    legacy = {k: v for k, v in cfg.items() if k not in ("init", "objective", "fit",
                                                        "teacher_train")}
    assert _key(cfg) == _key(legacy)
    routed = to_dict(from_dict(lib.RecallRunConfig, {"init": "teacher"}))
    assert _key(routed) != _key({k: v for k, v in routed.items() if k != "init"})
    assert MQARConfig().n_keys > 0


def test_the_command_lists_the_library_choices():
    from coulomb_attention.commands import recall as cmd
    from coulomb_attention.train.recall_teacher import FIT_METHODS

    assert cmd.OBJECTIVES == lib.RECALL_OBJECTIVES and cmd.FIT_METHODS == FIT_METHODS
    assert cmd.LEVELS is lib.RECALL_LEVELS


def test_tune_omega_trains_omega_in_phase_b_only_when_asked(tmp_path, monkeypatch):
    seen = []
    real_fit = lib.fit

    def omegas(model):
        return {k: v.clone() for k, v in model.state_dict().items() if k.endswith("omega")}

    def spy(net, data, config, **kw):
        if kw.get("desc") != "phase B":
            return real_fit(net, data, config, **kw)
        before = omegas(net.model)
        trainable = {n for n, p in net.model.named_parameters() if n.endswith("omega")}
        out = real_fit(net, data, config, **kw)
        seen.append((before, trainable, omegas(net.model)))
        return out

    monkeypatch.setattr(lib, "fit", spy)
    runs = [lib.run_recall(_cfg(kernel="learned", objective="indicator",
                                fit={"method": "adam"}, tune_omega=t), teacher_dir=tmp_path)
            for t in (False, True)]
    for (before, trainable, after), run, tune in zip(seen, runs, (False, True), strict=True):
        assert before and bool(trainable) == tune  # a parameter in phase B only when asked
        moved = [not torch.equal(before[k], after[k]) for k in before]
        assert all(moved) if tune else not any(moved)
        assert run["config"]["tune_omega"] is tune and 0 <= run["accuracy"] <= 1
    # the same phase A (seed, data, fit): the omega entering phase B is identical
    assert all(torch.equal(seen[0][0][k], seen[1][0][k]) for k in seen[0][0])
    with pytest.raises(ValueError, match="particles"):
        _cfg(model={"attention": "softmax"}, tune_omega=True)
    with pytest.raises(TypeError, match="tune_omega"):
        _cfg(tune_omega=1)
    with pytest.raises(ValueError, match="needs tune_omega"):
        _cfg(omega_lr_scale=10.0)
    with pytest.raises(ValueError, match="omega_lr_scale"):
        _cfg(tune_omega=True, omega_lr_scale=-1.0)


def test_tune_omega_keeps_the_resume_key_of_earlier_teacher_route_rows():
    from coulomb_attention.config import to_dict
    from coulomb_attention.studies.recall import run_key as _key

    routed = to_dict(_cfg(kernel="learned", objective="indicator"))
    assert _key(routed) == _key({k: v for k, v in routed.items() if k != "tune_omega"})
    tuned = to_dict(_cfg(kernel="learned", objective="indicator", tune_omega=True))
    assert _key(tuned) != _key(routed)
    bare = {k: v for k, v in routed.items() if k not in ("tune_omega", "omega_lr_scale")}
    assert _key(routed) == _key(bare)  # omega_lr_scale 1 leaves the key of earlier rows
    faster = to_dict(_cfg(kernel="learned", objective="indicator", tune_omega=True,
                          omega_lr_scale=10.0))
    assert _key(faster) != _key(tuned)

"""The training loop, checkpoints, the two phases and the train/suite/report commands.

Everything runs on tiny models (width 16, one or two blocks) and the shipped samples.
"""

from __future__ import annotations

import argparse
import json
import math
import os

import pytest
import torch
from torch import nn

from coulomb_attention.commands import suite
from coulomb_attention.commands import train as train_cmd
from coulomb_attention.config import override, to_dict
from coulomb_attention.data import SAMPLES_DIR
from coulomb_attention.nn.model import ModelConfig, TransformerClassifier
from coulomb_attention.reports import transformer as report
from coulomb_attention.stats import paired_difference
from coulomb_attention.train import run as pipeline
from coulomb_attention.train.checkpoint import (
    atomic_write_json,
    latest_checkpoint,
    load_checkpoint,
    load_model_file,
    optimizer_from_flat,
    optimizer_to_flat,
    save_checkpoint,
)
from coulomb_attention.train.loop import EncodedDataset, TrainConfig, fit, lr_factor, predict_proba
from coulomb_attention.train.phases import AlignConfig, align_features

TINY = {
    "warmup_epochs": 1,
    "data": {"max_length": 32, "vocab_size": 300, "train_limit": 96, "eval_limit": 48},
    "model": {"dim": 16, "layers": 1, "heads": 2, "mlp_dim": 32, "n_features": 8,
              "max_len": 32},
    "train": {"epochs": 1, "batch_size": 16, "lr": 3e-3, "eval_batch_size": 64},
    "align": {"n_examples": 64, "holdout": 32, "batch_size": 32, "steps": 4},
    "robust": {"rates": [0.2]},
}


def synthetic_set(n=96, t=10, vocab=30, seed=0) -> EncodedDataset:
    """Label 1 iff token 3 occurs: a task a one-layer model learns in a few epochs."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (n, t), generator=g)
    labels = torch.randint(0, 2, (n,), generator=g)
    pos = torch.randint(1, t // 2, (n,), generator=g)
    ids[labels == 1, pos[labels == 1]] = 3
    lengths = torch.randint(t // 2 + 1, t + 1, (n,), generator=g)
    mask = torch.arange(t)[None] < lengths[:, None]
    ids[~mask] = 0
    return EncodedDataset(ids, mask, labels)


def tiny_model(attention="favor", layers=1, seed=0) -> TransformerClassifier:
    cfg = ModelConfig(vocab_size=30, dim=16, layers=layers, heads=2, mlp_dim=32, max_len=16,
                      attention=attention, n_features=8, dropout=0.1)
    return TransformerClassifier(cfg, generator=torch.Generator().manual_seed(seed))


def _acc(model, data):
    p = predict_proba(model, data)
    return float((p.argmax(1) == data.labels).double().mean())


def test_lr_schedule():
    f = [lr_factor(s, 100, 0.1, "linear") for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[9:], f[10:], strict=False)) and f[-1] < 0.02
    c = [lr_factor(s, 100, 0.0, "cosine") for s in range(100)]
    assert c[0] == pytest.approx(1.0) and c[50] == pytest.approx(0.5, abs=0.02)
    assert lr_factor(50, 100, 0.1, "constant") == 1.0


def test_checkpoint_round_trip(tmp_path):
    model = tiny_model("softmax_feat")  # tied q/k: shared storage must round-trip
    data = synthetic_set()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = nn.functional.cross_entropy(model(data.input_ids[:8], data.attention_mask[:8]),
                                       data.labels[:8])
    loss.backward()
    opt.step()
    tensors, meta = optimizer_to_flat(opt)
    tensors["rng.torch"] = torch.get_rng_state()
    save_checkpoint(tmp_path, "epoch-001", model, {"optimizer": meta, "epoch": 1}, tensors)
    save_checkpoint(tmp_path, "epoch-002", model, {"optimizer": meta, "epoch": 2}, tensors)
    ck = latest_checkpoint(tmp_path)
    assert ck.name == "epoch-002" and not (tmp_path / "epoch-001").exists()
    fresh = tiny_model("softmax_feat", seed=5)
    load_model_file(ck / "model.safetensors", fresh)
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    assert fresh.attention_layers[0].k_proj is fresh.attention_layers[0].q_proj
    meta2, tensors2 = load_checkpoint(ck)
    opt2 = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    optimizer_from_flat(opt2, tensors2, meta2["optimizer"])
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert s1.keys() == s2.keys()
    for pid in s1:
        for key in s1[pid]:
            assert torch.equal(torch.as_tensor(s1[pid][key]), torch.as_tensor(s2[pid][key]))
    assert torch.equal(tensors2["rng.torch"], tensors["rng.torch"])
    with pytest.raises(FloatingPointError):
        atomic_write_json(tmp_path / "x.json", {"a": [1.0, math.nan]})
    assert not (tmp_path / "x.json").exists()


def test_resume_equals_uninterrupted(tmp_path):
    data = synthetic_set()
    cfg = TrainConfig(epochs=2, batch_size=16, lr=3e-3)

    def evaluate(m):
        return {"acc": _acc(m, data)}

    full = tiny_model()
    res_full = fit(full, data, cfg, seed=3, evaluate=evaluate, checkpoint_dir=tmp_path / "a")
    part = tiny_model()
    fit(part, data, cfg, seed=3, evaluate=evaluate, checkpoint_dir=tmp_path / "b", stop_after=1)
    assert json.loads((tmp_path / "b" / "latest.json").read_text())["name"] == "epoch-001"
    resumed = tiny_model(seed=9)  # different init: everything must come from the checkpoint
    res = fit(resumed, data, cfg, seed=3, evaluate=evaluate, checkpoint_dir=tmp_path / "b",
              resume=True)
    assert res.resumed_from_epoch == 1
    assert res.history == [dict(h, time_s=r["time_s"]) for h, r in
                           zip(res_full.history, res.history, strict=True)]
    for (k, a), b in zip(full.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    # A different configuration refuses to resume.
    with pytest.raises(ValueError, match="different configuration"):
        fit(tiny_model(), data, override(cfg, {"lr": 1e-2}), seed=3,
            checkpoint_dir=tmp_path / "b", resume=True)


def test_non_finite_loss_raises(tmp_path):
    class NaNModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(2))

        def forward(self, ids, mask):
            return self.w * torch.full((ids.shape[0], 2), math.nan)

    with pytest.raises(FloatingPointError, match="non-finite"):
        fit(NaNModel(), synthetic_set(), TrainConfig(epochs=1), seed=0, checkpoint_dir=tmp_path)
    assert latest_checkpoint(tmp_path) is None


def test_phase_a_raises_alignment_and_moves_only_omega():
    data = synthetic_set(n=128)
    model = tiny_model("favor", layers=2)
    fit(model, data, TrainConfig(epochs=1, batch_size=16, lr=3e-3), seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = AlignConfig(n_examples=96, holdout=32, batch_size=32, steps=10, eta=0.05,
                      eta_end=0.01, lam=0.1)
    records = align_features(model, data, cfg, generator=torch.Generator().manual_seed(0))
    assert [r["layer"] for r in records] == [0, 1]
    for r in records:
        assert r["train_after"] > r["train_before"] + 1e-4, r
        assert r["holdout_before"] is not None and math.isfinite(r["holdout_after"])
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"blocks.0.attn.omega", "blocks.1.attn.omega"}
    # Phase B: cross-entropy moves every parameter but never the particles.
    omega = {k: after[k].clone() for k in changed}
    params = {k: v.clone() for k, v in model.named_parameters()}
    fit(model, data, TrainConfig(epochs=1, batch_size=16, lr=3e-3), seed=1)
    for k in omega:
        assert torch.equal(model.state_dict()[k], omega[k])
    moved = [k for k, v in model.named_parameters() if not torch.equal(v, params[k])]
    assert "blocks.0.attn.q_proj.weight" in moved and "head.weight" in moved
    assert len(moved) >= len(params) - 2  # all but possibly untouched rows/biases


def _args(tmp_path, **kw):
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    base = dict(data_dir=str(SAMPLES_DIR), config=str(cfg), threads=None, progress="none")
    base.update({name: None for name in train_cmd.COMMON_FLAGS})
    base.update(kw)
    return argparse.Namespace(**base)


def test_train_command_writes_metrics(tmp_path):
    args = _args(tmp_path, task="sst2", attention="favor", kernel="learned", seed=0,
                 out=str(tmp_path / "run"), resume=False)
    assert train_cmd.run(args) == 0
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    for key in ("accuracy", "mcc", "f1", "ece", "log_loss", "brier", "robust", "timings",
                "reliability", "alignment", "config"):
        assert key in m, key
    assert 0 <= m["accuracy"] <= 1 and m["n_eval"] == 48
    assert set(m["robust"]) == {"delete@0.2", "unk@0.2", "swap@0.2", "advglue"}
    assert m["alignment"][0]["layer"] == 0 and len(m["reliability"]["count"]) == 15
    assert m["config"]["model"]["dim"] == 16 and m["config"]["kernel"] == "learned"
    assert m["timings"]["phase_a_s"] > 0 and m["timings"]["inference_s_per_example"] > 0
    # Without --resume an existing run directory is refused; with it, nothing is retrained.
    with pytest.raises(ValueError, match="resume"):
        train_cmd.run(args)
    args.resume = True
    assert train_cmd.run(args) == 0
    m2 = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m2["accuracy"] == m["accuracy"] and m2["history"] == m["history"]


def test_config_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": {"dimm": 3}}))
    args = _args(tmp_path, config=str(bad))
    with pytest.raises(ValueError, match="dimm"):
        train_cmd.build_config(args, {"task": "sst2"})
    with pytest.raises(ValueError, match="no particles"):
        train_cmd.build_config(_args(tmp_path), {"attention": "elu", "kernel": "learned"})
    with pytest.raises(ValueError, match="kernel"):
        train_cmd.build_config(_args(tmp_path), {"kernel": "magic"})
    cfg = train_cmd.build_config(_args(tmp_path, dim=24), {"attention": "softmax_feat"})
    assert cfg.model.dim == 24 and cfg.model.tie_qk is True and cfg.data.train_limit == 96


def test_suite_skips_finished_runs_and_report_builds(tmp_path):
    out = tmp_path / "results"
    args = _args(tmp_path, tasks=["rotten_tomatoes"], seeds=[0], rerun=False,
                 variants=["favor-vanilla", "favor-learned"], out=str(out))
    rows = suite.run_suite(args, log=lambda *a: None)
    assert [r["status"] for r in rows] == ["done", "done"]
    paths = [out / "rotten_tomatoes" / v / "seed0" / "metrics.json"
             for v in ("favor-vanilla", "favor-learned")]
    mtimes = [p.stat().st_mtime_ns for p in paths]
    # The learned run reused the vanilla run's warm-up: identical warm-up history.
    hv, hl = (json.loads(p.read_text())["history"]["warmup"] for p in paths)
    assert [h["train_loss"] for h in hv] == [h["train_loss"] for h in hl]
    rows = suite.run_suite(args, log=lambda *a: None)
    assert all(r["status"].startswith("skipped") for r in rows)
    assert [p.stat().st_mtime_ns for p in paths] == mtimes
    path = report.build_report(out)
    text = path.read_text()
    assert "| favor-learned | 1 |" in text and "| favor | 1 |" in text
    assert "Wall time: 2 run(s)" in text and "one seed of these 2 variant(s)" in text
    for name in ("reliability", "accuracy_ece", "robustness"):
        assert (out / "plots" / f"rotten_tomatoes_{name}.png").stat().st_size > 1000
    # Vocabulary provenance: metrics.json names the trainer; the report says re-runs reproduce.
    from coulomb_attention.data.tokenizer import HF_TRAINER, TRAINER

    assert json.loads(paths[0].read_text())["tokenizer"]["trainer"] == TRAINER
    assert "Vocabulary: trained deterministically" in text
    # A run written by an earlier version: no `tokenizer` key, a tokenizer.json without
    # `trainer` in its metadata (HF's trainer). The report says which runs do not reproduce.
    m = json.loads(paths[1].read_text())
    del m["tokenizer"]
    paths[1].write_text(json.dumps(m))
    tok = json.loads((paths[1].parent / "tokenizer.json").read_text())
    del tok["meta"]["trainer"]
    (paths[1].parent / "tokenizer.json").write_text(json.dumps(tok))
    assert report._tokenizer_trainer(report.load_results(out)[0]) == HF_TRAINER
    text = report.build_report(out, plots=False).read_text()
    assert "Vocabulary: 1 of 2 runs trained it with HF's WordPieceTrainer" in text
    # the run setup and the contribution line (no `none` runs here: not measured)
    assert "Processes: 1; global batch: " in text and "torch threads: " in text
    assert "Attention contribution: not measured" in text
    assert "**SHIPPED SAMPLE: 2 of 2 run(s) used the small data samples" in text  # no --data-dir
    m, lo, hi, n = paired_difference([0.8, 0.9, 0.85], [0.7, 0.8, 0.8])
    assert n == 3 and m == pytest.approx(0.0833333) and lo < m < hi


def _run(acc, ece, seed, loss=0.5):
    return {"seed": seed, "accuracy": acc, "mcc": 2 * acc - 1, "ece": ece, "log_loss": loss,
            "brier": loss / 2}


def test_report_target_lines_say_where_targets_hold_and_where_not():
    variants = {
        "softmax-vanilla": [_run(0.84, 0.08, s) for s in range(3)],
        "favor-vanilla": [_run(0.80 + 0.001 * s, 0.10, s) for s in range(3)],
        # learned: +3.5 points every seed (significant), ECE lower but noisy
        "favor-learned": [_run(0.835 + 0.001 * s, e, s) for s, e in enumerate((0.05, 0.12, 0.06))],
        "porf_softplus-learned": [_run(0.70, 0.2, 0)],  # no vanilla twin
    }
    text = "\n".join(report.target_lines("sst2", variants))
    assert "favor-learned vs favor-vanilla (3 seeds): accuracy ahead (significant)" in text
    assert "ece ahead (within noise)" in text
    assert "porf_softplus-learned vs porf_softplus-vanilla: no common seeds" in text
    # best learned 0.836 vs softmax 0.84: -0.4 points, within 1 point; ECE 0.0767 < 0.08.
    assert "best learned variant favor-learned: accuracy -0.40 points" in text
    assert "(target at most 1 point behind: met), ECE -0.0033 (target lower than softmax: met)" \
        in text
    assert ("absolute target accuracy >= 0.83 (issue 5's targets for the from-scratch "
            "classifier; docs/transformer.md): best mean 0.8400 (softmax-vanilla): met") in text
    worse = {"softmax-vanilla": [_run(0.84, 0.08, 0)], "favor-learned": [_run(0.81, 0.09, 0)],
             "favor-vanilla": [_run(0.82, 0.07, 0)]}
    text = "\n".join(report.target_lines("rotten_tomatoes", worse))
    assert "accuracy behind (one pair)" in text and "ece behind (one pair)" in text
    assert "(target at most 1 point behind: NOT met)" in text
    assert "(target lower than softmax: NOT met)" in text
    assert "best mean 0.8400 (softmax-vanilla): met" in text
    text = "\n".join(report.target_lines("sst2", {"favor-vanilla": [_run(0.8, 0.1, 0)]}))
    assert "NOT met" in text and "no learned variant" in text
    assert "QQP target, best learned ahead of softmax in accuracy: NOT met" in "\n".join(
        report.target_lines("qqp", worse))


def _write_run(root, task, att, seed, acc, **extra):
    d = root / task / f"{att}-vanilla" / f"seed{seed}"
    d.mkdir(parents=True)
    row = {"task": task, "attention": att, "kernel": "vanilla", "seed": seed, "accuracy": acc,
           "mcc": 0.0, "f1": 0.0, "ece": 0.1, "log_loss": 0.6, "brier": 0.4, **extra}
    (d / "metrics.json").write_text(json.dumps(row))


def test_report_prints_the_attention_contribution_and_sample_warning(tmp_path):
    for seed, (sm, no) in enumerate([(0.80, 0.70), (0.82, 0.71), (0.81, 0.70)]):
        _write_run(tmp_path, "easy", "softmax", seed, sm)
        _write_run(tmp_path, "easy", "none", seed, no)
    for seed, (sm, no) in enumerate([(0.80, 0.81), (0.82, 0.80), (0.81, 0.81)]):
        _write_run(tmp_path, "flat", "softmax", seed, sm, data_is_sample=True)
        _write_run(tmp_path, "flat", "none", seed, no)
    text = report.build_report(tmp_path, plots=False).read_text()
    easy, flat = text.split("## flat")[0].split("## easy")[1], text.split("## flat")[1]
    assert "paired over 3 seed(s): +0.1067 [" in easy
    assert "attention helps beyond seed noise: this task can rank kernels" in easy
    assert "within noise: this task cannot rank attention kernels" in flat
    assert "SHIPPED SAMPLE: 3 of 6 run(s)" in flat and "SHIPPED SAMPLE" not in easy
    assert "Processes: - (not recorded)" in easy


def test_checkpoints_written_before_a_config_key_existed_still_resume(tmp_path):
    """Keys added later (``embeddings``, ``model.embedding_dim``) are left out of the stored
    checkpoint config at their old value: a run written before they existed resumes."""
    cfg = train_cmd.build_config(_args(tmp_path), {"task": "sst2", "attention": "favor",
                                                   "kernel": "vanilla"})
    d = pipeline.checkpoint_config(to_dict(cfg))
    assert "embeddings" not in d and "embedding_dim" not in d["model"]
    assert pipeline.checkpoint_config({"embeddings": "minilm",
                                        "model": {"embedding_dim": 384}}) == {
        "embeddings": "minilm", "model": {"embedding_dim": 384}}
    out = tmp_path / "run"
    pipeline.run(cfg, out, data_dir=str(SAMPLES_DIR), log=lambda *_: None)
    for stage in ("warmup", "finetune"):
        ck = latest_checkpoint(out / "ckpt" / stage)
        meta = json.loads((ck / "state.json").read_text())
        assert "embeddings" not in meta["config"]["run"]  # the pre-existing format
        assert "embedding_dim" not in meta["config"]["run"]["model"]
    m = pipeline.run(cfg, out, data_dir=str(SAMPLES_DIR), resume=True,
                            log=lambda *_: None)
    assert m["config"]["embeddings"] == "scratch"  # metrics.json keeps the full config


def test_learned_run_encodes_with_the_tokenizer_of_the_warmup_it_reuses(tmp_path, monkeypatch):
    """A learned run that starts from its vanilla sibling's warm-up must take the sibling's
    tokenizer too, never train its own (HF's WordPiece trainer, used before, was not
    deterministic across processes): here every fresh training gives a different vocabulary."""
    from coulomb_attention.data import build_tokenizer

    trained = []

    def unstable(texts, vocab_size, cache_path):
        if cache_path.is_file():
            return build_tokenizer(texts, vocab_size=vocab_size, cache_path=cache_path)
        # a fresh training: two token ids swapped, differently each time (a tie broken the
        # other way), same fingerprint
        trained.append(cache_path)
        build_tokenizer(texts, vocab_size=vocab_size, cache_path=cache_path)
        d = json.loads(cache_path.read_text())
        vocab = d["tokenizer"]["model"]["vocab"]
        a, b = sorted(vocab, key=vocab.get)[40 + len(trained): 42 + len(trained)]
        vocab[a], vocab[b] = vocab[b], vocab[a]
        cache_path.write_text(json.dumps(d))
        return build_tokenizer(texts, vocab_size=vocab_size, cache_path=cache_path)

    monkeypatch.setattr(pipeline, "build_tokenizer", unstable)
    out = tmp_path / "results"
    args = _args(tmp_path, tasks=["rotten_tomatoes"], seeds=[0], rerun=False,
                 variants=["favor-vanilla", "favor-learned"], out=str(out))
    suite.run_suite(args, log=lambda *a: None)
    van, lrn = (out / "rotten_tomatoes" / v / "seed0" for v in ("favor-vanilla", "favor-learned"))
    assert trained == [van / "tokenizer.json"]
    assert (lrn / "tokenizer.json").read_bytes() == (van / "tokenizer.json").read_bytes()
    ml, mv = (json.loads((d / "metrics.json").read_text()) for d in (lrn, van))
    assert ml["config"]["model"]["vocab_size"] == mv["config"]["model"]["vocab_size"]
    # The warm-up is copied only to a run with the same tokenizer; one that already has its
    # own (different) vocabulary trains its own warm-up.
    from coulomb_attention.config import from_dict

    cfg = from_dict(pipeline.RunConfig, ml["config"])
    for name, text in (("same", (van / "tokenizer.json").read_text()),
                       ("other", (van / "tokenizer.json").read_text() + " ")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer.json").write_text(text)
        pipeline.copy_warmup(van, tmp_path / name, cfg)
    assert (tmp_path / "same" / "ckpt" / "warmup" / "latest.json").is_file()
    assert not (tmp_path / "other" / "ckpt").exists()


def test_same_seed_in_fresh_processes_gives_identical_weights(tmp_path):
    """A learned run (tokenizer training, warm-up, phase A Langevin, phase B) repeated from
    scratch in two fresh processes with different hash seeds ends with byte-identical weights
    and equal metrics: nothing depends on hash order or on state left by an earlier run."""
    import subprocess
    import sys

    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    outs = []
    for i, hash_seed in enumerate(("1", "2")):
        out = tmp_path / f"run{i}"
        cmd = [sys.executable, "-m", "coulomb_attention.cli", "train", "--task", "sst2",
               "--attention", "favor", "--kernel", "learned", "--seed", "3", "--config",
               str(cfg), "--data-dir", str(SAMPLES_DIR), "--out", str(out), "--threads", "1",
               "--no-progress"]
        subprocess.run(cmd, check=True, capture_output=True, timeout=300,
                       env={**os.environ, "PYTHONHASHSEED": hash_seed})
        outs.append(out)
    a, b = outs
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    weights = sorted(p.relative_to(a) for p in a.rglob("model.safetensors"))
    assert len(weights) >= 3  # warm-up, phase A (aligned) and fine-tune checkpoints
    for rel in weights:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in outs)
    for key in ("accuracy", "mcc", "ece", "log_loss", "brier", "robust", "history"):
        assert _untimed(ma[key]) == _untimed(mb[key]), key
    assert _untimed(ma["alignment"]) == _untimed(mb["alignment"])
    assert ma["alignment"][0]["train_after"] != ma["alignment"][0]["train_before"]  # phase A ran


def _untimed(x):
    """``x`` without the wall-time entries (keys containing 'time')."""
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if "time" not in k}
    if isinstance(x, list):
        return [_untimed(v) for v in x]
    return x


def test_omega_lr_scale_multiplies_the_particles_step_and_nothing_else():
    from coulomb_attention.nn import trainable_omega

    data = synthetic_set(n=16)
    cfg = TrainConfig(epochs=1, batch_size=16, lr=1e-2, warmup_fraction=0.0,
                      schedule="constant")
    steps = []
    for scale in (1.0, 4.0):  # one step: the same gradients, Adam's first step is lr * sign
        model = tiny_model(seed=0)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with trainable_omega(model):
            fit(model, data, cfg, seed=0, omega_lr_scale=scale)
        after = model.state_dict()
        steps.append({k: after[k] - before[k] for k in before})
    omega = [k for k in steps[0] if k.endswith("omega")]
    assert omega and all(steps[0][k].abs().max() > 0 for k in omega)
    for k in steps[0]:
        expected = 4 * steps[0][k] if k in omega else steps[0][k]
        torch.testing.assert_close(steps[1][k], expected, rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="omega_lr_scale"):
        fit(tiny_model(), data, cfg, seed=0, omega_lr_scale=0.0)

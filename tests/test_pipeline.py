"""The one run pipeline (train.run) for scratch and pretrained encoders, its config, and
``results.is_done`` (a finished run is reused only with the same configuration)."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from coulomb_attention.commands import suite
from coulomb_attention.commands import train as train_cmd
from coulomb_attention.config import to_dict
from coulomb_attention.results import (
    ConfigMismatchError,
    append_jsonl,
    atomic_write_json,
    config_diff,
    is_done,
    read_jsonl,
)
from coulomb_attention.train import run as pipeline


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny BERT checkpoint (the writer of test_pretrained)."""
    import test_pretrained

    return test_pretrained.tiny_dir.__wrapped__(tmp_path_factory)


def _args(**flags) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    train_cmd.add_arguments(parser)
    argv = []
    for k, v in flags.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return parser.parse_args(argv)


def _tiny_pretrained(encoder: str, **changes) -> pipeline.RunConfig:
    base = {"task": "sst2", "encoder": encoder, "attention": "favor", "kernel": "learned",
            "data": {"max_length": 16, "train_limit": 48, "eval_limit": 16},
            "model": {"n_features": 8},
            "train": {"epochs": 1, "batch_size": 8, "lr": 1e-3, "eval_batch_size": 16},
            "align": {"n_examples": 24, "holdout": 16, "batch_size": 24, "steps": 2},
            "distill": {"n_examples": 12, "holdout": 4, "batch_size": 6, "steps": 2,
                        "rows_per_sequence": 4},
            "robust": {"rates": [0.2], "advglue": False}}
    return pipeline.make_run_config({**base, **changes})


# ------------------------------------------------------------------------------- config


def test_pretrained_preset_lies_under_flags():
    cfg = train_cmd.build_config(_args(encoder="minilm", train_limit=300, epochs=2,
                                       n_features=32), {"task": "rotten_tomatoes"})
    assert cfg.encoder == "minilm" and cfg.data.train_limit == 300
    assert cfg.train.epochs == 2 and cfg.model.n_features == 32
    # the rest of the preset: short fine-tune, linear probe, frozen token table, no warm-up
    assert cfg.probe_init and cfg.freeze_word_embeddings and cfg.warmup_epochs == 0
    assert cfg.train.lr == pipeline.PRETRAINED_PRESET["train"]["lr"]
    # the scratch encoder keeps its own defaults
    scratch = train_cmd.build_config(_args(), {})
    assert scratch.encoder == "scratch" and not scratch.probe_init and scratch.warmup_epochs == 1


@pytest.mark.parametrize("flag, value", [("dim", 24), ("layers", 3), ("heads", 2)])
def test_pretrained_encoder_refuses_architecture_flags(flag, value):
    with pytest.raises(ValueError, match=f"{flag}.*pretrained encoder"):
        train_cmd.build_config(_args(encoder="minilm", **{flag: value}), {})


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="objective"):
        pipeline.make_run_config({"objective": "magic"})
    with pytest.raises(ValueError, match="embeddings applies to the scratch encoder"):
        pipeline.make_run_config({"encoder": "minilm", "embeddings": "minilm"})
    with pytest.raises(ValueError, match="train_limit"):
        train_cmd.build_config(_args(train_limit=0), {})
    with pytest.raises(ValueError, match="unknown key"):
        pipeline.make_run_config({"nonsense": 1})


def test_old_checkpoint_configs_still_match():
    """Keys added since checkpoints were first written are dropped at their old value, so the
    stored config of an older run equals the new one."""
    d = to_dict(pipeline.make_run_config({}))
    stored = pipeline.checkpoint_config(d)
    for key in ("encoder", "objective", "probe_init", "freeze_word_embeddings", "embeddings"):
        assert key not in stored
    assert "encoder" in pipeline.checkpoint_config({**d, "encoder": "minilm"})


# ------------------------------------------------------------------------ the pipeline


def test_pretrained_encoder_through_the_one_pipeline_and_resume(tiny_dir, tmp_path):
    """A pretrained encoder runs the same stages as the scratch one (phase A on labels, probe,
    phase B, evaluation); a second call with resume reuses every checkpoint and gives the same
    metrics; without resume an existing run is refused."""
    cfg = _tiny_pretrained(str(tiny_dir))
    assert cfg.probe_init and cfg.freeze_word_embeddings  # the preset
    out = tmp_path / "run"
    m = pipeline.run(cfg, out, log=lambda *_: None)
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["encoder"] == str(tiny_dir) and saved["n_train"] == 48
    assert saved["model_config"]["post_norm"] and saved["model_config"]["layers"] == 2
    assert len(saved["alignment"]) == 2  # one record per layer (shared omega)
    assert all(math.isfinite(m[k]) for k in ("accuracy", "ece", "log_loss", "brier"))
    assert (out / "ckpt" / "aligned" / "alignment.json").is_file()
    assert m["n_params"] - m["n_trainable_params"] >= 40 * 16  # the frozen token table
    with pytest.raises(ValueError, match="--resume"):
        pipeline.run(cfg, out, log=lambda *_: None)
    (out / "metrics.json").unlink()
    again = pipeline.run(cfg, out, resume=True, log=lambda *_: None)
    for k in ("accuracy", "mcc", "ece", "log_loss", "brier"):
        assert again[k] == m[k], k
    assert again["alignment"] == m["alignment"]


def test_pretrained_phase_a_moves_only_omega(tiny_dir, tmp_path):
    """Phase A changes the particles and nothing else (the aligned checkpoint against the
    model the pipeline starts from); a vanilla run has no phase A."""
    from coulomb_attention.nn.pretrained import load_pretrained_encoder
    from coulomb_attention.train.checkpoint import load_model_file

    learned = pipeline.run(_tiny_pretrained(str(tiny_dir)), tmp_path / "l", log=lambda *_: None)
    vanilla = pipeline.run(_tiny_pretrained(str(tiny_dir), kernel="vanilla"), tmp_path / "v",
                           log=lambda *_: None)
    assert learned["alignment"] and not vanilla["alignment"]
    assert not (tmp_path / "v" / "ckpt" / "aligned").exists()
    start = load_pretrained_encoder(str(tiny_dir), "favor", 8, num_labels=2, dropout=0.1,
                                    generator=torch.Generator().manual_seed(0))
    aligned = load_pretrained_encoder(str(tiny_dir), "favor", 8)
    load_model_file(tmp_path / "l" / "ckpt" / "aligned" / "model.safetensors", aligned)
    sa, sb = start.state_dict(), aligned.state_dict()
    moved = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert moved and all(k.endswith(".omega") for k in moved), moved


def test_teacher_objective_distils_the_softmax_attention(tiny_dir, tmp_path):
    """Phase A with the teacher objective (``minilm compare``'s softmax_align variant) runs
    through the same pipeline and lowers the row KL to the model's own softmax attention."""
    cfg = _tiny_pretrained(str(tiny_dir), objective="teacher")
    m = pipeline.run(cfg, tmp_path / "t", log=lambda *_: None)
    recs = m["alignment"]
    assert recs and m["config"]["objective"] == "teacher"
    assert all(math.isfinite(m[k]) for k in ("accuracy", "log_loss"))
    kl = [(r["kl_before"], r["kl_after"]) for r in recs]
    assert all(b is not None and a is not None and a <= b + 1e-9 for b, a in kl), kl


# --------------------------------------------------------------------------- is_done


def test_is_done_compares_the_stored_config(tmp_path):
    cfg = {"task": "sst2", "model": {"dim": 8, "vocab_size": 100}, "seed": 0}
    assert not is_done(tmp_path, cfg)
    atomic_write_json(tmp_path / "metrics.json", {"accuracy": 0.5, "config": cfg})
    assert is_done(tmp_path, cfg)
    changed = {**cfg, "model": {"dim": 16, "vocab_size": 100}}
    with pytest.raises(ConfigMismatchError, match="model.dim"):
        is_done(tmp_path, changed)
    assert not is_done(tmp_path, changed, on_mismatch="rerun")
    assert is_done(tmp_path, {**cfg, "model": {"dim": 8, "vocab_size": 7}},
                   ignore=("model.vocab_size",))
    assert config_diff({"a": [1, 2]}, {"a": [1, 3], "b": 1}) == ["a", "b"]


def test_suite_refuses_stale_results_and_reruns_on_request(tmp_path, monkeypatch):
    """A finished run of another configuration is not silently kept."""
    calls = []

    def fake_run(config, out, runtime, **kwargs):
        calls.append(config)
        atomic_write_json(out / "metrics.json", {"config": to_dict(config)})
        return {}

    from coulomb_attention.studies import suite as suite_study

    monkeypatch.setattr(suite_study, "run_pipeline", fake_run)
    parser = argparse.ArgumentParser()
    suite.add_arguments(parser)
    base = ["--tasks", "sst2", "--seeds", "0", "--variants", "favor-vanilla", "--out",
            str(tmp_path), "--no-progress"]
    suite.run_suite(parser.parse_args(base), log=lambda *_: None)
    suite.run_suite(parser.parse_args(base), log=lambda *_: None)  # same config: skipped
    assert len(calls) == 1
    with pytest.raises(ConfigMismatchError, match="n_features"):
        suite.run_suite(parser.parse_args(base + ["--n-features", "16"]), log=lambda *_: None)
    suite.run_suite(parser.parse_args(base + ["--n-features", "16", "--rerun"]),
                    log=lambda *_: None)
    assert len(calls) == 2 and calls[-1].model.n_features == 16


def test_jsonl_append_and_truncated_tail(tmp_path):
    path = tmp_path / "rows.jsonl"
    append_jsonl(path, {"a": 1})
    append_jsonl(path, {"a": 2})
    with open(path, "ab") as fh:
        fh.write(b'{"a": 3')  # a writer killed mid-line
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    read_jsonl(path, repair=True)
    append_jsonl(path, {"a": 4})
    assert [r["a"] for r in read_jsonl(path)] == [1, 2, 4]

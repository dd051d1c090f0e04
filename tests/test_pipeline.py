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
    assert len(saved["alignment"]) == 2 * 2  # one record per layer and head (untied, as convert)
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
    from coulomb_attention.nn.families.bert import load_pretrained_encoder
    from coulomb_attention.train.checkpoint import load_model_file

    learned = pipeline.run(_tiny_pretrained(str(tiny_dir)), tmp_path / "l", log=lambda *_: None)
    vanilla = pipeline.run(_tiny_pretrained(str(tiny_dir), kernel="vanilla"), tmp_path / "v",
                           log=lambda *_: None)
    assert learned["alignment"] and not vanilla["alignment"]
    assert not (tmp_path / "v" / "ckpt" / "aligned").exists()
    start = load_pretrained_encoder(str(tiny_dir), "favor", 8, num_labels=2, dropout=0.1,
                                    share_features=False,
                                    generator=torch.Generator().manual_seed(0))
    aligned = load_pretrained_encoder(str(tiny_dir), "favor", 8, share_features=False)
    load_model_file(tmp_path / "l" / "ckpt" / "aligned" / "model.safetensors", aligned)
    sa, sb = start.state_dict(), aligned.state_dict()
    moved = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert moved and all(k.endswith(".omega") for k in moved), moved


SENTENCES = ["the movie was good", "a bad film , not fun", "great", "it is not good",
             "the film was a great fun", "bad , bad movie", "it was fun", "not a film",
             "good good fun", "the bad movie is not great", "a film", "it is the movie"]


def _tiny_conversion(tiny_dir, tmp_path, *, variant="particles", seed=0, m=8):
    """A finished conversion of the tiny encoder (few steps), in a conversion cache."""
    from coulomb_attention.convert import ConvertConfig, cached_conversion
    from coulomb_attention.convert.distill import DistillConfig

    sent = tmp_path / "sentences.txt"
    sent.write_text("\n".join(SENTENCES) + "\n")
    distill = DistillConfig(n_examples=9, holdout=3, batch_size=3, rows_per_sequence=0,
                            steps=3, refine_steps=2, refine_examples=9)
    cfg = ConvertConfig(encoder=str(tiny_dir), feature_map="favor", n_features=m, seed=seed,
                        variant=variant, sentences_file=str(sent), distill=distill,
                        max_length=16)
    logs = []
    d = cached_conversion(cfg, tmp_path / "cache", log=logs.append)
    return cfg, d, logs


def test_teacher_phase_a_is_the_conversion_and_its_particles_stay_frozen(tiny_dir, tmp_path):
    """Phase A of the teacher objective is the conversion's directory: its records are the
    run's, its particles are the model's and phase B leaves them where the conversion put
    them; the cache reuses a finished conversion (same directory, no second fit)."""
    from safetensors.torch import load_file

    cfg, fresh, logs = _tiny_conversion(tiny_dir, tmp_path)
    conv = fresh.directory
    assert (conv / "result.json").is_file() and any("converting" in x for x in logs)
    _, again, logs2 = _tiny_conversion(tiny_dir, tmp_path)
    assert again.directory == conv and logs2 == [f"conversion reused: {conv}"]

    run_cfg = _tiny_pretrained(str(tiny_dir), objective="teacher")
    m = pipeline.run(run_cfg, tmp_path / "t", converted=fresh, log=lambda *_: None)
    assert m["conversion"]["dir"] == str(conv) and m["config"]["objective"] == "teacher"
    saved = [json.loads(x) for x in (conv / "records.jsonl").read_text().splitlines() if x]
    assert m["alignment"] == saved and saved
    assert all(math.isfinite(m[k]) for k in ("accuracy", "log_loss", "brier"))
    want = load_file(conv / "checkpoint" / "model.safetensors")
    final = load_file(tmp_path / "t" / "ckpt" / "finetune" / "epoch-001" / "model.safetensors")
    for layer in (0, 1):  # phase B froze the converted particles
        torch.testing.assert_close(final[f"blocks.{layer}.attn.omega"],
                                   want[f"encoder.layer.{layer}.attention.self.omega"],
                                   rtol=0, atol=0)


def test_teacher_run_converts_in_memory_and_a_cached_rerun_is_identical(tiny_dir, tmp_path):
    """``convert_cache=`` (the train command's --convert-cache): the run makes the conversion
    and fine-tunes the converted encoder in memory; a second run reuses the cached directory
    (its checkpoint read from disk) and gives the same metrics and phase-A records."""
    cfg = _tiny_pretrained(str(tiny_dir), objective="teacher",
                           distill={"n_examples": 12, "holdout": 4, "batch_size": 6, "steps": 2,
                                    "rows_per_sequence": 4, "refine_steps": 2,
                                    "refine_examples": 12})
    logs, logs2 = [], []
    a = pipeline.run(cfg, tmp_path / "a", convert_cache=tmp_path / "cache", log=logs.append)
    b = pipeline.run(cfg, tmp_path / "b", convert_cache=tmp_path / "cache", log=logs2.append)
    assert any(x.startswith("converting") for x in logs)
    assert any(x.startswith("conversion reused") for x in logs2)
    for key in ("accuracy", "log_loss", "brier", "ece"):
        assert a[key] == b[key], key
    assert json.loads(json.dumps(a["alignment"])) == b["alignment"] and b["alignment"]
    assert a["conversion"] == b["conversion"]


def test_teacher_without_or_with_a_wrong_conversion_is_refused(tiny_dir, tmp_path):
    """No conversion, a conversion of another seed or another method, a conversion given to a
    label run, a vanilla run on a converted encoder: each one line naming the problem."""
    conv = _tiny_conversion(tiny_dir, tmp_path)[1].directory
    teacher = _tiny_pretrained(str(tiny_dir), objective="teacher")
    with pytest.raises(ValueError, match="phase A of a pretrained encoder with the teacher"):
        pipeline.run(teacher, tmp_path / "a", log=lambda *_: None)
    with pytest.raises(ValueError, match="seed 0 .run: 1."):
        pipeline.run(_tiny_pretrained(str(tiny_dir), objective="teacher", seed=1),
                     tmp_path / "b", converted=conv, log=lambda *_: None)
    with pytest.raises(ValueError, match="method 'langevin' .run: 'hedgehog'."):
        pipeline.run(_tiny_pretrained(str(tiny_dir), objective="teacher",
                                      distill={"method": "hedgehog", "steps": 2}),
                     tmp_path / "c", converted=conv, log=lambda *_: None)
    with pytest.raises(ValueError, match="converted= is phase A"):
        pipeline.run(_tiny_pretrained(str(tiny_dir)), tmp_path / "d", converted=conv,
                     log=lambda *_: None)
    with pytest.raises(FileNotFoundError, match="not a finished conversion"):
        pipeline.run(teacher, tmp_path / "e", converted=tmp_path, log=lambda *_: None)
    with pytest.raises(ValueError, match="holds learned favor particles"):
        pipeline.run(_tiny_pretrained(str(conv), kernel="vanilla"), tmp_path / "f",
                     log=lambda *_: None)


def test_encoder_dir_of_a_conversion_fine_tunes_it_without_phase_a(tiny_dir, tmp_path):
    """``train --encoder DIR`` of a convert output: the checkpoint inside is the model, its
    particles are kept (no phase A records, no aligned checkpoint)."""
    conv = _tiny_conversion(tiny_dir, tmp_path)[1].directory
    m = pipeline.run(_tiny_pretrained(str(conv), objective="teacher"), tmp_path / "r",
                     log=lambda *_: None)
    assert not m["alignment"] and math.isfinite(m["accuracy"])
    assert m["timings"].get("phase_a_s", 0.0) == 0.0


def test_conversion_of_a_run_names_map_m_seed_and_method():
    from coulomb_attention.convert import conversion_key, conversion_of_run

    base = {"task": "sst2", "encoder": "minilm", "attention": "porf_softplus",
            "kernel": "learned", "objective": "teacher", "model": {"n_features": 32},
            "seed": 3}
    c = conversion_of_run(pipeline.make_run_config(base))
    assert (c.feature_map, c.n_features, c.seed, c.variant) == ("porf_softplus", 32, 3,
                                                                 "particles")
    h = conversion_of_run(pipeline.make_run_config({**base, "attention": "favor",
                                                     "distill": {"method": "hedgehog"}}))
    assert h.variant == "hedgehog" and h.distill.method == "langevin"
    assert conversion_key(c).startswith("minilm-porf_softplus-particles-M32-s3-")
    assert conversion_key(c) != conversion_key(h)
    # favor:adam, the reviewer's ablation: the same conversion fitted by plain Adam, its own
    # cache entry beside the particles' (same map, M and seed)
    from coulomb_attention.studies.minilm import parse_variant

    over = parse_variant("favor", "adam")
    a = conversion_of_run(pipeline.make_run_config({**base, **over}))
    p = conversion_of_run(pipeline.make_run_config({**base, **parse_variant("favor",
                                                                            "teacher")}))
    assert (a.variant, a.distill.method, p.distill.method) == ("particles", "adam", "langevin")
    assert conversion_key(a).startswith("minilm-favor-particles-M32-s3-")
    assert conversion_key(a) != conversion_key(p)


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


@pytest.mark.parametrize("variant", [("hedgehog", "hedgehog"), ("hedgehog", "teacher")])
def test_hedgehog_rows_fine_tune_their_conversion(tiny_dir, tmp_path, variant):
    """The Hedgehog baseline (its tied map by Adam) and particles on Hedgehog's map: each
    run's model carries the conversion's map and its rows (frozen through phase B)."""
    from safetensors.torch import load_file

    from coulomb_attention.convert import ConvertConfig, cached_conversion, conversion_of_run
    from coulomb_attention.convert.distill import DistillConfig
    from coulomb_attention.studies.minilm import parse_variant

    over = parse_variant(*variant)
    small = {"n_examples": 9, "holdout": 3, "batch_size": 3, "rows_per_sequence": 0,
             "steps": 3, "refine_steps": 2, "refine_examples": 9}
    cfg = _tiny_pretrained(str(tiny_dir), **{**over, "distill": {**over.get("distill", {}),
                                                                 **small}})
    conv_cfg = conversion_of_run(cfg)
    sent = tmp_path / "s.txt"
    sent.write_text("\n".join(SENTENCES) + "\n")
    conv_cfg = ConvertConfig(**{**conv_cfg.__dict__, "sentences_file": str(sent),
                                "max_length": 16,
                                "distill": DistillConfig(**{**conv_cfg.distill.__dict__})})
    made = cached_conversion(conv_cfg, tmp_path / "cache", log=lambda *_: None)
    conv = made.directory
    m = pipeline.run(cfg, tmp_path / "r", converted=made, log=lambda *_: None)
    assert math.isfinite(m["accuracy"]) and m["conversion"]["dir"] == str(conv)
    saved = json.loads((conv / "checkpoint" / "config.json").read_text())
    want = load_file(conv / "checkpoint" / "model.safetensors")
    final = load_file(tmp_path / "r" / "ckpt" / "finetune" / "epoch-001" / "model.safetensors")
    torch.testing.assert_close(final["blocks.0.attn.omega"],
                               want["encoder.layer.0.attention.self.omega"], rtol=0, atol=0)
    assert m["model_config"]["attention"] == "hedgehog", (saved, m["model_config"])

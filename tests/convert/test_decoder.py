"""The conversion of a causal language model (convert/decoder.py) end to end on a tiny llama:
the row KL falls, the checkpoint loads as the row it names, a finished directory is not
redone, a killed conversion resumes to the same particles, and bad rows fail in one line."""

from __future__ import annotations

import pytest
import torch

from coulomb_attention.convert import decoder as D
from coulomb_attention.convert.decoder import DecoderConfig, convert_decoder
from coulomb_attention.nn.families.llama import (
    conversion_spec,
    from_pretrained,
    save_pretrained,
)
from helpers import byte_tokenizer, tiny_llama


def _byte_tokenizer():
    return byte_tokenizer()

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    model = tiny_llama(vocab_size=256, max_positions=256)
    path = tmp_path_factory.mktemp("tiny_llama")
    save_pretrained(model, path, tokenizer=_byte_tokenizer())
    return path


def _config(model_dir, **kw):
    base = dict(model=str(model_dir), feature_map="favor", n_features=8, window=8, sinks=2,
                fit_length=64, n_docs=3, holdout=1, rows_per_sequence=16, batch_size=2,
                steps=4, window_steps=3)
    return DecoderConfig(**{**base, **kw})


def test_conversion_learns_saves_and_is_not_redone(tiny_dir, tmp_path):
    logs = []
    res = convert_decoder(_config(tiny_dir), tmp_path / "out", progress=False,
                          log=logs.append)
    assert any("shipped sample" in m for m in logs)  # no --data-dir: said loudly
    assert res["data"].startswith("sample:")
    assert res["row_kl_after"] < res["row_kl_before"]
    model = from_pretrained(tmp_path / "out" / "checkpoint")
    assert conversion_spec(model) == {"feature_map": "favor", "n_features": 8, "window": 8,
                                      "sinks": 2, "window_linear": True}
    logs.clear()
    again = convert_decoder(_config(tiny_dir), tmp_path / "out", progress=False,
                            log=logs.append)
    assert again == res and any("already converted" in m for m in logs)
    with pytest.raises(ValueError, match="another configuration"):
        convert_decoder(_config(tiny_dir, steps=5), tmp_path / "out", progress=False,
                        log=logs.append)


def test_killed_conversion_resumes_to_the_same_particles(tiny_dir, tmp_path, monkeypatch):
    convert_decoder(_config(tiny_dir, feature_map="hedgehog"), tmp_path / "whole",
                    progress=False, log=lambda m: None)
    whole = from_pretrained(tmp_path / "whole" / "checkpoint")
    save = D._save_progress

    def save_then_die(art, model, next_layer, *a, **k):
        save(art, model, next_layer, *a, **k)
        if next_layer == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(D, "_save_progress", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        convert_decoder(_config(tiny_dir, feature_map="hedgehog"), tmp_path / "cut",
                        progress=False, log=lambda m: None)
    monkeypatch.setattr(D, "_save_progress", save)
    logs = []
    convert_decoder(_config(tiny_dir, feature_map="hedgehog"), tmp_path / "cut",
                    progress=False, log=logs.append)
    assert any("resuming at layer 1" in m for m in logs)
    cut = from_pretrained(tmp_path / "cut" / "checkpoint")
    for a, b in zip(whole.attention_layers, cut.attention_layers, strict=True):
        assert torch.equal(a.omega, b.omega) and torch.equal(a.window_logit, b.window_logit)


def test_fixed_and_streaming_rows_fit_nothing(tiny_dir, tmp_path):
    fixed = convert_decoder(_config(tiny_dir, learned=False), tmp_path / "fixed",
                            progress=False, log=lambda m: None)
    stream = convert_decoder(_config(tiny_dir, linear=False), tmp_path / "stream",
                             progress=False, log=lambda m: None)
    assert fixed["row_kl_after"] is None and stream["row_kl_after"] is None
    assert "fixed" in fixed["row"] and stream["row"].startswith("streaming W=8 S=2")
    assert not from_pretrained(tmp_path / "stream" / "checkpoint").attention_layers[0] \
        .window_linear


@pytest.mark.parametrize("kw,msg", [
    (dict(window=0, sinks=4), "sinks need a window"),
    (dict(window=0, sinks=0, linear=False), "needs a window"),
    (dict(feature_map="softmax"), "unknown feature_map"),
    (dict(method="sgd"), "unknown method"),
    (dict(sinks=-1), "sinks must be an integer >= 0"),
    (dict(finish_docs=4), "go with --finish-steps"),
    (dict(finish_steps=2, finish_schedule="linear"), "unknown finish_schedule"),
    (dict(finish_steps=2, finish_clip=-1.0), "finish_clip must be >= 0"),
    (dict(finish_steps=2, finish_docs=-1), "finish_docs must be an integer >= 0"),
])
def test_bad_rows_fail_clearly(tiny_dir, kw, msg):
    with pytest.raises(ValueError, match=msg):
        _config(tiny_dir, **kw)


def test_documents_longer_than_the_model_fail(tiny_dir, tmp_path):
    with pytest.raises(ValueError, match="exceeds the model's 256 positions"):
        convert_decoder(_config(tiny_dir, fit_length=512), tmp_path / "x", progress=False,
                        log=lambda m: None)


def test_command_writes_the_hugging_face_directory(tiny_dir, tmp_path, capsys):
    from coulomb_attention.cli import main

    out = tmp_path / "cli"
    argv = ["convert", "--model", str(tiny_dir), "--feature-map", "favor", "--n-features", "8",
            "--window", "8", "--sinks", "2", "--fit-length", "64", "--docs", "3", "--holdout",
            "1", "--rows", "16", "--batch-size", "2", "--steps", "2", "--window-steps", "2",
            "--out", str(out), "--progress", "none"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "hybrid W=8 S=2 favor M=8 learned (langevin)" in printed
    cfg = (out / "hf" / "config.json").read_text()
    assert '"coulomb_llama"' in cfg and "AutoModelForCausalLM" in cfg
    assert "learned" in (out / "hf" / "README.md").read_text()
    assert main(argv) == 0 and "already converted" in capsys.readouterr().out
    assert main(["convert", "--model", str(tiny_dir), "--window", "0"]) == 2
    assert "--window must be > 0" in capsys.readouterr().err
    assert main(["convert", "--model", str(tmp_path / "none.gguf")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["convert", "--encoder", "minilm", "--sinks", "4"]) == 2
    assert "apply to --model" in capsys.readouterr().err


def test_finishing_is_its_own_row_and_lowers_the_next_token_kl(tiny_dir, tmp_path):
    """--finish-steps with LoRA: checkpoint/ keeps the transfer row, lowrank/checkpoint/ the
    finished one (adapters merged: a plain llama directory of the same row), whose next-token
    KL to the teacher on the finishing documents is lower."""
    from coulomb_attention.data import long_texts, token_documents
    from coulomb_attention.nn.families.llama import load

    cfg = _config(tiny_dir, finish_steps=8, finish_lr=0.02, finish_length=48, lora_rank=2)
    res = convert_decoder(cfg, tmp_path / "fin", progress=False, log=lambda m: None)
    assert res["finished"]["checkpoint"] == "lowrank/checkpoint"
    assert res["finished"]["lora_rank"] == 2
    transfer = from_pretrained(tmp_path / "fin" / "checkpoint")
    finished = from_pretrained(tmp_path / "fin" / "lowrank" / "checkpoint")
    assert conversion_spec(finished) == conversion_spec(transfer)
    teacher, tok = load(tiny_dir)
    docs = token_documents(tok, long_texts("train")[0], 64, n=3)[:, :48]

    def kl(model):
        with torch.no_grad():
            t = torch.log_softmax(teacher(docs), -1)
            s = torch.log_softmax(model(docs), -1)
        return float((t.exp() * (t - s)).sum(-1).mean())

    assert kl(finished) < kl(transfer)
    with pytest.raises(ValueError, match="finishing needs"):
        _config(tiny_dir, lora_rank=2)


def test_finishing_a_finished_transfer_reuses_it(tiny_dir, tmp_path):
    """A finished transfer asked for again with finishing: the transfer row is reused (its
    checkpoint unchanged), only the finishing runs; another transfer still raises."""
    out = tmp_path / "two_stages"
    convert_decoder(_config(tiny_dir), out, progress=False, log=lambda m: None)
    before = (out / "checkpoint" / "model.safetensors").read_bytes()
    logs = []
    res = convert_decoder(_config(tiny_dir, finish_steps=2, finish_length=32), out,
                          progress=False, log=logs.append)
    assert any("reusing its transfer row" in m for m in logs)
    assert res["finished"] is not None and res["config"]["finish_steps"] == 2
    assert (out / "checkpoint" / "model.safetensors").read_bytes() == before
    assert (out / "lowrank" / "checkpoint" / "config.json").is_file()
    with pytest.raises(ValueError, match="another configuration"):
        convert_decoder(_config(tiny_dir, steps=7, finish_steps=2), out, progress=False,
                        log=lambda m: None)


def test_killed_finishing_resumes_to_the_same_weights(tiny_dir, tmp_path, monkeypatch):
    """The finishing saves its resume point (parameters, Adam's moments, the generator)
    every few steps; a run killed after its first save finishes, on the same command, to the
    weights of an uninterrupted run, bit for bit."""
    from safetensors.torch import load_file

    monkeypatch.setattr(D, "FINISH_CHECKPOINT_EVERY", 2)
    cfg = _config(tiny_dir, finish_steps=5, finish_lr=0.02, finish_length=48, lora_rank=2)
    whole = convert_decoder(cfg, tmp_path / "whole", progress=False, log=lambda m: None)
    save = D._save_finishing

    def save_then_die(art, stamp, snap):
        save(art, stamp, snap)
        if snap["step"] == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(D, "_save_finishing", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        convert_decoder(cfg, tmp_path / "cut", progress=False, log=lambda m: None)
    monkeypatch.setattr(D, "_save_finishing", save)
    # the transfer row was complete before the kill: written, its finishing pending
    assert D.Artifact(tmp_path / "cut").read_result()["finished"] is None
    logs = []
    cut = convert_decoder(cfg, tmp_path / "cut", progress=False, log=logs.append)
    assert any("resuming the finishing at step 3/5" in m for m in logs)
    a = load_file(str(tmp_path / "whole" / "lowrank" / "checkpoint" / "model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "lowrank" / "checkpoint" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert cut["finished"]["kl_last10"] == whole["finished"]["kl_last10"]
    assert not (tmp_path / "cut" / "state").exists()
    # a finishing of another configuration left in state/ is not mixed in
    monkeypatch.setattr(D, "_save_finishing", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        convert_decoder(cfg, tmp_path / "other", progress=False, log=lambda m: None)
    monkeypatch.setattr(D, "_save_finishing", save)
    with pytest.raises(ValueError, match="unfinished finishing with another configuration"):
        convert_decoder(_config(tiny_dir, finish_steps=6, finish_lr=0.02, finish_length=48,
                                lora_rank=2), tmp_path / "other", progress=False,
                        log=lambda m: None)


def test_cosine_schedule_and_clipping_are_what_the_records_say(tiny_dir):
    """finish_rate: lr at the first step, lr/2 halfway, falling to 0 (closed form); the
    finishing's records carry that rate and the gradient norm before clipping, and a clip
    below every norm changes the weights (the clipped run is not the unclipped one)."""
    import math

    from coulomb_attention.data import long_texts, token_documents
    from coulomb_attention.nn.families.llama import load

    assert D.finish_rate(0.01, 0, 10, "cosine") == pytest.approx(0.01)
    assert D.finish_rate(0.01, 5, 10, "cosine") == pytest.approx(0.005)
    assert D.finish_rate(0.01, 9, 10, "cosine") == pytest.approx(
        0.005 * (1 + math.cos(math.pi * 0.9)))
    assert D.finish_rate(0.01, 7, 10, "constant") == 0.01
    with pytest.raises(ValueError, match="unknown schedule"):
        D.finish_rate(0.01, 0, 10, "step")
    teacher, tok = load(tiny_dir)
    docs = token_documents(tok, long_texts("train")[0], 48, n=3)

    def finish(clip):
        student, _ = load(tiny_dir)
        student = D._build(student, _config(tiny_dir))
        rec = D.finish_decoder(student, teacher, docs, steps=4, lr=0.02, lora_rank=2,
                               schedule="cosine", clip=clip, log=lambda m: None)
        return rec, torch.cat([a.omega.flatten() for a in student.attention_layers])

    free, w_free = finish(0.0)
    assert [r["lr"] for r in free] == pytest.approx([0.02 * (1 + math.cos(math.pi * s / 4)) / 2
                                                     for s in range(4)])
    assert all(r["grad_norm"] > 0 and math.isfinite(r["grad_norm"]) for r in free)
    clipped, w_clipped = finish(min(r["grad_norm"] for r in free) / 100)
    assert clipped[0]["grad_norm"] == pytest.approx(free[0]["grad_norm"])  # before clipping
    assert not torch.allclose(w_free, w_clipped)
    with pytest.raises(ValueError, match="clip must be >= 0"):
        D.finish_decoder(D._build(load(tiny_dir)[0], _config(tiny_dir)), teacher, docs,
                         steps=1, lr=0.01, clip=-1.0)


def test_finishing_on_spread_documents_and_old_configurations(tiny_dir, tmp_path, capsys):
    """--finish-docs finishes on that many windows spread over the training works (logged,
    counted in the result, trace kept); a result.json written before the finishing options
    existed compares equal to the same command now (the directory is left as it is)."""
    import json

    from coulomb_attention.cli import main

    out = tmp_path / "spread"
    argv = ["convert", "--model", str(tiny_dir), "--feature-map", "favor", "--n-features", "8",
            "--window", "8", "--sinks", "2", "--fit-length", "64", "--docs", "3", "--holdout",
            "1", "--rows", "16", "--batch-size", "2", "--steps", "2", "--window-steps", "2",
            "--finish-steps", "3", "--finish-length", "32", "--finish-docs", "5",
            "--finish-schedule", "cosine", "--finish-clip", "0.5", "--no-hf",
            "--out", str(out), "--progress", "none"]
    assert main(argv) == 0
    assert "finishing on 5 documents of 32 tokens spread over 2 works" in capsys.readouterr().out
    res = json.loads((out / "result.json").read_text())
    assert res["finished"]["documents"] == 5 and len(res["finished"]["trace"]) == 3
    assert res["config"]["finish_schedule"] == "cosine" and res["config"]["finish_clip"] == 0.5
    # an old directory: its config lacks the new fields (it ran with their defaults)
    old = tmp_path / "old"
    convert_decoder(_config(tiny_dir, finish_steps=2, finish_length=32), old, progress=False,
                    log=lambda m: None)
    saved = json.loads((old / "result.json").read_text())
    for k in ("finish_docs", "finish_schedule", "finish_clip"):
        del saved["config"][k]
    (old / "result.json").write_text(json.dumps(saved))
    logs = []
    convert_decoder(_config(tiny_dir, finish_steps=2, finish_length=32), old, progress=False,
                    log=logs.append)
    assert any("already converted" in m for m in logs)
    assert main(["convert", "--encoder", "minilm", "--finish-docs", "4"]) == 2
    assert "apply to --model" in capsys.readouterr().err


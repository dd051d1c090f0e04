"""What a new user sees (issue 18): the shipped-sample warning, resume feedback, file modes that
honour the umask, the process/batch record in metrics.json, clipped limits, --help defaults."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch

from coulomb_attention.cli import main
from coulomb_attention.results import (
    apply_umask,
    atomic_write_json,
    atomic_write_text,
    current_umask,
)
from coulomb_attention.train import checkpoint as ckpt
from coulomb_attention.train import run as pipeline

# a run of a few seconds on the shipped samples (no --data-dir: the case under test)
TINY = ["train", "--task", "sst2", "--attention", "favor", "--kernel", "vanilla",
        "--epochs", "1", "--warmup-epochs", "1", "--dim", "16", "--layers", "1", "--heads", "2",
        "--n-features", "8", "--train-limit", "64", "--eval-limit", "5000",
        "--vocab-size", "300", "--max-length", "16", "--batch-size", "32", "--no-progress",
        "--threads", "1", "--seed", "0"]


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def no_data_env(monkeypatch):
    monkeypatch.delenv("COULOMB_DATA_DIR", raising=False)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_current_umask_reads_the_process_umask(umask_022):
    assert current_umask() == 0o022
    os.umask(0o027)
    assert current_umask() == 0o027


def test_atomic_writes_honour_the_umask(tmp_path, umask_022):
    atomic_write_text(tmp_path / "a.txt", "x")
    atomic_write_json(tmp_path / "b.json", {"x": 1})
    atomic_write_text(tmp_path / "c.txt", "x", exclusive=True)
    for name in ("a.txt", "b.json", "c.txt"):
        assert _mode(tmp_path / name) == 0o644, name
    os.umask(0o077)
    atomic_write_text(tmp_path / "private.txt", "x")
    assert _mode(tmp_path / "private.txt") == 0o600


def test_checkpoint_folders_honour_the_umask(tmp_path, umask_022):
    model = torch.nn.Linear(2, 2)
    final = ckpt.save_checkpoint(tmp_path / "ck", "epoch-001", model, {"epoch": 1})
    assert _mode(final) == 0o755
    for f in final.iterdir():
        assert _mode(f) == 0o644, f.name
    assert _mode(tmp_path / "ck" / "latest.json") == 0o644
    d = tmp_path / "plain"
    d.mkdir(mode=0o700)
    apply_umask(d)
    assert _mode(d) == 0o755


def test_shipped_sample_resume_feedback_and_run_record(tmp_path, capsys, no_data_env,
                                                      umask_022):
    out = tmp_path / "run"
    # --resume on a folder that does not exist is an error (a mistyped --out)
    assert main([*TINY, "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "does not exist" in err and not out.exists()

    assert main([*TINY, "--out", str(out), "--resume", "auto"]) == 0
    cap = capsys.readouterr()
    assert f"nothing to resume in {out}: starting fresh" in cap.out
    # no --data-dir: loud at the start, in the summary line, on stderr after the result
    lines = cap.out.splitlines()
    warning = next(i for i, line in enumerate(lines) if line.startswith("WARNING"))
    assert "SHIPPED SAMPLE" in lines[warning]
    assert warning < next(i for i, line in enumerate(lines) if "fine-tune" in line.lower()
                          or "warm-up" in line.lower() or line.startswith("[sst2"))
    summary = [line for line in lines if line.startswith("[sst2/") and "accuracy" in line]
    assert summary and "[SHIPPED SAMPLE" in summary[-1]
    assert "SHIPPED SAMPLE" in cap.err
    # a limit above the split size is said, not silently clipped
    assert "eval_limit 5000 is more than the" in cap.out
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["data_is_sample"] is True
    assert metrics["world_size"] == 1 and metrics["global_batch_size"] == 32
    assert metrics["batch_size_per_process"] == 32 and metrics["torch_threads"] == 1
    # result files and checkpoint folders are readable by others (umask 022)
    assert _mode(out / "metrics.json") == 0o644
    assert _mode(out / "tokenizer.json") == 0o644
    last = ckpt.latest_checkpoint(out / "ckpt" / "finetune")
    assert _mode(last) == 0o755 and _mode(last / "model.safetensors") == 0o644

    assert pipeline.resume_point(out) == "after fine-tune epoch 1 (finished: re-evaluates)"
    assert main([*TINY, "--out", str(out), "--resume"]) == 0
    assert f"resuming {out} after fine-tune epoch 1" in capsys.readouterr().out


def test_resume_point_names_the_latest_stage(tmp_path):
    model = torch.nn.Linear(2, 2)
    assert pipeline.resume_point(tmp_path) is None
    ckpt.save_checkpoint(tmp_path / "ckpt" / "warmup", "epoch-002", model, {"epoch": 2})
    assert pipeline.resume_point(tmp_path) == "after warm-up epoch 2"
    ckpt.save_phase_a_partial(tmp_path / "ckpt" / "aligned", model, 1, [], torch.zeros(3), 1.0)
    assert pipeline.resume_point(tmp_path) == "in phase A, 1 layer(s) aligned"
    atomic_write_json(tmp_path / "ckpt" / "aligned" / "alignment.json",
                      {"alignment": [], "time_s": 1.0})
    assert pipeline.resume_point(tmp_path) == "after phase A"
    ckpt.save_checkpoint(tmp_path / "ckpt" / "finetune", "epoch-001", model, {"epoch": 1})
    assert pipeline.resume_point(tmp_path) == "after fine-tune epoch 1"


def test_resume_mode_is_checked(tmp_path):
    cfg = pipeline.make_run_config({})
    with pytest.raises(ValueError, match="resume must be one of"):
        pipeline.run(cfg, tmp_path, resume="yes")


def test_train_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: sst2)" in text and "(default: favor)" in text
    assert "phase-B (fine-tuning) epochs (default: 2; pretrained encoder: 1)" in text
    assert "random subset of the evaluation split (default: all)" in text
    assert "random features per head (default: 64)" in text

"""Crashes lose nothing: atomic writes, checkpoints, a SIGKILLed run resumed.

(Reliability, issue 7, issue 7; see docs/reliability.md.)
"""


from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from coulomb_attention.data.registry import SAMPLES_DIR
from coulomb_attention.train import checkpoint as ckpt
from reliability_helpers import _record, _tiny_model

# ----------------------------------------------------------------------------- crashes


def test_atomic_write_crash_keeps_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.json"
    ckpt.atomic_write_json(path, {"v": 1})

    def boom(src, dst):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(ckpt.os, "replace", boom)
    with pytest.raises(OSError, match="simulated crash"):
        ckpt.atomic_write_json(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]  # no temp left


def test_checkpoint_crash_mid_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    model = _tiny_model("elu")
    ckpt.save_checkpoint(tmp_path, "epoch-001", model, {"epoch": 1}, {"x": torch.ones(2)})
    real = ckpt.save_tensors

    def crash_on_state(path, tensors, *a, **k):
        if str(path).endswith("state.safetensors"):
            raise OSError("simulated crash while writing state.safetensors")
        return real(path, tensors, *a, **k)

    monkeypatch.setattr(ckpt, "save_tensors", crash_on_state)
    with pytest.raises(OSError, match="simulated crash"):
        ckpt.save_checkpoint(tmp_path, "epoch-002", model, {"epoch": 2}, {"x": torch.ones(2)})
    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest.name == "epoch-001"
    meta, tensors = ckpt.load_checkpoint(latest)
    assert meta == {"epoch": 1} and torch.equal(tensors["x"], torch.ones(2))
    assert not (tmp_path / "epoch-002").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


class _CrashingJson:
    """Stand-in for a module's ``json``: serialising a result dies half-way (a crash while
    the result file is being written)."""

    def __init__(self):
        self.real = json

    def __getattr__(self, name):
        return getattr(self.real, name)

    def dump(self, obj, fh, **kw):
        fh.write(self.real.dumps(obj, **kw)[:25])
        raise OSError("simulated crash while writing")

    def dumps(self, obj, **kw):
        raise OSError("simulated crash while writing")


def test_bench_langevin_result_never_half_written(tmp_path, monkeypatch):
    from coulomb_attention.bench import langevin as bl

    cfg = bl.LangevinBenchConfig(N=(4, 8), n=(8, 16), d=2, repeats=1, threads=1,
                                 dtype="float64")
    monkeypatch.setattr(bl, "plot", lambda *a, **k: None)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    assert bl.run_benchmark(cfg, tmp_path, log=lambda m: None)["rows"]
    path = tmp_path / "langevin_step.json"
    first = json.loads(path.read_text())
    monkeypatch.setattr(bl, "json", _CrashingJson())
    with pytest.raises(OSError, match="simulated crash"):
        bl.run_benchmark(cfg, tmp_path, log=lambda m: None)
    try:
        again = json.loads(path.read_text())
    except json.JSONDecodeError:
        _record("crash", "bench langevin: crash while writing langevin_step.json",
                "file left truncated (not valid JSON)")
        raise
    assert again["rows"][0]["N"] == first["rows"][0]["N"]


TRAIN_ARGS = [
    "train", "--task", "sst2", "--attention", "favor", "--kernel", "learned",
    "--epochs", "3", "--warmup-epochs", "1", "--dim", "16", "--layers", "1", "--heads", "2",
    "--n-features", "8", "--train-limit", "256", "--eval-limit", "64", "--align-steps", "5",
    "--align-examples", "64", "--vocab-size", "300", "--max-length", "32",
    "--batch-size", "16", "--no-progress", "--threads", "1", "--seed", "3",
    "--data-dir", str(SAMPLES_DIR),
]


def _comparable(metrics: dict) -> dict:
    """metrics.json without wall times (which differ between runs)."""
    drop = {"timings", "time_s", "train_time_s"}

    def clean(obj):
        if isinstance(obj, dict):
            return {k: clean(v) for k, v in obj.items() if k not in drop}
        if isinstance(obj, list):
            return [clean(v) for v in obj]
        return obj

    return clean(metrics)


@pytest.mark.slow
def test_train_killed_with_sigkill_and_resumed_matches_uninterrupted(tmp_path, capsys):
    """`train` killed by SIGKILL right after its first fine-tuning checkpoint, then rerun with
    --resume, ends with exactly the metrics.json (minus wall times) of an uninterrupted run."""
    from coulomb_attention.cli import main

    killed = tmp_path / "killed"
    small = tmp_path / "small.json"  # fewer robustness evaluations (not under test here)
    small.write_text(json.dumps({"robust": {"kinds": ["delete"], "rates": [0.2],
                                            "advglue": False}}))
    args = [*TRAIN_ARGS, "--config", str(small)]
    env = {k: v for k, v in os.environ.items() if k != "COULOMB_DATA_DIR"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "coulomb_attention.cli", *args,
                             "--out", str(killed)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    threads = torch.get_num_threads()
    first = killed / "ckpt" / "finetune" / "latest.json"
    watch = {}

    def kill_after_first_checkpoint():
        deadline = time.monotonic() + 240
        while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        watch["seen"] = first.exists()
        proc.send_signal(signal.SIGKILL)

    watcher = threading.Thread(target=kill_after_first_checkpoint, daemon=True)
    watcher.start()
    try:
        # HF's WordPiece trainer breaks frequency ties in per-process hash order (docs/data.md),
        # so the reference uses the killed run's tokenizer file (its cache is keyed by the texts)
        tok = killed / "tokenizer.json"
        deadline = time.monotonic() + 240
        while not tok.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tok.exists(), f"no tokenizer written: {proc.stderr.read().decode()[-2000:]}"
        time.sleep(0.2)  # written atomically; let the writer finish its rename
        (tmp_path / "reference").mkdir()
        (tmp_path / "reference" / "tokenizer.json").write_bytes(tok.read_bytes())
        # the uninterrupted reference runs in this process meanwhile (same --threads 1)
        assert main([*args, "--out", str(tmp_path / "reference")]) == 0
        watcher.join(240)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        torch.set_num_threads(threads)
    assert watch.get("seen"), f"no checkpoint appeared: {proc.stderr.read().decode()[-2000:]}"
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "metrics.json").exists(), "the run finished before it was killed"
    state = json.loads((ckpt.latest_checkpoint(killed / "ckpt" / "finetune")
                        / "state.json").read_text())
    killed_at = state["epoch"]
    assert killed_at < 3
    try:
        assert main([*args, "--out", str(killed), "--resume"]) == 0
    finally:
        torch.set_num_threads(threads)
    ref = json.loads((tmp_path / "reference" / "metrics.json").read_text())
    res = json.loads((killed / "metrics.json").read_text())
    assert _comparable(res) == _comparable(ref)
    assert len(res["history"]["finetune"]) == 3
    capsys.readouterr()
    _record("crash", "train killed by SIGKILL after fine-tuning epoch "
            f"{killed_at} of 3, rerun with --resume",
            f"metrics.json identical to the uninterrupted run except wall times (accuracy "
            f"{res['accuracy']:.4f}, log_loss {res['log_loss']:.6f}); test wall time "
            f"{time.perf_counter() - t0:.0f} s")



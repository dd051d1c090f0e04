"""Untrusted files: crafted pickles are never executed; checkpoints are safetensors + JSON.

(Reliability, issue 7, issue 7; see docs/reliability.md.)
"""


from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from coulomb_attention.train import checkpoint as ckpt
from coulomb_attention.train.loop import TrainConfig, fit
from reliability_helpers import (
    USER_ERRORS,
    _describe,
    _record,
    _tiny_dataset,
    _tiny_model,
    assert_user_error,
)

# ----------------------------------------------------------------------------- untrusted files


class _Evil:
    """Unpickling this object runs ``touch MARKER`` (what a malicious checkpoint would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil_pickle(marker: Path) -> bytes:
    return pickle.dumps({"weight": _Evil(marker)})


def _evil_torch_zip(path: Path, marker: Path) -> None:
    torch.save({"weight": _Evil(marker)}, path)  # torch's zip format with a pickle inside


def _loaders(tmp_path: Path, payload_writer):
    """(name, callable) for each project loader, with the crafted file where it reads."""
    out = []
    # 1. model weights of a checkpoint
    d1 = tmp_path / "model"
    d1.mkdir()
    payload_writer(d1 / "model.safetensors")
    out.append(("checkpoint model.safetensors (load_model_file)",
                lambda: ckpt.load_model_file(d1 / "model.safetensors", _tiny_model("elu"))))
    # 2. optimizer/RNG state of a training checkpoint, found through latest.json
    root = tmp_path / "ckpt"
    ckpt.save_checkpoint(root, "epoch-001", _tiny_model("elu"), {"epoch": 1},
                         {"x": torch.ones(1)})
    payload_writer(root / "epoch-001" / "state.safetensors")
    out.append(("checkpoint state.safetensors (load_checkpoint)",
                lambda: ckpt.load_checkpoint(ckpt.latest_checkpoint(root))))
    # 3. resuming training from that checkpoint
    out.append(("fit(resume=True) on that checkpoint",
                lambda: fit(_tiny_model(), _tiny_dataset(), TrainConfig(epochs=2), seed=0,
                            checkpoint_dir=root, resume=True)))
    # 4. a pretrained BERT/MiniLM directory with pytorch_model.bin
    from coulomb_attention.nn.families import bert as pretrained

    d4 = tmp_path / "bert"
    d4.mkdir()
    (d4 / "config.json").write_text(json.dumps({  # a valid config, so the weights are read
        "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 32, "vocab_size": 50, "max_position_embeddings": 16}))
    payload_writer(d4 / "pytorch_model.bin")
    out.append(("pretrained pytorch_model.bin (load_bert_state_dict)",
                lambda: pretrained.load_bert_state_dict(d4)))
    return out


@pytest.mark.parametrize("fmt", ("raw pickle", "torch.save zip"))
def test_crafted_pickle_is_never_executed(tmp_path, fmt):
    marker = tmp_path / "PWNED"

    def write(path: Path) -> None:
        if fmt == "raw pickle":
            path.write_bytes(_evil_pickle(marker))
        else:
            _evil_torch_zip(path, marker)

    assert not marker.exists()
    for name, load in _loaders(tmp_path, write):
        try:
            load()
        except Exception as exc:  # noqa: BLE001 (the loader must refuse; which error is below)
            _record("untrusted file", f"{fmt} as {name}", f"refused, {_describe(exc)}; "
                    f"marker file created: {marker.exists()}")
        else:
            _record("untrusted file", f"{fmt} as {name}", "loaded without error")
            pytest.fail(f"{name}: a crafted pickle loaded without error")
        assert not marker.exists(), f"{name}: unpickling executed code"


def test_crafted_checkpoint_gives_clear_error(tmp_path):
    marker = tmp_path / "PWNED"
    for name, load in _loaders(tmp_path, lambda p: p.write_bytes(_evil_pickle(marker)))[:3]:
        assert_user_error("untrusted file", f"clear error: {name}", load, (ValueError,),
                     r"safetensors|\.safetensors")


def test_crafted_pretrained_bin_gives_clear_error(tmp_path):
    marker = tmp_path / "PWNED"
    name, load = _loaders(tmp_path, lambda p: p.write_bytes(_evil_pickle(marker)))[3]
    exc = assert_user_error("untrusted file", f"clear error: {name}", load, (ValueError,),
                       "pytorch_model.bin")
    assert "weights_only=False" not in str(exc)


def test_corrupt_checkpoint_json_names_the_file(tmp_path):
    root = tmp_path / "ckpt"
    ckpt.save_checkpoint(root, "epoch-001", _tiny_model("elu"), {"epoch": 1})
    (root / "latest.json").write_text('{"name": "epo')  # torn write by an older tool
    assert_user_error("crash", "truncated latest.json", lambda: ckpt.latest_checkpoint(root),
                 USER_ERRORS, "latest.json")


def test_particles_round_trip_through_safetensors_only(tmp_path):
    """Learned particles travel in the model's safetensors file, bit-exact, and loading checks
    keys (a file of another architecture is refused)."""
    model = _tiny_model("favor")
    layer = model.attention_layers[0]
    layer.load_features_(torch.randn(8, 8, generator=torch.Generator().manual_seed(5)))
    ckpt.save_model_file(tmp_path / "m.safetensors", model)
    other = _tiny_model("favor", seed=1)
    ckpt.load_model_file(tmp_path / "m.safetensors", other)
    assert torch.equal(other.attention_layers[0].omega, layer.omega)
    with pytest.raises(RuntimeError, match="Missing key|Unexpected key|size mismatch"):
        ckpt.load_model_file(tmp_path / "m.safetensors", _tiny_model("elu"))
    with pytest.raises(FileNotFoundError, match="no model file"):
        ckpt.load_model_file(tmp_path / "absent.safetensors", other)



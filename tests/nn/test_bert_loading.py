"""Checkpoint reading errors of nn.families.bert: each bad file raises one ValueError naming it."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from coulomb_attention.nn.families.bert import (
    check_vocabulary,
    load_bert_state_dict,
    read_bert_config,
)
from test_pretrained import TINY, write_tiny_bert


@pytest.fixture()
def tiny(tmp_path):
    return write_tiny_bert(tmp_path)


def _to_safetensors(directory):
    state = torch.load(directory / "pytorch_model.bin", weights_only=True)
    (directory / "pytorch_model.bin").unlink()
    save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"))
    return state


@pytest.mark.parametrize("keep", [0.5, 0.99, 8 / 10_000])
def test_cut_safetensors_is_one_value_error(tiny, keep):
    state = _to_safetensors(tiny)
    assert load_bert_state_dict(tiny).keys() >= {k.replace("gamma", "weight") for k in state
                                                 if "gamma" in k}
    path = tiny / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: max(1, int(len(data) * keep))])
    with pytest.raises(ValueError, match="not a readable safetensors file") as exc:
        load_bert_state_dict(tiny)
    assert str(path) in str(exc.value)


def test_garbage_safetensors_and_cut_bin(tiny):
    data = (tiny / "pytorch_model.bin").read_bytes()
    (tiny / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load_bert_state_dict(tiny)
    (tiny / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_bert_state_dict(tiny)


def test_non_bert_configs_and_vocabulary(tiny):
    (tiny / "config.json").write_text(json.dumps({**TINY, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not a BERT-family encoder"):
        read_bert_config(tiny)
    (tiny / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        read_bert_config(tiny)
    cfg = {k: v for k, v in TINY.items() if k != "model_type"}  # old configs: accepted
    (tiny / "config.json").write_text(json.dumps(cfg))
    assert read_bert_config(tiny)["hidden_size"] == TINY["hidden_size"]
    assert check_vocabulary(tiny, TINY["vocab_size"]) == TINY["vocab_size"]
    with pytest.raises(ValueError, match="40 tokens but the word embeddings have 41 rows"):
        check_vocabulary(tiny, 41)
    (tiny / "vocab.txt").unlink()
    with pytest.raises(FileNotFoundError, match="no vocab.txt"):
        check_vocabulary(tiny, 40)

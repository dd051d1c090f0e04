"""Decoding a converted llama in constant memory: for every row (exact softmax, pure linear per
map, the window + sinks hybrid, StreamingLLM), 1,000 token steps after a prefill equal one
parallel forward over the whole sequence (logits to 1e-5), the linear rows' state does not grow
with the context, and a converted model saves and loads (safetensors) to the same logits."""

from __future__ import annotations

import pytest
import torch

from coulomb_attention.nn.families.llama import (
    LlamaForCausalLM,
    conversion_spec,
    convert_attention_,
    from_pretrained,
    save_pretrained,
)
from helpers import tiny_llama

ROWS = {
    "teacher": None,
    "favor": dict(feature_map="favor"),
    "hedgehog": dict(feature_map="hedgehog"),
    "softmax_feat": dict(feature_map="softmax_feat"),
    "hybrid_favor": dict(feature_map="favor", window=8, sinks=2),
    "hybrid_hedgehog": dict(feature_map="hedgehog", window=8, sinks=2),
    "streamingllm": dict(feature_map="favor", window=8, sinks=2, linear=False),
}


def _model(row: str, seed: int = 0) -> LlamaForCausalLM:
    return tiny_llama(seed, row=ROWS[row], window_logits=True)


@pytest.mark.parametrize("row", sorted(ROWS))
def test_thousand_steps_after_a_prefill_equal_the_parallel_forward(row):
    model = _model(row)
    ids = torch.randint(0, 64, (1, 1032), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(ids)  # (1, 1032, V): the chunked parallel form
        logits, states = model(ids[:, :32], output_states=True)
        parts = [logits]
        for t in range(32, ids.shape[1]):
            logits, states = model(ids[:, t:t + 1], states=states, output_states=True)
            parts.append(logits)
    steps = torch.cat(parts, 1)
    assert states[0].position == 1032
    err = (steps - full).abs().max().item()
    assert err < 1e-5, f"{row}: max |logit difference| {err:.2e}"


@pytest.mark.parametrize("row", [r for r in sorted(ROWS) if r != "teacher"])
def test_state_size_does_not_depend_on_the_context(row):
    model = _model(row)
    ids = torch.randint(0, 64, (2, 400), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, short = model(ids[:, :50], output_states=True)
        _, long = model(ids, output_states=True)
    assert model.state_bytes(short) == model.state_bytes(long) > 0


def test_teacher_cache_grows_with_the_context():
    model = _model("teacher")
    ids = torch.randint(0, 64, (1, 400), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, short = model(ids[:, :50], output_states=True)
        _, long = model(ids, output_states=True)
    assert model.state_bytes(long) == 8 * model.state_bytes(short)


@pytest.mark.parametrize("row", ["hybrid_favor", "hedgehog", "streamingllm"])
def test_converted_model_saves_and_loads(tmp_path, row):
    model = _model(row)
    save_pretrained(model, tmp_path)
    back = from_pretrained(tmp_path)
    assert conversion_spec(back) == conversion_spec(model) is not None
    ids = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(back(ids), model(ids))


def test_conversion_rejects_bad_rows(tmp_path):
    model = _model("teacher")
    with pytest.raises(ValueError, match="window must be > 0"):
        convert_attention_(model, "favor", window=-1)
    with pytest.raises(ValueError, match="sinks must be an integer >= 0"):
        convert_attention_(_model("teacher"), "favor", window=8, sinks=-1)
    with pytest.raises(ValueError, match="need a window"):
        convert_attention_(_model("teacher"), "favor", sinks=4)
    with pytest.raises(ValueError, match="unknown feature_map"):
        convert_attention_(_model("teacher"), "nope")
    save_pretrained(_model("favor"), tmp_path)
    cfg = (tmp_path / "config.json").read_text().replace('"coulomb_attention"', '"other"')
    (tmp_path / "config.json").write_text(cfg)
    with pytest.raises(ValueError, match="no 'coulomb_attention' section"):
        from_pretrained(tmp_path)

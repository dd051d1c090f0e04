"""coulomb-attention generate on tiny random llamas saved with a byte-level tokenizer: the
streamed tokens are greedy_generate's (teacher and converted rows), sampling is reproducible
and stays inside the nucleus, the stats line compares the state with the KV cache, and bad
input exits 2 with one line."""

from __future__ import annotations

import math

import pytest
import torch

from coulomb_attention.cli import main
from coulomb_attention.commands import generate as gen_cmd
from coulomb_attention.nn.families.llama import (
    LlamaConfig,
    LlamaForCausalLM,
    convert_attention_,
    save_pretrained,
)
from helpers import byte_tokenizer

PROMPT = "The particles repel"


def _tokenizer():
    return byte_tokenizer()


def _model(row: str | None = None, max_positions: int = 64) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=48, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, max_positions=max_positions)
    model = LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.2 if name.endswith("norm.weight") else 1 / math.sqrt(p.shape[-1])
            p.copy_(name.endswith("norm.weight") + scale * torch.randn(p.shape, generator=g))
    if row == "hybrid":
        convert_attention_(model, "favor", 8, window=4, sinks=2, generator=1)
    elif row == "favor":
        convert_attention_(model, "favor", 8, generator=1)
    return model


@pytest.fixture(params=[None, "hybrid", "favor"], ids=["teacher", "hybrid", "favor"])
def saved(request, tmp_path):
    model = _model(request.param)
    save_pretrained(model, tmp_path, tokenizer=_tokenizer())
    return model, tmp_path


def test_streams_the_greedy_tokens(saved, capsys):
    model, path = saved
    tok = _tokenizer()
    ids = torch.tensor([tok.encode(PROMPT).ids])
    want = model.greedy_generate(ids, 30)[0, ids.shape[1]:].tolist()
    got = list(gen_cmd.stream_tokens(model, ids, 30))
    assert got == want
    assert main(["generate", str(path), "--prompt", PROMPT, "--max-new-tokens", "30"]) == 0
    out, err = capsys.readouterr()
    assert out == tok.decode(want) + "\n"
    assert "tokens/s" in err and "vs the original's KV cache" in err
    kv = gen_cmd.kv_cache_bytes(model.config, ids.shape[1] + 29) / 2**20
    assert f"KV cache {kv:.2f} MB" in err


def test_state_line_is_constant_for_converted_rows(tmp_path, capsys):
    save_pretrained(_model("hybrid"), tmp_path, tokenizer=_tokenizer())
    lines = []
    for n in ("5", "80"):  # 80 + the prompt: past the teacher's 64 positions
        assert main(["generate", str(tmp_path), "--prompt", PROMPT, "--max-new-tokens", n]) == 0
        lines.append(capsys.readouterr().err)
    sizes = [line.split("constant-size state ")[1].split(" MB")[0] for line in lines]
    assert sizes[0] == sizes[1]


def test_sampling_is_seeded_and_inside_the_nucleus():
    logits = torch.tensor([[4.0, 3.9, 0.0, -1.0, -5.0]])
    # p = 0.518, 0.469, 0.009, ...: top-p 0.9 keeps tokens 0 and 1, top-p 0.5 token 0 alone
    draws = {int(gen_cmd.next_token(logits, 1.0, 0.9, torch.Generator().manual_seed(s)))
             for s in range(50)}
    assert draws == {0, 1}
    assert {int(gen_cmd.next_token(logits, 1.0, 0.5, torch.Generator().manual_seed(s)))
            for s in range(20)} == {0}
    assert int(gen_cmd.next_token(logits)) == 0
    model, tok = _model(), _tokenizer()
    ids = torch.tensor([tok.encode(PROMPT).ids])
    runs = [list(gen_cmd.stream_tokens(model, ids, 12, temperature=1.5, top_p=0.9,
                                       generator=torch.Generator().manual_seed(7)))
            for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 12


def test_stops_at_eos():
    model, tok = _model(), _tokenizer()
    ids = torch.tensor([tok.encode(PROMPT).ids])
    greedy = list(gen_cmd.stream_tokens(model, ids, 10))
    stopped = list(gen_cmd.stream_tokens(model, ids, 10, eos_token_id=(999, greedy[3])))
    assert stopped == greedy[:greedy.index(greedy[3]) + 1]


@pytest.mark.parametrize("argv, message", [
    (["--temperature", "-0.5"], "--temperature must be"),
    (["--top-p", "0"], "--top-p must lie in"),
    (["--max-new-tokens", "-1"], "--max-new-tokens must be >= 0"),
])
def test_bad_flags_exit_2(saved, capsys, argv, message):
    _, path = saved
    assert main(["generate", str(path), "--prompt", PROMPT, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_missing_source_and_long_prompt_exit_2(tmp_path, capsys):
    assert main(["generate", str(tmp_path / "nope"), "--prompt", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err
    save_pretrained(_model(), tmp_path, tokenizer=_tokenizer())
    assert main(["generate", str(tmp_path), "--prompt", "y" * 70, "--max-new-tokens", "0"]) == 2
    err = capsys.readouterr().err
    assert "exceed the softmax model's 64 positions" in err and len(err.splitlines()) == 1
    assert main(["generate", str(tmp_path), "--prompt", "y" * 60, "--max-new-tokens", "10"]) == 2
    assert main(["generate", str(tmp_path), "--prompt", ""]) == 2
    assert "empty" in capsys.readouterr().err.splitlines()[-1]

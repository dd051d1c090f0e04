"""bench decoder on tiny random llamas: every row and cell in one table, the converted rows'
state constant in the context and the teacher's KV cache growing as the config says, the
prefill without the prompt's logits equal to the model's forward, verdicts and their refusal on
a busy machine, and the command's files. No timing is asserted."""

from __future__ import annotations

import json

import pytest
import torch

from coulomb_attention.bench import decoder as bd
from coulomb_attention.cli import main
from coulomb_attention.commands import bench_decoder as cmd
from coulomb_attention.nn.families.llama import LlamaConfig

TINY = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=8, max_positions=128)


def _cfg(**kw) -> bd.DecoderBenchConfig:
    base = dict(lengths=(48, 96, 256), batches=(1, 2), decode_steps=3, warmup_steps=1,
                prefill_repeats=1, n_features=8, window=8, sinks=2, threads=1)
    return bd.DecoderBenchConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_decoder")
    s = bd.run_benchmark(_cfg(), out, model=bd.random_model(TINY, 0), log=lambda m: None)
    return s, out


def test_table_has_every_row_and_cell(summary):
    s, _ = summary
    got = {(r["row"], r["L"], r["B"]) for r in s["rows"]}
    want = {(row, L, B) for row in bd.ROWS for L in (48, 96, 256) for B in (1, 2)
            if not (row == "teacher" and L > TINY.max_positions)}
    assert got == want
    for r in s["rows"]:
        assert "error" not in r, r
        assert r["prefill_s"] > 0 and r["decode_ms"] > 0 and r["tokens_per_s"] > 0
        assert r["prefill_tokens"] == r["L"] - 4
        if r["row"] != "teacher" and r["L"] <= TINY.max_positions:
            assert r["decode_speedup"] > 0 and r["prefill_ratio"] > 0


def test_converted_state_is_constant_and_the_kv_cache_grows(summary):
    s, _ = summary
    by = {(r["row"], r["L"], r["B"]): r for r in s["rows"]}
    for B in (1, 2):
        teacher = [by["teacher", L, B]["state_bytes"] for L in (48, 96)]
        assert teacher == [bd.kv_cache_bytes(TINY, L, B) for L in (48, 96)]
        assert teacher[1] == 2 * teacher[0]
        for row in ("hybrid_hedgehog", "hybrid_favor", "favor"):
            sizes = {by[row, L, B]["state_bytes"] for L in (48, 96, 256)}
            assert len(sizes) == 1 and sizes.pop() > 0, row
            assert by[row, 256, B]["state_over_kv"] < by[row, 48, B]["state_over_kv"]
    assert by["favor", 48, 2]["state_bytes"] == 2 * by["favor", 48, 1]["state_bytes"]


def test_files_hold_the_table(summary):
    s, out = summary
    back = json.loads((out / "results.json").read_text())
    assert back["rows"] == s["rows"] and back["threads"] == 1 and back["complete"] is True
    md = (out / "results.md").read_text()
    assert md.count("\n| hybrid_favor |") == 6 and md.count("\n| teacher |") == 4
    assert "load average" in md
    assert "No verdict: the targets need the teacher and L = 8192" in md


def test_decode_steps_are_interleaved_across_rows():
    """A cell prefills each row in turn, then takes step i of every row before step i + 1 of
    any (so drifting load hits every row alike); a row past the teacher's positions is left
    out of the cell, the others still run."""
    teacher = bd.random_model(TINY, 0)
    cfg = _cfg(decode_steps=3, warmup_steps=1)
    models = {r: teacher if bd.ROWS[r] is None else bd._converted(teacher, bd.ROWS[r], cfg)
              for r in ("teacher", "hybrid_hedgehog", "favor")}
    calls = []
    for name, m in models.items():
        m.register_forward_pre_hook(
            lambda mod, args, kwargs, name=name: calls.append(name), with_kwargs=True)
    rows = bd._cell(models, 48, 1, cfg, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert calls == ["teacher", "hybrid_hedgehog", "favor"] * 4  # the prefills call no forward
    assert [r["row"] for r in rows] == list(models)
    assert all(r["prefill_tokens"] == 44 and r["decode_ms"] > 0 for r in rows)
    calls.clear()
    long = bd._cell(models, 200, 1, cfg, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert [r["row"] for r in long] == ["hybrid_hedgehog", "favor"]
    assert calls == ["hybrid_hedgehog", "favor"] * 4


def test_prefill_equals_the_forward_without_the_prompt_logits():
    model = bd.random_model(TINY, 1)
    ids = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full, states = model(ids, output_states=True)
    last, ours = bd.prefill(model, ids)
    torch.testing.assert_close(last, full[:, -1], rtol=1e-5, atol=1e-5)
    assert [s.position for s in ours] == [30] * 2
    assert model.state_bytes(ours) == model.state_bytes(states)
    with pytest.raises(ValueError, match="exceed max_positions"):
        bd.prefill(model, torch.zeros(1, 129, dtype=torch.long))


def _rows(speedup, state, prefill):
    return [{"row": "teacher", "L": 8192, "B": 1},
            {"row": "favor", "L": 8192, "B": 1, "decode_speedup": speedup,
             "state_over_kv": state, "prefill_ratio": prefill}]


def test_verdicts_apply_the_issue_targets():
    ok = bd.verdicts(_rows(2.0, 0.05, 1.0))
    assert [t["pass"] for t in ok] == [True, True, True]
    bad = bd.verdicts(_rows(1.99, 0.051, 1.01))
    assert [t["pass"] for t in bad] == [False, False, False]
    assert bd.verdicts(_rows(3, 0.01, 0.5), length=2048) == []


def test_no_verdict_on_a_busy_machine():
    cfg = _cfg(lengths=(512, 8192), threads=2)
    busy = bd._withheld(cfg, cores=2, load_start=(2.5, 2, 2), load_end=(4.0, 3, 3))
    assert busy is not None and "busy" in busy and "2.50" in busy
    assert bd._withheld(cfg, cores=8, load_start=(1.0, 1, 1), load_end=(3.0, 1, 1)) is None
    assert bd._withheld(cfg, cores=8, load_start=(6.5, 1, 1), load_end=(3.0, 1, 1))
    assert "need the teacher" in bd._withheld(_cfg(), 8, (0, 0, 0), (0, 0, 0))


def test_random_model_has_smollm2_shapes_without_gguf():
    cfg = LlamaConfig(**bd.SMOLLM2_SHAPES)
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (30, 9, 3, 64)
    assert bd.kv_cache_bytes(cfg, 8192) == 2 * 30 * 3 * 64 * 8192 * 4
    a, b = bd.random_model(TINY, 3), bd.random_model(TINY, 3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert a.lm_head.weight.std() > 0.01


def test_config_rejects_bad_grids():
    with pytest.raises(ValueError, match="unknown rows"):
        _cfg(rows=("teacher", "nope"))
    with pytest.raises(ValueError, match="leave no prompt"):
        _cfg(lengths=(4,))
    with pytest.raises(ValueError, match="batches must be positive"):
        _cfg(batches=(0,))


def test_command_defaults_match_the_library():
    assert cmd.ROW_NAMES == tuple(bd.ROWS) and cmd.DTYPE_NAMES == tuple(bd.DTYPES)
    cfg = bd.DecoderBenchConfig()
    assert list(cfg.lengths) == cmd.DEFAULTS["lengths"]
    assert list(cfg.batches) == cmd.DEFAULTS["batches"]
    assert cfg.decode_steps == cmd.DEFAULTS["decode_steps"]


def test_command_bad_input_exits_2(capsys):
    assert main(["bench", "decoder", "--random", "--lengths", "2"]) == 2
    assert "leave no prompt" in capsys.readouterr().err
    assert main(["bench", "decoder", "--random", "--device", "cuda:9"]) == 2 or \
        torch.cuda.is_available()

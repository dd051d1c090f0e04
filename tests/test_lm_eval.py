"""The causal-LM evaluation (issue 47, item 5) on a tiny random llama with a byte-level
tokenizer: the chunked losses equal one parallel forward's cross-entropy for every row, the
position buckets and the repeated-text split are the right slices of it, the passkey prompt has
its length and its needle where asked, the memory-matched StreamingLLM window holds exactly the
hybrid's bytes, the study resumes (a rerun adds nothing; a run cut mid-way ends with the same
rows), a saved fixed conversion as a directory row equals the fixed row (learned - fixed = 0),
and the command refuses bad input with one line and exit 2."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from coulomb_attention.cli import main
from coulomb_attention.convert import lm_eval as m
from coulomb_attention.nn.families.llama import (
    LlamaForCausalLM,
    convert_attention_,
    save_pretrained,
)
from coulomb_attention.reports.lm_eval import load_rows, pairs, summarise, unit_key
from coulomb_attention.studies import lm_eval as study
from helpers import byte_tokenizer, tiny_llama

ROWS = {
    "teacher": None,
    "favor": dict(feature_map="favor"),
    "hybrid": dict(feature_map="favor", window=8, sinks=2),
    "streaming": dict(feature_map="favor", window=8, sinks=2, linear=False),
}


def _tokenizer():
    return byte_tokenizer()


def _model(row: str = "teacher", seed: int = 0) -> LlamaForCausalLM:
    return tiny_llama(seed, row=ROWS[row], vocab_size=256)


def _full_nll(model, ids):
    with torch.no_grad():
        logits = model(ids[None])[0]  # (T, V)
    return F.cross_entropy(logits[:-1], ids[1:], reduction="none")


@pytest.mark.parametrize("row", sorted(ROWS))
@pytest.mark.parametrize("chunk", [1, 7, 64, 500])
def test_chunked_losses_equal_the_parallel_cross_entropy(row, chunk):
    model = _model(row)
    ids = torch.randint(0, 256, (150,), generator=torch.Generator().manual_seed(1))
    nll = m.token_nll(model, ids, chunk=chunk)
    ref = _full_nll(model, ids)
    assert nll.shape == (149,)
    assert torch.allclose(nll, ref, atol=1e-4, rtol=1e-4), (nll - ref).abs().max()


def test_buckets_are_the_slices_of_the_loss_and_nest_into_coarse_ones():
    nll = torch.arange(1, 300, dtype=torch.float64)  # entry i = target i + 1 = i + 1
    edges = m.log2_edges(300)
    assert edges == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
    sums, counts = m.position_buckets(nll, edges)
    for lo, hi, s, n in zip(edges[:-1], edges[1:], sums, counts, strict=True):
        assert n == hi - lo and s == sum(range(lo, hi))  # targets lo..hi-1 carry value t
    assert sum(counts) == 299 and sum(sums) == float(nll.sum())
    cs, cn = m.coarse_buckets(edges, sums, counts, [0, 64, 256, 300])
    assert cn == [63, 192, 44] and cs == [sum(range(1, 64)), sum(range(64, 256)),
                                          sum(range(256, 300))]


def test_greedy_continuation_is_greedy_generate():
    model = _model("hybrid")
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(2))
    new = m.greedy_continue(model, ids, 6, chunk=16)
    assert new == model.greedy_generate(ids, 6)[0, 40:].tolist()


@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_passkey_prompt_has_its_length_and_its_needle_at_the_depth(depth):
    tok = _tokenizer()
    ids, info = m.passkey_prompt(tok, 1000, depth, 12345, bos=7)
    assert ids.shape == (1000,) and int(ids[0]) == 7
    text = tok.decode(ids[1:].tolist())
    needle = m.PASSKEY.format(key=12345)
    assert text.count(needle) == 1 and text.endswith(" " + m.QUESTION)
    unit = len(tok.encode(" " + m.FILLER).ids)
    # the needle sits on a sentence-group boundary within half a group of the asked depth
    assert abs(info["depth"] * info["filler_tokens"] - depth * info["filler_tokens"]) \
        <= unit / 2 + 1
    at = info["needle_at"]
    assert tok.decode(ids[at:at + info["needle_tokens"]].tolist()) == " " + needle
    with pytest.raises(ValueError, match="cannot hold"):
        m.passkey_prompt(tok, 20, 0.5, 12345)


def test_memory_matched_streaming_holds_the_hybrids_bytes():
    hybrid, streaming = _model("hybrid"), _model("teacher")
    w = m.memory_matched_window(8, 16, 8)
    assert w == 8 + 16 * 10 // 16  # W + M (dh + 2) / (2 dh)
    convert_attention_(streaming, "favor", 1, window=w, sinks=2, linear=False)
    ids = torch.randint(0, 256, (1, 200), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, sh = hybrid(ids, output_states=True)
        _, ss = streaming(ids, output_states=True)
    assert hybrid.state_bytes(sh) == streaming.state_bytes(ss) > 0
    assert m.memory_matched_window(64, 64, 64) == 97  # SmolLM2: dh 64, M 64, W 64


def test_repeated_text_losses_are_the_two_copies_slices():
    model = _model("favor")
    p = torch.randint(0, 256, (30,), generator=torch.Generator().manual_seed(4))
    first, second = m.repeated_text_nll(model, p, bos=5, chunk=11)
    ref = _full_nll(model, torch.cat((torch.tensor([5]), p, p)))  # entry i: target i + 1
    assert first == pytest.approx(float(ref[:30].mean()), abs=1e-5)
    assert second == pytest.approx(float(ref[30:60].mean()), abs=1e-5)


def test_row_specs_parse_and_bad_ones_raise(tmp_path):
    assert study.parse_row("teacher").kind == "teacher"
    r = study.parse_row("fixed:hedgehog:64:4", 32)
    assert (r.kind, r.feature_map, r.n_features, r.window, r.sinks) == \
        ("hybrid", "hedgehog", 32, 64, 4)
    assert study.parse_row("fixed:favor").kind == "linear"
    assert study.parse_row("streaming:97:4").window == 97
    assert study.parse_row("streaming:matched").matched
    for bad in ("fixed:nope", "streaming:8", "fixed:favor:x:4", "teacher:1"):
        with pytest.raises(ValueError):
            study.parse_row(bad)
    with pytest.raises(FileNotFoundError, match="neither a row spec"):
        study.parse_row(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        study.parse_row(str(tmp_path))
    rows = study.resolve_rows(study.LmEvalConfig(rows=("streaming:matched", "streaming:97:4")),
                              64)
    assert [r.name for r in rows] == ["streaming:97:4"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    teacher = _model("teacher")
    save_pretrained(teacher, root / "teacher", tokenizer=_tokenizer())
    fixed = _model("teacher")
    convert_attention_(fixed, "favor", 16, window=8, sinks=2, generator=0)  # = fixed:favor:8:2
    save_pretrained(fixed, root / "converted")
    return root


def _config(dirs, **kw):
    base = dict(model=str(dirs / "teacher"),
                rows=("teacher", "fixed:favor:8:2", "streaming:8:2", "streaming:matched",
                      str(dirs / "converted")),
                lengths=(64, 128), passkey_lengths=(160,), trials=3, repeat_length=32,
                repeat_docs=3, limit_docs=3, n_features=16, matched_window=8,
                matched_sinks=2, new_tokens=6, chunk=48)
    return study.LmEvalConfig(**{**base, **kw})


def test_study_resumes_and_a_saved_fixed_conversion_equals_the_fixed_row(dirs, tmp_path):
    config = _config(dirs)
    out = tmp_path / "run"
    results = study.run_study(config, out, progress=False, log=lambda s: None)
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    # 5 rows x (2 lengths x 3 docs + 3 trials + 3 passages)
    assert len(rows) == 5 * 12 and len({unit_key(r) for r in rows}) == 60
    assert {r["row"] for r in rows} >= {"streaming:18:2", str(dirs / "converted")}
    by = {(r["row"], r["task"], r["length"], r["doc"]): r for r in rows}
    conv = str(dirs / "converted")
    for (row, task, length, doc), r in by.items():
        if row == conv:
            twin = by[("fixed:favor:8:2", task, length, doc)]
            for k in ("nll", "nll_first", "nll_second", "success"):
                if k in r:
                    assert r[k] == pytest.approx(twin[k], abs=1e-6)
    s = summarise(load_rows(out))
    d = [x for x in s["differences"] if x["what"] == "learned - fixed" and x["task"] == "ppl"]
    assert len(d) == 2 and all(abs(x["mean"]) < 1e-6 for x in d)
    assert {(x["a"], x["b"]) for x in s["differences"] if x["what"] ==
            "hybrid - StreamingLLM"} >= {("fixed:favor:8:2", "streaming:8:2"),
                                          ("fixed:favor:8:2", "streaming:18:2")}
    # the matched row's cache holds the hybrid's bytes (state_bytes recorded per document)
    sb = {r["row"]: r["state_bytes"] for r in rows if r["task"] == "ppl" and r["length"] == 128}
    assert sb["streaming:18:2"] == sb["fixed:favor:8:2"] < sb["teacher"]
    # a rerun adds nothing
    study.run_study(config, out, progress=False, log=lambda s: None)
    assert results.read_text().count("\n") == 60
    # a run cut mid-way (23 whole lines and half of the next) ends with the same rows
    lines = results.read_text().splitlines(keepends=True)
    results.write_text("".join(lines[:23]) + lines[23][:40])
    study.run_study(config, out, progress=False, log=lambda s: None)
    again = {unit_key(r): r for r in load_rows(out)}
    assert set(again) == {unit_key(r) for r in rows}
    for r in rows:
        for k in ("nll", "nll_first", "nll_second", "success", "key"):
            if k in r:
                assert again[unit_key(r)][k] == pytest.approx(r[k], abs=1e-6)


def test_the_teacher_is_skipped_with_a_note_or_refused(dirs, tmp_path):
    kw = dict(rows=("teacher", "streaming:8:2"), lengths=(4096,), tasks=("ppl",),
              limit_docs=1)
    with pytest.raises(ValueError, match="exceeds the teacher's 2048 positions"):
        study.run_study(_config(dirs, **kw), tmp_path / "a", progress=False)
    out = tmp_path / "b"
    notes = []
    study.run_study(_config(dirs, skip_long_teacher=True, **kw), out, progress=False,
                    log=notes.append)
    rows = load_rows(out)
    assert [r["row"] for r in rows if r.get("skipped")] == ["teacher"]
    assert [r["row"] for r in rows if "nll" in r] == ["streaming:8:2"]
    assert any("skipped" in n for n in notes)


def test_pairs_follow_the_attention():
    att = {"teacher": {"kind": "teacher", "source": "pretrained"},
           "fixed:favor:64:4": {"kind": "hybrid", "source": "fixed", "feature_map": "favor",
                                "n_features": 64, "window": 64, "sinks": 4},
           "dir": {"kind": "hybrid", "source": "directory", "feature_map": "favor",
                   "n_features": 64, "window": 64, "sinks": 4},
           "fixed:hedgehog": {"kind": "linear", "source": "fixed", "feature_map": "hedgehog",
                              "n_features": 64, "window": 0, "sinks": 0},
           "streaming:97:4": {"kind": "streaming", "source": "pretrained", "window": 97,
                              "sinks": 4},
           "dir2": {"kind": "hybrid", "source": "directory", "feature_map": "favor",
                    "n_features": 64, "window": 64, "sinks": 4},
           "dir3": {"kind": "hybrid", "source": "directory", "feature_map": "favor",
                    "n_features": 64, "window": 32, "sinks": 4}}
    got = {(a, b): w for a, b, w in pairs(att)}
    assert got[("dir2", "dir")] == "learned - learned"  # the later row minus the earlier
    assert ("dir", "dir2") not in got and ("dir3", "dir") not in got  # once; same attention
    assert got[("dir", "fixed:favor:64:4")] == "learned - fixed"
    assert got[("dir", "streaming:97:4")] == "hybrid - StreamingLLM"
    assert got[("fixed:hedgehog", "teacher")] == "row - teacher"
    assert ("fixed:hedgehog", "fixed:favor:64:4") not in got
    assert ("teacher", "dir") not in got


def test_progress_prints_a_heartbeat(capsys):
    import time

    with study._Progress(True, every=0.2) as prog:
        prog.stage = "teacher ppl L=8192 #0"
        time.sleep(5.5)
    assert "teacher ppl L=8192 #0 (running)" in capsys.readouterr().err


def test_command_runs_resumes_and_reports(dirs, tmp_path, capsys):
    out = tmp_path / "cmd"
    argv = ["lm-eval", "--model", str(dirs / "teacher"), "--rows", "teacher", "streaming:8:2",
            "--lengths", "64", "--passkey-lengths", "160", "--trials", "2", "--repeat-length",
            "32", "--limit-docs", "2", "--chunk", "48", "--threads", "1", "--out", str(out),
            "--no-progress"]
    assert main(argv) == 0
    assert {p.name for p in out.iterdir()} >= {"results.jsonl", "report.md", "report.json",
                                               "loss_vs_position.png", "passkey.png"}
    report = (out / "report.md").read_text()
    assert "## Perplexity" in report and "streaming:8:2 - teacher" in report
    n = (out / "results.jsonl").read_text().count("\n")
    assert n == 2 * (2 + 2 + 2)
    assert main(argv) == 0
    assert (out / "results.jsonl").read_text().count("\n") == n


@pytest.mark.parametrize("rows, lengths, message", [
    (["fixed:nope"], ["64"], "unknown feature map"),
    (["/no/such/dir"], ["64"], "neither a row spec"),
    (["teacher"], ["4096"], "exceeds the teacher's 2048 positions"),
])
def test_bad_input_is_one_line_and_exit_2(dirs, tmp_path, capsys, rows, lengths, message):
    rc = main(["lm-eval", "--model", str(dirs / "teacher"), "--rows", *rows, "--lengths",
               *lengths, "--tasks", "ppl", "--out", str(tmp_path / "x"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0]


def test_the_commands_help_copies_agree_with_the_study():
    from coulomb_attention.commands import lm_eval as cmd

    assert cmd.DEFAULT_ROWS == study.DEFAULT_ROWS and cmd.TASK_NAMES == study.TASKS
    assert set(cmd._FIELDS) <= set(study.LmEvalConfig.__dataclass_fields__)


@pytest.mark.parametrize("n", [3, 10, 12, 20])
def test_every_row_of_a_plot_has_its_own_style(n):
    """Twelve rows in one panel once drew two rows in the same colour; each row's (colour,
    line style, marker) is now distinct."""
    from coulomb_attention.reports import pyplot
    from coulomb_attention.reports.lm_eval import _row_styles

    styles = _row_styles(pyplot(), [f"row{i}" for i in range(n)])
    keys = {(tuple(s["color"]), s["linestyle"], s["marker"]) for s in styles.values()}
    assert len(styles) == n and len(keys) == n

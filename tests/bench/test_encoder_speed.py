"""``bench encoder --random-init`` (bench.encoder_speed.random_encoder_speed): both
architectures from configurations with random weights, tiny shapes, on the CPU."""

from __future__ import annotations

import json
import math
import shutil
import statistics

import pytest
import torch

from coulomb_attention.bench import encoder_speed as es
from coulomb_attention.cli import main

TINY = {"vocab_size": 50, "hidden_size": 24, "num_hidden_layers": 2, "num_attention_heads": 3,
        "intermediate_size": 48, "max_position_embeddings": 32, "feature_map": "favor",
        "n_features": 8, "share_features": False}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A directory like an export's: config.json (tiny shapes) and the remote code."""
    d = tmp_path_factory.mktemp("tiny-export")
    (d / "config.json").write_text(json.dumps({**TINY, "model_type": "coulomb_bert"}))
    for name in ("configuration_coulomb_bert.py", "modeling_coulomb_bert.py"):
        shutil.copyfile(es._EXPORT_DIR / name, d / name)
    return d


def test_random_models_share_every_weight_but_the_particles(tiny_dir):
    conv, orig = es.random_models(tiny_dir, max_positions=64, n_features=5)
    assert conv.config.max_position_embeddings == 64 == orig.config.max_position_embeddings
    assert orig.config._attn_implementation == "sdpa"
    cs, os_ = conv.state_dict(), orig.state_dict()
    omegas = [k for k in cs if k.endswith(".omega")]
    assert len(omegas) == 2 and all(cs[k].shape == (3, 5, 8) for k in omegas)
    assert all(float(cs[k].std()) > 0.5 for k in omegas)  # drawn, not the zero buffer
    for k, v in os_.items():
        if k in cs:
            assert torch.equal(cs[k], v), k
    assert set(cs) - set(os_) == set(omegas)
    # random BERT attention is nearly uniform, which FAVOR+ reproduces: the two random models
    # embed alike, unlike an original drawn with another seed (the weights really are shared)
    conv, orig = es.random_models(tiny_dir, n_features=64)
    _, other = es.random_models(tiny_dir, seed=1)
    ids = torch.randint(5, 50, (3, 20), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        a, b, c = (es._pooled(m(input_ids=ids, attention_mask=mask).last_hidden_state, mask)
                   for m in (conv, orig, other))
    assert float((a * b).sum(-1).min()) > 0.999 > float((c * b).sum(-1).max())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_random_encoder_speed_rows(tiny_dir, dtype):
    rows = es.random_encoder_speed((8, 40), tiny_dir, batch_size=3, repeats=2, dtype=dtype,
                                   max_positions=48)
    assert [r["length"] for r in rows] == [8, 40]
    for r in rows:
        assert r["dtype"] == dtype and r["random_init"] and r["max_positions"] == 48
        assert r["batch_size"] == r["batch_size_asked"] == 3 and len(r["original_s"]) == 2
        assert math.isclose(r["converted_sps"], 3 / statistics.median(r["converted_s"]))
        assert math.isclose(r["original_sps"], 3 / statistics.median(r["original_s"]))
        pairs = [o / c for c, o in zip(r["converted_s"], r["original_s"], strict=True)]
        assert math.isclose(r["paired_ratio"], statistics.median(pairs))
        assert math.isclose(r["cpu_ratio"], statistics.median(r["original_cpu_s"])
                            / statistics.median(r["converted_cpu_s"]))
        assert all(c > 0 for c in r["converted_cpu_s"] + r["original_cpu_s"])
    with pytest.raises(ValueError, match="exceed the position table"):
        es.random_encoder_speed((64,), tiny_dir, batch_size=1, repeats=1, max_positions=48)
    with pytest.raises(ValueError, match="dtype must be one of"):
        es.random_encoder_speed((8,), tiny_dir, dtype="float64")


def test_out_of_memory_halves_the_batch(tiny_dir, monkeypatch):
    real = es._time_pair
    asked = []

    def fake(conv, orig, L, batch, *rest):
        asked.append(batch)
        if batch > 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 9 GiB")
        return real(conv, orig, L, batch, *rest)

    monkeypatch.setattr(es, "_time_pair", fake)
    (row,) = es.random_encoder_speed((8,), tiny_dir, batch_size=9, repeats=1)
    assert asked == [9, 4, 2] and row["batch_size"] == 2 and row["batch_size_asked"] == 9
    monkeypatch.setattr(es, "_time_pair", lambda *a: (_ for _ in ()).throw(RuntimeError("bug")))
    with pytest.raises(RuntimeError, match="bug"):  # anything else is not retried
        es.random_encoder_speed((8,), tiny_dir, batch_size=4, repeats=1)


def test_cli_random_init_writes_json_csv_md(tiny_dir, tmp_path, capsys):
    out = tmp_path / "speed" / "cpu.json"
    out.parent.mkdir()
    assert main(["bench", "encoder", str(tiny_dir), "--random-init", "--lengths", "8", "100",
                 "--max-positions", "100", "--batch-size", "2", "--repeats", "1",
                 "--threads", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "random weights" in printed and "position table 100" in printed
    # the machine it ran on: threads and load, printed and in every row
    assert "1 thread(s) of" in printed and "load average" in printed
    assert all(r["threads"] == 1 and len(r["load_average_start"]) == 3 and r["cpu_count"]
               and "verdict_withheld" in r for r in json.loads(out.read_text()))
    assert out.with_suffix(".md").read_text().startswith("random weights (speed only")
    rows = json.loads(out.read_text())
    assert [r["length"] for r in rows] == [8, 100]
    csv = out.with_suffix(".csv").read_text().splitlines()
    assert csv[0].startswith("length,batch_size,dtype") and len(csv) == 3
    ratio = rows[1]["converted_sps"] / rows[1]["original_sps"]
    assert csv[2].startswith("100,2,float32,cpu,1,1,")
    assert math.isclose(float(csv[2].split(",")[-3]), ratio, rel_tol=1e-3)
    assert math.isclose(float(csv[2].split(",")[-1]), rows[1]["cpu_ratio"], rel_tol=1e-3)
    assert f"| 100 | 2 | float32 | {rows[1]['converted_sps']:.1f} |" in \
        out.with_suffix(".md").read_text()
    assert f"| {rows[1]['paired_ratio']:.2f} | {rows[1]['cpu_ratio']:.2f} |" in \
        out.with_suffix(".md").read_text()
    # flags that need --random-init, and a missing HF_DIR without it: one line, exit 2
    for argv, msg in [(["bench", "encoder", str(tiny_dir), "--dtype", "bfloat16"],
                       "need --random-init"),
                      (["bench", "encoder"], "HF_DIR is required")]:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and "\n" not in err, err


def test_random_init_window_hybrid_rows(tiny_dir, tmp_path, capsys):
    """`bench encoder --random-init --window W`: the converted model is the hybrid (its layers
    carry the window and weights 0.1) and the rows say so; --window without --random-init is
    one line, exit 2."""
    conv, _ = es.random_models(tiny_dir, window=4)
    att = conv.encoder.layer[0].attention.self
    assert att.window == 4 and torch.allclose(torch.sigmoid(att.window_logit),
                                              torch.full((3,), 0.1), atol=2e-3)
    (row,) = es.random_encoder_speed((20,), tiny_dir, batch_size=2, repeats=1, window=4)
    assert row["window"] == 4 and row["converted_sps"] > 0
    assert main(["bench", "encoder", str(tiny_dir), "--random-init", "--window", "4",
                 "--lengths", "8", "--batch-size", "2", "--repeats", "1"]) == 0
    assert "+ window 4" in capsys.readouterr().out
    rc = main(["bench", "encoder", str(tiny_dir), "--window", "4"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "--random-init" in err and "\n" not in err


@pytest.mark.parametrize("feature_map", ["favor", "softmax_feat"])
def test_fused_attention_gives_the_remote_codes_outputs(tiny_dir, tmp_path, feature_map):
    """use_fused_attention_ (bench encoder --fused) swaps the attention op only: the same
    hidden states, padded batch included (the kernels in Triton's interpreter)."""
    TL = pytest.importorskip("coulomb_attention.nn.ops.triton_linear")
    if not TL.interpreter_active():
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1 before triton's import)")
    d = tmp_path / "export"
    shutil.copytree(tiny_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "feature_map": feature_map}))
    conv, _ = es.random_models(d)
    ids = torch.randint(5, 50, (2, 13), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    with torch.no_grad():
        ref = conv(input_ids=ids, attention_mask=mask).last_hidden_state
        assert es.use_fused_attention_(conv) == TINY["num_hidden_layers"]
        out = conv(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.allclose(out[0], ref[0], atol=1e-5) and torch.allclose(out[1, :9], ref[1, :9],
                                                                        atol=1e-5)

"""The GPU attention benchmark (bench/attention_gpu.py) and the --device cuda flags: the clear
exit without CUDA, the bytes model, the targets' logic, and one tiny run on the CPU (the
fused kernels in Triton's interpreter, CPU timers) that writes every file."""

from __future__ import annotations

import json
import math

import pytest
import torch

from coulomb_attention.bench import attention_gpu as AG

NO_CUDA = not torch.cuda.is_available()


@pytest.mark.skipif(not NO_CUDA, reason="checks the machine without CUDA")
@pytest.mark.parametrize("argv", [["bench", "attention", "--device", "cuda"],
                                  ["bench", "encoder", "--random-init", "--device", "cuda"]])
def test_device_cuda_without_cuda_exits_2_with_one_line(argv, capsys, tmp_path):
    from coulomb_attention.cli import main

    assert main([*argv, "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device is available" in err[0]


def test_bytes_model_counts_inputs_outputs_and_the_normaliser():
    rows, d, e = 10, 64, 64
    fwd = AG.fused_bytes(rows, d, e, 2, "fwd")
    assert fwd == rows * (2 * (64 + 64 + 64 + 64) + 4)  # q, k, v, out in bf16; den float32
    both = AG.fused_bytes(rows, d, e, 2, "fwdbwd")
    # backward: q, k, v, out, d out read, dq, dk, dv written (8 tensors of 64), den read
    assert both - fwd == rows * (2 * 8 * 64 + 4)


def test_targets_from_rows():
    def row(L, m, fwd, fb, frac=None):
        return {"dtype": "bfloat16", "L": L, "method": m, "fwd_ms": fwd, "fwdbwd_ms": fb,
                "fwdbwd_frac_bw": frac}

    rows = [row(512, "sdpa", 1.0, 3.0), row(512, "fused/favor", 1.1, 2.0),
            row(2048, "sdpa", 4.0, 12.0), row(2048, "fused/favor", 2.0, 6.0),
            row(8192, "sdpa", 40.0, 120.0), row(8192, "fused/favor", 8.0, 30.0),
            row(16384, "fused/favor", 16.0, 60.0, 0.4)]
    t = AG.gpu_targets(rows)
    assert t["fwdbwd_faster_from_2048"]["held"] is True
    assert t["fwdbwd_3x_at_8192"]["speedup"] == pytest.approx(4.0)
    assert t["fwd_within_1.2x_at_512"]["held"] is True
    assert t["bandwidth_50pct_at_16384"]["held"] is False
    assert AG.gpu_targets(rows[:2])["fwdbwd_3x_at_8192"]["held"] is None  # not measured


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="not divisible"):
        AG.GpuAttentionBenchConfig(batch_heads=30, heads=4)
    with pytest.raises(ValueError, match="dtypes must be among"):
        AG.GpuAttentionBenchConfig(dtypes=("float64",))
    with pytest.raises(ValueError, match="maps must be among"):
        AG.GpuAttentionBenchConfig(maps=("elu",))


def test_tiny_run_on_the_cpu_writes_tables_and_plot(tmp_path):
    TL = pytest.importorskip("coulomb_attention.nn.ops.triton_linear")
    if not TL.interpreter_active():
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1 before triton's import)")
    cfg = AG.GpuAttentionBenchConfig(lengths=(32,), dtypes=("float32",), batch_heads=2,
                                     heads=2, head_dim=16, n_features=16, repeats=1,
                                     device="cpu", no_performer=True, no_fla=True)
    summary = AG.run_gpu_benchmark(cfg, tmp_path, log=lambda m: None)
    rows = {r["method"]: r for r in summary["rows"]}
    assert set(rows) == {"fused/favor", "ops/favor", "sdpa"}
    for r in rows.values():
        assert r["error"] == "" and r["fwd_ms"] > 0 and r["fwdbwd_ms"] > 0
    assert rows["fused/favor"]["fwd_gbs"] > 0 and math.isnan(summary["copy_bandwidth_gbs"])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["targets"]["fwdbwd_3x_at_8192"]["held"] is None
    assert "| float32 | 32 |" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "bench_attention_gpu.png").stat().st_size > 1000
    assert (tmp_path / "results.csv").read_text().count("\n") == 4

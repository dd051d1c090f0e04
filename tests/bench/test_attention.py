"""The attention benchmark (coulomb_attention.bench.attention) and its command."""

from __future__ import annotations

import json
import math

import pytest
import torch


def test_bench_attention_tiny_grid(tmp_path):
    from coulomb_attention.cli import main

    out = tmp_path / "bench"
    rc = main(["bench", "attention", "--lengths", "32,64", "--features", "16", "--repeats",
               "1", "--threads", "1", "--no-performer", "--peak-size", "128",
               "--out", str(out)])
    assert rc == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    methods = {r["method"] for r in rows}
    assert {"favor_fused", "sdpa"} <= methods
    for r in rows:
        assert r["fwd_s"] > 0 and r["fwdbwd_s"] > 0 and math.isfinite(r["gflops_fwd"])
    assert (out / "results.csv").exists() and (out / "table.md").exists()
    assert (out / "bench_attention.png").stat().st_size > 1000
    summary = json.loads((out / "summary.json").read_text())
    assert summary["matmul_peak_gflops"] > 0
    assert main(["bench", "attention", "--lengths", "0", "--out", str(out)]) == 2


def test_bench_peak_memory_counts_reused_memory():
    """The memory pass sees an allocation even when the heap could serve it from memory freed
    earlier (an earlier version reported 0 MB after the timing pass)."""
    from coulomb_attention.bench import attention as BA

    if BA._proc_status() is None:
        pytest.skip("needs /proc/self/status")
    for _ in range(3):  # 16 MiB blocks: glibc's dynamic threshold moves them onto the heap
        torch.ones(1 << 22).add_(1.0)
    BA._return_freed_memory()

    def alloc():
        torch.ones(1 << 22).add_(1.0)  # 16 MiB, may reuse the freed heap block

    mb = [BA._peak_bytes(alloc) / 2**20 for _ in range(2)]
    if any(math.isnan(m) for m in mb):
        pytest.skip("VmHWM cannot be reset here")
    assert all(14 <= m <= 100 for m in mb), mb


# ----------------------------------------------------------------------------- causal


def test_bench_attention_short_tiny_grid(tmp_path, monkeypatch):
    from coulomb_attention.bench import attention as BA
    from coulomb_attention.cli import main

    monkeypatch.setitem(BA.SHORT, "batches", [2])
    monkeypatch.setitem(BA.SHORT, "lengths", [16, 32])
    monkeypatch.setitem(BA.SHORT, "features", [8])
    monkeypatch.setitem(BA.SHORT, "shapes", {"tiny": (16, 2)})
    out = tmp_path / "short"
    assert main(["bench", "attention", "--short", "--repeats", "1", "--threads", "1",
                 "--no-performer", "--out", str(out)]) == 0
    table = (out / "table.md").read_text()
    assert "performer-pytorch not installed" in table and "| tiny | 2 | 32 |" in table
    summary = json.loads((out / "summary.json").read_text())
    assert summary["performer"] is False and summary["targets"]["vs_performer_held"] is None
    rows = (out / "results.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2  # header + (favor, sdpa) x 2 lengths
    assert (out / "bench_attention_short.png").stat().st_size > 1000


def test_bench_attention_quick_fills_only_the_flags_not_given(tmp_path, monkeypatch):
    from coulomb_attention.bench import attention as BA
    from coulomb_attention.cli import main

    seen = []
    monkeypatch.setattr(BA, "run_benchmark", lambda cfg, out, log: seen.append(cfg) or {})
    assert main(["bench", "attention", "--quick", "--lengths", "64", "--out",
                 str(tmp_path)]) == 0
    assert seen[-1].lengths == (64,)  # explicit
    assert seen[-1].features == (64,) and seen[-1].repeats == 2  # from --quick
    assert main(["bench", "attention", "--out", str(tmp_path)]) == 0
    assert seen[-1].lengths[-1] == 16384 and seen[-1].repeats == 5  # the defaults
    assert main(["bench", "attention", "--quick", "--repeats", "0",
                 "--out", str(tmp_path)]) == 2  # an explicit bad value is not replaced

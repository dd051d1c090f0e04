"""Every benchmark records its threads and the machine's load, and gives no verdict from a run
on a busy machine (coulomb_attention.bench.machine, issue 48)."""

from __future__ import annotations

import json
import math

import pytest

from coulomb_attention.bench import machine


def test_verdict_withheld_rule():
    # 2 cores, 1 thread: 1 core free (+ a quarter of noise)
    assert machine.verdict_withheld(1, (0.2, 0, 0), (1.1, 0, 0), 2) is None
    assert machine.verdict_withheld(1, (1.2, 0, 0), (1.0, 0, 0), 2) is None
    busy = machine.verdict_withheld(1, (1.3, 0, 0), (1.0, 0, 0), 2)  # start above 1.25
    assert busy and "busy" in busy and "1.30" in busy and "1 core(s) left free of 2" in busy
    # the end average includes this run's own threads
    assert machine.verdict_withheld(2, (0.0, 0, 0), (2.2, 0, 0), 4) is None
    assert machine.verdict_withheld(2, (0.0, 0, 0), (4.3, 0, 0), 4)  # 2.3 others > 2 free
    # every core taken by the run: any other load is too much
    assert machine.verdict_withheld(2, (0.5, 0, 0), (2.0, 0, 0), 2)
    assert "not available" in machine.verdict_withheld(1, (math.nan,) * 3, (0.0,) * 3, 2)
    line = machine.withheld_line(busy)
    assert line.startswith("verdict withheld: the machine is busy") and "quiet machine" in line


def test_machine_record_and_line():
    rec = machine.machine_record(1, (2.5, 1, 1), (2.0, 1, 1), n_cores=2)
    assert rec["threads"] == 1 and rec["cores"] == 2 and rec["cpu_count"] >= 1
    assert rec["load_average_start"] == [2.5, 1, 1] and rec["load_average_end"] == [2.0, 1, 1]
    assert rec["verdict_withheld"] and "busy" in rec["verdict_withheld"]
    line = machine.machine_line(1, (2.5, 1, 1), (2.0, 1, 1), 2)
    assert line.startswith("1 thread(s) of 2 cores")
    assert "2.50 at the start, 2.00 at the end" in line


TINY = ["bench", "attention", "--lengths", "32", "64", "--features", "16", "--repeats", "1",
        "--threads", "1", "--no-performer", "--peak-size", "128"]


@pytest.mark.parametrize("load", [0.0, 9.0])
def test_bench_attention_verdict_only_on_a_quiet_machine(load, tmp_path, capsys, monkeypatch):
    from coulomb_attention.bench import attention as BA
    from coulomb_attention.cli import main

    monkeypatch.setattr(machine, "load_average", lambda: (load, load, load))
    monkeypatch.setattr(machine, "cores", lambda: 2)
    # the targets' points are not in a tiny grid: give the verdicts something to judge
    monkeypatch.setattr(BA, "targets", lambda rows: {
        "linear": [{"M": 16, "mode": "fwd", "ratio": 12.0, "held": False}],
        "linear_held": False, "vs_sdpa": [], "vs_sdpa_held": None,
        "vs_performer": [], "vs_performer_held": None,
        "peak": [{"M": 16, "mode": "fwd", "fraction": 0.5, "held": True}], "peak_held": True})
    out = tmp_path / "bench"
    assert main([*TINY, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    table = (out / "table.md").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["threads"] == 1 and summary["cores"] == 2
    assert summary["load_average_start"][0] == load and summary["load_average_end"][0] == load
    assert summary["cpu_count"] >= 1
    assert "1 thread(s) of 2 cores" in printed and "1 thread(s) of 2 cores" in table
    for text in (printed, table):
        if load:
            assert "MISSED" not in text and ": held" not in text
            assert "verdict withheld: the machine is busy" in text and "no verdict" in text
        else:
            assert "MISSED" in text and ": held" in text and "verdict withheld" not in text
    assert (summary["verdict_withheld"] is None) == (load == 0.0)


def test_bench_attention_short_withholds_its_verdict(tmp_path, capsys, monkeypatch):
    from coulomb_attention.bench import attention as BA
    from coulomb_attention.cli import main

    monkeypatch.setattr(machine, "load_average", lambda: (5.0, 5.0, 5.0))
    monkeypatch.setattr(machine, "cores", lambda: 2)
    monkeypatch.setitem(BA.SHORT, "batches", [32])
    monkeypatch.setitem(BA.SHORT, "lengths", [16])
    monkeypatch.setitem(BA.SHORT, "features", [8])
    monkeypatch.setitem(BA.SHORT, "shapes", {"tiny": (16, 2)})
    out = tmp_path / "short"
    assert main(["bench", "attention", "--short", "--repeats", "1", "--threads", "1",
                 "--no-performer", "--out", str(out)]) == 0
    table = (out / "table.md").read_text()
    assert "**no verdict**" in table and "MISSED" not in table and "**held**" not in table
    assert "verdict withheld" in table
    assert json.loads((out / "summary.json").read_text())["verdict_withheld"]


def test_bench_decoder_says_why_its_verdict_is_withheld(monkeypatch):
    from coulomb_attention.bench import decoder as bd

    cfg = bd.DecoderBenchConfig(model="random", rows=("teacher", "favor"), lengths=(8192,),
                                threads=1)
    assert "busy" in bd._withheld(cfg, 2, (3.0, 0, 0), (3.0, 0, 0))
    assert bd._withheld(cfg, 2, (0.1, 0, 0), (1.0, 0, 0)) is None

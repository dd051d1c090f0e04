"""One thread policy for every command (issue 48): ``--threads {auto,N}``, default ``auto`` =
the cores the 1-minute load average leaves free (commands._args), said once on stderr."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import torch

from coulomb_attention.cli import build_parser, main
from coulomb_attention.commands import _args
from coulomb_attention.commands._args import free_cores, resolve_threads

COMMANDS_DIR = Path(_args.__file__).parent
#: (sub)commands that compute nothing, so take no --threads
NO_THREADS = {"report", "minilm report"}


def _leaves(parser: argparse.ArgumentParser, prefix: str = ""):
    """(name, parser) of every (sub)command that runs something."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix.strip(), parser
        return
    for name, sub in subs[0].choices.items():
        yield from _leaves(sub, f"{prefix} {name}")


def test_free_cores_is_cpu_count_less_the_rounded_load():
    assert free_cores(cpu_count=2, load=1.3) == (1, 2, 1.3)
    assert free_cores(cpu_count=2, load=1.6) == (1, 2, 1.6)  # round(1.6) = 2 -> at least 1
    assert free_cores(cpu_count=16, load=3.4)[0] == 13
    assert free_cores(cpu_count=4, load=0.0)[0] == 4
    assert free_cores(cpu_count=2, load=9.0)[0] == 1


def test_free_cores_without_a_load_average(monkeypatch):
    import os

    def no_loadavg():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", no_loadavg)
    assert free_cores(cpu_count=6) == (6, 6, 0.0)  # os.cpu_count(), every core free


def test_resolve_threads():
    said = []
    assert resolve_threads("auto", cpu_count=2, load=1.3, log=said.append) == 1
    assert said == ["threads: 1 (auto: 2 cores, load 1.3)"]
    assert resolve_threads("auto", cpu_count=16, load=0.2) == 16
    assert resolve_threads("auto", jobs=4, cpu_count=16, load=0.2) == 4  # per job
    assert resolve_threads("auto", jobs=4, cpu_count=2, load=0.0) == 1
    assert resolve_threads(3, cpu_count=2, load=5.0, log=said.append) == 3  # N: as given
    assert said[-1] == "threads: 3 (--threads 3; 2 cores, load 5.0)"
    ns = argparse.Namespace(threads="auto")
    assert resolve_threads(ns, cpu_count=8, load=2.0) == 6
    for bad in (0, -2, "x", "1.5", True):
        with pytest.raises(ValueError, match="--threads must be auto or an integer >= 1"):
            resolve_threads(bad, cpu_count=2, load=0.0)


def test_every_command_takes_threads_with_the_same_default():
    seen = []
    for name, parser in _leaves(build_parser()):
        actions = {a.dest: a for a in parser._actions}
        if name in NO_THREADS:
            assert "threads" not in actions, name
            continue
        assert "threads" in actions, f"{name} has no --threads"
        a = actions["threads"]
        assert a.default == "auto" and isinstance(a, _args._ThreadsAction), name
        assert "auto" in a.help and "busy machine" in a.help, name
        seen.append(name)
    assert {"train", "convert", "minilm run", "minilm compare", "minilm timing",
            "bench attention", "bench decoder", "ablation", "synthetic", "generate"} <= set(seen)


def test_commands_use_the_one_helper():
    """No command declares its own --threads or sets torch's threads itself."""
    for path in sorted(COMMANDS_DIR.glob("*.py")):
        if path.name == "_args.py":
            continue
        text = path.read_text()
        assert 'add_argument("--threads"' not in text, path.name
        assert "set_num_threads" not in text, path.name


@pytest.mark.parametrize("value", ["0", "-1", "many", "2.5"])
def test_bad_threads_is_one_line_exit_2(value, capsys, tmp_path):
    assert main(["demo", "--threads", value, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"coulomb-attention: error: --threads must be auto or an integer >= 1, "
                   f"got {value!r}"]


def test_a_run_says_its_threads_once_and_records_them(tmp_path, capsys, monkeypatch):
    """``bench langevin`` (seconds): the resolved count once on stderr, set in torch, and in
    its result file with the machine's load."""
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    before = torch.get_num_threads()
    out = tmp_path / "bench"
    try:
        assert main(["bench", "langevin", "--N", "8", "--n", "8", "16", "--repeats", "1",
                     "--rounds", "1", "--out", str(out)]) == 0
        assert torch.get_num_threads() == max(1, os.cpu_count())
    finally:
        torch.set_num_threads(before)
    err = capsys.readouterr().err.splitlines()
    said = [line for line in err if line.startswith("threads: ")]
    assert said == [f"threads: {os.cpu_count()} (auto: {os.cpu_count()} cores, load 0.0)"]
    meta = json.loads((out / "langevin_step.json").read_text())["meta"]
    assert meta["threads"] == os.cpu_count() and meta["load_average_start"][0] == 0.0
    assert meta["cpu_count"] == os.cpu_count() and meta["verdict_withheld"] is None


def test_bad_input_stays_one_line_although_threads_were_resolved(tmp_path, capsys):
    """The thread count is held until the command first writes: a command that stops on bad
    input (here after apply_threads) still prints one line."""
    assert main(["recall", "--quick", "--n-features", "0", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search("n_features must be a positive integer", err[0])

"""Bad input to every CLI command: exit status 2 and one line on stderr naming the problem.

Every case runs ``coulomb_attention.cli.main(argv)`` in this process (``--out`` under the
test's tmp dir) and must fail before any heavy work. Errors caught by argparse itself (a value
that is not a number, a choice not offered) also exit 2; argparse prints its usage line
before the ``error:`` line, which is checked separately.

``DEFECTS`` lists the cases the audit found broken (since fixed; kept as regression tests). With
``RELIABILITY_LOG=path.jsonl`` every case appends what it got (for docs/reliability.md).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import time
from pathlib import Path

import pytest
import torch

from coulomb_attention.cli import main
from coulomb_attention.data.registry import SAMPLES_DIR

# Commands that take --out (everything but report); the tests point it at tmp_path.
_HAS_OUT = {"demo", "synthetic", "meanfield", "concentration", "train", "suite", "bench"}


def _record(case: str, outcome: str) -> None:
    path = os.environ.get("RELIABILITY_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"kind": "cli", "case": case, "outcome": outcome}) + "\n")


def _fill(argv: list[str], tmp_path: Path) -> list[str]:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] in _HAS_OUT and "--out" not in argv:
        argv = [*argv, "--out", str(tmp_path / "out")]
    return argv


def _run(argv: list[str], capsys) -> tuple[int, list[str], float]:
    threads = torch.get_num_threads()
    t0 = time.perf_counter()
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse
        rc = exc.code
    finally:
        torch.set_num_threads(threads)  # commands may set it
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return rc, err, time.perf_counter() - t0


# ----------------------------------------------------------------------------- fixtures


def _write_gz(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))


def _prepare(tmp_path: Path) -> None:
    """Files the cases refer to as {tmp}/..."""
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "unknown_key.json").write_text('{"nope": 1}')
    (tmp_path / "unknown_train_key.json").write_text('{"train": {"nope": 1}}')
    (tmp_path / "list.json").write_text("[1, 2]")
    # data dirs with one broken training file each (validation from the samples)
    good = json.dumps({"sentence": "a fine film", "label": 1})
    broken = {
        "truncated": None,
        "missing_col": [good, json.dumps({"text": "x", "label": 0})],
        "bad_label": [good, good, json.dumps({"sentence": "x", "label": 5})],
    }
    for name, lines in broken.items():
        d = tmp_path / f"data_{name}" / "sst2"
        d.mkdir(parents=True)
        (d / "validation.jsonl.gz").write_bytes(
            (SAMPLES_DIR / "sst2" / "validation.jsonl.gz").read_bytes())
        if lines is None:
            data = (SAMPLES_DIR / "sst2" / "train.jsonl.gz").read_bytes()
            (d / "train.jsonl.gz").write_bytes(data[: len(data) // 2])
        else:
            _write_gz(d / "train.jsonl.gz", lines)
    (tmp_path / "data_empty").mkdir()
    # results dirs for report
    (tmp_path / "empty_results").mkdir()
    for name, text in (("torn", '{"accuracy": 0.5, "ta'), ("nokeys", "{}")):
        p = tmp_path / f"results_{name}" / "sst2" / "favor-vanilla" / "seed0" / "metrics.json"
        p.parent.mkdir(parents=True)
        p.write_text(text)
    # an output dir that already holds checkpoints
    (tmp_path / "used" / "ckpt" / "warmup").mkdir(parents=True)
    (tmp_path / "used" / "ckpt" / "warmup" / "latest.json").write_text('{"name": "epoch-001"}')


# (argv, pattern the one-line message must match)
CASES: list[tuple[list[str], str]] = [
    # demo
    (["demo", "--n", "5"], r"--n must be >= 10, got 5"),
    (["demo", "--noise", "0.7"], r"--noise must be in \[0, 0.5\), got 0.7"),
    (["demo", "--d", "1"], r"d >= 2, got d=1"),
    (["demo", "--threads", "0"], r"--threads must be auto or an integer >= 1, got '0'"),
    # synthetic
    (["synthetic", "--tasks", "nope"],
     r"unknown task 'nope'; valid: anisotropic, checkerboard, radial, spectral, xor"),
    (["synthetic", "--methods", "nope"], r"unknown method 'nope'; valid: rff, orf"),
    (["synthetic", "--budgets", "0"], r"budgets must be positive integers, got 0"),
    (["synthetic", "--noise", "0.9"], r"noise levels must be in \[0, 0.5\), got 0.9"),
    (["synthetic", "--seeds", "-1"], r"seeds must be integers >= 0, got -1"),
    (["synthetic", "--seeds", "0,x"], r"--seeds: invalid int value 'x'"),
    (["synthetic", "--n-train", "-5"], r"n_train must be a positive integer, got -5"),
    (["synthetic", "--jobs", "0"], r"--jobs must be >= 1"),
    (["synthetic", "--config", "{tmp}/absent.json"], r"config file not found: .*absent\.json"),
    (["synthetic", "--config", "{tmp}/bad.json"], r"bad\.json is not valid JSON"),
    (["synthetic", "--config", "{tmp}/unknown_key.json"],
     r"unknown key\(s\) for SyntheticConfig: nope; valid:"),
    (["synthetic", "--report-only"], r"--report-only needs .*results\.jsonl"),
    # meanfield
    (["meanfield", "--beta", "0"], r"--beta must be a positive finite number, got 0"),
    (["meanfield", "--beta", "-1"], r"--beta must be a positive"),
    (["meanfield", "--dim", "3"], r"--dim must be 1 or 2, got 3"),
    (["meanfield", "--feature", "nope"], r"unknown --feature 'nope'; valid: positive, rff"),
    (["meanfield", "--potential", "nope"],
     r"unknown --potential 'nope'; valid: coulomb, log, riesz"),
    (["meanfield", "--half-width", "0"], r"--half-width must be a positive"),
    (["meanfield", "--eta", "0"], r"--eta must be a positive"),
    (["meanfield", "--lam", "-1"], r"--lam must be a finite number >= 0"),
    (["meanfield", "--eps", "nan"], r"--eps must be a positive finite number, got nan"),
    (["meanfield", "--s", "-1"], r"\bs must be a positive finite number, got -1"),
    (["meanfield", "--ns", "a,b"], r"--ns: invalid int value 'a'"),
    (["meanfield", "--ns", "8"], r"--ns needs at least two values >= 2"),
    (["meanfield", "--n-seeds", "0"], r"--n-seeds must be a positive integer"),
    (["meanfield", "--snapshots", "1"], r"--snapshots must be >= 2"),
    # concentration
    (["concentration", "--budgets", "0"], r"budgets must be positive integers, got 0"),
    (["concentration", "--betas", "-1"], r"betas must be > 0"),
    (["concentration", "--betas", "nan"], r"betas must be > 0.*nan"),
    (["concentration", "--seeds", "1"], r"n_seeds must be an integer >= 2"),
    (["concentration", "--particle-steps", "0"], r"n_steps must be a positive integer, got 0"),
    (["concentration", "--jobs", "0"], r"--jobs and --threads must be >= 1"),
    (["concentration", "--config", "{tmp}/absent.json"], r"config file not found"),
    (["concentration", "--config", "{tmp}/unknown_key.json"],
     r"unknown key\(s\) for ConcentrationConfig: nope"),
    # bench attention
    (["bench", "attention", "--lengths", "a,b"], r"--lengths: invalid int value 'a'"),
    (["bench", "attention", "--features", "0"], r"features must be positive integers, got \[0\]"),
    (["bench", "attention", "--quick", "--lengths", "0"], r"lengths must be positive integers"),
    (["bench", "attention", "--repeats", "0"], r"--repeats must be a positive integer, got 0"),
    (["bench", "attention", "--budget", "nan"], r"--budget must be positive, got nan"),
    # bench langevin
    (["bench", "langevin", "--N", "1"], r"--N values must be >= 2"),
    (["bench", "langevin", "--n", "0"], r"--n values must be >= 2"),
    (["bench", "langevin", "--d", "0"], r"--d, --repeats and --threads must be >= 1"),
    (["bench", "langevin", "--repeats", "0"], r"--d, --repeats and --threads must be >= 1"),
    # train
    (["train", "--task", "nope"], r"unknown task 'nope'; valid: qqp, rotten_tomatoes, sst2"),
    (["train", "--attention", "nope"],
     r"unknown attention 'nope'; valid: elu, favor, "),
    (["train", "--kernel", "nope"], r"unknown kernel 'nope'; valid: learned, vanilla"),
    (["train", "--attention", "elu", "--kernel", "learned"], r"'elu' has no particles"),
    (["train", "--epochs", "0"], r"epochs must be a positive integer, got 0"),
    (["train", "--lr", "-1"], r"lr must be a positive finite number, got -1"),
    (["train", "--lr", "nan"], r"lr must be a positive finite number, got nan"),
    (["train", "--n-features", "0"], r"n_features must be a positive integer, got 0"),
    (["train", "--dim", "30", "--heads", "4"], r"dim \(30\) must be divisible by heads \(4\)"),
    (["train", "--lam", "-1"], r"lam must be a finite number >= 0"),
    (["train", "--dropout", "1.5"], r"dropout must be in \[0, 1\)"),
    (["train", "--seed", "-1"], r"seed must be a finite number >= 0, got -1"),
    (["train", "--threads", "0"], r"--threads must be auto or an integer >= 1, got '0'"),
    (["train", "--max-length", "0"], r"max_length must be a positive integer"),
    (["train", "--align-steps", "0"], r"steps must be a positive integer, got 0"),
    (["train", "--kernel", "learned", "--warmup-epochs", "0"], r"needs warmup_epochs >= 1"),
    (["train", "--config", "{tmp}/absent.json"], r"config file not found: .*absent\.json"),
    (["train", "--config", "{tmp}/bad.json"], r"bad\.json is not valid JSON"),
    (["train", "--config", "{tmp}/list.json"], r"list\.json must hold a JSON object"),
    (["train", "--config", "{tmp}/unknown_key.json"], r"unknown key\(s\) for RunConfig: nope"),
    (["train", "--config", "{tmp}/unknown_train_key.json"],
     r"unknown key\(s\) for TrainConfig: nope"),
    (["train", "--data-dir", "{tmp}/absent"], r"absent.*does not exist"),
    (["train", "--data-dir", "{tmp}/data_empty"], r"no file for sst2 split 'train'"),
    (["train", "--data-dir", "{tmp}/data_truncated"],
     r"train\.jsonl\.gz: truncated or corrupt gzip"),
    (["train", "--data-dir", "{tmp}/data_missing_col"],
     r"train\.jsonl\.gz, line 2: missing column 'sentence'"),
    (["train", "--data-dir", "{tmp}/data_bad_label"],
     r"train\.jsonl\.gz, line 3: label 5 is out of range"),
    (["train", "--out", "{tmp}/used"], r"already holds checkpoints; pass --resume"),
    # suite
    (["suite", "--tasks", "nope"], r"unknown task 'nope'; valid: qqp, rotten_tomatoes, sst2"),
    (["suite", "--variants", "nope"], r"unknown variant 'nope'; valid: elu-vanilla"),
    (["suite", "--data-dir", "{tmp}/absent"], r"absent.*does not exist"),
    (["suite", "--tasks", "sst2", "--epochs", "0"], r"epochs must be a positive integer"),
    (["suite", "--config", "{tmp}/unknown_key.json"], r"unknown key\(s\) for RunConfig: nope"),
    (["demo", "--seed", "-1"], r"--seed must be >= 0"),
    # report
    (["report", "{tmp}/absent"], r"results directory not found: .*absent"),
    (["report", "{tmp}/empty_results"],
     r"empty_results: expected a train run \(metrics\.json\), .*"
     r"a suite \(\*/\*/seed\*/metrics\.json\)"),
]

DEFECTS = {
    "suite --seeds a": "suite --seeds a reports \"invalid literal for int() with base 10: 'a'\" "
                       "without naming --seeds",
    "report torn metrics.json": "report on a torn metrics.json prints json's parse error "
                                "('Unterminated string ...') without the file name",
    "report metrics.json without keys": "report on a metrics.json without 'task' crashes with "
                                        "a KeyError traceback",
    "synthetic --particle-steps 0": "synthetic --particle-steps 0 runs the grid (15 runs, "
                                    "~25 s) before ParticleFeatures rejects n_steps=0",
    "meanfield --grid 0": "meanfield --grid 0 silently uses the default grid (args.grid or "
                          "default) and runs the whole experiment",
}
DEFECT_CASES: list[tuple[str, list[str], str]] = [
    ("suite --seeds a", ["suite", "--seeds", "a"], r"--seeds"),
    ("report torn metrics.json", ["report", "{tmp}/results_torn"], r"metrics\.json"),
    ("report metrics.json without keys", ["report", "{tmp}/results_nokeys"],
     r"metrics\.json.*task"),
]


def _assert_cli_error(argv, pattern, tmp_path, capsys, case=None, max_s=20.0):
    _prepare(tmp_path)
    argv = _fill(argv, tmp_path)
    case = case or " ".join(a.replace(str(tmp_path), "TMP") for a in argv if a != "--out"
                            and not a.endswith("/out"))
    try:
        rc, err, wall = _run(argv, capsys)
    except BaseException as exc:
        _record(case, f"uncaught {type(exc).__name__}: {str(exc)[:150]} (traceback)")
        raise
    shown = err[-1].replace(str(tmp_path), "TMP") if err else "(no stderr)"
    _record(case, f"exit {rc}: {shown[:200]}")
    assert rc == 2, f"{case}: exit status {rc}, stderr {err}"
    assert not any("Traceback" in line for line in err)
    assert len(err) == 1, f"{case}: expected one stderr line, got {err}"
    assert err[0].startswith("coulomb-attention: error: ")
    assert re.search(pattern, err[0]), f"{case}: message does not name the problem: {err[0]}"
    assert wall < max_s, f"{case}: took {wall:.1f} s (the error must come before heavy work)"


@pytest.mark.parametrize("argv,pattern", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_cli_bad_input_exits_2_with_one_line(argv, pattern, tmp_path, capsys):
    _assert_cli_error(argv, pattern, tmp_path, capsys)


@pytest.mark.parametrize(
    "case,argv,pattern",
    [pytest.param(*c, id=c[0]) for c in DEFECT_CASES],
)
def test_cli_former_defects(case, argv, pattern, tmp_path, capsys):
    _assert_cli_error(argv, pattern, tmp_path, capsys, case=case)


def test_synthetic_rejects_bad_particle_args_before_running(tmp_path, capsys):
    _assert_cli_error(["synthetic", "--quick", "--tasks", "xor", "--methods", "rff", "particles",
            "--budgets", "16", "--seeds", "1", "--particle-steps", "0"],
           r"n_steps must be a positive integer, got 0", tmp_path, capsys,
           case="synthetic --particle-steps 0", max_s=10.0)
    rows = tmp_path / "out" / "results.jsonl"
    n_rows = len(rows.read_text().splitlines()) if rows.exists() else 0
    _record("synthetic --particle-steps 0: grid rows computed before the error", str(n_rows))
    assert n_rows == 0, f"{n_rows} grid run(s) computed before the bad argument was rejected"


def test_meanfield_rejects_grid_zero(tmp_path, capsys, monkeypatch):
    from coulomb_attention.studies import meanfield

    ran = []

    def stop(*a, **k):  # if validation lets --grid 0 through, stop before the heavy work
        ran.append(a)
        raise ValueError("reached _setup: --grid 0 was not rejected")

    monkeypatch.setattr(meanfield, "_setup", stop)
    _assert_cli_error(["meanfield", "--grid", "0"], r"--grid must be a positive integer, got 0",
                      tmp_path, capsys, case="meanfield --grid 0")
    assert not ran


ARGPARSE_CASES = [
    (["demo", "--n", "abc"], r"argument --n: invalid int value: 'abc'"),
    (["train", "--lr", "fast"], r"argument --lr: invalid float value: 'fast'"),
    (["bench", "langevin", "--dtype", "float16"], r"argument --dtype: invalid choice"),
    (["meanfield", "--dtype", "int8"], r"argument --dtype: invalid choice"),
    (["nope"], r"argument COMMAND: invalid choice: 'nope'"),
]


@pytest.mark.parametrize("argv,pattern", ARGPARSE_CASES,
                         ids=[" ".join(c[0]) for c in ARGPARSE_CASES])
def test_cli_argparse_errors_exit_2(argv, pattern, tmp_path, capsys):
    rc, err, _ = _run(_fill(argv, tmp_path), capsys)
    _record(" ".join(argv), f"exit {rc} (argparse: usage line, then) {err[-1][:160]}")
    assert rc == 2
    assert not any("Traceback" in line for line in err)
    assert re.search(pattern, err[-1]) and "error:" in err[-1]


def test_cli_non_finite_training_stops_with_one_line(tmp_path, capsys, monkeypatch):
    """A loss that turns NaN stops `train` with exit 2 and one line (no metrics written)."""
    from coulomb_attention.train import loop

    real = loop.nn.functional.cross_entropy
    calls = {"n": 0}

    def nan_after_three(*a, **k):
        calls["n"] += 1
        loss = real(*a, **k)
        return loss * float("nan") if calls["n"] > 3 else loss

    monkeypatch.setattr(loop.nn.functional, "cross_entropy", nan_after_three)
    out = tmp_path / "nan"
    argv = ["train", "--task", "sst2", "--attention", "elu", "--kernel", "vanilla",
            "--dim", "8", "--layers", "1", "--heads", "2", "--train-limit", "64",
            "--eval-limit", "16", "--vocab-size", "200", "--batch-size", "16",
            "--warmup-epochs", "0", "--epochs", "1", "--no-progress",
            "--data-dir", str(SAMPLES_DIR), "--out", str(out)]
    rc, err, _ = _run(argv, capsys)
    _record("train: loss becomes NaN at step 4", f"exit {rc}: {err[-1][:200] if err else ''}")
    # the run had started: its thread count was noted (commands._args.flush_notes), then one line
    assert err and err[0].startswith("threads: ")
    err = err[1:]
    assert rc == 2 and len(err) == 1
    assert re.search(r"non-finite training loss \(nan\) at epoch 1, step 3", err[0])
    assert not (out / "metrics.json").exists()


def test_cli_internal_bug_keeps_traceback_and_exits_1(monkeypatch, capsys):
    """A bug (here a TypeError inside a command) is not a user error: it propagates with its
    traceback (the console script exits 1), instead of a one-line exit 2."""
    from coulomb_attention.commands import demo

    def broken(args):
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

    monkeypatch.setattr(demo, "run", broken)
    with pytest.raises(TypeError, match="unsupported operand"):
        main(["demo"])


def test_cli_missing_optional_package_is_a_user_error(monkeypatch, capsys):
    from coulomb_attention.commands import demo

    def needs(args):
        raise ModuleNotFoundError("No module named 'performer_pytorch'", name="performer_pytorch")

    monkeypatch.setattr(demo, "run", needs)
    assert main(["demo"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "performer_pytorch" in err[0] and "optional" in err[0]

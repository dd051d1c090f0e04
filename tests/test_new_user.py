"""What a new user sees (issue 18): the shipped-sample warning, resume feedback, file modes that
honour the umask, the process/batch record in metrics.json, clipped limits, --help defaults.
Round two (issue 48): result files record their data source, progress lines off a terminal,
`report` of a train run and the layouts it expects, target sources, `convert` on the samples and
on a finished --out, `--data-dir hf` without `datasets`, subcommand usage, the SPDX license."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest
import torch

from coulomb_attention.cli import main
from coulomb_attention.results import (
    apply_umask,
    atomic_write_json,
    atomic_write_text,
    current_umask,
)
from coulomb_attention.train import checkpoint as ckpt
from coulomb_attention.train import run as pipeline

# a run of a few seconds on the shipped samples (no --data-dir: the case under test)
TINY = ["train", "--task", "sst2", "--attention", "favor", "--kernel", "vanilla",
        "--epochs", "1", "--warmup-epochs", "1", "--dim", "16", "--layers", "1", "--heads", "2",
        "--n-features", "8", "--train-limit", "64", "--eval-limit", "5000",
        "--vocab-size", "300", "--max-length", "16", "--batch-size", "32", "--no-progress",
        "--threads", "1", "--seed", "0"]


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def no_data_env(monkeypatch):
    monkeypatch.delenv("COULOMB_DATA_DIR", raising=False)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_current_umask_reads_the_process_umask(umask_022):
    assert current_umask() == 0o022
    os.umask(0o027)
    assert current_umask() == 0o027


def test_atomic_writes_honour_the_umask(tmp_path, umask_022):
    atomic_write_text(tmp_path / "a.txt", "x")
    atomic_write_json(tmp_path / "b.json", {"x": 1})
    atomic_write_text(tmp_path / "c.txt", "x", exclusive=True)
    for name in ("a.txt", "b.json", "c.txt"):
        assert _mode(tmp_path / name) == 0o644, name
    os.umask(0o077)
    atomic_write_text(tmp_path / "private.txt", "x")
    assert _mode(tmp_path / "private.txt") == 0o600


def test_checkpoint_folders_honour_the_umask(tmp_path, umask_022):
    model = torch.nn.Linear(2, 2)
    final = ckpt.save_checkpoint(tmp_path / "ck", "epoch-001", model, {"epoch": 1})
    assert _mode(final) == 0o755
    for f in final.iterdir():
        assert _mode(f) == 0o644, f.name
    assert _mode(tmp_path / "ck" / "latest.json") == 0o644
    d = tmp_path / "plain"
    d.mkdir(mode=0o700)
    apply_umask(d)
    assert _mode(d) == 0o755


def test_shipped_sample_resume_feedback_and_run_record(tmp_path, capsys, no_data_env,
                                                      umask_022):
    out = tmp_path / "run"
    # --resume on a folder that does not exist is an error (a mistyped --out)
    assert main([*TINY, "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "does not exist" in err and not out.exists()

    assert main([*TINY, "--out", str(out), "--resume", "auto"]) == 0
    cap = capsys.readouterr()
    assert f"nothing to resume in {out}: starting fresh" in cap.out
    # no --data-dir: loud at the start, in the summary line, on stderr after the result
    lines = cap.out.splitlines()
    warning = next(i for i, line in enumerate(lines) if line.startswith("WARNING"))
    assert "SHIPPED SAMPLE" in lines[warning]
    assert warning < next(i for i, line in enumerate(lines) if "fine-tune" in line.lower()
                          or "warm-up" in line.lower() or line.startswith("[sst2"))
    summary = [line for line in lines if line.startswith("[sst2/") and "accuracy" in line]
    assert summary and "[SHIPPED SAMPLE" in summary[-1]
    assert "SHIPPED SAMPLE" in cap.err
    # a limit above the split size is said, not silently clipped
    assert "eval_limit 5000 is more than the" in cap.out
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["data_is_sample"] is True
    assert metrics["world_size"] == 1 and metrics["global_batch_size"] == 32
    assert metrics["batch_size_per_process"] == 32 and metrics["torch_threads"] == 1
    # result files and checkpoint folders are readable by others (umask 022)
    assert _mode(out / "metrics.json") == 0o644
    assert _mode(out / "tokenizer.json") == 0o644
    last = ckpt.latest_checkpoint(out / "ckpt" / "finetune")
    assert _mode(last) == 0o755 and _mode(last / "model.safetensors") == 0o644

    assert pipeline.resume_point(out) == "after fine-tune epoch 1 (finished: re-evaluates)"
    assert main([*TINY, "--out", str(out), "--resume"]) == 0
    assert f"resuming {out} after fine-tune epoch 1" in capsys.readouterr().out


def test_resume_point_names_the_latest_stage(tmp_path):
    model = torch.nn.Linear(2, 2)
    assert pipeline.resume_point(tmp_path) is None
    ckpt.save_checkpoint(tmp_path / "ckpt" / "warmup", "epoch-002", model, {"epoch": 2})
    assert pipeline.resume_point(tmp_path) == "after warm-up epoch 2"
    ckpt.save_phase_a_partial(tmp_path / "ckpt" / "aligned", model, 1, [], torch.zeros(3), 1.0)
    assert pipeline.resume_point(tmp_path) == "in phase A, 1 layer(s) aligned"
    atomic_write_json(tmp_path / "ckpt" / "aligned" / "alignment.json",
                      {"alignment": [], "time_s": 1.0})
    assert pipeline.resume_point(tmp_path) == "after phase A"
    ckpt.save_checkpoint(tmp_path / "ckpt" / "finetune", "epoch-001", model, {"epoch": 1})
    assert pipeline.resume_point(tmp_path) == "after fine-tune epoch 1"


def test_resume_mode_is_checked(tmp_path):
    cfg = pipeline.make_run_config({})
    with pytest.raises(ValueError, match="resume must be one of"):
        pipeline.run(cfg, tmp_path, resume="yes")


def test_train_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: sst2)" in text and "(default: favor)" in text
    assert "phase-B (fine-tuning) epochs (default: 2; pretrained encoder: 1)" in text
    assert "random subset of the evaluation split (default: all)" in text
    assert "random features per head (default: 64)" in text


# ------------------------------------------------------------------ round two (issue 48)

def _train_argv(out, *extra):
    argv = [a for a in TINY if a != "--no-progress"]
    return [*argv, "--out", str(out), *extra]


@pytest.fixture(scope="module")
def train_run(tmp_path_factory):
    """One TINY run on the shipped samples, as `train` lays it out under runs/train, with its
    progress in lines (off a terminal) and a clock that advances 31 s per reading."""
    import contextlib
    import io

    from coulomb_attention import progress
    from coulomb_attention.commands._args import progress_mode

    root = tmp_path_factory.mktemp("runs") / "train"
    out = root / "sst2-favor-vanilla-s0"
    t = {"now": 0.0}

    def clock():
        t["now"] += 31.0
        return t["now"]

    env = os.environ.pop("COULOMB_DATA_DIR", None)
    old_clock = progress._clock
    progress._clock = clock
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            rc = main(_train_argv(out, "--progress", "lines"))
    finally:
        progress._clock = old_clock
        progress_mode("bar")
        if env is not None:
            os.environ["COULOMB_DATA_DIR"] = env
    assert rc == 0, stderr.getvalue()
    return root, out, stdout.getvalue(), stderr.getvalue()


def test_train_records_its_data_source_and_threads(train_run):
    from coulomb_attention.data.registry import SAMPLES_DIR

    _, out, _, err = train_run
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["data"] == {"source": "samples", "path": str(SAMPLES_DIR)}
    assert metrics["data_is_sample"] is True and metrics["torch_threads"] == 1
    said = [line for line in err.splitlines() if line.startswith("threads: ")]
    assert len(said) == 1 and said[0].startswith("threads: 1 (--threads 1; ")


def test_train_prints_progress_lines_off_a_terminal(train_run):
    """--progress lines (auto off a terminal): each epoch's loop says where it is at least
    every 30 s: step i/n, elapsed, loss."""
    out = train_run[2]
    lines = [line for line in out.splitlines()
             if re.match(r"(warm-up|fine-tune) 1/1: step \d+/\d+, .* elapsed, loss \d", line)]
    assert any(line.startswith("fine-tune 1/1: step 1/2,") for line in lines), out
    assert any(line.startswith("warm-up 1/1: step 2/2,") for line in lines), out


def test_data_source_of_each_kind(tmp_path, monkeypatch):
    from coulomb_attention.data.registry import SAMPLES_DIR, data_source

    monkeypatch.delenv("COULOMB_DATA_DIR", raising=False)
    assert data_source() == {"source": "samples", "path": str(SAMPLES_DIR)}
    assert data_source(SAMPLES_DIR / "sst2")["source"] == "samples"
    assert data_source("hf") == {"source": "hf", "path": None}
    assert data_source(tmp_path) == {"source": "dir", "path": str(tmp_path.resolve())}
    monkeypatch.setenv("COULOMB_DATA_DIR", str(tmp_path))
    assert data_source()["source"] == "dir"
    with pytest.raises(FileNotFoundError):
        data_source(tmp_path / "absent")


def test_report_reads_a_train_run_and_train_default_folder(train_run, tmp_path, capsys):
    root, out, _, _ = train_run
    for target in (out, root):
        assert main(["report", str(target), "--no-plots"]) == 0
        text = (target / "report.md").read_text()
        assert "1 run(s) read from" in text and "## sst2" in text
        assert "Data: the SHIPPED SAMPLE of the package" in text
        # every target line names where its target comes from
        targets = [line for line in text.splitlines() if "target" in line.lower()
                   and line.startswith("- ")]
        assert targets and all("docs/transformer.md" in line for line in targets), targets
    # a result file from before the data source was recorded still reports
    old = tmp_path / "old" / "sst2-favor-vanilla-s0"
    old.mkdir(parents=True)
    metrics = json.loads((out / "metrics.json").read_text())
    del metrics["data"]
    (old / "metrics.json").write_text(json.dumps(metrics))
    assert main(["report", str(old.parent), "--no-plots"]) == 0
    assert "Data: not recorded" in (old.parent / "report.md").read_text()


def test_report_says_which_layouts_it_expects(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    assert main(["report", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{tmp_path / 'x'}: expected a train run (metrics.json)" in err[0]
    assert "(*/metrics.json)" in err[0] and "a suite (*/*/seed*/metrics.json)" in err[0]
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "results.jsonl").write_text("")
    assert main(["report", str(tmp_path / "m")]) == 2
    assert "minilm report" in capsys.readouterr().err


def test_every_report_target_names_its_source():
    from coulomb_attention.reports import minilm, recall, transformer

    runs = {"softmax-vanilla": [{"seed": 0, "accuracy": 0.8, "ece": 0.1, "mcc": 0.5,
                                 "log_loss": 0.5, "brier": 0.2}],
            "favor-learned": [{"seed": 0, "accuracy": 0.81, "ece": 0.09, "mcc": 0.5,
                               "log_loss": 0.5, "brier": 0.2}]}
    for task in ("sst2", "qqp"):
        lines = [line for line in transformer.target_lines(task, runs)
                 if "target" in line.lower() and line.startswith("- ")]
        assert lines and all(transformer.TARGET_SOURCE in line for line in lines), lines
    assert "docs/minilm.md" in minilm.TARGET_SOURCE
    assert "docs/recall.md" in (Path(recall.__file__).read_text())


def _tiny_bert(tmp_path):
    from test_pretrained import write_tiny_bert

    (tmp_path / "tiny-bert").mkdir()
    return write_tiny_bert(tmp_path / "tiny-bert", qk_scale=4.0)


def test_convert_on_samples_warns_records_and_a_finished_one_is_left(tmp_path, capsys,
                                                                     no_data_env):
    """`convert` without --data-dir warns as `train` does (stdout at the start, stderr at
    the end), records its data source, and a second run of a finished --out does nothing
    (exit 0, one line saying so) unless --force."""
    tiny = _tiny_bert(tmp_path)
    out = tmp_path / "conv"
    argv = ["convert", "--encoder", str(tiny), "--n-features", "4", "--tasks", "sst2",
            "--n-sentences", "9", "--holdout", "3", "--steps", "2", "--batch-size", "3",
            "--max-length", "16", "--eval-sentences", "8", "--refine-steps", "0",
            "--probe-tasks", "--no-hf", "--no-progress", "--threads", "1", "--out", str(out)]
    assert main(argv) == 0
    cap = capsys.readouterr()
    assert cap.out.startswith("WARNING: no data directory given") and "SHIPPED SAMPLE" in cap.out
    assert "SHIPPED SAMPLE" in cap.err.splitlines()[-1]
    assert "data: the SHIPPED SAMPLE of the package" in cap.out
    res = json.loads((out / "result.json").read_text())
    assert res["data"]["source"] == "samples"
    stamp = (out / "result.json").stat().st_mtime_ns

    assert main(argv) == 0  # finished: nothing to do
    cap = capsys.readouterr()
    assert cap.out.strip() == (f"{out} holds a finished conversion (result.json); nothing to "
                               "do. --force converts again, --evaluate re-measures it.")
    assert "SHIPPED" not in cap.out + cap.err
    assert (out / "result.json").stat().st_mtime_ns == stamp

    assert main([*argv, "--force"]) == 0  # converts again
    assert "embedding cosine" in capsys.readouterr().out
    assert (out / "result.json").stat().st_mtime_ns != stamp
    assert main([*argv, "--force", "--evaluate"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--force converts again" in err and "\n" not in err


def test_data_dir_hf_without_datasets_is_one_line(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` fails
    assert main(_train_argv(tmp_path / "hf", "--data-dir", "hf", "--no-progress")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("coulomb-attention: error: ")
    assert "`datasets` package" in err[0] and "pip install datasets" in err[0]
    assert "coulomb-attention[hf]" in err[0]


def test_a_missing_optional_package_names_its_install_line():
    from coulomb_attention.cli import optional_message

    msg = optional_message(ModuleNotFoundError("No module named 'transformers'",
                                               name="transformers"))
    assert msg == ("No module named 'transformers': the optional package transformers is not "
                   "installed; pip install transformers (or pip install "
                   "'coulomb-attention[hf-export]')")
    try:
        import definitely_not_a_package  # noqa: F401
    except ModuleNotFoundError as exc:
        assert "pip install definitely-not-a-package" in optional_message(exc)


@pytest.mark.parametrize("argv,usage", [
    (["train", "--taks", "sst2"], "usage: coulomb-attention train "),
    (["minilm", "compare", "--bogus"], "usage: coulomb-attention minilm compare "),
    (["bench", "attention", "--bogus"], "usage: coulomb-attention bench attention "),
    (["convert", "--bogus"], "usage: coulomb-attention convert "),
])
def test_a_subcommand_parse_error_shows_its_usage(argv, usage, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert err.strip().splitlines()[-1].endswith(f"error: unrecognized arguments: {argv[-1]}"
                                                  if argv[-1] != "sst2" else
                                                  "error: unrecognized arguments: --taks sst2")


def test_license_is_an_spdx_string():
    """PEP 639: `license = "MIT"` (a table is deprecated and warns on every install); needs
    setuptools >= 77 in the build requirements."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    repo = Path(__file__).resolve().parents[1]
    project = tomllib.loads((repo / "pyproject.toml").read_text())
    assert project["project"]["license"] == "MIT"
    assert not any("License ::" in c for c in project["project"].get("classifiers", []))
    pins = [r for r in project["build-system"]["requires"] if r.startswith("setuptools")]
    assert pins == ["setuptools>=77"]

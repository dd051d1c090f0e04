"""The README as a newcomer uses it (issue 48): every ```python block runs on its own, as
written, in a fresh interpreter and prints what it computes; every ```bash line names a command
(and subcommand) the CLI has, or a Makefile target; the Commands table names real commands."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from coulomb_attention.cli import BENCHMARKS, COMMANDS, build_parser

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
#: seconds a block may take (each runs alone, one thread)
BLOCK_TIMEOUT = 120


def blocks(text: str, lang: str) -> list[str]:
    """The bodies of the fenced ```lang blocks of ``text``, in order."""
    return re.findall(rf"^```{lang}[ \t]*\n(.*?)^```[ \t]*$", text, flags=re.S | re.M)


def shell_commands(block: str) -> list[list[str]]:
    """Each command of a bash block as its words (comments dropped, ``\\`` continuations
    joined)."""
    joined = re.sub(r"\\\n", " ", block)
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(words)
    return out


def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, flags=re.M))


def check_shell(words: list[str]) -> str | None:
    """Why ``words`` is not a command the README may show (None: it is)."""
    if words[0] == "make":
        missing = [t for t in words[1:] if not t.startswith("-") and "=" not in t
                   and t not in make_targets()]
        return f"no Makefile target {missing}" if missing else None
    if words[0] == "coulomb-attention":
        argv = words[1:]
        try:
            build_parser(argv).parse_args(argv)
        except SystemExit as exc:
            return f"the CLI rejects {' '.join(argv)!r} (exit {exc.code})"
        except ValueError as exc:
            return f"the CLI rejects {' '.join(argv)!r}: {exc}"
        return None
    return None  # other tools (pip, python, ...) are not ours to check


PY_BLOCKS = blocks(README, "python")


def test_the_readme_has_python_and_bash_blocks():
    assert len(PY_BLOCKS) >= 2 and blocks(README, "bash")


_RUNS: dict[int, subprocess.CompletedProcess] = {}


def run_block(index: int, cwd: Path) -> subprocess.CompletedProcess:
    """README python block ``index`` run once, alone, in a fresh interpreter (one thread)."""
    if index not in _RUNS:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        _RUNS[index] = subprocess.run([sys.executable, "-c", PY_BLOCKS[index]], cwd=cwd,
                                      env=env, capture_output=True, text=True,
                                      timeout=BLOCK_TIMEOUT)
    return _RUNS[index]


@pytest.mark.parametrize("index", range(len(PY_BLOCKS)))
def test_python_block_runs_on_its_own(index, tmp_path):
    proc = run_block(index, tmp_path)
    assert proc.returncode == 0, f"README python block {index + 1} failed:\n{proc.stderr[-2000:]}"
    assert proc.stdout.strip(), f"README python block {index + 1} prints nothing"


def test_python_blocks_print_what_they_compute(tmp_path):
    """What the prose promises: learned features that fit the moons, particles (64, 2), an
    attention output of the input's shape; a held-out row KL that falls, one omega per head."""
    first = run_block(0, tmp_path).stdout.splitlines()
    score, shape = first[0].split(" ", 1)
    assert float(score) > 0.9 and shape == "(64, 2)"  # a numpy array
    assert first[1] == "torch.Size([2, 10, 256])"
    second = run_block(1, tmp_path).stdout.splitlines()
    before, after = (float(v) for v in second[0].split(" -> "))
    assert 0 < after < before
    assert second[1] == "torch.Size([2, 64, 64])"


def test_bash_blocks_use_commands_that_exist():
    problems = []
    for block in blocks(README, "bash"):
        for words in shell_commands(block):
            why = check_shell(words)
            if why:
                problems.append(f"{' '.join(words)}: {why}")
    assert not problems, "\n".join(problems)


def test_the_commands_table_names_real_commands():
    section = README.split("## Commands", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert len(rows) >= 5
    for row in rows:
        cell = row.split(" | ")[0]
        for span in re.findall(r"`([^`]+)`", cell):
            words = span.replace("\\|", "|").split()
            if words[0] == "bench":
                for name in (w for w in words[1:] if w.isidentifier() and w.islower()):
                    assert name in BENCHMARKS, f"README names bench {name}"
            else:
                assert words[0] in COMMANDS, f"README names command {words[0]!r}"


def test_the_checks_can_fail():
    assert check_shell(["coulomb-attention", "trian"]) is not None
    assert check_shell(["coulomb-attention", "train", "--taks", "sst2"]) is not None
    assert check_shell(["coulomb-attention", "bench", "attenton"]) is not None
    assert check_shell(["coulomb-attention", "minilm", "compare", "--bogus"]) is not None
    assert check_shell(["coulomb-attention", "train", "--task", "sst2"]) is None
    assert check_shell(["make", "demo"]) is None and check_shell(["make", "deploy"])
    text = "x\n```python\nprint(1)\n```\n\n```bash\nmake demo  # a comment\n" \
           "coulomb-attention report \\\n    runs/suite\n```\n"
    assert blocks(text, "python") == ["print(1)\n"]
    assert shell_commands(blocks(text, "bash")[0]) == [["make", "demo"],
                                                       ["coulomb-attention", "report",
                                                        "runs/suite"]]

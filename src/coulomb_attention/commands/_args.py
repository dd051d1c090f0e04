"""The command line's shared conventions, in one place.

- Lists: every list flag takes space-separated values (``--seeds 0 1 2``, as argparse users
  expect); commas are accepted too (``--seeds 0,1,2``, ``--seeds 0,1 2``). :func:`list_arg`.
- Presets (``--quick``): a preset fills only the flags the user did not give; flags default
  to ``None`` and :func:`fill` resolves them. An explicit flag always wins.
- Progress: ``--progress {auto,bar,lines,none}``; ``auto`` (the default) draws bars only when
  stderr is a terminal and otherwise prints a line per stage (``convert > log 2>&1`` holds no
  bar redraws) and, inside a long stage, a line at least every 30 s
  (:class:`coulomb_attention.progress.Ticker`); ``--no-progress`` = ``--progress none``.
  :func:`add_progress`, :func:`progress_mode`.
- Threads: every command that computes takes ``--threads {auto,N}`` (default ``auto``: the
  cores the 1-minute load average leaves free, divided among ``--jobs`` where a command runs
  several processes). :func:`add_threads`, :func:`resolve_threads`, :func:`apply_threads`.

Nothing here imports torch (``--help`` of every command prints without it).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

from ..bench.machine import load_average  # the one reader of the load average
from ..progress import set_lines

__all__ = ["PROGRESS_MODES", "THREADS_HELP", "add_progress", "add_threads", "apply_threads",
           "fill", "flush_notes", "free_cores", "list_arg", "note", "progress_mode",
           "resolve_threads", "split_list"]

PROGRESS_MODES = ("auto", "bar", "lines", "none")


def split_list(values: Iterable[str], kind: Callable[[str], Any] = str,
               choices: Iterable | None = None, name: str = "list") -> list:
    """``["0,1", "2"]`` -> ``[0, 1, 2]`` (with ``kind=int``); empty items are skipped.

    Raises ``ValueError`` (the CLI's exit 2 with one line) on a value ``kind`` rejects or one
    outside ``choices``, and on an empty list.
    """
    valid = None if choices is None else list(choices)
    out = []
    for text in values:
        for item in str(text).split(","):
            item = item.strip()
            if not item:
                continue
            try:
                value = kind(item)
            except (TypeError, ValueError):
                raise ValueError(
                    f"{name}: invalid {getattr(kind, '__name__', 'value')} value {item!r}"
                ) from None
            if valid is not None and value not in valid:
                raise ValueError(
                    f"{name}: invalid choice {value!r} (choose from {', '.join(map(str, valid))})")
            out.append(value)
    if not out:
        raise ValueError(f"{name}: expected at least one value")
    return out


class _ListAction(argparse.Action):
    def __init__(self, option_strings, dest, kind=str, list_choices=None, **kwargs):
        self.kind, self.list_choices = kind, list_choices
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, split_list(values, self.kind, self.list_choices,
                                                 option_string or self.dest))


def list_arg(parser: argparse.ArgumentParser, *flags: str, type: Callable = str,  # noqa: A002
             choices: Iterable | None = None, **kwargs) -> argparse.Action:
    """Add a list flag: space-separated values, commas accepted too.

    ``choices`` are checked per item (after ``type``); ``default`` is returned as given (a
    list, or ``None`` for a flag a preset or a config fills).
    """
    kwargs.setdefault("metavar", (flags[0].lstrip("-").upper().replace("-", "_")
                                  if choices is None else "{" + ",".join(map(str, choices)) + "}"))
    return parser.add_argument(*flags, nargs="+", action=_ListAction, kind=type,
                               list_choices=None if choices is None else tuple(choices),
                               **kwargs)


def fill(args: argparse.Namespace, preset: dict[str, Any]) -> argparse.Namespace:
    """Set each ``preset`` flag (by dest) that the user left at ``None``; explicit flags win."""
    for dest, value in preset.items():
        if getattr(args, dest, None) is None:
            setattr(args, dest, value)
    return args


def add_progress(parser: argparse.ArgumentParser) -> None:
    """``--progress [{auto,bar,lines,none}]`` (default ``auto``; ``--progress`` alone: ``bar``)
    and ``--no-progress`` (= ``--progress none``)."""
    parser.add_argument("--progress", choices=PROGRESS_MODES, default="auto", nargs="?",
                        const="bar",
                        help="progress display: bars, a line per stage, or nothing; auto: bars "
                             "only when stderr is a terminal, else a line per stage; "
                             "--progress alone: bar (default: auto)")
    parser.add_argument("--no-progress", dest="progress", action="store_const", const="none",
                        help="same as --progress none")


def progress_mode(args: argparse.Namespace | str, stream=None) -> str:
    """The resolved mode (``bar``, ``lines`` or ``none``) of ``args.progress``.

    The libraries take ``progress: bool`` (bars and their per-stage lines); pass
    ``mode != "none"``. Outside ``bar`` mode the process's tqdm bars are switched off here
    (:func:`_bars`), so only the per-stage lines remain.
    """
    mode = args if isinstance(args, str) else getattr(args, "progress", "auto")
    if mode not in PROGRESS_MODES:
        raise ValueError(f"progress must be one of {', '.join(PROGRESS_MODES)}, got {mode!r}")
    if mode == "auto":
        stream = sys.stderr if stream is None else stream
        mode = "bar" if getattr(stream, "isatty", lambda: False)() else "lines"
    _bars(mode == "bar")
    set_lines(mode == "lines")
    return mode


# ------------------------------------------------------------------------------- threads

THREADS_HELP = ("torch CPU threads: auto (the cores the 1-minute load average leaves "
                "free, at least 1) or N >= 1; on a busy machine fewer threads than cores is "
                "often faster")


def free_cores(cpu_count: int | None = None, load: float | None = None) -> tuple[int, int, float]:
    """``(free, cores, load)``: ``free = max(1, cores - round(load))`` with ``load`` the
    1-minute load average (``os.getloadavg``; unavailable: 0, every core free) and ``cores``
    ``os.cpu_count()``."""
    cores = int(cpu_count or os.cpu_count() or 1)
    if load is None:
        load = load_average()[0]
        load = load if math.isfinite(load) else 0.0  # not on this system
    return max(1, cores - round(load)), cores, float(load)


class _ThreadsAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, _parse_threads(values, option_string or "--threads"))


def _parse_threads(value, flag: str = "--threads") -> int | str:
    """``"auto"`` or an int >= 1; anything else raises ``ValueError`` (one line, exit 2)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    text = str(value).strip()
    n = int(text) if text.isdigit() and not isinstance(value, bool) else 0
    if n < 1:
        raise ValueError(f"{flag} must be auto or an integer >= 1, got {value!r}")
    return n


def add_threads(parser: argparse.ArgumentParser, per: str = "") -> argparse.Action:
    """``--threads {auto,N}`` (default ``auto``); ``per``: what each count is for (``"per
    job"`` where a command runs ``--jobs`` processes)."""
    help_ = THREADS_HELP + (f" ({per}; auto divides the free cores among them)" if per else "")
    return parser.add_argument("--threads", action=_ThreadsAction, default="auto",
                               metavar="{auto,N}", help=help_ + " (default: auto)")


def resolve_threads(args: argparse.Namespace | int | str, jobs: int = 1, *,
                    cpu_count: int | None = None, load: float | None = None,
                    log: Callable[[str], None] | None = None) -> int:
    """The thread count of ``args.threads`` (or of the value itself): an int as given;
    ``"auto"``: ``max(1, free_cores // jobs)`` (:func:`free_cores`). ``log`` (e.g. ``print`` to
    stderr) receives one line, ``threads: 1 (auto: 2 cores, load 1.3)``."""
    value = getattr(args, "threads", "auto") if isinstance(args, argparse.Namespace) else args
    value = "auto" if value is None else _parse_threads(value)
    free, cores, load = free_cores(cpu_count, load)
    if value == "auto":
        n = max(1, free // max(1, int(jobs)))
        how = (f"auto: {cores} cores, load {load:.1f}"
               + (f", {jobs} jobs" if jobs > 1 else ""))
    else:
        n, how = int(value), f"--threads {value}; {cores} cores, load {load:.1f}"
    if log is not None:
        log(f"threads: {n}{' per job' if jobs > 1 else ''} ({how})")
    return n


#: (stream, line) held until the command's first output (:func:`note`, :func:`flush_notes`)
_NOTES: list[tuple[str, str]] = []


def note(line: str, stream: str = "stderr") -> None:
    """Hold ``line`` (the thread count, the shipped-sample warning) for ``stream`` until the
    command first writes to stdout (:func:`flush_notes`): a command that stops on bad input
    before that prints only its one error line."""
    if os.environ.get("RANK", "0") == "0":  # torchrun: once, from rank 0
        _NOTES.append((stream, line))


def flush_notes(show: bool = True, stdout=None) -> None:
    """Print the held notes, once, each on its stream (``stdout``: that stream instead of
    ``sys.stdout``); ``show=False`` drops them. The CLI calls it when the command first writes
    to stdout, or when it ends without having done so, and drops them on bad input."""
    held = list(_NOTES)
    _NOTES.clear()
    for stream, line in held if show else ():
        print(line, file=sys.stderr if stream == "stderr" else (stdout or sys.stdout),
              flush=True)


def apply_threads(args: argparse.Namespace, jobs: int = 1) -> int:
    """Resolve ``args.threads`` (:func:`resolve_threads`), store the count back in
    ``args.threads``, set ``torch.set_num_threads`` and note the count for stderr
    (:func:`flush_notes`: shown once the command runs)."""
    import torch

    n = resolve_threads(args, jobs, log=note)
    args.threads = n
    torch.set_num_threads(n)
    return n


_TQDM_INIT = None


def _bars(on: bool) -> None:
    """Switch every tqdm bar of this process on (tqdm's own behaviour) or off (``disable``
    forced, whatever the caller passed). tqdm reads ``TQDM_DISABLE`` only when it is first
    imported, so the switch wraps ``tqdm.std.tqdm.__init__`` (every tqdm class calls it)."""
    global _TQDM_INIT
    try:
        from tqdm import std
    except ImportError:  # no tqdm: no bars anyway
        return
    if on:
        if _TQDM_INIT is not None:
            std.tqdm.__init__ = _TQDM_INIT
            _TQDM_INIT = None
        return
    if _TQDM_INIT is None:
        _TQDM_INIT = orig = std.tqdm.__init__

        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            orig(self, *args, **kwargs)

        std.tqdm.__init__ = __init__

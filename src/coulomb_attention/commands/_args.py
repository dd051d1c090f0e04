"""The command line's shared conventions, in one place.

- Lists: every list flag takes space-separated values (``--seeds 0 1 2``, as argparse users
  expect); commas are accepted too (``--seeds 0,1,2``, ``--seeds 0,1 2``). :func:`list_arg`.
- Presets (``--quick``): a preset fills only the flags the user did not give; flags default
  to ``None`` and :func:`fill` resolves them. An explicit flag always wins.
- Progress: ``--progress {auto,bar,lines,none}``; ``auto`` (the default) draws bars only when
  stderr is a terminal and otherwise prints a line per stage (``convert > log 2>&1`` holds no
  bar redraws); ``--no-progress`` = ``--progress none``. :func:`add_progress`,
  :func:`progress_mode`.

Nothing here imports torch (``--help`` of every command prints without it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["PROGRESS_MODES", "add_progress", "fill", "list_arg", "progress_mode", "split_list"]

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
    return mode


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

"""Throttled progress lines for long loops whose output is not a terminal (torch-free).

Off a terminal (``--progress lines``, the CLI's ``auto`` there) the tqdm bars are switched off
and each stage prints one line when it starts and ends. A stage that runs for minutes (the
conversion's joint refinement, its evaluation, the low-rank finishing, a training epoch) would
then be silent for that long; a :class:`Ticker` in its loop prints ``label: step i/n, elapsed,
loss`` at most once every :data:`EVERY_S` seconds, so a log never goes quiet for longer::

    tick = Ticker("refine (all layers)", total=steps, enabled=progress)
    for k in range(steps):
        ...
        tick.update(k + 1, loss=float(loss))

Whether lines are printed is a process-wide switch: :func:`set_lines` (the CLI's
``commands._args.progress_mode`` sets it from ``--progress``); library code alone prints
nothing unless a caller switches it on or passes ``enabled=True``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

__all__ = ["EVERY_S", "Ticker", "format_seconds", "lines_on", "set_lines"]

#: at most this many seconds between two progress lines of a running loop
EVERY_S = 30.0

_LINES = False
#: the clock of every :class:`Ticker` not given one (tests replace it)
_clock: Callable[[], float] = time.monotonic


def set_lines(on: bool) -> None:
    """Switch the progress lines of every :class:`Ticker` (created afterwards) on or off."""
    global _LINES
    _LINES = bool(on)


def lines_on() -> bool:
    """Whether progress lines are switched on for this process (:func:`set_lines`)."""
    return _LINES


def _print(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


def format_seconds(s: float) -> str:
    """``"42 s"``, ``"3 min 05 s"``, ``"1 h 02 min"``."""
    s = max(0.0, float(s))
    if s < 60:
        return f"{s:.0f} s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m} min {sec:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


class Ticker:
    """One loop's throttled progress line.

    Parameters
    ----------
    label : str
        What runs (``"refine (all layers)"``, ``"fine-tune 1/2"``).
    total : int, optional
        Steps of the loop (``step i/n``); None: ``step i``.
    every : float
        Seconds between two lines, at most (default :data:`EVERY_S`). The first line comes
        ``every`` seconds after the ticker was created.
    enabled : bool, optional
        False: print nothing (a caller's ``progress=False``); None (default) or True: print
        when :func:`lines_on` (the CLI's lines mode; with bars or ``--no-progress`` it is off).
    clock : callable, optional
        Seconds (monotonic; default the module's ``_clock``); tests pass a fake one.
    log : callable
        Where a line goes (default: stdout, flushed).
    """

    def __init__(self, label: str, total: int | None = None, *, every: float = EVERY_S,
                 enabled: bool | None = None, clock: Callable[[], float] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        if not every > 0:
            raise ValueError(f"every must be > 0 seconds, got {every!r}")
        self.label, self.total, self.every = label, total, float(every)
        self.enabled = enabled is not False and lines_on()
        self.clock, self.log = clock or _clock, log or _print
        self.start = self._last = self.clock()
        self.lines = 0

    def line(self, step: int, **values: float | str) -> str:
        """The line for ``step`` done: ``label: step i/n, 35 s elapsed, loss 0.1234``."""
        n = f"/{self.total}" if self.total is not None else ""
        parts = [f"{self.label}: step {step}{n}",
                 f"{format_seconds(self.clock() - self.start)} elapsed"]
        for key, v in values.items():
            parts.append(f"{key} {v:.4g}" if isinstance(v, float) else f"{key} {v}")
        return ", ".join(parts)

    def update(self, step: int, **values: float | str) -> bool:
        """Print the line for ``step`` when ``every`` seconds have passed since the last one
        (or the start); returns whether it printed."""
        if not self.enabled:
            return False
        now = self.clock()
        if now - self._last < self.every:
            return False
        self._last = now
        self.lines += 1
        self.log(self.line(step, **values))
        return True

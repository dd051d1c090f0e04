"""The machine a benchmark ran on: threads, cores, load; and whether its verdict may stand.

Every benchmark (``bench attention``, ``langevin``, ``encoder``, ``decoder``) records
:func:`machine_record` in its result file, prints :func:`machine_line` in its header, and
gives its verdict (``held``/``MISSED``, ``PASS``/``FAIL``) only when :func:`verdict_withheld`
returns None; otherwise it prints :func:`withheld_line` instead. Ratios measured on a machine
whose cores are shared with other jobs say more about the other jobs than about the methods.
"""

from __future__ import annotations

import math
import os
from typing import Any

__all__ = ["NOISE_CORES", "cores", "load_average", "machine_line", "machine_record",
           "verdict_withheld", "withheld_line"]

#: background load (cores) tolerated beyond the cores the benchmark leaves free
NOISE_CORES = 0.25


def load_average() -> tuple[float, float, float]:
    """``os.getloadavg()`` (1, 5, 15 minutes); NaN where the system has none."""
    try:
        return tuple(float(x) for x in os.getloadavg())  # type: ignore[return-value]
    except (AttributeError, OSError):
        return (math.nan,) * 3


def cores() -> int:
    """The cores this process may run on (its CPU affinity; else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def machine_record(threads: int, load_start, load_end, n_cores: int | None = None
                   ) -> dict[str, Any]:
    """What a result file records of the machine: ``threads``, ``cores`` (affinity),
    ``cpu_count``, ``load_average_start`` / ``_end`` (1, 5, 15 min) and
    ``verdict_withheld`` (:func:`verdict_withheld`: None or the reason)."""
    n_cores = cores() if n_cores is None else int(n_cores)
    return {"threads": int(threads), "cores": n_cores, "cpu_count": os.cpu_count(),
            "load_average_start": list(load_start), "load_average_end": list(load_end),
            "verdict_withheld": verdict_withheld(threads, load_start, load_end, n_cores)}


def machine_line(threads: int, load_start, load_end=None, n_cores: int | None = None) -> str:
    """``2 thread(s) of 2 cores (cpu_count 2); load average 0.31 at the start, 1.92 at the
    end``: one line for a benchmark's header."""
    n_cores = cores() if n_cores is None else int(n_cores)
    text = (f"{threads} thread(s) of {n_cores} cores (cpu_count {os.cpu_count()}); load "
            f"average {load_start[0]:.2f} at the start")
    return text + ("" if load_end is None else f", {load_end[0]:.2f} at the end")


def verdict_withheld(threads: int, load_start, load_end, n_cores: int | None = None
                     ) -> str | None:
    """Why no verdict may be given from this run (None: it may).

    The rule: the other processes' load is the larger of the 1-minute load average at the
    start and at the end less this run's own ``threads`` (the end average includes them).
    When that exceeds the cores the run leaves free, ``cores - threads``, by more than
    :data:`NOISE_CORES`, the run's timings shared cores with other jobs and the verdict is
    withheld. Without a load average (no ``os.getloadavg``) it is withheld too.
    """
    n_cores = cores() if n_cores is None else int(n_cores)
    start, end = float(load_start[0]), float(load_end[0])
    others = max(start, end - threads)
    free = n_cores - threads
    if not math.isfinite(others):
        return "the load average is not available on this system"
    if others > free + NOISE_CORES:
        return (f"the machine is busy: other processes' load {others:.2f} (1-minute load "
                f"average: {start:.2f} at the start, {end:.2f} at the end with this run's "
                f"{threads} thread(s)) exceeds the {max(free, 0)} core(s) left free of "
                f"{n_cores}, so the timings share cores with other jobs")
    return None


def withheld_line(reason: str) -> str:
    """The line a benchmark prints instead of its verdict."""
    return f"verdict withheld: {reason}; rerun on a quiet machine (or with fewer --threads)"

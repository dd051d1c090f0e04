"""The Langevin-step benchmark: wall time of one projected Langevin step.

One step of the core dynamics (``learn_particles`` on the core ``Hamiltonian``: centered
alignment of an rff kernel on a batch of ``n`` points in ``d`` dimensions, Riesz repulsion,
ball projection, finite beta) for ``N`` particles. Its cost is ``O(n N d + n N^2)`` for the
alignment statistics (``Phi^T Phi``) plus ``O(N^2 d)`` for the pair energy: linear in ``n``.
For each N the table gives the time per step at each n, the slope of ``log time`` versus
``log n`` fitted by least squares over all n (1 = linear), the local slope between the two
largest n, and the slope in N at the largest n. The time of a cell (N, n) is the median of
all its timed steps over ``--rounds`` rounds interleaved over the cells, each round at least
``--repeats`` steps after a warm-up step and at least 0.5 s of them: with the minimum of 2
steps (the old default) two quiet ``--quick`` runs gave 1024->4096 slopes of 0.73 and 1.19.

Config in (:class:`LangevinBenchConfig`); :func:`run_benchmark` writes ``langevin_step.csv``,
``langevin_step.json`` and ``langevin_step.png`` under ``out`` and returns the result.
"""

from __future__ import annotations

import csv
import io
import json
import math
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..results import atomic_write_text
from ..stats import loglog_slope

if TYPE_CHECKING:  # torch is imported where used: a fast ``--help``
    import torch

__all__ = ["LangevinBenchConfig", "plot", "run_benchmark", "step_times", "time_step"]

# Each cell (N, n) is timed in --rounds rounds, interleaved over the cells (a load change on a
# shared machine then hits every cell alike, not one cell's whole measurement); a round times
# at least --repeats consecutive steps, and at least MIN_ROUND_SECONDS of them (a 2 ms cell
# gets ~250 steps a round). The reported time is the median over all timed steps of a cell.
DEFAULT_REPEATS = 3
DEFAULT_ROUNDS = 5
MIN_ROUND_SECONDS = 0.5


@dataclass(frozen=True)
class LangevinBenchConfig:
    """Cells ``N x n`` (``quick``: N <= 1024 by default), input dimension ``d``; every cell is
    timed in ``rounds`` rounds of at least ``repeats`` steps (and ``MIN_ROUND_SECONDS``)."""

    N: tuple[int, ...] | None = None
    n: tuple[int, ...] | None = None
    d: int = 16
    repeats: int = DEFAULT_REPEATS
    rounds: int = DEFAULT_ROUNDS
    threads: int = 1
    dtype: str = "float32"
    quick: bool = False
    Ns: tuple[int, ...] = field(init=False)
    ns: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        default_N = (64, 256, 1024) if self.quick else (64, 256, 1024, 4096)
        set_ = object.__setattr__
        set_(self, "Ns", tuple(self.N) if self.N else default_N)
        set_(self, "ns", tuple(self.n) if self.n else (256, 1024, 4096))
        for name, vals in (("--N", self.Ns), ("--n", self.ns)):
            if any(v < 2 for v in vals):
                raise ValueError(f"{name} values must be >= 2, got {list(vals)}")
        if self.d < 1 or self.repeats < 1 or self.threads < 1:
            raise ValueError("--d, --repeats and --threads must be >= 1")
        if self.rounds < 1:
            raise ValueError(f"--rounds must be >= 1, got {self.rounds}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"--dtype must be float32 or float64, got {self.dtype!r}")


class _Enough(Exception):
    """Raised by the timing callback to end the Langevin run early."""


def step_times(N: int, n: int, d: int, repeats: int, dtype: torch.dtype, seed: int = 0,
               min_seconds: float = 0.0) -> list[float]:
    """Wall times (s) of consecutive Langevin steps after one warm-up step: ``repeats`` steps,
    or more until they add up to ``min_seconds``."""
    import torch

    from ..dynamics import Ball, LangevinSchedule, learn_particles
    from ..energy import Hamiltonian, LabelAlignment, encode_labels, make_potential
    from ..features import draw_bias, feature_fn, sample

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=dtype)
    y = (x[:, 0] * x[:, 1] > 0).long().numpy()
    Y, _ = encode_labels(y)
    omega = sample("gaussian", N, d, scale=math.sqrt(2.0 / d), generator=gen, dtype=dtype)
    phi = feature_fn("rff", draw_bias(N, generator=gen, dtype=dtype))
    ham = Hamiltonian(LabelAlignment(phi), make_potential("riesz", s=1.0, eps=0.05), lam=0.01)
    times: list[float] = []
    last = {"t": 0.0}

    def clock(state, info) -> None:  # time of each step, measured between callbacks
        now = time.perf_counter()
        if state.step > 1:  # the first step is the warm-up
            times.append(now - last["t"])
            if len(times) >= repeats and sum(times) >= min_seconds:
                raise _Enough
        last["t"] = now

    last["t"] = time.perf_counter()
    try:
        learn_particles(ham, omega, LangevinSchedule(steps=10**9, eta=1e-3, beta=1e4),
                        [(x, Y)], projection=Ball(3.0), generator=gen, callbacks=[clock])
    except _Enough:
        pass
    return times


def time_step(N: int, n: int, d: int, repeats: int, dtype: torch.dtype, seed: int = 0) -> float:
    """Median wall time (s) of one Langevin step over ``repeats`` steps (after a warm-up)."""
    return float(np.median(step_times(N, n, d, repeats, dtype, seed)))


def run_benchmark(cfg: LangevinBenchConfig, out: str | Path,
                  log: Callable[[str], None] = print) -> dict:
    """Time every cell, write the files and return the result (``langevin_step.json``)."""
    import torch

    Ns, ns, rounds = list(cfg.Ns), list(cfg.ns), cfg.rounds

    from . import machine

    torch.set_num_threads(cfg.threads)
    load_start = machine.load_average()
    log(machine.machine_line(cfg.threads, load_start))
    dtype = getattr(torch, cfg.dtype)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cells = [(N, n) for N in Ns for n in ns]
    steps: dict[tuple[int, int], list[float]] = {c: [] for c in cells}
    for r in range(rounds):
        for N, n in cells:
            ts = step_times(N, n, cfg.d, cfg.repeats, dtype, min_seconds=MIN_ROUND_SECONDS)
            steps[N, n] += ts
            log(f"round {r + 1}/{rounds} N={N:<5} n={n:<6} {1e3 * np.median(ts):9.2f} ms/step "
                f"(median of {len(ts)})")
    rows = [{"N": N, "n": n, "d": cfg.d, "seconds": float(np.median(steps[N, n])),
             "steps": len(steps[N, n]),
             "iqr_seconds": [float(q) for q in np.percentile(steps[N, n], [25, 75])]}
            for N, n in cells]
    slopes_n = {N: loglog_slope(ns, [r["seconds"] for r in rows if r["N"] == N]) for N in Ns}
    # the n-independent O(N^2 d) part flattens the small-n end: also report the local slope
    # between the two largest n, which tends to 1 for a cost linear in n
    top = sorted(ns)[-2:]
    slopes_top = {N: loglog_slope(top, [r["seconds"] for n in top for r in rows
                                         if r["N"] == N and r["n"] == n]) for N in Ns}
    n_max = max(ns)
    slope_N = loglog_slope(Ns, [r["seconds"] for r in rows if r["n"] == n_max])
    header = (
        "| N | "
        + " | ".join(f"n={n} (ms)" for n in ns)
        + f" | slope in n (all) | slope in n ({top[0]}->{top[1]}) |"
    )
    lines = [header, "|---" * (len(ns) + 3) + "|"]
    for N in Ns:
        cells = [f"{1e3 * r['seconds']:.1f}" for r in rows if r["N"] == N]
        lines.append(
            f"| {N} | " + " | ".join(cells) + f" | {slopes_n[N]:.2f} | {slopes_top[N]:.2f} |"
        )
    table = "\n".join(lines)
    log("\n" + table)
    log(f"slope of log time in log N at n={n_max}: {slope_N:.2f}")
    record = machine.machine_record(cfg.threads, load_start, machine.load_average())
    log(machine.machine_line(cfg.threads, load_start, record["load_average_end"],
                             record["cores"]))
    if record["verdict_withheld"]:
        log(machine.withheld_line(record["verdict_withheld"]))
    meta = {
        **record,
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("N", "n")},
        "d": cfg.d,
        "dtype": cfg.dtype,
        "threads": cfg.threads,
        "repeats": cfg.repeats,
        "rounds": rounds,
        "min_round_seconds": MIN_ROUND_SECONDS,
        "statistic": "median",
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
    }
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=["N", "n", "d", "seconds", "steps"])
    w.writeheader()
    w.writerows({k: r[k] for k in ("N", "n", "d", "seconds", "steps")} for r in rows)
    atomic_write_text(out / "langevin_step.csv", buf.getvalue())
    result = {
        "meta": meta,
        "rows": rows,
        "slope_in_n": {str(k): v for k, v in slopes_n.items()},
        "slope_in_n_top": {str(k): v for k, v in slopes_top.items()},
        "slope_in_n_top_range": top,
        "slope_in_N_at_max_n": slope_N,
        "table_md": table,
    }
    atomic_write_text(out / "langevin_step.json", json.dumps(result, indent=1))
    plot(out / "langevin_step.json", out / "langevin_step.png")
    return result


def plot(json_path: Path, png_path: Path) -> None:
    """Time per step versus n, one line per N (log-log), read from the JSON only."""
    from ..reports import pyplot

    plt = pyplot()

    res = json.loads(Path(json_path).read_text())
    rows = res["rows"]
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for N in sorted({r["N"] for r in rows}):
        rs = sorted((r for r in rows if r["N"] == N), key=lambda r: r["n"])
        ns = np.array([r["n"] for r in rs], float)
        ts = np.array([r["seconds"] for r in rs])
        label = f"N={N}: slope {res['slope_in_n'][str(N)]:.2f} over all n"
        if "slope_in_n_top" in res and len(ns) > 2:  # files of older versions lack it
            lo, hi = res["slope_in_n_top_range"]
            label += f", {res['slope_in_n_top'][str(N)]:.2f} from {lo} to {hi}"
        ax.loglog(ns, 1e3 * ts, "o-", label=label)
    ns = np.array(sorted({r["n"] for r in rows}), float)
    t0 = min(r["seconds"] for r in rows if r["n"] == ns[0])
    ax.loglog(ns, 1e3 * t0 * ns / ns[0], "k:", label="linear in n")
    ax.set_xticks(ns, [str(int(v)) for v in ns])
    ax.minorticks_off()
    ax.set_xlabel("n (data points per step)")
    ax.set_ylabel("ms per Langevin step")
    meta = res["meta"]
    stat = (f"median over {meta['rounds']} rounds" if "rounds" in meta
            else f"min of {meta['repeats']}")
    ax.set_title(
        f"one projected Langevin step (d={meta['d']}, {meta['dtype']}, "
        f"{meta['threads']} thread{'s' if meta['threads'] != 1 else ''}, {stat})", fontsize=9
    )
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * (hi / lo) ** 0.4)  # head room: the legend above the lines
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)

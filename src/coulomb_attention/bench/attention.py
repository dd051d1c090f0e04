"""The attention benchmark: time, memory and GFLOP/s of attention versus L.

Compares, in one run and interleaved (so load changes hit every method alike):

- ``favor_fused``: :func:`coulomb_attention.nn.functional.favor_attention` (this package),
- ``performer``: ``performer_pytorch.FastAttention`` (optional dependency, same n_features),
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (exact softmax).

Config in (:class:`AttentionBenchConfig`); :func:`run_benchmark` (long sequences) and
:func:`run_short` (sentence lengths) write their files under ``out`` and return the summary.

Shapes: B = 1, H = 4, head dim 64 (``heads``, ``head_dim``). For every L and method it
reports the median over ``--repeats`` of the forward time and the forward+backward time
(gradients of q, k, v), the peak memory of one forward+backward, and the achieved GFLOP/s
against this machine's float32 matmul peak, measured in the same run: a ``(1024, 1024)``
float32 matmul timed in the same interleaved rounds as the attention calls at every L (so it
sees the same load); the fraction of peak uses that median.

FLOP model (counted the same way for every linear method, multiply-add = 2 FLOPs):
forward ``2 B H [(T + S) M d + (T + S) M (e + 1)]`` (features, key-value product, output
with normaliser), softmax ``2 B H T S (d + e)``; forward+backward = 3 x forward.

Peak memory: the rise of the process's peak resident set size (``VmHWM``, reset through
``/proc/self/clear_refs``) during one forward+backward call, above the resident size before
it; it counts every allocation of that call, inputs excluded (torch's CPU allocator keeps no
statistics). Memory is measured in a second pass after all the timings: on glibc that pass
fixes the mmap threshold at 64 KiB so that freed tensors leave the resident set at once. The
timings run before it, under the allocator's defaults: with the 64 KiB threshold every
temporary of 64 KiB or more would be a fresh mmap, page-faulted on every call, which slows
methods that allocate many mid-size temporaries (the chunked FAVOR+ 2-3x at L = 16384) and
is not how anyone runs them. Where ``/proc`` is not available memory is reported as NaN.
"""

from __future__ import annotations

import csv
import json
import math
import platform
import re
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..nn.functional import (
    clear_workspace,
    favor_attention,
    linear_is_unchunked,
    quadratic_is_cheaper,
)
from ..results import atomic_write_text
from . import machine

PEAK_N = 1024  # float32 (PEAK_N, PEAK_N) @ (PEAK_N, PEAK_N): the matmul peak
QUICK = {"lengths": [128, 512, 2048], "features": [64], "repeats": 2}


@dataclass(frozen=True)
class AttentionBenchConfig:
    """Lengths L and feature counts M of the long-sequence grid (``run_short`` has its own
    grid, :data:`SHORT`), medians of ``repeats`` timings, ``threads`` torch threads."""

    lengths: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    features: tuple[int, ...] = (64, 128, 256)
    repeats: int = 5
    threads: int = 2
    heads: int = 4
    head_dim: int = 64
    batch: int = 1
    budget: float = 20.0
    peak_size: int = PEAK_N
    no_performer: bool = False

    def __post_init__(self) -> None:
        for name in ("lengths", "features"):
            vals = tuple(getattr(self, name))
            if not vals or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0
                               for v in vals):
                raise ValueError(f"{name} must be positive integers, got {list(vals)}")
            object.__setattr__(self, name, vals)
        for name in ("repeats", "threads", "heads", "head_dim", "batch", "peak_size"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, "
                                 f"got {val}")
        if not self.budget > 0:
            raise ValueError(f"--budget must be positive, got {self.budget}")


# --------------------------------------------------------------------------- measurements


def _proc_status() -> dict[str, int] | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    out = {}
    for key in ("VmHWM", "VmRSS"):
        m = re.search(rf"{key}:\s+(\d+)\s*kB", text)
        if m is None:
            return None
        out[key] = int(m.group(1)) * 1024
    return out


def _malloc_trim() -> None:
    """glibc: give the free heap pages back to the OS (no-op elsewhere), so that memory freed
    earlier and reused by ``fn`` counts in the peak RSS rise."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _peak_bytes(fn) -> float:
    """Rise of the peak RSS during ``fn()`` above the RSS before it (NaN if unavailable)."""
    _malloc_trim()
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    except OSError:
        fn()
        return math.nan
    before = _proc_status()
    fn()
    after = _proc_status()
    if before is None or after is None:
        return math.nan
    return float(max(0, after["VmHWM"] - before["VmRSS"]))


def _return_freed_memory() -> bool:
    """glibc: serve every allocation >= 64 KiB by mmap (fixed threshold), so freed tensors
    leave the resident set at once and the peak RSS tracks live memory. False elsewhere."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 1 << 16)) and bool(
            libc.mallopt(M_TRIM_THRESHOLD, 1 << 16))
    except (OSError, AttributeError):
        return False


def matmul_peak_gflops(n: int = 1024, repeats: int = 10) -> dict[str, float]:
    """float32 ``(n, n) @ (n, n)`` throughput: best and median over ``repeats`` (GFLOP/s)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g)
    b = torch.randn(n, n, generator=g)
    a @ b
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    flops = 2.0 * n**3
    return {"best": flops / min(times) / 1e9, "median": flops / statistics.median(times) / 1e9}


def linear_flops(B: int, H: int, T: int, S: int, M: int, d: int, e: int) -> float:
    """Forward FLOPs of linear attention with M features (see module docstring)."""
    return 2.0 * B * H * ((T + S) * M * d + (T + S) * M * (e + 1))


def softmax_flops(B: int, H: int, T: int, S: int, d: int, e: int) -> float:
    """Forward FLOPs of exact softmax attention."""
    return 2.0 * B * H * T * S * (d + e)


def _load_performer(no_performer: bool):
    if no_performer:
        print("performer-pytorch: left out (--no-performer)")
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from performer_pytorch import FastAttention
    except Exception as exc:  # optional dependency: any import failure means "skip"
        print(f"performer-pytorch not available ({type(exc).__name__}: {exc}); skipping its "
              "rows. Install with: pip install performer-pytorch")
        return None
    return FastAttention


def _methods(features: list[int], d: int, FastAttention, gen: torch.Generator):
    """name -> (M or None, fn(q, k, v) -> out) with q, k, v (B, H, L, d) unscaled."""
    from ..features import orthogonal

    scale = d**-0.25
    methods = {}
    for M in features:
        omega = orthogonal(M, d, generator=gen)[None]  # (1, M, d)
        methods[f"favor_fused/M={M}"] = (
            M, lambda q, k, v, om=omega: favor_attention(q * scale, k * scale, v, om))
        if FastAttention is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fa = FastAttention(d, nb_features=M)  # scales by d**-0.25 itself
            fa.projection_matrix.copy_(omega[0])
            methods[f"performer/M={M}"] = (M, lambda q, k, v, fa=fa: fa(q, k, v))
    methods["sdpa"] = (None, lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
        q, k, v))
    return methods


def _forward(fn, q, k, v):
    def call():
        with torch.no_grad():
            fn(q, k, v)

    return call


def _forward_backward(fn, q, k, v):
    def call():
        out = fn(q, k, v)
        out.backward(torch.ones_like(out))
        q.grad = k.grad = v.grad = None

    return call


def _time_all(calls: dict, repeats: int, budget: float) -> dict:
    """Interleaved timing: one warm-up call each, then ``repeats`` rounds over all calls; a
    call whose warm-up exceeds ``budget`` s runs once."""
    times: dict = {}
    n_rep = {}
    for name, fn in calls.items():
        t = time.perf_counter()
        fn()
        first = time.perf_counter() - t
        n_rep[name] = 1 if first > budget else repeats
        times[name] = []
    for r in range(repeats):
        for name, fn in calls.items():
            if r >= n_rep[name]:
                continue
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return times


# --------------------------------------------------------------------------- run


def run_benchmark(cfg: AttentionBenchConfig, out: str | Path,
                  log: Callable[[str], None] = print) -> dict:
    """Time and measure every (L, method) of ``cfg``; write ``results.jsonl``, ``results.csv``,
    ``table.md``, ``summary.json`` and ``bench_attention.png`` under ``out``; returns the
    summary."""
    lengths, feats = list(cfg.lengths), list(cfg.features)
    repeats, threads = cfg.repeats, cfg.threads
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)

    torch.set_num_threads(threads)
    B, H, d = cfg.batch, cfg.heads, cfg.head_dim
    load_start = machine.load_average()
    n_peak = cfg.peak_size
    peak0 = matmul_peak_gflops(n_peak)
    FastAttention = _load_performer(cfg.no_performer)
    gen = torch.Generator().manual_seed(0)
    methods = _methods(feats, d, FastAttention, gen)
    log(f"{machine.machine_line(threads, load_start)}; B={B} H={H} d={d} lengths={lengths} "
        f"features={feats} repeats={repeats}; matmul peak {peak0['best']:.1f} GFLOP/s (best "
        "of 10)")

    peak_a = torch.randn(n_peak, n_peak, generator=gen)
    # Global warm-up (thread pools, first allocations) so the first L is not charged for it.
    w = [torch.randn(B, H, min(lengths), d, generator=gen).requires_grad_() for _ in range(3)]
    for _, fn in methods.values():
        _forward_backward(fn, *w)()
    rows = []
    t_start = time.perf_counter()
    for L in lengths:
        q, k, v = (torch.randn(B, H, L, d, generator=gen).requires_grad_() for _ in range(3))

        calls = {("matmul_peak", "fwd"): lambda: peak_a @ peak_a}  # peak under the same load
        for name, (_, fn) in methods.items():
            calls[(name, "fwd")] = _forward(fn, q, k, v)
            calls[(name, "fwdbwd")] = _forward_backward(fn, q, k, v)
        times = _time_all(calls, repeats, cfg.budget)
        peak_l = 2.0 * n_peak**3 / statistics.median(times[("matmul_peak", "fwd")]) / 1e9
        for name, (M, _) in methods.items():
            f_fwd = (softmax_flops(B, H, L, L, d, d) if M is None
                     else linear_flops(B, H, L, L, M, d, d))
            t_f = statistics.median(times[(name, "fwd")])
            t_fb = statistics.median(times[(name, "fwdbwd")])
            row = {
                "method": name.split("/")[0], "n_features": M, "L": L, "B": B, "H": H, "d": d,
                "threads": threads, "repeats": len(times[(name, "fwd")]),
                "repeats_fwdbwd": len(times[(name, "fwdbwd")]), "name": name,
                "fwd_s": t_f, "fwdbwd_s": t_fb,
                "gflops_fwd": f_fwd / t_f / 1e9, "gflops_fwdbwd": 3 * f_fwd / t_fb / 1e9,
            }
            row["matmul_peak_gflops"] = peak_l
            row["frac_peak_fwd"] = row["gflops_fwd"] / peak_l
            row["frac_peak_fwdbwd"] = row["gflops_fwdbwd"] / peak_l
            row["frac_best_peak_fwd"] = row["gflops_fwd"] / peak0["best"]
            rows.append(row)
            log(f"L={L:6d} {name:22s} fwd {t_f * 1e3:9.2f} ms  fwd+bwd {t_fb * 1e3:9.2f} ms  "
                  f"{row['gflops_fwd']:6.1f} GFLOP/s ({100 * row['frac_peak_fwd']:.0f}% of peak)")
    # Second pass, after every timing: peak memory of one forward+backward per (L, method).
    exact_rss = _return_freed_memory()
    for L in lengths:
        q, k, v = (torch.randn(B, H, L, d, generator=gen).requires_grad_() for _ in range(3))
        for row in (r for r in rows if r["L"] == L):
            fn = methods[row.pop("name")][1]
            clear_workspace()  # the fused path's kept scratch blocks count in its peak
            row["peak_mem_mb"] = _peak_bytes(_forward_backward(fn, q, k, v)) / 2**20
            log(f"L={L:6d} {row['method']:12s} M={row['n_features']}: peak memory "
                  f"{row['peak_mem_mb']:8.1f} MB")
    peak1 = matmul_peak_gflops(n_peak)
    load_end = machine.load_average()

    summary = {
        "config": asdict(cfg),
        "torch": torch.__version__, "python": platform.python_version(),
        "cpu": _cpu_name(), **machine.machine_record(threads, load_start, load_end),
        "matmul_peak_gflops": peak0["best"], "matmul_peak_start": peak0,
        "peak_method": f"({n_peak},{n_peak}) float32 matmul; per-L rows use the median of "
                       "the matmul timed in the same interleaved rounds as the attention calls",
        "matmul_peak_end": peak1, "wall_s": time.perf_counter() - t_start,
        "performer": FastAttention is not None,
        "memory_method": "peak RSS rise (VmHWM after reset via /proc/self/clear_refs, minus "
                         "VmRSS before) over one forward+backward call, in a second pass after "
                         "all timings (which run under the allocator's defaults); glibc mmap "
                         f"threshold fixed at 64 KiB for that pass: {exact_rss}",
        "flop_model": "forward linear 2BH[(T+S)Md + (T+S)M(e+1)], softmax 2BHTS(d+e); "
                      "forward+backward = 3 x forward",
        "targets": targets(rows),
    }
    _write(out_dir, rows, summary)
    log(_targets_text(summary["targets"], summary["verdict_withheld"]))
    return summary


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# --------------------------------------------------------------------------- targets


def _get(rows, method, M, L, key):
    for r in rows:
        if r["method"] == method and r["n_features"] == M and r["L"] == L:
            return r[key]
    return None


def targets(rows: list[dict]) -> dict:
    """Evaluate the performance targets on measured rows (ratios within this run).

    - ``linear``: favor time(16384) / time(2048) <= 9 (fwd and fwd+bwd, every M);
    - ``vs_sdpa``: favor faster than softmax SDPA for every L >= 1024;
    - ``vs_performer``: favor >= 1.5x faster than performer at the same M for L >= 4096;
    - ``peak``: favor forward >= 35% of the measured matmul peak at L = 16384.
    Each entry lists the measured values and ``held`` (None when the grid lacks the points).
    """
    Ms = sorted({r["n_features"] for r in rows if r["method"] == "favor_fused"})
    Ls = sorted({r["L"] for r in rows})
    out: dict = {"linear": [], "vs_sdpa": [], "vs_performer": [], "peak": []}
    for M in Ms:
        for key in ("fwd_s", "fwdbwd_s"):
            a, b = _get(rows, "favor_fused", M, 16384, key), _get(rows, "favor_fused", M, 2048, key)
            if a is not None and b is not None:
                # Informational: the ratio rescaled by the matmul peak measured alongside
                # (a load change between the two lengths cancels); "held" uses the raw ratio.
                pa = _get(rows, "favor_fused", M, 16384, "matmul_peak_gflops")
                pb = _get(rows, "favor_fused", M, 2048, "matmul_peak_gflops")
                out["linear"].append({"M": M, "mode": key[:-2], "ratio": a / b,
                                      "ratio_load_normalised": a * pa / (b * pb),
                                      "held": a / b <= 9})
            for L in Ls:
                f = _get(rows, "favor_fused", M, L, key)
                s = _get(rows, "sdpa", None, L, key)
                if L >= 1024 and f is not None and s is not None:
                    out["vs_sdpa"].append({"M": M, "L": L, "mode": key[:-2],
                                           "speedup": s / f, "held": s > f})
                p = _get(rows, "performer", M, L, key)
                if L >= 4096 and f is not None and p is not None:
                    out["vs_performer"].append({"M": M, "L": L, "mode": key[:-2],
                                                "speedup": p / f, "held": p / f >= 1.5})
        for key in ("frac_peak_fwd", "frac_peak_fwdbwd"):
            fr = _get(rows, "favor_fused", M, 16384, key)
            if fr is not None:
                out["peak"].append({"M": M, "mode": key[10:], "fraction": fr,
                                    "held": fr >= 0.35})
    for name in ("linear", "vs_sdpa", "vs_performer", "peak"):
        items = out[name]
        out[name + "_held"] = all(i["held"] for i in items) if items else None
    return out


def _status(held: bool | None, withheld: str | None) -> str:
    """A target's verdict: held / MISSED / not measured; none at all on a busy machine."""
    if held is None:
        return "not measured"
    return "no verdict" if withheld else ("held" if held else "MISSED")


def _targets_text(t: dict, withheld: str | None = None) -> str:
    """The targets, their measured values and (``withheld`` None) their verdicts."""
    lines = ["targets (ratios measured in this run):"]
    desc = {"linear": "time(16384)/time(2048) <= 9", "vs_sdpa": "faster than SDPA for L >= 1024",
            "vs_performer": ">= 1.5x faster than performer-pytorch for L >= 4096",
            "peak": ">= 35% of matmul peak at L = 16384 (forward)"}
    for name, text in desc.items():
        status = _status(t[name + "_held"], withheld)
        vals = []
        for i in t[name]:
            v = i.get("ratio", i.get("speedup", i.get("fraction")))
            tag = f"M={i['M']}" + (f",L={i['L']}" if "L" in i else "") + f",{i['mode']}"
            vals.append(f"{tag}:{v:.2f}{'' if i['held'] or withheld else '!'}")
        lines.append(f"  {text}: {status}" + (f"  [{' '.join(vals)}]" if vals else ""))
    if withheld:
        lines.append(machine.withheld_line(withheld))
    return "\n".join(lines)


# --------------------------------------------------------------------------- output


def _write(out_dir: Path, rows: list[dict], summary: dict) -> None:
    with open(out_dir / "results.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    with open(out_dir / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2))
    atomic_write_text(out_dir / "table.md", markdown_table(rows, summary))
    plot(rows, out_dir / "bench_attention.png")


def markdown_table(rows: list[dict], summary: dict) -> str:
    """Markdown: one row per (L, method, M) plus the targets."""
    lines = [
        f"Attention benchmark: B={rows[0]['B']}, H={rows[0]['H']}, head dim {rows[0]['d']}, "
        f"{summary['cpu']}; float32 matmul peak "
        f"{summary['matmul_peak_gflops']:.1f} GFLOP/s (best of 10 at the start; '% peak' uses "
        "the matmul timed alongside at each L, column 'peak'); "
        + machine.machine_line(summary["threads"], summary["load_average_start"],
                               summary["load_average_end"], summary.get("cores")) + ".",
        "Times are medians; memory is the peak RSS rise of one forward+backward.",
        "",
        "| L | method | M | fwd ms | fwd+bwd ms | peak MB | fwd GFLOP/s | peak | % peak "
        "| reps f/fb |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['L']} | {r['method']} | {r['n_features'] or '-'} | {r['fwd_s'] * 1e3:.2f} | "
            f"{r['fwdbwd_s'] * 1e3:.2f} | {r['peak_mem_mb']:.1f} | {r['gflops_fwd']:.1f} | "
            f"{r['matmul_peak_gflops']:.1f} | {100 * r['frac_peak_fwd']:.0f} | "
            f"{r['repeats']}/{r['repeats_fwdbwd']} |"
        )
    lines += ["", "```", _targets_text(summary["targets"], summary.get("verdict_withheld")),
              "```", ""]
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    """Four panels versus L: forward time, forward+backward time, peak memory, GFLOP/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels = [("fwd_s", "forward time (s)"), ("fwdbwd_s", "forward+backward time (s)"),
              ("peak_mem_mb", "peak memory, fwd+bwd (MB)"), ("gflops_fwd", "forward GFLOP/s")]
    series: dict[tuple, list] = {}
    for r in rows:
        series.setdefault((r["method"], r["n_features"]), []).append(r)
    colors = {"favor_fused": "tab:blue", "performer": "tab:orange", "sdpa": "black"}
    Ms = sorted({r["n_features"] for r in rows if r["n_features"]})
    styles = ["-", "--", ":", "-."]
    for ax, (key, title) in zip(axes.flat, panels, strict=True):
        for (method, M), rs in sorted(series.items(), key=lambda s: (s[0][0], s[0][1] or 0)):
            rs = sorted(rs, key=lambda r: r["L"])
            ls = styles[Ms.index(M) % len(styles)] if M else "-"
            label = method if M is None else f"{method} M={M}"
            ax.plot([r["L"] for r in rs], [r[key] for r in rs], ls, marker="o", ms=3,
                    color=colors.get(method, "gray"), label=label)
        if key == "gflops_fwd":
            pk = sorted({(r["L"], r["matmul_peak_gflops"]) for r in rows})
            ax.plot([p[0] for p in pk], [p[1] for p in pk], color="red", lw=1,
                    label="matmul peak (same rounds)")
            ax.plot([p[0] for p in pk], [0.35 * p[1] for p in pk], color="red", lw=1, ls=":",
                    label="35% of peak")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    axes[1, 1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- short sequences

SHORT = {
    "batches": [1, 32],
    "lengths": [16, 32, 64, 128, 256, 512],
    "features": [16, 64],
    # name -> (model dim, heads): the default classifier and MiniLM (head dim 32 both)
    "shapes": {"classifier": (128, 4), "minilm": (384, 12)},
}


def run_short(cfg: AttentionBenchConfig, out: str | Path,
              log: Callable[[str], None] = print) -> dict:
    """``bench attention --short``: FAVOR+ (order picked by cost) against SDPA and
    performer-pytorch at the lengths of sentence tasks (:data:`SHORT`; ``cfg``'s lengths,
    features and shapes are not used); interleaved timing per (shape, B, L) cell, medians of
    ``cfg.repeats``. Writes ``results.csv``, ``table.md``, ``summary.json`` and
    ``bench_attention_short.png``; returns the summary."""
    repeats, threads = cfg.repeats, cfg.threads
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(threads)
    load_start = machine.load_average()
    FastAttention = _load_performer(cfg.no_performer)
    gen = torch.Generator().manual_seed(0)
    log(f"{machine.machine_line(threads, load_start)}; repeats={repeats} "
        f"performer={FastAttention is not None}")
    rows = []
    t_start = time.perf_counter()
    for shape, (dim, H) in SHORT["shapes"].items():
        d = dim // H
        methods = _methods(SHORT["features"], d, FastAttention, gen)
        for B in SHORT["batches"]:
            for L in SHORT["lengths"]:
                q, k, v = (torch.randn(B, H, L, d, generator=gen).requires_grad_()
                           for _ in range(3))
                calls = {}
                for name, (_, fn) in methods.items():
                    calls[(name, "fwd")] = _forward(fn, q, k, v)
                    calls[(name, "fwdbwd")] = _forward_backward(fn, q, k, v)
                times = _time_all(calls, repeats, cfg.budget)
                for name, (M, _) in methods.items():
                    method = name.split("/")[0]
                    row = {
                        "shape": shape, "dim": dim, "B": B, "H": H, "d": d, "L": L,
                        "method": "favor" if method == "favor_fused" else method,
                        "n_features": M, "threads": threads,
                        "order": (("quadratic" if quadratic_is_cheaper(L, L, M, d, B * H)
                                   else "linear" if linear_is_unchunked(L, L, M, B * H)
                                   else "chunked") if method == "favor_fused" else ""),
                        "repeats": len(times[(name, "fwd")]),
                        "fwd_s": statistics.median(times[(name, "fwd")]),
                        "fwdbwd_s": statistics.median(times[(name, "fwdbwd")]),
                    }
                    rows.append(row)
                    log(f"{shape:10s} B={B:2d} L={L:4d} {name:16s} {row['order']:9s} fwd "
                          f"{row['fwd_s'] * 1e3:8.2f} ms  fwd+bwd {row['fwdbwd_s'] * 1e3:8.2f} ms")
    load_end = machine.load_average()
    summary = {
        "config": asdict(cfg),
        "grid": SHORT, "torch": torch.__version__, "python": platform.python_version(),
        "cpu": _cpu_name(), **machine.machine_record(threads, load_start, load_end),
        "performer": FastAttention is not None, "wall_s": time.perf_counter() - t_start,
        "targets": short_targets(rows),
    }
    with open(out_dir / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2))
    table = short_table(rows, summary)
    atomic_write_text(out_dir / "table.md", table)
    plot_short(rows, out_dir / "bench_attention_short.png")
    log(table)
    return summary


def _short_get(rows, shape, B, L, method, M):
    for r in rows:
        if (r["shape"], r["B"], r["L"], r["method"], r["n_features"]) == (shape, B, L, method, M):
            return r
    return None


def short_targets(rows: list[dict]) -> dict:
    """Forward+backward at B = 32, L <= 256: FAVOR+ no slower than performer-pytorch (same M)
    and within 1.5x of SDPA, at both shapes. ``held`` is None where a column is absent."""
    out: dict = {"vs_performer": [], "vs_sdpa": []}
    for r in rows:
        if r["method"] != "favor" or r["B"] != 32 or r["L"] > 256:
            continue
        key = (r["shape"], r["B"], r["L"])
        s = _short_get(rows, *key, "sdpa", None)
        p = _short_get(rows, *key, "performer", r["n_features"])
        tag = {"shape": r["shape"], "L": r["L"], "M": r["n_features"]}
        if s is not None:
            ratio = r["fwdbwd_s"] / s["fwdbwd_s"]
            out["vs_sdpa"].append({**tag, "ratio": ratio, "held": ratio <= 1.5})
        if p is not None:
            ratio = r["fwdbwd_s"] / p["fwdbwd_s"]
            out["vs_performer"].append({**tag, "ratio": ratio, "held": ratio <= 1.0})
    for name in ("vs_performer", "vs_sdpa"):
        items = out[name]
        out[name + "_held"] = all(i["held"] for i in items) if items else None
    return out


def short_table(rows: list[dict], summary: dict) -> str:
    """Markdown: per (shape, B, L) one line, times of every method, plus the targets."""
    Ms = summary["grid"]["features"]
    perf = summary["performer"]
    cols = [("favor", M) for M in Ms] + ([("performer", M) for M in Ms] if perf else [])
    cols.append(("sdpa", None))
    head = " | ".join(f"{m}{'' if M is None else f' M={M}'}" for m, M in cols)
    lines = [
        f"Short-sequence attention benchmark: {summary['cpu']}, torch {summary['torch']}; "
        + machine.machine_line(summary["threads"], summary["load_average_start"],
                               summary["load_average_end"], summary.get("cores"))
        + f". Medians of {summary['config']['repeats']} "
        "interleaved repeats, milliseconds, forward / forward+backward. FAVOR+ order: "
        "q = quadratic, l = linear unchunked, c = linear chunked (picked by cost). "
        + ("" if perf else "performer-pytorch not installed: its columns are absent."),
        "",
        f"| shape | B | L | {head} | favor/sdpa fwd+bwd (M=64) |",
        "|---|---:|---:|" + "---:|" * len(cols) + "---:|",
    ]
    keys = sorted({(r["shape"], r["B"], r["L"]) for r in rows},
                  key=lambda t: (list(summary["grid"]["shapes"]).index(t[0]), t[1], t[2]))
    for key in keys:
        cells = []
        for m, M in cols:
            r = _short_get(rows, *key, m, M)
            if r is None:
                cells.append("-")
                continue
            tag = f" {r['order'][0]}" if r["order"] else ""
            cells.append(f"{r['fwd_s'] * 1e3:.2f} / {r['fwdbwd_s'] * 1e3:.2f}{tag}")
        f64, s = _short_get(rows, *key, "favor", max(Ms)), _short_get(rows, *key, "sdpa", None)
        ratio = f"{f64['fwdbwd_s'] / s['fwdbwd_s']:.2f}" if f64 and s else "-"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells)
                     + f" | {ratio} |")
    t = summary["targets"]
    withheld = summary.get("verdict_withheld")
    lines += ["", "Targets (forward+backward, B = 32, L <= 256, both shapes):", ""]
    for name, text in (("vs_performer", "no slower than performer-pytorch (same M)"),
                       ("vs_sdpa", "within 1.5x of SDPA")):
        status = _status(t[name + "_held"], withheld)
        vals = " ".join(f"{i['shape']},L={i['L']},M={i['M']}:{i['ratio']:.2f}"
                        f"{'' if i['held'] or withheld else '!'}" for i in t[name])
        lines.append(f"- {text}: **{status}** (time ratios favor/other: {vals})")
    if withheld:
        lines += ["", machine.withheld_line(withheld)]
    return "\n".join(lines) + "\n"


def plot_short(rows: list[dict], path: Path) -> None:
    """Forward+backward time versus L, one panel per (shape, B)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["shape"], r["B"]) for r in rows},
                    key=lambda t: (t[0] != "classifier", t[1]))
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), squeeze=False)
    colors = {"favor": "tab:blue", "performer": "tab:orange", "sdpa": "black"}
    for ax, (shape, B) in zip(axes.flat, panels, strict=False):
        series: dict = {}
        for r in rows:
            if (r["shape"], r["B"]) == (shape, B):
                series.setdefault((r["method"], r["n_features"]), []).append(r)
        for (method, M), rs in sorted(series.items(), key=lambda t: (t[0][0], t[0][1] or 0)):
            rs = sorted(rs, key=lambda r: r["L"])
            ax.plot([r["L"] for r in rs], [r["fwdbwd_s"] * 1e3 for r in rs],
                    "--" if M == 16 else "-", marker="o", ms=3, color=colors.get(method, "gray"),
                    label=method if M is None else f"{method} M={M}")
        dim, H = rows[0]["dim"], rows[0]["H"]
        for r in rows:
            if r["shape"] == shape:
                dim, H = r["dim"], r["H"]
                break
        ax.set_title(f"{shape} (dim {dim}, {H} heads), B={B}: forward+backward")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L")
        ax.set_ylabel("ms")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

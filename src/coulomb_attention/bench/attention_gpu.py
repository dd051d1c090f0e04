"""The attention benchmark on a GPU (``bench attention --device cuda``): the fused Triton kernels
against FlashAttention-backed SDPA, op level, bf16 and float32, L = 128..16384.

Methods (all timed in one run, interleaved per length; a method that fails or runs out of
memory at a length gets NaN and its error in the row):

- ``fused/<map>``: :func:`coulomb_attention.nn.ops.triton_linear.fused_kernel_attention`;
- ``ops/favor``: today's FAVOR+ ops (:func:`coulomb_attention.nn.functional.favor_attention`);
- ``sdpa``: ``scaled_dot_product_attention``, restricted to the flash backend for bf16/fp16
  (float32: torch's choice, flash takes no float32); the row names the backend;
- ``fla_causal/favor`` and ``sdpa_causal``: causal, where flash-linear-attention is installed:
  our FAVOR+ features, then ``fla.ops.linear_attn.chunk_linear_attn(normalize=True)``; the row
  ``fla_check`` of the summary gives its relative error against
  :func:`coulomb_attention.nn.functional.causal_favor_attention` (the naive-twin test on the
  device: fla's kernels do not run in Triton's CPU interpreter);
- ``performer/favor``: ``performer_pytorch.FastAttention`` where installed.

Shapes: ``B H = batch_heads`` (B = batch_heads / heads), head dim ``head_dim``, M features.
Times: CUDA events around each call, median over ``repeats`` after a warm-up; forward under
``no_grad``, forward+backward with gradients of q, k, v.

Bandwidth of the fused path (bytes the kernels read and write, from the shapes; B H L rows,
``s`` the inputs' item size): forward reads q, k, v and writes out and the float32 normaliser,
``B H L (s (2 d + 2 e) + 4)`` (omega and the (M, e) sums are negligible); the backward reads q,
k, v, out, the output gradient and the normaliser and writes dq, dk, dv, ``B H L (s (4 d + 4 e)
+ 4)``; forward+backward is their sum. GB/s = bytes / median time, against the device's copy
bandwidth measured in the same run (``y.copy_(x)`` of 1 GiB: 2 GiB moved).
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..results import atomic_write_text

__all__ = ["GpuAttentionBenchConfig", "fused_bytes", "gpu_targets", "require_device",
           "run_gpu_benchmark"]

DTYPES = ("bfloat16", "float32", "float16")


def require_device(device: str) -> str:
    """``device`` if usable, else ``ValueError`` with one line (the CLI's exit 2)."""
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device is available on this machine "
                         "(torch.cuda.is_available() is False)")
    return device


@dataclass(frozen=True)
class GpuAttentionBenchConfig:
    """Grid and shapes of :func:`run_gpu_benchmark`."""

    lengths: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    dtypes: tuple[str, ...] = ("bfloat16", "float32")
    maps: tuple[str, ...] = ("favor",)
    batch_heads: int = 32
    heads: int = 4
    head_dim: int = 64
    n_features: int = 64
    repeats: int = 10
    device: str = "cuda"
    no_performer: bool = False
    no_fla: bool = False
    budget_s: float = 400.0

    def __post_init__(self) -> None:
        for name in ("lengths",):
            vals = tuple(getattr(self, name))
            if not vals or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0
                               for v in vals):
                raise ValueError(f"{name} must be positive integers, got {list(vals)}")
            object.__setattr__(self, name, vals)
        for name in ("batch_heads", "heads", "head_dim", "n_features", "repeats"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, "
                                 f"got {val}")
        if self.batch_heads % self.heads:
            raise ValueError(f"--batch-heads {self.batch_heads} is not divisible by --heads "
                             f"{self.heads}")
        bad = [d for d in self.dtypes if d not in DTYPES]
        if bad or not self.dtypes:
            raise ValueError(f"dtypes must be among {', '.join(DTYPES)}, got {list(self.dtypes)}")
        from ..nn.ops.triton_linear import FUSED_MAPS

        bad = [m for m in self.maps if m not in FUSED_MAPS]
        if bad:
            raise ValueError(f"maps must be among {', '.join(FUSED_MAPS)}, got {bad}")
        object.__setattr__(self, "dtypes", tuple(self.dtypes))
        object.__setattr__(self, "maps", tuple(self.maps))
        if not self.budget_s > 0:
            raise ValueError(f"--budget must be positive, got {self.budget_s}")


def fused_bytes(rows: int, d: int, e: int, itemsize: int, mode: str) -> float:
    """Bytes the fused kernels read and write for ``rows = B H L`` (module docstring)."""
    fwd = rows * (itemsize * (2 * d + 2 * e) + 4)
    bwd = rows * (itemsize * (4 * d + 4 * e) + 4)
    return float(fwd if mode == "fwd" else fwd + bwd)


class _Timer:
    """Median milliseconds of a call: CUDA events on a GPU, ``perf_counter`` on the CPU."""

    def __init__(self, device: str) -> None:
        self.cuda = str(device).startswith("cuda")

    def __call__(self, fn: Callable[[], object], repeats: int) -> float:
        fn()  # warm-up (compilation, autotuning, allocator)
        times = []
        for _ in range(repeats):
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - t))
        return statistics.median(times)


def copy_bandwidth(device: str, n_bytes: int = 1 << 30) -> float:
    """GB/s of ``y.copy_(x)`` (reads and writes ``n_bytes`` each), median of 5."""
    x = torch.empty(n_bytes // 4, device=device)
    y = torch.empty_like(x)
    ms = _Timer(device)(lambda: y.copy_(x), 5)
    return 2.0 * n_bytes / (ms * 1e-3) / 1e9


def _sdpa(dtype):
    """(name, fn) of SDPA: the flash backend for half types, torch's choice for float32."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional
    if dtype in (torch.bfloat16, torch.float16):
        def flash(q, k, v, causal=False):
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return "flash", flash
    return "auto", lambda q, k, v, causal=False: F.scaled_dot_product_attention(
        q, k, v, is_causal=causal)


def _load_fla(no_fla: bool):
    if no_fla:
        return None
    try:
        from fla.ops.linear_attn import chunk_linear_attn
    except Exception:  # optional dependency: any import failure means "leave it out"
        return None
    return chunk_linear_attn


def _methods(cfg, omega, dtype, fla, performer):
    """name -> (kind, fn(q, k, v)) with q, k, v (B, H, L, d) unscaled."""
    from ..nn.functional import causal_favor_attention, favor_attention, favor_features
    from ..nn.ops.triton_linear import fused_kernel_attention

    s = cfg.head_dim ** -0.25
    methods: dict = {}
    for name in cfg.maps:
        om = omega if name != "hedgehog" else torch.cat([omega[:, ::2], -omega[:, ::2]], 1)
        methods[f"fused/{name}"] = ("fused", lambda q, k, v, om=om, n=name:
                                    fused_kernel_attention(q * s, k * s, v, om, n))
    methods["ops/favor"] = ("linear", lambda q, k, v: favor_attention(q * s, k * s, v, omega))
    backend, sdpa = _sdpa(dtype)
    methods["sdpa"] = (f"softmax ({backend})", sdpa)
    if fla is not None:
        def fla_causal(q, k, v):
            pq = favor_features(q * s, omega, is_query=True).to(q.dtype)
            pk = favor_features(k * s, omega, is_query=False).to(q.dtype)
            o, _ = fla(pq.transpose(1, 2), pk.transpose(1, 2), v.transpose(1, 2), scale=1.0,
                       normalize=True)
            return o.transpose(1, 2)
        methods["fla_causal/favor"] = ("causal linear (fla)", fla_causal)
        methods["ops_causal/favor"] = ("causal linear", lambda q, k, v: causal_favor_attention(
            q * s, k * s, v, omega))
        methods["sdpa_causal"] = (f"causal softmax ({backend})",
                                  lambda q, k, v: sdpa(q, k, v, causal=True))
    if performer is not None:
        fa = performer(cfg.head_dim, nb_features=cfg.n_features).to(cfg.device)
        fa.projection_matrix.copy_(omega[0])
        methods["performer/favor"] = ("linear", lambda q, k, v: fa(q, k, v))
    return methods


def _fla_check(fla, omega, cfg, dtype) -> float | None:
    """Relative error of fla's causal output against ours (float32 inputs, L = 256)."""
    if fla is None:
        return None
    from ..nn.functional import causal_favor_attention, favor_features

    g = torch.Generator(device=cfg.device).manual_seed(1)
    B, H, d = cfg.batch_heads // cfg.heads, cfg.heads, cfg.head_dim
    q, k, v = (torch.randn(B, H, 256, d, device=cfg.device, generator=g) * d ** -0.25
               for _ in range(3))
    ref = causal_favor_attention(q, k, v, omega)
    pq = favor_features(q, omega, is_query=True)
    pk = favor_features(k, omega, is_query=False)
    o, _ = fla(pq.transpose(1, 2), pk.transpose(1, 2), v.transpose(1, 2), scale=1.0,
               normalize=True)
    return float((o.transpose(1, 2) - ref).norm() / ref.norm())


def run_gpu_benchmark(cfg: GpuAttentionBenchConfig, out: str | Path,
                      log: Callable[[str], None] = print) -> dict:
    """Time every (dtype, L, method); write ``results.json``, ``results.csv``, ``table.md`` and
    ``bench_attention_gpu.png`` under ``out``; return the summary (rows, targets)."""
    require_device(cfg.device)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = cfg.device
    B, H, d, M = cfg.batch_heads // cfg.heads, cfg.heads, cfg.head_dim, cfg.n_features
    gen = torch.Generator(device=dev).manual_seed(0)
    omega = torch.randn(1, M, d, device=dev, generator=gen)
    fla = _load_fla(cfg.no_fla)
    performer = None
    if not cfg.no_performer:
        try:
            from performer_pytorch import FastAttention as performer
        except Exception:
            performer = None
    bw = copy_bandwidth(dev) if dev.startswith("cuda") else math.nan
    timer = _Timer(dev)
    t0 = time.perf_counter()
    rows: list[dict] = []
    name = torch.cuda.get_device_name(0) if dev.startswith("cuda") else platform.processor()
    log(f"{name}: copy bandwidth {bw:.0f} GB/s; B={B} H={H} d={d} M={M}; fla "
        f"{'yes' if fla else 'no'}; performer {'yes' if performer else 'no'}")
    for dname in cfg.dtypes:
        dtype = getattr(torch, dname)
        methods = _methods(cfg, omega, dtype, fla, performer)
        for L in cfg.lengths:
            if time.perf_counter() - t0 > cfg.budget_s:
                log(f"budget of {cfg.budget_s:.0f} s spent: stopping before {dname} L={L}")
                break
            q, k, v = (torch.randn(B, H, L, d, device=dev, generator=gen, dtype=dtype)
                       .requires_grad_() for _ in range(3))
            g_out = torch.randn(B, H, L, d, device=dev, generator=gen, dtype=dtype)
            for mname, (kind, fn) in methods.items():
                row = {"dtype": dname, "L": L, "method": mname, "kind": kind, "B": B, "H": H,
                       "d": d, "M": M, "error": ""}
                try:
                    with torch.no_grad():
                        row["fwd_ms"] = timer(lambda fn=fn, x=(q, k, v): fn(*x), cfg.repeats)

                    def fb(fn=fn, x=(q, k, v), g=g_out):
                        fn(*x).backward(g)
                        for t in x:
                            t.grad = None
                    row["fwdbwd_ms"] = timer(fb, cfg.repeats)
                except Exception as exc:  # OOM, a backend that refuses the shape: recorded
                    row.update(fwd_ms=math.nan, fwdbwd_ms=math.nan,
                               error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                    if dev.startswith("cuda"):
                        torch.cuda.empty_cache()
                if mname.startswith("fused/"):
                    for mode in ("fwd", "fwdbwd"):
                        nb = fused_bytes(B * H * L, d, d, q.element_size(), mode)
                        gbs = nb / (row[f"{mode}_ms"] * 1e-3) / 1e9
                        row[f"{mode}_gbs"] = gbs
                        row[f"{mode}_frac_bw"] = gbs / bw
                rows.append(row)
                log(f"{dname:8s} L={L:6d} {mname:18s} fwd {row['fwd_ms']:9.3f} ms  fwd+bwd "
                    f"{row['fwdbwd_ms']:9.3f} ms {row['error']}")
    summary = {"config": asdict(cfg), "device_name": name, "torch": torch.__version__,
               "copy_bandwidth_gbs": bw, "fla": fla is not None,
               "fla_check_rel_err": _fla_check(fla, omega, cfg, torch.float32),
               "performer": performer is not None, "wall_s": time.perf_counter() - t0,
               "bytes_model": "fused fwd B H L (s (2d + 2e) + 4); bwd B H L (s (4d + 4e) + 4)",
               "targets": gpu_targets(rows), "rows": rows}
    atomic_write_text(out_dir / "results.json", json.dumps(summary, indent=2))
    cols = list(dict.fromkeys(k for r in rows for k in r))
    lines = [",".join(cols)] + [",".join(str(r.get(c, "")) for c in cols) for r in rows]
    atomic_write_text(out_dir / "results.csv", "\n".join(lines) + "\n")
    table = gpu_table(summary)
    atomic_write_text(out_dir / "table.md", table)
    plot_gpu(rows, out_dir / "bench_attention_gpu.png")
    log(table)
    return summary


def _get(rows, dtype, L, method, key):
    for r in rows:
        if (r["dtype"], r["L"], r["method"]) == (dtype, L, method):
            v = r.get(key)
            return v if v is not None and not math.isnan(v) else None
    return None


def gpu_targets(rows: list[dict]) -> dict:
    """The issue's op-level targets, from rows of one run (bf16, ``fused/favor`` vs ``sdpa``):
    forward+backward faster than SDPA at every L >= 2048 and >= 3x at 8192; forward within
    1.2x of SDPA at 512; >= 50% of the copy bandwidth at 16384 (fwd+bwd). ``held`` is None
    where the rows lack the points."""
    dt, f, s = "bfloat16", "fused/favor", "sdpa"
    out: dict = {}
    sp = [(L, _get(rows, dt, L, s, "fwdbwd_ms"), _get(rows, dt, L, f, "fwdbwd_ms"))
          for L in sorted({r["L"] for r in rows}) if L >= 2048]
    sp = [(L, a / b) for L, a, b in sp if a is not None and b is not None]
    out["fwdbwd_faster_from_2048"] = {"speedups": sp,
                                      "held": all(x > 1 for _, x in sp) if sp else None}
    a, b = _get(rows, dt, 8192, s, "fwdbwd_ms"), _get(rows, dt, 8192, f, "fwdbwd_ms")
    out["fwdbwd_3x_at_8192"] = {"speedup": a / b if a and b else None,
                                "held": (a / b >= 3) if a and b else None}
    a, b = _get(rows, dt, 512, s, "fwd_ms"), _get(rows, dt, 512, f, "fwd_ms")
    out["fwd_within_1.2x_at_512"] = {"ratio": b / a if a and b else None,
                                     "held": (b / a <= 1.2) if a and b else None}
    fr = _get(rows, dt, 16384, f, "fwdbwd_frac_bw")
    out["bandwidth_50pct_at_16384"] = {"fraction": fr,
                                       "held": (fr >= 0.5) if fr is not None else None}
    return out


def gpu_table(summary: dict) -> str:
    """Markdown: per dtype and L the times of every method (ms, fwd / fwd+bwd), the fused
    path's GB/s, then the targets."""
    rows = summary["rows"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    lines = [f"Attention on {summary['device_name']} (torch {summary['torch']}), copy "
             f"bandwidth {summary['copy_bandwidth_gbs']:.0f} GB/s; B H = "
             f"{summary['config']['batch_heads']}, d = {summary['config']['head_dim']}, M = "
             f"{summary['config']['n_features']}; medians of {summary['config']['repeats']}, "
             "ms forward / forward+backward.", "",
             "| dtype | L | " + " | ".join(methods) + " | fused GB/s fwd+bwd (% copy) |",
             "|---|---:|" + "---:|" * (len(methods) + 1)]
    for dt in dict.fromkeys(r["dtype"] for r in rows):
        for L in sorted({r["L"] for r in rows if r["dtype"] == dt}):
            cells = []
            for m in methods:
                a, b = _get(rows, dt, L, m, "fwd_ms"), _get(rows, dt, L, m, "fwdbwd_ms")
                cells.append("-" if a is None else f"{a:.3f} / {b:.3f}" if b else f"{a:.3f}")
            gb = _get(rows, dt, L, "fused/favor", "fwdbwd_gbs")
            fr = _get(rows, dt, L, "fused/favor", "fwdbwd_frac_bw")
            bw = "-" if gb is None else f"{gb:.0f}" + ("" if fr is None else f" ({100*fr:.0f}%)")
            lines.append(f"| {dt} | {L} | " + " | ".join(cells) + f" | {bw} |")
    lines += ["", "Targets (bf16, fused/favor against sdpa, this run):", ""]
    for name, t in summary["targets"].items():
        held = t["held"]
        status = "not measured" if held is None else ("held" if held else "MISSED")
        vals = {k: v for k, v in t.items() if k != "held"}
        lines.append(f"- {name}: **{status}** {vals}")
    if summary.get("fla_check_rel_err") is not None:
        lines.append(f"- fla causal against our causal FAVOR+ (float32, L = 256): relative "
                     f"error {summary['fla_check_rel_err']:.2e}")
    return "\n".join(lines) + "\n"


def plot_gpu(rows: list[dict], path: Path) -> None:
    """Forward+backward time versus L per dtype, and the fused path's bandwidth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dts = list(dict.fromkeys(r["dtype"] for r in rows))
    fig, axes = plt.subplots(1, len(dts) + 1, figsize=(5 * (len(dts) + 1), 4), squeeze=False)
    for ax, dt in zip(axes[0], dts, strict=False):
        for m in dict.fromkeys(r["method"] for r in rows):
            rs = [r for r in rows if r["dtype"] == dt and r["method"] == m]
            ax.plot([r["L"] for r in rs], [r["fwdbwd_ms"] for r in rs], marker="o", ms=3,
                    label=m)
        ax.set(xscale="log", yscale="log", xlabel="L", ylabel="ms (fwd+bwd)", title=dt)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    for dt in dts:
        rs = [r for r in rows if r["dtype"] == dt and r["method"] == "fused/favor"]
        ax.plot([r["L"] for r in rs], [100 * r.get("fwdbwd_frac_bw", math.nan) for r in rs],
                marker="o", ms=3, label=dt)
    ax.set(xscale="log", xlabel="L", ylabel="% of copy bandwidth (fwd+bwd)",
           title="fused/favor bandwidth")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""Decoding speed and state size of a llama decoder: the teacher (exact softmax, its state the
KV cache) against converted rows (the window + sinks hybrid, pure linear attention), issue 47.

Every row runs in one process with the same threads, cell by cell (context ``L``, batch
``B``): each row prefills the cell's prompt in turn, then the rows' decode steps are
interleaved (step ``i`` of every row before step ``i + 1`` of any; :func:`_cell`), so load that
drifts during the run hits all rows of a cell alike and the decode ratios compare steps taken
seconds apart. (Before session 13 each row decoded all its steps before the next row started;
on a shared CPU the teacher's step then varied 180-258 ms from run to run.)

One cell of one row
-------------------
- **prefill**: ``L - n`` random token ids (``n`` = warm-up + timed decode steps) through every
  block with ``output_states=True`` and the head at the last position only (:func:`prefill`, as
  Hugging Face's ``logits_to_keep=1``: the logits of every prompt position are not part of
  generating, and at ``B = 8``, ``L = 32768`` they would be 51 GB); the median of up to
  ``prefill_repeats`` calls (one call when it takes over a second);
- **decode**: ``n`` greedy steps through the states (``model(next, states=, output_states=
  True)``, one token each, interleaved with the other rows' steps), so the last step reads a
  context of ``L`` tokens; the median over
  the ``decode_steps`` timed steps after ``warmup_steps`` untimed ones, in ms per step; tokens/s
  = ``B`` / median step time;
- **state**: :meth:`LlamaForCausalLM.state_bytes` after the last step (position ``L``) beside
  the teacher's KV cache at ``L`` from the config, ``2 * layers * kv_heads * head_dim * L * B *
  itemsize`` (so rows past the teacher's positions still get a ratio).

The teacher runs only where ``L <= max_positions`` (8,192 for SmolLM2). The converted rows
share the teacher's weights (only the attention layers are new, with fresh particles: speed does
not depend on their values, so untrained rows are fine for timing).

Verdicts (issue 47's targets, at ``L = 8192``, every batch and converted row): decode tokens/s
at least twice the teacher's, state at most 1/20 of the KV cache, prefill no slower than the
teacher's. On the CPU a verdict needs a quiet machine: when the other processes' load (the
1-minute load average at the start, and at the end less this run's threads) exceeds the cores
left free by ``threads`` (plus a quarter core of background noise;
:func:`coulomb_attention.bench.machine.verdict_withheld`), the measured ratios are still
written but no verdict is given, and the summary says why.
"""

from __future__ import annotations

import copy
import gc
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ..nn.families.llama import LlamaConfig, LlamaForCausalLM, convert_attention_
from ..results import atomic_write_json, atomic_write_text
from . import machine

__all__ = ["DecoderBenchConfig", "ROWS", "SMOLLM2_SHAPES", "TARGET_LENGTH", "build_model",
           "kv_cache_bytes", "markdown", "prefill", "random_model", "run_benchmark",
           "verdicts"]

#: SmolLM2-135M-Instruct's shapes (its GGUF metadata), for ``--random`` (no gguf needed).
SMOLLM2_SHAPES: dict[str, Any] = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
    num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5, max_positions=8192,
    tie_embeddings=True)

#: Row name -> :func:`convert_attention_` keywords (``None``: the teacher as loaded). The window
#: and sinks of the hybrids come from the config (``window``, ``sinks``).
ROWS: dict[str, dict[str, Any] | None] = {
    "teacher": None,
    "hybrid_hedgehog": {"feature_map": "hedgehog", "hybrid": True},
    "hybrid_favor": {"feature_map": "favor", "hybrid": True},
    "favor": {"feature_map": "favor", "hybrid": False},
}

#: The context of the verdicts.
TARGET_LENGTH = 8192
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class DecoderBenchConfig:
    """Grid and settings of :func:`run_benchmark`.

    ``model``: ``"random"`` (SmolLM2's shapes, random weights), ``"smollm2"`` or a llama
    directory / GGUF file (:func:`build_model`). ``budget_s``: seconds; the cells left when it
    is spent are skipped (``None``: no limit).
    """

    model: str = "random"
    rows: tuple[str, ...] = tuple(ROWS)
    lengths: tuple[int, ...] = (512, 2048, 8192, 32768)
    batches: tuple[int, ...] = (1, 8)
    decode_steps: int = 24
    warmup_steps: int = 2
    prefill_repeats: int = 3
    n_features: int = 64
    window: int = 64
    sinks: int = 4
    threads: int = 2
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    budget_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("lengths", "batches"):
            vals = tuple(getattr(self, name))
            if not vals or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0
                               for v in vals):
                raise ValueError(f"{name} must be positive integers, got {vals!r}")
            object.__setattr__(self, name, vals)
        rows = tuple(self.rows)
        bad = [r for r in rows if r not in ROWS]
        if bad or not rows:
            raise ValueError(f"unknown rows {bad or rows!r}; valid: {', '.join(ROWS)}")
        object.__setattr__(self, "rows", rows)
        for name in ("decode_steps", "prefill_repeats", "n_features", "window", "threads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name in ("warmup_steps", "sinks", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.budget_s is not None and not self.budget_s > 0:
            raise ValueError(f"budget_s must be > 0 or None, got {self.budget_s!r}")
        short = [L for L in self.lengths if L <= self.decode_steps + self.warmup_steps]
        if short:
            raise ValueError(f"lengths {short} leave no prompt before the "
                             f"{self.decode_steps + self.warmup_steps} decode steps")


# ------------------------------------------------------------------------------- models


def random_model(config: LlamaConfig, generator: torch.Generator | int = 0) -> LlamaForCausalLM:
    """A llama of ``config``'s shapes with random weights (N(0, 0.02), norms 1), drawn from
    ``generator`` (no global seed). Built on the meta device, so no default init is wasted."""
    if not isinstance(generator, torch.Generator):
        generator = torch.Generator().manual_seed(int(generator))
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu")
    if config.tie_embeddings:  # to_empty gives every module its own tensor
        model.lm_head.weight = model.embed_tokens.weight
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=generator)
    return model.eval()


def build_model(source: str, seed: int = 0) -> LlamaForCausalLM:
    """``"random"``: :func:`random_model` of :data:`SMOLLM2_SHAPES`; ``"smollm2"`` or a path:
    the pretrained weights (:func:`coulomb_attention.nn.families.llama.load` /
    ``from_pretrained``; a GGUF file needs the ``gguf`` package). float32, CPU, eval mode."""
    if source == "random":
        return random_model(LlamaConfig(**SMOLLM2_SHAPES), seed)
    from ..nn.families import llama

    if source == "smollm2":
        return llama.from_pretrained(llama.smollm2_path())
    return llama.from_pretrained(source)


def _converted(teacher: LlamaForCausalLM, spec: dict[str, Any], cfg: DecoderBenchConfig
               ) -> LlamaForCausalLM:
    """A copy of ``teacher`` sharing every parameter but the attention layers, converted."""
    memo = {id(p): p for p in teacher.parameters()}  # deepcopy keeps these tensors shared
    model = copy.deepcopy(teacher, memo)
    window, sinks = (cfg.window, cfg.sinks) if spec["hybrid"] else (0, 0)
    return convert_attention_(model, spec["feature_map"], cfg.n_features, window=window,
                              sinks=sinks, generator=cfg.seed + 1)


def kv_cache_bytes(config: LlamaConfig, positions: int, batch: int = 1,
                   dtype: torch.dtype = torch.float32) -> int:
    """Bytes of the teacher's KV cache after ``positions`` tokens: ``2 * layers * kv_heads *
    head_dim * positions * batch * itemsize``."""
    item = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * positions * batch * item


@torch.no_grad()
def prefill(model: LlamaForCausalLM, input_ids: torch.Tensor
            ) -> tuple[torch.Tensor, list]:
    """Run ``input_ids`` (B, T) through every block with its decoding state and the head at
    the last position only. Returns the last position's logits (B, V) float32 and the
    per-layer states (the same as ``model(ids, output_states=True)`` gives, without the
    (B, T, V) logits of the earlier positions)."""
    T = input_ids.shape[1]
    if T > model.config.max_positions and any(
            a.feature_map == "softmax" for a in model.attention_layers):
        raise ValueError(f"{T} tokens exceed max_positions = {model.config.max_positions} of "
                         "the softmax attention")
    h = model.embed_tokens(input_ids)  # (B, T, D)
    states = []
    for block in model.layers:
        h, s = block(h, None, None, True)
        states.append(s)
    return model.lm_head(model.norm(h[:, -1:])).float()[:, 0], states  # (B, V)


# ------------------------------------------------------------------------------- timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _error(exc: BaseException) -> str:
    """A failed row's ``error``: the exception's type and first line."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


@torch.no_grad()
def _cell(models: dict[str, LlamaForCausalLM], L: int, B: int, cfg: DecoderBenchConfig,
          device: torch.device, gen: torch.Generator) -> list[dict[str, Any]]:
    """One cell (``L``, ``B``) of every row: each row prefills the same ``L - n`` random tokens
    in turn, then the ``n`` decode steps are interleaved (step ``i`` of every row before step
    ``i + 1`` of any), so that the load the machine sees while decoding hits every row alike
    and the decode ratios pair steps taken seconds apart, not minutes. A row that fails (out of
    memory among them) gets an ``error`` and leaves the others running."""
    n = cfg.warmup_steps + cfg.decode_steps
    vocab = next(iter(models.values())).config.vocab_size
    ids = torch.randint(0, vocab, (B, L - n), generator=gen).to(device)
    rows: dict[str, dict[str, Any]] = {}
    live: dict[str, list] = {}  # name -> [model, logits, states, step seconds]
    for name, model in models.items():
        if ROWS.get(name, 0) is None and L > model.config.max_positions:
            continue  # the teacher stops at its positions
        row = rows[name] = {"row": name, "L": L, "B": B}
        try:
            times = []
            for _ in range(cfg.prefill_repeats):
                states = None  # the previous state is freed before the next prefill
                _sync(device)
                t0 = time.perf_counter()
                logits, states = prefill(model, ids)
                _sync(device)
                times.append(time.perf_counter() - t0)
                if times[0] > 1.0:
                    break
        except (RuntimeError, MemoryError) as exc:  # out of memory among them
            row["error"] = _error(exc)
            _free(device)
            continue
        row.update(prefill_s=statistics.median(times), prefill_repeats=len(times),
                   prefill_tokens=L - n)
        live[name] = [model, logits, states, []]
    for i in range(n):
        for name in list(live):
            model, logits, states, steps = live[name]
            nxt = logits.argmax(-1, keepdim=True)  # (B, 1) greedy
            try:
                _sync(device)
                t0 = time.perf_counter()
                out, states = model(nxt, states=states, output_states=True)
                _sync(device)
            except (RuntimeError, MemoryError) as exc:
                rows[name]["error"] = _error(exc)
                del live[name]
                _free(device)
                continue
            if i >= cfg.warmup_steps:
                steps.append(time.perf_counter() - t0)
            live[name][1:3] = out[:, -1], states
    for name, (model, _, states, steps) in live.items():
        assert states[0].position == L
        step_s = statistics.median(steps)
        rows[name].update(decode_ms=1e3 * step_s, decode_ms_min=1e3 * min(steps),
                          tokens_per_s=B / step_s, state_bytes=model.state_bytes(states))
    return list(rows.values())


_NO_TARGETS = f"the targets need the teacher and L = {TARGET_LENGTH}"


def run_benchmark(cfg: DecoderBenchConfig, out: str | Path | None = None, *,
                  model: LlamaForCausalLM | None = None,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Time every (row, L, B) of ``cfg`` in one process; write ``results.json`` and
    ``results.md`` under ``out`` (when given; ``results.json`` also after every row, with
    ``complete: false``, so a run cut short keeps its rows); returns the summary (``rows``:
    one dict per cell and row, ``targets``, ``verdict`` or ``verdict_withheld``).

    ``model``: a softmax llama to use instead of ``cfg.model`` (tests pass a tiny one).
    """
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {cfg.device}: no CUDA device is available on this machine")
    dtype = DTYPES[cfg.dtype]
    torch.set_num_threads(cfg.threads)
    load_start = machine.load_average()
    t_start = time.perf_counter()
    teacher = build_model(cfg.model, cfg.seed) if model is None else model
    if any(a.feature_map != "softmax" for a in teacher.attention_layers):
        raise ValueError("the benchmark needs the pretrained (softmax) model as its teacher; "
                         "this one is already converted")
    teacher = teacher.to(device=device, dtype=dtype).eval()
    config = teacher.config
    models = {r: teacher if ROWS[r] is None else _converted(teacher, ROWS[r], cfg)
              for r in cfg.rows}
    cores = machine.cores()
    log(f"decoder bench: model {cfg.model} ({config.num_layers} layers, {config.num_heads}/"
        f"{config.num_kv_heads} heads of {config.head_dim}), {cfg.device} {cfg.dtype}, torch "
        f"threads {torch.get_num_threads()} of {cores} cores, load average "
        f"{load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}; rows {', '.join(cfg.rows)}")
    gen = torch.Generator().manual_seed(cfg.seed)
    warm = replace(cfg, prefill_repeats=1, decode_steps=2, warmup_steps=0)
    _cell(models, 34, 1, warm, device, gen)  # thread pools, first allocations: not charged
    rows, skipped = [], []
    for L in cfg.lengths:
        for B in cfg.batches:
            if cfg.budget_s is not None and time.perf_counter() - t_start > cfg.budget_s:
                skipped.append({"L": L, "B": B, "reason": "time budget spent"})
                log(f"L={L} B={B}: skipped (time budget {cfg.budget_s:.0f} s spent)")
                continue
            for row in _cell(models, L, B, cfg, device, gen):
                _free(device)
                row["kv_bytes"] = kv_cache_bytes(config, L, B, dtype)
                if "state_bytes" in row:
                    row["state_over_kv"] = row["state_bytes"] / row["kv_bytes"]
                rows.append(row)
                log(_line(row))
                if out is not None:  # a run cut short still leaves its rows
                    atomic_write_json(Path(out) / "results.json",
                                      {"config": asdict(cfg), "complete": False, "rows": rows})
    _ratios(rows)
    load_end = machine.load_average()
    summary = {
        "config": asdict(cfg), "model_config": config.to_dict(), "rows": rows,
        "skipped": skipped, "torch": torch.__version__, "python": platform.python_version(),
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else _cpu_name()),
        **machine.machine_record(torch.get_num_threads(), load_start, load_end, cores),
        "wall_s": time.perf_counter() - t_start, "complete": True,
        "method": "prefill: median of up to prefill_repeats calls over L - n tokens (head at "
                  "the last position); decode: median step over decode_steps greedy steps "
                  "after warmup_steps, the last one at context L; state after L positions; "
                  "kv_bytes: the teacher's KV cache at L from the config",
    }
    summary["targets"] = verdicts(rows)
    reason = _withheld(cfg, cores, load_start, load_end)
    summary["verdict_withheld"] = reason
    summary["verdict"] = None if reason or not summary["targets"] else all(
        t["pass"] for t in summary["targets"])
    text = markdown(summary)
    log(text)
    if reason and reason != _NO_TARGETS:
        log(machine.withheld_line(reason))
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / "results.json", summary)
        atomic_write_text(out / "results.md", text)
    return summary


def _ratios(rows: list[dict]) -> None:
    """Each converted row's decode speed-up and prefill ratio against the teacher's cell."""
    teacher = {(r["L"], r["B"]): r for r in rows if r["row"] == "teacher" and "decode_ms" in r}
    for r in rows:
        t = teacher.get((r["L"], r["B"]))
        if r["row"] != "teacher" and t is not None and "decode_ms" in r:
            r["decode_speedup"] = r["tokens_per_s"] / t["tokens_per_s"]
            r["prefill_ratio"] = r["prefill_s"] / t["prefill_s"]


def verdicts(rows: list[dict], length: int = TARGET_LENGTH) -> list[dict]:
    """Issue 47's targets at ``length``, one entry per (converted row, batch, target) with the
    measured value and ``pass``: decode tokens/s >= 2 x the teacher's, state <= KV / 20,
    prefill time <= the teacher's. Cells without a teacher or with an error are left out."""
    out = []
    for r in rows:
        if r["L"] != length or r["row"] == "teacher" or "decode_speedup" not in r:
            continue
        key = {"row": r["row"], "B": r["B"], "L": length}
        out.append({**key, "target": "decode >= 2x teacher tokens/s",
                    "value": r["decode_speedup"], "pass": r["decode_speedup"] >= 2.0})
        out.append({**key, "target": "state <= 1/20 of the KV cache",
                    "value": r["state_over_kv"], "pass": r["state_over_kv"] <= 1 / 20})
        out.append({**key, "target": "prefill no slower than the teacher",
                    "value": r["prefill_ratio"], "pass": r["prefill_ratio"] <= 1.0})
    return out


def _withheld(cfg: DecoderBenchConfig, cores: int, load_start, load_end) -> str | None:
    """Why no verdict may be given (``None``: it may)."""
    if not any(r == "teacher" for r in cfg.rows) or TARGET_LENGTH not in cfg.lengths:
        return _NO_TARGETS
    if torch.device(cfg.device).type != "cpu":
        return None
    return machine.verdict_withheld(cfg.threads, load_start, load_end, cores)


# ------------------------------------------------------------------------------- output


def _mb(b: float | None) -> str:
    return "-" if b is None else f"{b / 2**20:.4g}"


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['row']:16s} L={r['L']:6d} B={r['B']}: {r['error']}"
    return (f"{r['row']:16s} L={r['L']:6d} B={r['B']}: prefill {r['prefill_s']:8.3f} s, "
            f"decode {r['decode_ms']:8.2f} ms/step ({r['tokens_per_s']:8.1f} tok/s), state "
            f"{_mb(r['state_bytes'])} MB = {r['state_over_kv']:.4f} x KV")


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def markdown(summary: dict) -> str:
    """The table (one line per row and cell), the targets and the verdict, as Markdown."""
    cfg = summary["config"]
    la, le = summary["load_average_start"], summary["load_average_end"]
    head = [f"# Decoder benchmark ({cfg['model']}, {cfg['device']} {cfg['dtype']})", "",
            f"{summary['device']}; torch {summary['torch']}, {summary['threads']} thread(s) of "
            f"{summary['cores']} cores; load average {la[0]:.2f} at the start, {le[0]:.2f} at "
            f"the end; {summary['wall_s']:.0f} s. Hybrid rows: window {cfg['window']}, "
            f"{cfg['sinks']} sinks, {cfg['n_features']} features; decode median of "
            f"{cfg['decode_steps']} steps.", "",
            "| row | B | L | prefill s | decode ms/token | tokens/s | state MB | teacher KV MB "
            "| state / KV | decode x teacher | prefill / teacher |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in summary["rows"]:
        if "error" in r:
            head.append(f"| {r['row']} | {r['B']} | {r['L']} | {r['error']} |"
                        + " |" * 7)
            continue
        head.append(
            f"| {r['row']} | {r['B']} | {r['L']} | {r['prefill_s']:.3f} | "
            f"{r['decode_ms']:.2f} | {r['tokens_per_s']:.1f} | {_mb(r['state_bytes'])} | "
            f"{_mb(r['kv_bytes'])} | {r['state_over_kv']:.4f} | "
            f"{_fmt(r.get('decode_speedup'), '.2f')} | {_fmt(r.get('prefill_ratio'), '.2f')} |")
    for s in summary["skipped"]:
        head.append(f"| (skipped) | {s['B']} | {s['L']} | {s['reason']} |" + " |" * 7)
    head += ["", f"## Targets at L = {TARGET_LENGTH}", ""]
    if not summary["targets"]:
        head.append(f"No converted row with a teacher at L = {TARGET_LENGTH}.")
    reason = summary["verdict_withheld"]
    for t in summary["targets"]:
        mark = "" if reason else (" PASS" if t["pass"] else " FAIL")
        head.append(f"- {t['row']} B={t['B']}: {t['target']}: {t['value']:.4g}{mark}")
    head.append("")
    if reason:
        head.append(f"No verdict: {reason}.")
    elif summary["targets"]:
        head.append(f"Verdict: {'every target met' if summary['verdict'] else 'targets missed'}"
                    f" ({sum(t['pass'] for t in summary['targets'])} of "
                    f"{len(summary['targets'])}).")
    return "\n".join(head) + "\n"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"

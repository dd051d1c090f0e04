"""The evaluation of causal language models: rows x tasks -> one result row per unit, resumable.

A *row* is an attention the model computes, named by a spec string:

* ``teacher`` the pretrained softmax model as loaded (its KV cache grows with the context);
* ``fixed:MAP`` pure linear attention with ``M`` untrained features of ``MAP`` drawn with the
  study's seed; ``fixed:MAP:W:S`` the hybrid (exact softmax over ``S`` sinks and the last ``W``
  tokens, the untrained linear term for the rest);
* ``streaming:W:S`` StreamingLLM (sinks and window, older keys dropped); ``streaming:matched``
  the StreamingLLM window whose cache holds the bytes of the hybrid ``fixed:favor:64:4``
  (:func:`~coulomb_attention.convert.lm_eval.memory_matched_window`), named by its window;
* a directory loadable by ``from_pretrained`` (a converted model).

The tasks (:mod:`coulomb_attention.convert.lm_eval` computes each): ``ppl`` the per-document
loss of ``token_documents`` windows of the test works at each length, with its sums over
power-of-two position buckets; ``passkey`` retrieval of a 5-digit key (seeded per length and
trial, the same for every row) at a depth cycling through ``depths``; ``repeat`` a passage of
``repeat_length`` tokens given twice (the loss on each copy).

:func:`run_study` appends one fsync'd line per (row, task, length, document or trial) to
``OUT/results.jsonl``; a unit whose key (:func:`unit_key`, :func:`coulomb_attention.results.
run_key`) is already there is skipped, so a rerun or a run killed mid-way continues where it
stopped. The report (:mod:`coulomb_attention.reports.lm_eval`) reads that file only.
"""

from __future__ import annotations

import copy
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..names import ATTENTION_MAPS
from ..reports.lm_eval import KEY_FIELDS, unit_key
from ..results import append_jsonl, read_jsonl

__all__ = ["DEFAULT_ROWS", "KEY_FIELDS", "LmEvalConfig", "Row", "TASKS", "build_row",
           "parse_row", "resolve_rows", "run_study", "unit_key"]

#: the tasks, in the order they run
TASKS: tuple[str, ...] = ("ppl", "passkey", "repeat")
#: the rows run when none are named
DEFAULT_ROWS: tuple[str, ...] = ("teacher", "streaming:64:4", "streaming:matched")
_SPECS = ("teacher, fixed:MAP, fixed:MAP:W:S, streaming:W:S, streaming:matched or a model "
          "directory")


@dataclass(frozen=True)
class LmEvalConfig:
    """One evaluation.

    Parameters
    ----------
    model : ``"smollm2"``, a ``.gguf`` file or a model directory with ``tokenizer.json``
        (the teacher and the tokenizer of every row)
    rows : row specs (module docstring)
    tasks : a selection of :data:`TASKS`
    lengths : document lengths of ``ppl`` (tokens)
    passkey_lengths : total lengths of ``passkey`` (prompt + ``new_tokens``)
    trials : passkey trials per length
    depths : needle depths, trial ``i`` at ``depths[i % len(depths)]``
    repeat_length, repeat_docs : passage length P and number of passages of ``repeat``
    limit_docs : at most this many documents per ppl length and passages (None: all)
    n_features : M of the ``fixed`` rows and of the hybrid ``streaming:matched`` matches
    seed : features of the ``fixed`` rows and the passkeys
    new_tokens : tokens decoded per passkey trial
    chunk : tokens per forward call (memory; not the numbers)
    data_dir : folder of ``shakespeare/test.jsonl.gz``; None: the shipped sample
    threads : ``torch.set_num_threads`` (None: leave it)
    skip_long_teacher : a length above the teacher's positions is skipped with a note in the
        results (True) or refused before anything runs (False)
    matched_window, matched_sinks : the hybrid that ``streaming:matched`` matches
    """

    model: str = "smollm2"
    rows: tuple[str, ...] = DEFAULT_ROWS
    tasks: tuple[str, ...] = TASKS
    lengths: tuple[int, ...] = (512, 2048, 8192)
    passkey_lengths: tuple[int, ...] = (1024, 2048, 4096, 8192)
    trials: int = 20
    depths: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    repeat_length: int = 256
    repeat_docs: int = 20
    limit_docs: int | None = None
    n_features: int = 64
    seed: int = 0
    new_tokens: int = 8
    chunk: int = 512
    data_dir: str | None = None
    threads: int | None = None
    skip_long_teacher: bool = False
    matched_window: int = 64
    matched_sinks: int = 4

    def __post_init__(self):
        for name in ("rows", "tasks", "lengths", "passkey_lengths", "depths"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.rows:
            raise ValueError("rows: expected at least one row")
        bad = [t for t in self.tasks if t not in TASKS]
        if bad or not self.tasks:
            raise ValueError(f"tasks: unknown {bad} (valid: {', '.join(TASKS)})")
        ints = {"trials": 1, "repeat_length": 2, "repeat_docs": 1, "n_features": 1,
                "seed": 0, "new_tokens": 1, "chunk": 1, "matched_window": 1, "matched_sinks": 0}
        for name, low in ints.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        for name in ("limit_docs", "threads"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be None or an integer >= 1, got {v!r}")
        for name, low in (("lengths", 2), ("passkey_lengths", self.new_tokens + 1)):
            for v in getattr(self, name):
                if isinstance(v, bool) or not isinstance(v, int) or v < low:
                    raise ValueError(f"{name}: each must be an integer >= {low}, got {v!r}")
        for d in self.depths:
            if not 0.0 <= float(d) <= 1.0:
                raise ValueError(f"depths: each must lie in [0, 1], got {d!r}")
        if "passkey" in self.tasks and not self.depths:
            raise ValueError("depths: expected at least one depth")


@dataclass(frozen=True)
class Row:
    """A parsed row: ``kind`` one of ``teacher``, ``linear``, ``hybrid``, ``streaming``;
    ``source`` ``pretrained``, ``fixed`` or ``directory``; ``path`` for a directory."""

    name: str
    kind: str
    source: str
    feature_map: str | None = None
    n_features: int | None = None
    window: int = 0
    sinks: int = 0
    path: str | None = None
    matched: bool = field(default=False, compare=False)

    def attention(self) -> dict[str, Any]:
        """The row's attention as stored with every result row (the report pairs rows by it)."""
        return {k: v for k, v in asdict(self).items() if k not in ("name", "path")}


def _int(spec: str, text: str, low: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"row {spec!r}: {text!r} is not an integer") from None
    if v < low:
        raise ValueError(f"row {spec!r}: {v} must be >= {low}")
    return v


def parse_row(spec: str, n_features: int = 64) -> Row:
    """The :class:`Row` of a spec string (module docstring). ``streaming:matched`` comes back
    with ``window=0`` and ``matched=True`` (:func:`resolve_rows` fills the window from the
    model).

    Raises ``ValueError`` for a spec of no known form, ``FileNotFoundError`` for a directory
    that does not exist or holds no ``config.json``.
    """
    parts = str(spec).split(":")
    head = parts[0]
    if spec == "teacher":
        return Row(spec, "teacher", "pretrained")
    if head == "fixed" and len(parts) in (2, 4):
        if parts[1] not in ATTENTION_MAPS:
            raise ValueError(f"row {spec!r}: unknown feature map {parts[1]!r} (valid: "
                             f"{', '.join(ATTENTION_MAPS)})")
        if len(parts) == 2:
            return Row(spec, "linear", "fixed", parts[1], n_features)
        return Row(spec, "hybrid", "fixed", parts[1], n_features, _int(spec, parts[2], 1),
                   _int(spec, parts[3], 0))
    if head == "streaming" and parts[1:] == ["matched"]:
        return Row(spec, "streaming", "pretrained", matched=True)
    if head == "streaming" and len(parts) == 3:
        return Row(spec, "streaming", "pretrained", None, None, _int(spec, parts[1], 1),
                   _int(spec, parts[2], 0))
    if head in ("teacher", "fixed", "streaming"):
        raise ValueError(f"row {spec!r}: not a row spec ({_SPECS})")
    path = Path(spec)
    if not path.is_dir():
        raise FileNotFoundError(f"row {spec!r} is neither a row spec ({_SPECS}) nor an "
                                "existing directory")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"row {spec!r}: {path} holds no config.json (not a model "
                                "directory from save_pretrained; of a `convert --model` run "
                                "pass its OUT/hf)")
    return Row(spec, "directory", "directory", path=str(path))


def resolve_rows(config: LmEvalConfig, head_dim: int) -> list[Row]:
    """Every row of ``config`` parsed, ``streaming:matched`` given its window (for a model of
    ``head_dim``), duplicates (by name) dropped."""
    from ..convert.lm_eval import memory_matched_window

    rows: dict[str, Row] = {}
    for spec in config.rows:
        row = parse_row(spec, config.n_features)
        if row.matched:
            w = memory_matched_window(head_dim, config.n_features, config.matched_window)
            row = Row(f"streaming:{w}:{config.matched_sinks}", "streaming", "pretrained",
                      window=w, sinks=config.matched_sinks, matched=True)
        rows.setdefault(row.name, row)
    return list(rows.values())


def build_row(row: Row, teacher, seed: int = 0):
    """The model of ``row``: the teacher itself, a converted copy of it, or the directory
    loaded. A directory row's :class:`Row` is returned with its attention filled in from the
    directory's ``config.json``."""
    from ..nn.families.llama import conversion_spec, convert_attention_, from_pretrained

    if row.kind == "teacher":
        return teacher, row
    if row.kind == "directory":
        model = from_pretrained(row.path)
        spec = conversion_spec(model)
        if spec is None:
            return model, Row(row.name, "teacher", "directory", path=row.path)
        kind = ("streaming" if not spec["window_linear"] else "hybrid") if spec["window"] \
            else "linear"
        return model, Row(row.name, kind, "directory",
                          None if kind == "streaming" else spec["feature_map"],
                          None if kind == "streaming" else spec["n_features"],
                          spec["window"], spec["sinks"], row.path)
    model = copy.deepcopy(teacher)
    if row.kind == "streaming":
        convert_attention_(model, "favor", 1, window=row.window, sinks=row.sinks, linear=False,
                           generator=seed)
    else:
        convert_attention_(model, row.feature_map, row.n_features, window=row.window,
                           sinks=row.sinks, generator=seed)
    return model.eval(), row


class _Progress:
    """Lines on stderr: one per finished unit, and a heartbeat naming the current unit when
    none was printed for ``every`` seconds."""

    def __init__(self, enabled: bool, every: float = 30.0, stream=None):
        self.enabled, self.every = enabled, every
        self.stream = sys.stderr if stream is None else stream
        self.stage, self.last, self.t0 = "starting", time.monotonic(), time.monotonic()
        self._stop = threading.Event()
        self._thread = None

    def line(self, msg: str) -> None:
        self.last = time.monotonic()
        if self.enabled:
            print(f"[lm-eval {self.last - self.t0:6.0f}s] {msg}", file=self.stream, flush=True)

    def _beat(self) -> None:
        while not self._stop.wait(min(self.every, 5.0)):
            if time.monotonic() - self.last >= self.every:
                self.line(f"{self.stage} (running)")

    def __enter__(self):
        if self.enabled:
            self._thread = threading.Thread(target=self._beat, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


class _CachedTokenizer:
    """``encode(text) -> list[int]`` memoised (the works are cut at several lengths)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.cache = tokenizer, {}

    def encode(self, text: str) -> list[int]:
        if text not in self.cache:
            enc = self.tokenizer.encode(text)
            self.cache[text] = list(getattr(enc, "ids", enc))
        return self.cache[text]


def _documents(tok, texts, length: int, limit: int | None) -> list[tuple[int, int, Any]]:
    """``(text index, window index, ids (length,))`` of the first ``limit`` windows, in text
    order."""
    from ..data import token_documents

    out = []
    for t, text in enumerate(texts):
        if len(tok.encode(text)) < length:
            continue
        docs = token_documents(tok, [text], length)
        out += [(t, w, docs[w]) for w in range(docs.shape[0])]
        if limit is not None and len(out) >= limit:
            return out[:limit]
    if not out:
        longest = max(len(tok.encode(t)) for t in texts)
        raise ValueError(f"no test text holds {length} tokens (the longest has {longest}); "
                         "pass --data-dir for the full works or a shorter length")
    return out


def _check_lengths(rows: list[Row], config: LmEvalConfig, max_positions: int) -> None:
    """Refuse a length above the softmax teacher's positions (unless skipped with a note)."""
    if config.skip_long_teacher:
        return
    need = {"ppl": max(config.lengths), "passkey": max(config.passkey_lengths),
            "repeat": 2 * config.repeat_length}
    for task in config.tasks:
        if need[task] > max_positions and any(r.kind == "teacher" for r in rows):
            flag = {"ppl": "--lengths", "passkey": "--passkey-lengths",
                    "repeat": "--repeat-length (x2)"}[task]
            raise ValueError(f"{flag} {need[task]} exceeds the teacher's {max_positions} "
                             "positions: drop the teacher row or that length")


def _units(config: LmEvalConfig, docs: Callable, passages: Callable, source: str):
    """``(task, length, doc, depth, payload)`` of every unit, in run order."""
    import numpy as np

    for task in config.tasks:
        if task == "ppl":
            for length in config.lengths:
                for i, d in enumerate(docs(length)):
                    yield task, length, i, None, source, d
        elif task == "passkey":
            for length in config.passkey_lengths:
                for i in range(config.trials):
                    key = int(np.random.default_rng([config.seed, length, i]).integers(
                        10000, 100000))
                    yield task, length, i, float(config.depths[i % len(config.depths)]), \
                        "passkey", key
        else:
            for i, d in enumerate(passages()):
                yield task, config.repeat_length, i, None, source, d


def _run_unit(m, model, tokenizer, config: LmEvalConfig, rec: dict[str, Any], payload,
              tick) -> tuple[dict[str, Any], str]:
    """The measurements of one unit and a short text for its progress line."""
    task, length = rec["task"], rec["length"]
    if task == "ppl":
        text, window, ids = payload
        nll, states = m.token_nll(model, ids, chunk=config.chunk, on_chunk=tick,
                                  output_states=True)
        edges = m.log2_edges(length)
        sums, counts = m.position_buckets(nll, edges)
        res = {"nll": float(nll.double().mean()), "tokens": int(nll.numel()), "text": text,
               "window": window, "edges": edges, "bucket_sum": sums, "bucket_n": counts,
               "state_bytes": model.state_bytes(states)}
        return res, f"nll {res['nll']:.3f}"
    if task == "passkey":
        r = m.passkey_trial(model, tokenizer, length, rec["depth"], payload,
                            n_new=config.new_tokens, chunk=config.chunk, on_chunk=tick)
        res = {"key": payload, "success": r["success"], "output": r["output"],
               "actual_depth": r["depth"], "prompt_tokens": r["prompt_tokens"]}
        return res, f"{'found' if r['success'] else 'missed'} {payload}"
    first, second = m.repeated_text_nll(model, payload, chunk=config.chunk)
    return {"nll_first": first, "nll_second": second}, f"nll {first:.3f} -> {second:.3f}"


def run_study(config: LmEvalConfig, out: str | Path, *, progress: bool = True,
              log: Callable[[str], None] | None = None) -> Path:
    """Run every unit of ``config`` not yet in ``out/results.jsonl``; returns that path.

    ``log`` gets the few lines worth printing (the rows resolved, the memory-matched window,
    skipped lengths); ``progress`` prints a line per unit and a heartbeat on stderr.
    """
    import torch

    from ..convert import lm_eval as m
    from ..data import long_texts
    from ..nn.families.llama import load

    log = log or (lambda s: print(s, file=sys.stderr))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    for spec in config.rows:  # a bad spec or a missing directory fails before the load
        parse_row(spec, config.n_features)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    done = {unit_key(r) for r in read_jsonl(results, repair=True)}
    teacher, tokenizer = load(config.model)
    cfg = teacher.config
    rows = resolve_rows(config, cfg.head_dim)
    for r in rows:
        if r.matched:
            hyb = 2 * cfg.head_dim * config.matched_window + config.n_features * (
                cfg.head_dim + 2)
            log(f"memory-matched StreamingLLM: window {r.window} (sinks {r.sinks}): "
                f"{2 * cfg.head_dim * r.window} floats per layer and KV head vs the hybrid "
                f"W={config.matched_window} S={config.matched_sinks} M={config.n_features}'s "
                f"{hyb} (+ {2 * cfg.head_dim * r.sinks} of sinks in both)")
    _check_lengths(rows, config, cfg.max_positions)
    texts, source_text = long_texts("test", config.data_dir)
    source = "sample" if source_text.startswith("sample:") else "test"
    tok = _CachedTokenizer(tokenizer)
    cache: dict[Any, Any] = {}

    def docs(length):
        if length not in cache:
            cache[length] = _documents(tok, texts, length, config.limit_docs)
        return cache[length]

    def passages():
        if "repeat" not in cache:
            n = min(config.repeat_docs, config.limit_docs or config.repeat_docs)
            cache["repeat"] = [d[2] for d in _documents(tok, texts, config.repeat_length, n)]
        return cache["repeat"]

    with _Progress(progress) as prog:
        for row in rows:
            fixed = row.source == "fixed"
            base = {"row": row.name, "seed": config.seed if fixed else None,
                    "n_features": config.n_features if fixed else None}
            pending, notes = [], []
            for task, length, i, depth, src, payload in _units(config, docs, passages,
                                                               source):
                rec = {**base, "task": task, "length": length, "doc": i, "depth": depth,
                       "source": src}
                span = 2 * length if task == "repeat" else length
                if row.kind == "teacher" and span > cfg.max_positions:  # noted once
                    skip = {**rec, "doc": None, "depth": None, "attention": row.attention(),
                            "skipped": f"{span} tokens exceed the teacher's "
                                       f"{cfg.max_positions} positions"}
                    if unit_key(skip) not in done and skip not in notes:
                        notes.append(skip)
                elif unit_key(rec) not in done:
                    pending.append((rec, payload))
            for skip in notes:
                append_jsonl(results, skip)
                done.add(unit_key(skip))
                log(f"note: {row.name} {skip['task']} at {skip['length']} skipped: "
                    f"{skip['skipped']}")
            if not pending:
                prog.line(f"{row.name}: every unit done")
                continue
            model, row = build_row(row, teacher, config.seed)
            attention = row.attention()
            prog.line(f"{row.name}: {len(pending)} units to run")
            for rec, payload in pending:
                what = f"{row.name} {rec['task']} L={rec['length']} #{rec['doc']}"
                prog.stage = what

                def tick(k, n, what=what):
                    prog.stage = f"{what} ({k}/{n} tokens)"

                t0 = time.perf_counter()
                res, shown = _run_unit(m, model, tokenizer, config, rec, payload, tick)
                record = {**rec, **res, "attention": attention,
                          "seconds": round(time.perf_counter() - t0, 3)}
                append_jsonl(results, record)
                done.add(unit_key(record))
                prog.line(f"{what}: {shown} ({record['seconds']:.1f} s)")
            model = None  # a converted copy is freed before the next row's
    return results

"""The ablation study (issue 24): one resumable plan of runs over arenas, one record per run.

An *arena* is a module named in :data:`ARENAS` (imported only when used) that exposes

* ``ARENA``: its name;
* ``plan(quick, seeds, features) -> list[dict]``: run specs, each with at least ``arena``,
  ``setting``, ``variant`` (one of :data:`VARIANTS`), ``params`` (dict), ``M``, ``seed``;
* ``run(spec) -> dict``: the record (the spec's keys plus ``metric``, ``score`` (held out,
  higher is better), ``diagnostics``, ``energy_trace``, ``time_s`` and any extra fields).
  ``run`` may take the keyword arguments ``run_dir`` (a folder of its own under
  ``<out>/runs/`` for checkpoints) and ``data_dir`` (the datasets' folder); it gets those it
  names.
* optionally ``cache_group(spec) -> str``: runs of one group share a cache the first of them
  fills (MQAR: the softmax teacher of a level and seed). With ``jobs > 1`` the first run of
  every group runs before the others of its group start, so no cache is filled twice.

:func:`run_study` builds the plan (:func:`make_plan`) and runs it into ``<out>/records.jsonl``:
the runs whose key (:func:`run_key`: arena, setting, variant, sorted params, M, seed) is
already there are skipped, the others run in plan order and each record is appended (one
fsync'd line, :func:`coulomb_attention.results.append_jsonl`) as soon as it is done, so an
interrupted study resumes where it stopped. ``jobs = N > 1`` runs N worker processes (each
with ``threads`` torch threads); the parent alone writes the records (in the order the runs
finish; every run seeds itself, so a record does not depend on the order or on ``jobs``).
The report is :mod:`coulomb_attention.reports.ablation`, from the records only.
"""

from __future__ import annotations

import importlib
import inspect
import multiprocessing
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ..reports.ablation import SPEC_KEYS, VARIANTS, record_key  # the contract, one home
from ..results import append_jsonl, read_jsonl

__all__ = [
    "ARENAS",
    "DEFAULT_FEATURES",
    "DEFAULT_SEEDS",
    "QUICK_SEEDS",
    "RECORD_KEYS",
    "SPEC_KEYS",
    "VARIANTS",
    "check_variants",
    "load_arena",
    "make_plan",
    "run_key",
    "run_plan",
    "run_study",
]

#: arena name -> module (imported lazily: an arena's dependencies load only when it runs)
ARENAS: dict[str, str] = {
    "synthetic": "coulomb_attention.studies.ablation_synthetic",
    "mqar": "coulomb_attention.studies.ablation_mqar",
    "convert": "coulomb_attention.studies.ablation_convert",
}

RECORD_KEYS = ("metric", "score", "diagnostics", "energy_trace", "time_s")
DEFAULT_SEEDS = (0, 1, 2, 3, 4)
QUICK_SEEDS = (0, 1)
DEFAULT_FEATURES = (8, 16, 32, 64, 128)


def _valid(kind: str, name: str, valid: Sequence[str]) -> ValueError:
    return ValueError(f"unknown {kind} {name!r}; valid: {', '.join(valid)}")


def load_arena(name: str) -> ModuleType:
    """The arena module of ``name`` (``ValueError`` listing the valid names if unknown)."""
    if name not in ARENAS:
        raise _valid("arena", name, list(ARENAS))
    mod = importlib.import_module(ARENAS[name])
    for attr in ("ARENA", "plan", "run"):
        if not hasattr(mod, attr):
            raise TypeError(f"arena module {ARENAS[name]} lacks {attr!r}")
    if mod.ARENA != name:
        raise ValueError(f"arena module {ARENAS[name]} says ARENA={mod.ARENA!r}, not {name!r}")
    return mod


def check_variants(variants: Sequence[str] | None) -> list[str] | None:
    """``variants`` as a list, each one of :data:`VARIANTS` (else ``ValueError``)."""
    if variants is None:
        return None
    for v in variants:
        if v not in VARIANTS:
            raise _valid("variant", v, VARIANTS)
    return list(variants)


def run_key(spec: dict[str, Any]) -> str:
    """The run's key: ``(arena, setting, variant, sorted params, M, seed)`` as one JSON string
    (a record carries its spec's keys, so a record and its spec have the same key)."""
    missing = [k for k in SPEC_KEYS if k not in spec]
    if missing:
        raise ValueError(f"run spec lacks {', '.join(missing)}: {spec!r}")
    if not isinstance(spec["params"], dict):
        raise ValueError(f"params must be a dict, got {spec['params']!r}")
    return record_key(spec)


def make_plan(arenas: Sequence[str], *, quick: bool = False, seeds: Sequence[int] | None = None,
              features: Sequence[int] | None = None,
              variants: Sequence[str] | None = None,
              settings: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Every arena's plan, in order, restricted to ``variants`` (default: all) and to the
    runs whose setting starts with one of ``settings`` (e.g. ``easy``, ``easy/favor``,
    ``fit64``; default: all).

    ``seeds`` default to :data:`QUICK_SEEDS` with ``quick`` and :data:`DEFAULT_SEEDS`
    otherwise; ``features`` ``None`` lets each arena choose its own feature counts.
    """
    if not arenas:
        raise ValueError(f"no arena given; valid: {', '.join(ARENAS)}")
    for a in arenas:
        if a not in ARENAS:
            raise _valid("arena", a, list(ARENAS))
    wanted = check_variants(variants)
    seeds = list(QUICK_SEEDS if quick else DEFAULT_SEEDS) if seeds is None else list(seeds)
    feats = None if features is None else [int(m) for m in features]
    plan, seen = [], set()
    for name in dict.fromkeys(arenas):
        for spec in load_arena(name).plan(quick, seeds, feats):
            key = run_key(spec)
            if spec["arena"] != name:
                raise ValueError(f"arena {name!r} planned a run of arena {spec['arena']!r}")
            if spec["variant"] not in VARIANTS:
                raise _valid("variant", spec["variant"], VARIANTS)
            if wanted is not None and spec["variant"] not in wanted:
                continue
            if settings is not None and not any(str(spec["setting"]).startswith(p)
                                                for p in settings):
                continue
            if key in seen:
                raise ValueError(f"arena {name!r} planned the same run twice: {key}")
            seen.add(key)
            plan.append(spec)
    if settings is not None and not plan:
        raise ValueError(f"no planned run has a setting starting with {', '.join(settings)}")
    return plan


def _slug(spec: dict[str, Any]) -> str:
    params = "".join(f"-{k}{v}" for k, v in sorted(spec["params"].items()))
    name = f"{spec['variant']}{params}-M{int(spec['M'])}-s{int(spec['seed'])}"
    return "/".join(re.sub(r"[^A-Za-z0-9_.+=-]", "_", s)
                    for s in (str(spec["arena"]), str(spec["setting"]), name))


def _check_record(record: Any, spec: dict[str, Any]) -> None:
    if not isinstance(record, dict):
        raise TypeError(f"an arena's run must return a dict, got {type(record).__name__}")
    missing = [k for k in (*SPEC_KEYS, *RECORD_KEYS) if k not in record]
    if missing:
        raise ValueError(f"record of {run_key(spec)} lacks {', '.join(missing)}")
    if run_key(record) != run_key(spec):
        raise ValueError(f"record key {run_key(record)} differs from its spec's {run_key(spec)}")


def _call(spec: dict[str, Any], out: str, data_dir: str | Path | None) -> dict[str, Any]:
    """One run of ``spec`` (in this process or a worker's)."""
    mod = load_arena(spec["arena"])
    accepted = inspect.signature(mod.run).parameters
    extra = {k: v for k, v in (("run_dir", str(Path(out) / "runs" / _slug(spec))),
                               ("data_dir", data_dir)) if k in accepted}
    record = mod.run(dict(spec), **extra)
    _check_record(record, spec)
    return record


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(max(1, int(threads)))


def _waves(todo: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``todo`` in two waves: the first run of every cache group (:func:`load_arena`'s
    optional ``cache_group``), then the rest; one wave when no arena groups its runs."""
    first, rest, seen = [], [], set()
    for spec in todo:
        group = getattr(load_arena(spec["arena"]), "cache_group", None)
        key = None if group is None else (spec["arena"], group(spec))
        if key is not None and key not in seen:
            seen.add(key)
            first.append(spec)
        else:
            rest.append(spec)
    return [w for w in (first, rest) if w] if first else [rest]


def run_plan(plan: Sequence[dict[str, Any]], out: str | Path, *,
             data_dir: str | Path | None = None, jobs: int = 1, threads: int = 1,
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the specs of ``plan`` whose key is not yet in ``out/records.jsonl``, appending each
    record when it is done (``jobs`` worker processes of ``threads`` torch threads each when
    ``jobs > 1``). Returns ``{"ran", "skipped", "records"}`` (counts, the file)."""
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
    out = Path(out)
    path = out / "records.jsonl"
    done = {run_key(r) for r in read_jsonl(path, repair=True)
            if all(k in r for k in SPEC_KEYS)}
    todo = [s for s in plan if run_key(s) not in done]
    skipped = len(plan) - len(todo)
    ran = 0

    def finished(spec: dict[str, Any], record: dict[str, Any]) -> None:
        nonlocal ran
        append_jsonl(path, record)
        ran += 1
        log(f"[ablation {ran}/{len(todo)}] {_slug(spec)}: {record['metric']} "
            f"{record['score']:.4f}, {record['time_s']:.1f} s")

    if jobs == 1:
        for spec in todo:
            log(f"[ablation {ran + 1}/{len(todo)}] {_slug(spec)}")
            finished(spec, _call(spec, str(out), data_dir))
        return {"ran": ran, "skipped": skipped, "records": str(path)}
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_init_worker,
                             initargs=(threads,)) as pool:
        for wave in _waves(todo):
            pending = {pool.submit(_call, spec, str(out), data_dir): spec for spec in wave}
            while pending:
                ready, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in ready:
                    finished(pending.pop(fut), fut.result())
    return {"ran": ran, "skipped": skipped, "records": str(path)}


def run_study(arenas: Sequence[str], out: str | Path, *, quick: bool = False,
              seeds: Sequence[int] | None = None, features: Sequence[int] | None = None,
              variants: Sequence[str] | None = None, data_dir: str | Path | None = None,
              settings: Sequence[str] | None = None, jobs: int = 1, threads: int = 1,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """:func:`make_plan` then :func:`run_plan` into ``out``; returns the counts and the plan
    size (``planned``)."""
    plan = make_plan(arenas, quick=quick, seeds=seeds, features=features, variants=variants,
                     settings=settings)
    return {"planned": len(plan), **run_plan(plan, out, data_dir=data_dir, jobs=jobs,
                                             threads=threads, log=log)}

"""Frozen dataclass configs: build from dicts (unknown keys raise), dump to dicts."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["deep_merge", "from_dict", "to_dict", "override", "load_overrides"]


def from_dict(cls: type[T], data: dict[str, Any] | None) -> T:
    """Build dataclass ``cls`` from ``data``; nested dataclass fields are built recursively.

    Raises ``ValueError`` naming unknown keys.
    """
    data = dict(data or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(
            f"unknown key(s) for {cls.__name__}: {', '.join(unknown)}; "
            f"valid: {', '.join(sorted(fields))}"
        )
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        hint = hints.get(key)
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = from_dict(hint, value)
        kwargs[key] = value
    return cls(**kwargs)


def to_dict(obj) -> dict[str, Any]:
    """A JSON-friendly dict of a (nested) dataclass."""
    return dataclasses.asdict(obj)


def override(obj: T, changes: dict[str, Any] | None) -> T:
    """Return a copy of dataclass ``obj`` with ``changes`` applied (unknown keys raise)."""
    merged = to_dict(obj)
    for key, value in (changes or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return from_dict(type(obj), merged)


def load_overrides(path: str | Path) -> dict[str, Any]:
    """Read a JSON object of config overrides from ``path`` (a ``--config`` file).

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` naming the file for
    invalid JSON or a JSON value that is not an object.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"config file not found: {p}")
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"config file {p} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"config file {p} must hold a JSON object")
    return data


def deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` laid over it, nested dicts merged key by key (a new dict;
    neither argument is modified). How config files, presets and flags are combined."""
    out = dict(base)
    for k, v in changes.items():
        out[k] = deep_merge(out[k] if isinstance(out.get(k), dict) else {}, v) \
            if isinstance(v, dict) else v
    return out

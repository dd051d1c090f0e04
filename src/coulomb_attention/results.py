"""Result files, written one way: atomic JSON/text, fsync'd JSON-lines, and ``is_done``.

* :func:`atomic_write_text` / :func:`atomic_write_json`: temporary file in the same directory,
  fsync, ``os.replace``; a crash leaves the old file or the new one, never half of one. The
  file gets the mode a plain ``open`` would give it (``0o666`` minus the umask), not the
  private ``0o600`` of the temporary file (:func:`apply_umask`), so others on a shared file
  system can read results as the umask allows.
  ``exclusive=True`` never replaces an existing file (first writer wins).
* :func:`save_tensors`: a safetensors file, written the same way (temporary file, umask mode,
  rename); never pickle, so loading it back runs no code.
* :func:`append_jsonl`: one line per call with a single ``write`` + fsync (no half lines);
  :func:`read_jsonl` skips (and with ``repair`` cuts) a truncated last line.
* :func:`is_done`: a run directory is done when its ``metrics.json`` exists *and* was written
  by the same configuration; a changed configuration is reported, never silently reused.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "ConfigMismatchError",
    "append_jsonl",
    "apply_umask",
    "atomic_write_json",
    "atomic_write_text",
    "config_diff",
    "current_umask",
    "is_done",
    "read_jsonl",
    "run_key",
    "save_tensors",
]


class ConfigMismatchError(ValueError):
    """A run directory holds results of another configuration."""


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux
    ``/proc/self/status``); elsewhere set and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(path: str | os.PathLike, directory: bool | None = None) -> None:
    """Give ``path`` the mode a plain ``open``/``mkdir`` would: ``0o666`` (files) or ``0o777``
    (directories) minus the umask. For files and folders made by ``tempfile`` (always private,
    0o600 / 0o700) before they are renamed into place."""
    if directory is None:
        directory = os.path.isdir(path)
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


def atomic_write_text(path: str | os.PathLike, text: str, exclusive: bool = False) -> bool:
    """Write ``text`` to ``path`` atomically; returns False only when ``exclusive`` and the
    file already existed (then nothing is written)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        apply_umask(tmp, directory=False)
        if not exclusive:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)  # atomic, and fails if path exists
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links
            if path.exists():
                return False
            os.replace(tmp, path)
        return True
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_tensors(path: str | os.PathLike, tensors: dict, metadata: dict | None = None) -> None:
    """Write ``{name: tensor}`` as a safetensors file atomically, with the umask's mode
    (safetensors itself creates files 0o600)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp),
                  metadata=metadata)
        apply_umask(tmp, directory=False)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _check_finite_json(obj: Any, where: str = "") -> None:
    if isinstance(obj, float) and not math.isfinite(obj):
        raise FloatingPointError(f"refusing to write a non-finite value at {where or 'top'}: {obj}")
    if isinstance(obj, dict):
        for k, v in obj.items():
            _check_finite_json(v, f"{where}.{k}" if where else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _check_finite_json(v, f"{where}[{i}]")


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON; NaN/inf raise ``FloatingPointError``."""
    _check_finite_json(obj)
    atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def append_jsonl(path: str | os.PathLike, row: dict) -> None:
    """Append one JSON line with a single write, flushed and fsync'ed (no half lines)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(row, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_jsonl(path: str | os.PathLike, repair: bool = False) -> list[dict]:
    """Rows of a JSON-lines file ([] if absent). A truncated last line (an interrupted write)
    is skipped and, with ``repair=True``, cut from the file so later appends start clean."""
    path = Path(path)
    if not path.exists():
        return []
    raw = path.read_bytes()
    complete = raw[: raw.rfind(b"\n") + 1]
    if len(complete) < len(raw):
        print(f"warning: ignoring a truncated last line in {path}", file=sys.stderr)
        if repair:
            with open(path, "r+b") as fh:
                fh.truncate(len(complete))
    rows = []
    for line in complete.split(b"\n"):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                print(f"warning: skipping a malformed line in {path}", file=sys.stderr)
    return rows


def run_key(record: dict, fields: tuple[str, ...] | None = None) -> str:
    """A run's resume key: its identifying ``fields`` of ``record`` (all of them when None) as
    one JSON string with sorted keys (``json.dumps(..., sort_keys=True)``, default separators).

    The one key scheme of the studies' result files (the ablation's records, the recall grid,
    the synthetic study's config hash): a record and the spec or config it ran carry the same
    key. Keys already written to result files rely on this exact string: do not change it.
    """
    key = dict(record) if fields is None else {k: record[k] for k in fields}
    return json.dumps(key, sort_keys=True)


def config_diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys where two (nested) JSON-like configs differ, sorted."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            key = f"{prefix}.{k}" if prefix else str(k)
            if k not in a or k not in b:
                out.append(key)
            else:
                out.extend(config_diff(a[k], b[k], key))
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return [] if list(a) == list(b) else [prefix or "(top)"]
    return [] if a == b else [prefix or "(top)"]


def is_done(run_dir: str | os.PathLike, config: dict, *, on_mismatch: str = "raise",
            ignore: tuple[str, ...] = (), normalize=None) -> bool:
    """Whether ``run_dir/metrics.json`` holds the finished run of ``config``.

    Parameters
    ----------
    run_dir : the run's directory
    config : the resolved configuration (a JSON-like dict) the run would use
    on_mismatch : ``"raise"`` (default): a finished run of another configuration raises
        :class:`ConfigMismatchError` naming the differing keys; ``"rerun"``: returns False
        (the caller re-runs into the directory)
    ignore : top-level or dotted keys left out of the comparison (e.g. sizes filled in from
        the data at run time)
    normalize : optional ``dict -> dict`` applied to both configs before comparing (e.g.
        dropping keys added later at their old default)
    """
    if on_mismatch not in ("raise", "rerun"):
        raise ValueError(f"on_mismatch must be 'raise' or 'rerun', got {on_mismatch!r}")
    path = Path(run_dir) / "metrics.json"
    if not path.is_file():
        return False
    try:
        stored = json.loads(path.read_text(encoding="utf-8")).get("config")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise ValueError(f"{path}: unreadable metrics file ({exc}); delete it to re-run") from exc
    want = json.loads(json.dumps(config))
    if normalize is not None:
        want = normalize(want)
        stored = normalize(stored) if isinstance(stored, dict) else stored
    diff = [k for k in config_diff(stored if isinstance(stored, dict) else {}, want)
            if not any(k == i or k.startswith(i + ".") for i in ignore)]
    if not diff:
        return True
    if on_mismatch == "rerun":
        return False
    shown = ", ".join(diff[:8]) + (" ..." if len(diff) > 8 else "")
    raise ConfigMismatchError(f"{run_dir} holds results of another configuration (differs in: "
                              f"{shown}); use another --out, delete it, or pass --rerun")

"""Atomic checkpoints that load without executing code (safetensors + JSON).

Layout of a checkpoint root::

    ROOT/latest.json          {"name": "epoch-002"}   (written last, atomically)
    ROOT/epoch-002/model.safetensors   model state_dict (particles included)
    ROOT/epoch-002/state.safetensors   optimizer moments, RNG states (uint8 tensors)
    ROOT/epoch-002/state.json          epoch, step, config, history, optimizer scalars

Each checkpoint directory is written under a temporary name and renamed into place, then
``latest.json`` is replaced; a crash at any point leaves the previous checkpoint valid.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..results import (
    _check_finite_json,
    apply_umask,
    atomic_write_json,
    atomic_write_text,
    save_tensors,
)

__all__ = [
    "atomic_write_json",
    "atomic_write_text",
    "latest_checkpoint",
    "load_checkpoint",
    "load_phase_a_partial",
    "load_model_file",
    "optimizer_from_flat",
    "optimizer_to_flat",
    "save_checkpoint",
    "save_model_file",
    "save_phase_a_partial",
]

LATEST = "latest.json"


def _contiguous(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # Tied weights (q_proj is k_proj) share storage; safetensors refuses shared tensors.
    return {k: v.detach().cpu().contiguous().clone() for k, v in state.items()}


def save_model_file(path: str | os.PathLike, model: torch.nn.Module) -> None:
    """Save ``model.state_dict()`` (buffers included) to a safetensors file, atomically."""
    save_tensors(path, _contiguous(model.state_dict()))


def load_model_file(path: str | os.PathLike, model: torch.nn.Module) -> None:
    """Load a safetensors state dict into ``model`` (strict: missing/unexpected keys raise)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {path}")
    state = _load_safetensors(path)
    model.load_state_dict(state, strict=True)


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """``load_file`` with a ``ValueError`` naming the file for a corrupt/foreign file."""
    try:
        return load_file(str(path))
    except SafetensorError as exc:
        raise ValueError(f"{path}: not a valid safetensors file ({exc}); the checkpoint is "
                         "corrupt or was not written by coulomb-attention") from exc


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); the checkpoint is corrupt") from exc


def optimizer_to_flat(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split an optimizer state dict into tensors (``"{param}.{key}"``) and JSON scalars."""
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for pid, st in sd["state"].items():
        for key, value in st.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{pid}.{key}"] = value.detach().cpu().contiguous().clone()
            else:
                scalars[f"{pid}.{key}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def optimizer_from_flat(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                        meta: dict) -> None:
    """Inverse of :func:`optimizer_to_flat`."""
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if not name.startswith("optim."):
            continue
        _, pid, key = name.split(".", 2)
        state.setdefault(int(pid), {})[key] = value
    for name, value in meta["scalars"].items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def save_checkpoint(
    root: str | os.PathLike,
    name: str,
    model: torch.nn.Module,
    meta: dict,
    tensors: dict[str, torch.Tensor] | None = None,
    keep: int = 1,
) -> Path:
    """Write checkpoint ``ROOT/name`` atomically and point ``latest.json`` at it.

    Parameters
    ----------
    root : checkpoint root directory
    name : checkpoint name (e.g. ``epoch-003``)
    model : its ``state_dict`` goes to ``model.safetensors``
    meta : JSON-serialisable state (``state.json``)
    tensors : extra tensors (optimizer moments, RNG states) for ``state.safetensors``
    keep : how many checkpoints to keep (older ``epoch-*`` directories are removed)
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    _check_finite_json(meta)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-{name}-"))
    try:
        apply_umask(tmp, directory=True)  # mkdtemp is private (0o700); honour the umask
        save_model_file(tmp / "model.safetensors", model)
        save_tensors(tmp / "state.safetensors", tensors or {})
        (tmp / "state.json").write_text(json.dumps(meta, indent=2, allow_nan=False) + "\n")
        final = root / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_json(root / LATEST, {"name": name})
    older = sorted(p for p in root.iterdir() if p.is_dir() and p.name != name
                   and not p.name.startswith("."))
    for p in older[: max(len(older) - (keep - 1), 0)]:
        shutil.rmtree(p, ignore_errors=True)
    return final


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The directory named by ``ROOT/latest.json``, or ``None`` when there is none."""
    root = Path(root)
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    entry = _read_json(pointer)
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise ValueError(f"{pointer}: expected {{\"name\": ...}}, got {entry!r}")
    name = entry["name"]
    path = root / name
    if not (path / "state.json").is_file():
        raise FileNotFoundError(f"{pointer} names {name!r} but {path}/state.json is missing")
    return path


def load_checkpoint(path: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(meta, tensors)`` of one checkpoint directory (the model file is loaded separately)."""
    path = Path(path)
    meta = _read_json(path / "state.json")
    tensors = _load_safetensors(path / "state.safetensors")
    return meta, tensors


# ------------------------------------------------------------------ phase A, per layer


def save_phase_a_partial(a_dir: str | os.PathLike, model: torch.nn.Module, next_layer: int,
                         records: list, generator_state: torch.Tensor, time_s: float) -> None:
    """Phase-A checkpoint after a layer: ``a_dir/layer-NNN/`` then the pointer ``partial.json``.

    The pointer is written last (atomically), so a kill at any point leaves either the
    previous complete checkpoint or this one.
    """
    d = Path(a_dir) / f"layer-{next_layer:03d}"
    d.mkdir(parents=True, exist_ok=True)
    save_model_file(d / "model.safetensors", model)
    save_tensors(d / "generator.safetensors", {"generator": generator_state})
    atomic_write_json(Path(a_dir) / "partial.json", {"dir": d.name, "next_layer": next_layer,
                                                     "records": records, "time_s": time_s})


def load_phase_a_partial(a_dir: str | os.PathLike, model: torch.nn.Module) -> dict[str, Any] | None:
    """The last per-layer phase-A checkpoint (model loaded in place), or None."""
    pointer = Path(a_dir) / "partial.json"
    if not pointer.is_file():
        return None
    try:
        meta = json.loads(pointer.read_text())
        d = Path(a_dir) / meta["dir"]
        load_model_file(d / "model.safetensors", model)
        state = load_file(str(d / "generator.safetensors"))["generator"]
    except (json.JSONDecodeError, KeyError, TypeError, SafetensorError) as exc:
        raise ValueError(f"{pointer}: corrupt phase-A checkpoint ({exc})") from exc
    return {"next_layer": int(meta["next_layer"]), "records": meta["records"],
            "generator_state": state, "time_s": float(meta["time_s"])}

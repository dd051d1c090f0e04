"""A conversion directory: the one reader and writer of its layout (torch-free).

``coulomb-attention convert --out OUT`` (:func:`coulomb_attention.convert.convert_encoder`)
leaves::

    OUT/result.json             config, fidelity, probes, times (read by reports, export, train)
    OUT/records.jsonl           per layer and head group: row KL / output MSE before and after
    OUT/checkpoint/             the converted encoder (config.json, model.safetensors, vocab)
    OUT/lowrank/checkpoint/     the low-rank finished row, when ``ConvertConfig.finish`` is set
    OUT/hf/, OUT/lowrank/hf/    the Hugging Face directories (``export-hf``)
    OUT/speed.json              ``convert --speed``
    OUT/state/                  while unfinished: progress.json, omega.safetensors,
                                generator.safetensors (the resume point)

Every other module reaches these files through :class:`Artifact` (``tests/test_architecture.py``
fails on a path join with one of these names elsewhere). The files inside ``checkpoint/`` are
the pretrained family's format (:mod:`coulomb_attention.nn.families`), not this module's.
Tensors are read and written through :func:`coulomb_attention.results.save_tensors` and
``safetensors`` inside the functions that need them, so importing this module needs no torch.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..results import atomic_write_json

__all__ = ["Artifact", "find_results"]

RESULT = "result.json"
RECORDS = "records.jsonl"
CHECKPOINT = "checkpoint"
LOWRANK = "lowrank"
HF = "hf"
STATE = "state"
SPEED = "speed.json"
PROGRESS = "progress.json"
OMEGA = "omega.safetensors"
GENERATOR = "generator.safetensors"
#: a checkpoint directory is complete once its config.json is written (the family's file)
CHECKPOINT_CONFIG = "config.json"


@dataclass(frozen=True)
class Artifact:
    """The files of one conversion directory ``root`` (nothing is read on construction)."""

    root: Path

    def __init__(self, root: str | os.PathLike) -> None:
        object.__setattr__(self, "root", Path(root))

    # ------------------------------------------------------------------ paths
    @property
    def result_path(self) -> Path:
        return self.root / RESULT

    @property
    def records_path(self) -> Path:
        return self.root / RECORDS

    @property
    def checkpoint(self) -> Path:
        """The converted encoder's checkpoint directory (``checkpoint/``)."""
        return self.root / CHECKPOINT

    @property
    def lowrank(self) -> Path:
        """The low-rank finished row's directory (``lowrank/``)."""
        return self.root / LOWRANK

    @property
    def lowrank_checkpoint(self) -> Path:
        return self.lowrank / CHECKPOINT

    @property
    def hf(self) -> Path:
        return self.root / HF

    @property
    def lowrank_hf(self) -> Path:
        return self.lowrank / HF

    @property
    def speed_path(self) -> Path:
        return self.root / SPEED

    @property
    def state(self) -> Path:
        """The resume point of an unfinished conversion (``state/``)."""
        return self.root / STATE

    @classmethod
    def of_checkpoint(cls, checkpoint: str | os.PathLike, lowrank: bool = False) -> Artifact:
        """The conversion directory that holds ``checkpoint`` (``OUT/checkpoint`` or, with
        ``lowrank``, ``OUT/lowrank/checkpoint``)."""
        path = Path(checkpoint)
        return cls(path.parent.parent if lowrank else path.parent)

    @staticmethod
    def relative_lowrank_checkpoint() -> str:
        """``lowrank/checkpoint``: how ``result.json["lowrank"]["checkpoint"]`` names it."""
        return f"{LOWRANK}/{CHECKPOINT}"

    # ------------------------------------------------------------------ questions
    def has_result(self) -> bool:
        return self.result_path.is_file()

    def has_checkpoint(self) -> bool:
        """Whether ``checkpoint/`` exists (complete or not)."""
        return self.checkpoint.is_dir()

    def checkpoint_complete(self, lowrank: bool = False) -> bool:
        """Whether ``checkpoint/`` (``lowrank/checkpoint/``) holds its ``config.json``."""
        ckpt = self.lowrank_checkpoint if lowrank else self.checkpoint
        return (ckpt / CHECKPOINT_CONFIG).is_file()

    def has_lowrank(self) -> bool:
        return self.lowrank_checkpoint.is_dir()

    def is_finished(self) -> bool:
        """``result.json`` and a complete ``checkpoint/``: a finished conversion."""
        return self.has_result() and self.checkpoint_complete()

    # ------------------------------------------------------------------ result files
    def read_result(self) -> dict[str, Any]:
        return json.loads(self.result_path.read_text(encoding="utf-8"))

    def write_result(self, result: dict[str, Any]) -> Path:
        atomic_write_json(self.result_path, result)
        return self.result_path

    def read_records(self) -> list[dict[str, Any]]:
        """The rows of ``records.jsonl`` (``[]`` when absent)."""
        if not self.records_path.is_file():
            return []
        return [json.loads(line) for line in
                self.records_path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def write_records(self, records: list[dict[str, Any]]) -> Path:
        with open(self.records_path, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        return self.records_path

    def write_speed(self, rows: list[dict[str, Any]]) -> Path:
        self.speed_path.write_text(json.dumps(rows, indent=2))
        return self.speed_path

    # ------------------------------------------------------------------ resume state
    def save_state(self, tensors: dict[str, Any], generator_state: Any,
                   progress: dict[str, Any]) -> None:
        """Write the resume point: ``tensors`` (name -> tensor), the generator state and
        ``progress`` (JSON; written last, so it names a complete state)."""
        from ..results import save_tensors

        save_tensors(self.state / OMEGA, tensors)
        save_tensors(self.state / GENERATOR, {"state": generator_state})
        atomic_write_json(self.state / PROGRESS, progress)

    def load_state(self) -> tuple[dict[str, Any], dict[str, Any], Any] | None:
        """``(progress, tensors, generator_state)`` of the resume point, or None."""
        if not (self.state / PROGRESS).is_file():
            return None
        from safetensors.torch import load_file

        progress = json.loads((self.state / PROGRESS).read_text())
        tensors = load_file(str(self.state / OMEGA))
        return progress, tensors, load_file(str(self.state / GENERATOR))["state"]

    def clear_state(self) -> None:
        if self.state.is_dir():
            shutil.rmtree(self.state)


def find_results(directory: str | os.PathLike) -> list[Path]:
    """The conversion directories directly under ``directory`` that hold a ``result.json``,
    sorted by name (a grid's runs)."""
    return sorted(p.parent for p in Path(directory).glob(f"*/{RESULT}"))

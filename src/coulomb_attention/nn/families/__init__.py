"""Pretrained model families, one module each (``bert``, ``llama``).

A family module holds its config, its model, ``from_pretrained`` with the key map, its
tokenizer, and the attention sites the conversion reads (nanoGPT's ``model.py``); the
conversion, evaluation and export reach a family only through this package, so a new family is
one module and its tests. :data:`FAMILIES` names each family's module: every public module of
this package is one, found on its path (so a new family registers by existing, and no list is
edited); :func:`get_family` imports it (lazily: a family's optional dependencies load only when
it is used).

The family interface
--------------------
A family module defines, at module level (:class:`Family` states it as a Protocol)::

    NAME                                   the family's key in FAMILIES
    from_pretrained(path, ...) -> model    a checkpoint directory (the family's own format,
                                           a converted one included) -> the model
    load(source, ...) -> model             from_pretrained, or a packaged model by name
                                           (bert: "minilm")
    load_tokenizer(path) -> tokenizer      the checkpoint's tokenizer
    save_pretrained(model, directory, ...) write a checkpoint from_pretrained reads back
                                           (the particles with it): what export builds on
    attention_sites(model) -> [layers]     the attention layers a conversion rewrites, in order
    teacher_rows(layer, hidden, mask)      the softmax teacher's attention rows (B, H, T, T)
                                           of one site on its input (B, T, D)
    fidelity_output(model, ids, mask)      what fidelity compares between teacher and student
                                           (bert: the pooled, L2-normalised sentence embedding)

``bert`` (:mod:`.bert`) implements it; ``llama`` (:mod:`.llama`) follows it.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Any, Protocol

from ..._validation import check_choice

__all__ = ["FAMILIES", "Family", "get_family"]


def _modules(path: list[str]) -> dict[str, str]:
    """``{name: name}`` of the public modules (not ``_private``, not packages) on ``path``,
    sorted, found without importing them."""
    return {m.name: m.name for m in sorted(pkgutil.iter_modules(path), key=lambda m: m.name)
            if not m.name.startswith("_") and not m.ispkg}


#: Family name -> its module under this package: every public module here, its ``NAME`` that
#: name (tests/nn/families/test_families.py checks each against :class:`Family`).
FAMILIES: dict[str, str] = _modules(__path__)


class Family(Protocol):
    """The interface a family module offers (see the module docstring)."""

    NAME: str

    def from_pretrained(self, path: Any, *args: Any, **kwargs: Any) -> Any: ...
    def load(self, source: Any, *args: Any, **kwargs: Any) -> Any: ...
    def load_tokenizer(self, path: Any) -> Any: ...
    def save_pretrained(self, model: Any, directory: Any, *args: Any, **kwargs: Any) -> Any: ...
    def attention_sites(self, model: Any) -> list[Any]: ...
    def teacher_rows(self, layer: Any, hidden: Any, attention_mask: Any = None) -> Any: ...
    def fidelity_output(self, model: Any, input_ids: Any, attention_mask: Any = None) -> Any: ...


def get_family(name: str) -> ModuleType:
    """The module of family ``name`` (one of :data:`FAMILIES`; unknown names raise
    ``ValueError`` listing the valid ones)."""
    check_choice("family", name, FAMILIES)
    return importlib.import_module(f"{__name__}.{FAMILIES[name]}")

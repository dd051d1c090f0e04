"""Pretrained model families, one module each (``bert``, ``llama``).

A family module holds its config, its model, ``from_pretrained`` with the key map, its
tokenizer, and the attention sites the conversion reads (nanoGPT's ``model.py``); the
conversion, evaluation and export reach a family only through this package, so a new family is
one module and its tests. :data:`FAMILIES` names each family's module; :func:`get_family`
imports it (lazily: a family's optional dependencies load only when it is used).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..._validation import check_choice

__all__ = ["FAMILIES", "get_family"]

#: Family name -> its module under this package.
FAMILIES: dict[str, str] = {
    "llama": "llama",
}


def get_family(name: str) -> ModuleType:
    """The module of family ``name`` (one of :data:`FAMILIES`; unknown names raise
    ``ValueError`` listing the valid ones)."""
    check_choice("family", name, FAMILIES)
    return importlib.import_module(f"{__name__}.{FAMILIES[name]}")

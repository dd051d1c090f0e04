"""Datasets, loaders, tokenizer and test-time corruption.

- :data:`DATASETS` / :class:`TaskSpec`: the registry (``sst2``, ``qqp``, ``rotten_tomatoes``;
  AdvGLUE sets as the split ``"advglue"`` of sst2 and qqp).
- :func:`load_task`: ``<data_dir>/<task>/<split>.jsonl.gz`` (or ``.jsonl``, ``.tsv``,
  ``.parquet``) -> :class:`TextExamples`; :func:`resolve_data_dir` picks the directory
  (argument, ``$COULOMB_DATA_DIR``, else the shipped samples; ``"hf"`` = the hub).
- :func:`build_tokenizer` / :class:`Tokenizer`: WordPiece (HF ``tokenizers``), cached as JSON.
- :func:`corrupt_tokens`: deletion / ``[UNK]`` substitution / adjacent swaps.
- :func:`pseudo_documents`: held-out texts concatenated to a fixed token length;
  :func:`long_texts` / :func:`token_documents`: long works (Shakespeare) cut into token
  windows for causal language models.
- :mod:`.synthetic`: synthetic classification tasks (numpy only); :mod:`.mqar`: associative
  recall sequences.

The names below are loaded on first use (PEP 562), so that importing a light submodule such as
:mod:`coulomb_attention.data.synthetic` does not import torch or tokenizers.
"""

from __future__ import annotations

import importlib

_HOME = {
    "CORRUPTIONS": "corruption", "corrupt_tokens": "corruption",
    "document_texts": "documents", "pseudo_documents": "documents",
    "LONG_TEXTS": "documents", "long_texts": "documents", "token_documents": "documents",
    "EXTENSIONS": "loaders", "TextExamples": "loaders", "find_split_file": "loaders",
    "load_task": "loaders", "read_rows": "loaders",
    "ADVERSARIAL_SPLIT": "registry", "DATA_DIR_ENV": "registry", "DATASETS": "registry",
    "HF": "registry", "SAMPLE_ORIGINS": "registry", "SAMPLES_DIR": "registry",
    "TaskSpec": "registry", "get_task": "registry", "resolve_data_dir": "registry",
    "DATA_SOURCES": "registry", "SAMPLE_WARNING": "registry", "data_source": "registry",
    "SPECIAL_TOKENS": "tokenizer", "Tokenizer": "tokenizer", "build_tokenizer": "tokenizer",
    "texts_fingerprint": "tokenizer",
}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name in _HOME:
        value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))

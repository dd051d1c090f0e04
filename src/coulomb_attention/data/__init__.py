"""Datasets, loaders, tokenizer and test-time corruption.

- :data:`DATASETS` / :class:`TaskSpec`: the registry (``sst2``, ``qqp``, ``rotten_tomatoes``;
  AdvGLUE sets as the split ``"advglue"`` of sst2 and qqp).
- :func:`load_task`: ``<data_dir>/<task>/<split>.jsonl.gz`` (or ``.jsonl``, ``.tsv``,
  ``.parquet``) -> :class:`TextExamples`; :func:`resolve_data_dir` picks the directory
  (argument, ``$COULOMB_DATA_DIR``, else the shipped samples; ``"hf"`` = the hub).
- :func:`build_tokenizer` / :class:`Tokenizer`: WordPiece (HF ``tokenizers``), cached as JSON.
- :func:`corrupt_tokens`: deletion / ``[UNK]`` substitution / adjacent swaps.
"""

from .corruption import CORRUPTIONS, corrupt_tokens
from .loaders import EXTENSIONS, TextExamples, find_split_file, load_task, read_rows
from .registry import (
    ADVERSARIAL_SPLIT,
    DATA_DIR_ENV,
    DATASETS,
    HF,
    SAMPLE_ORIGINS,
    SAMPLES_DIR,
    TaskSpec,
    get_task,
    resolve_data_dir,
)
from .tokenizer import SPECIAL_TOKENS, Tokenizer, build_tokenizer, texts_fingerprint

__all__ = [
    "ADVERSARIAL_SPLIT",
    "CORRUPTIONS",
    "DATASETS",
    "DATA_DIR_ENV",
    "EXTENSIONS",
    "HF",
    "SAMPLES_DIR",
    "SAMPLE_ORIGINS",
    "SPECIAL_TOKENS",
    "TaskSpec",
    "TextExamples",
    "Tokenizer",
    "build_tokenizer",
    "corrupt_tokens",
    "find_split_file",
    "get_task",
    "load_task",
    "read_rows",
    "resolve_data_dir",
    "texts_fingerprint",
]

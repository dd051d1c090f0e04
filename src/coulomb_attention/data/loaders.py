"""Read a task split into :class:`TextExamples`, with errors that name the file and line.

Files are ``<data_dir>/<task>/<split>.<ext>`` with ``ext`` one of ``.jsonl.gz``, ``.jsonl``,
``.tsv`` (header row, tab separated, no quoting, as GLUE) or ``.parquet`` (needs pyarrow or
pandas). AdvGLUE sets are the split ``"advglue"`` and live at ``<data_dir>/advglue/<task>.<ext>``.
``data_dir="hf"`` reads from the Hugging Face hub (needs the ``datasets`` package).
"""

from __future__ import annotations

import csv
import gzip
import json
import numbers
import os
import pathlib
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from .registry import (
    ADVERSARIAL_SPLIT,
    HF,
    SAMPLE_ORIGINS,
    SAMPLES_DIR,
    TaskSpec,
    get_task,
    resolve_data_dir,
)

__all__ = ["EXTENSIONS", "TextExamples", "find_split_file", "load_task", "read_rows"]

#: File formats tried for a split, in this order.
EXTENSIONS = (".jsonl.gz", ".jsonl", ".tsv", ".parquet")
# Raw GLUE files call the validation split "dev" (dev.tsv); tried right after "validation".
_SPLIT_ALIASES = {"validation": ("dev",)}
_INT_RE = re.compile(r"^[+-]?\d+$")


@dataclass
class TextExamples:
    """A labelled split of a text classification task.

    Attributes
    ----------
    texts : list of tuple of str
        One tuple per example, with 1 (single sentence) or 2 (pair) strings.
    labels : np.ndarray, shape (n,), int64
    source : str
        The file path read, or ``"hf:<path>:<split>"`` for the hub.
    split : str
        The split actually read, e.g. ``"validation_half"`` when the full QQP validation file
        is absent; ``"advglue"`` for the adversarial set.
    task : str
    is_sample : bool
        True when the rows come from the small samples shipped with the package.
    description : str
        One line naming task, split, file and any subsampling, for reports.
    """

    texts: list[tuple[str, ...]]
    labels: np.ndarray
    source: str
    split: str
    task: str = ""
    is_sample: bool = False
    description: str = ""
    indices: np.ndarray | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.texts)

    def class_counts(self, num_labels: int | None = None) -> np.ndarray:
        """Number of examples per label, shape (num_labels,)."""
        n = num_labels if num_labels is not None else int(self.labels.max(initial=-1)) + 1
        return np.bincount(self.labels, minlength=n)


# --------------------------------------------------------------------------- file readers


def _read_jsonl(path: pathlib.Path) -> Iterator[tuple[int, dict]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    lineno = 0
    try:
        with opener(path, "rb") as fh:
            for lineno, raw in enumerate(fh, start=1):  # noqa: B007 (used after the loop)
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ValueError(f"{path}, line {lineno}: not valid UTF-8 ({exc})") from exc
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}, line {lineno}: invalid JSON ({exc.msg})") from exc
                if not isinstance(obj, dict):
                    raise ValueError(
                        f"{path}, line {lineno}: expected a JSON object, got {type(obj).__name__}"
                    )
                yield lineno, obj
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ValueError(
            f"{path}: truncated or corrupt gzip file (read {lineno} complete line(s)): {exc}"
        ) from exc


def _read_tsv(path: pathlib.Path) -> Iterator[tuple[int, dict]]:
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:  # -sig: tolerate a BOM
            reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
            header = next(reader, None)
            if header is None:
                raise ValueError(f"{path}: empty file (a .tsv needs a header row)")
            for row in reader:
                lineno = reader.line_num
                if not row or row == [""]:
                    continue
                if len(row) != len(header):
                    raise ValueError(
                        f"{path}, line {lineno}: {len(row)} tab-separated field(s), header has "
                        f"{len(header)} ({', '.join(header)})"
                    )
                yield lineno, dict(zip(header, row, strict=True))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not valid UTF-8 ({exc})") from exc


def _read_parquet(path: pathlib.Path) -> Iterator[tuple[int, dict]]:
    try:
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    except ImportError:
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError(
                f"reading {path} needs pyarrow or pandas; install one: pip install pyarrow"
            ) from exc
        try:
            rows = pd.read_parquet(path).to_dict("records")
        except ImportError as exc:
            raise ImportError(
                f"reading {path} needs a parquet engine; install one: pip install pyarrow"
            ) from exc
    yield from enumerate(rows, start=1)


def read_rows(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, row_dict)`` from a ``.jsonl(.gz)``, ``.tsv`` or ``.parquet`` file.

    Raises
    ------
    ValueError
        Naming the file (and line) for a truncated/corrupt gzip, invalid JSON or UTF-8, or a
        ragged TSV row; ``ImportError`` for parquet without pyarrow/pandas.
    """
    path = pathlib.Path(path)
    name = path.name
    if name.endswith((".jsonl.gz", ".jsonl")):
        return _read_jsonl(path)
    if name.endswith(".tsv"):
        return _read_tsv(path)
    if name.endswith(".parquet"):
        return _read_parquet(path)
    raise ValueError(f"{path}: unsupported file type; supported: {', '.join(EXTENSIONS)}")


# --------------------------------------------------------------------------- row checks


def _parse_label(value, where: str, num_labels: int, from_text: bool) -> int:
    if from_text and isinstance(value, str) and _INT_RE.match(value.strip()):  # TSV cells
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{where}: label must be an integer, got {value!r}")
    value = int(value)
    if not 0 <= value < num_labels:
        raise ValueError(
            f"{where}: label {value} is out of range; valid labels are 0..{num_labels - 1}"
        )
    return value


def _convert(
    rows: Iterator[tuple[int, dict]], spec: TaskSpec, where_prefix: str, from_text: bool = False
) -> tuple[list[tuple[str, ...]], np.ndarray]:
    """Check rows and split them into texts and int64 labels (``from_text``: labels may be
    digit strings, as in a .tsv)."""
    texts: list[tuple[str, ...]] = []
    labels: list[int] = []
    label_names = (spec.label_field, *spec.label_aliases)
    for lineno, row in rows:
        where = f"{where_prefix}, line {lineno}"
        item = []
        for col in spec.text_fields:
            if col not in row:
                raise ValueError(
                    f"{where}: missing column {col!r} (task {spec.name} needs "
                    f"{', '.join(spec.text_fields)} and {spec.label_field}; row has "
                    f"{', '.join(map(str, row))})"
                )
            value = row[col]
            if not isinstance(value, str):
                raise ValueError(
                    f"{where}: column {col!r} must be a string, got {type(value).__name__}"
                )
            item.append(value)
        label_col = next((c for c in label_names if c in row), None)
        if label_col is None:
            raise ValueError(
                f"{where}: missing column {spec.label_field!r} (row has {', '.join(map(str, row))})"
            )
        labels.append(_parse_label(row[label_col], where, spec.num_labels, from_text))
        texts.append(tuple(item))
    if not texts:
        raise ValueError(f"{where_prefix}: no examples")
    return texts, np.asarray(labels, dtype=np.int64)


# --------------------------------------------------------------------------- locating files


def _check_split_name(split) -> str:
    if not isinstance(split, str) or not split.strip():
        raise ValueError(f"split must be a non-empty string, got {split!r}")
    if any(c in split for c in "/\\") or split.startswith("."):
        raise ValueError(f"split must be a plain name (no path), got {split!r}")
    return split


def find_split_file(
    spec: TaskSpec | str, split: str, data_dir: pathlib.Path
) -> tuple[pathlib.Path, str]:
    """Return ``(path, actual_split)`` of the file holding ``split`` of ``spec`` in ``data_dir``.

    Tries the split name (and ``dev`` for ``validation``), then the documented fallback subsets
    (QQP: ``train_10k``, ``validation_half``), each with every extension of :data:`EXTENSIONS`.

    Raises
    ------
    FileNotFoundError
        Naming the folder, the names tried and the files that do exist there.
    """
    spec = get_task(spec)
    split = _check_split_name(split)
    data_dir = pathlib.Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"data directory {str(data_dir)!r} does not exist")
    if split == ADVERSARIAL_SPLIT:
        if not spec.has_adversarial:
            raise ValueError(
                f"task {spec.name!r} has no AdvGLUE set; valid splits: "
                f"{', '.join(spec.valid_splits())}"
            )
        folder, stems = data_dir / ADVERSARIAL_SPLIT, [(spec.name, ADVERSARIAL_SPLIT)]
    else:
        folder, stems = data_dir / spec.name, []
        if not folder.is_dir():
            folder = next(
                (data_dir / a for a in spec.dir_aliases if (data_dir / a).is_dir()), folder
            )
        for cand in spec.candidates(split):
            stems.append((cand, cand))
            stems.extend((alias, cand) for alias in _SPLIT_ALIASES.get(cand, ()))
    tried = []
    for stem, actual in stems:
        for ext in EXTENSIONS:
            path = folder / f"{stem}{ext}"
            tried.append(path.name)
            if path.is_file():
                return path, actual
    if folder.is_dir():
        present = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
        there = f"files in {folder}: {', '.join(present) or '(none)'}"
    else:
        present = sorted(p.name for p in data_dir.iterdir() if not p.name.startswith("."))
        there = (
            f"folder {folder} does not exist; {data_dir} holds: {', '.join(present) or '(none)'}"
        )
    raise FileNotFoundError(
        f"no file for {spec.name} split {split!r} in {folder} (tried {', '.join(tried)}); "
        f"{there}; splits of {spec.name}: {', '.join(spec.valid_splits())}"
    )


# --------------------------------------------------------------------------- public loader


def _load_hf(spec: TaskSpec, split: str) -> tuple[list, np.ndarray, str, str]:
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(
            "data_dir='hf' needs the Hugging Face `datasets` package: pip install datasets "
            "(or pip install 'coulomb-attention[hf]')", name="datasets"
        ) from exc
    if split == ADVERSARIAL_SPLIT:
        if not spec.has_adversarial:
            raise ValueError(
                f"task {spec.name!r} has no AdvGLUE set; valid splits: "
                f"{', '.join(spec.valid_splits())}"
            )
        args, hf_split = spec.hf_adversarial, "validation"
    else:
        if split not in spec.splits:
            hub = (*spec.splits, ADVERSARIAL_SPLIT) if spec.has_adversarial else spec.splits
            raise ValueError(
                f"split {split!r} of {spec.name} is not a labelled split on the hub; "
                f"valid: {', '.join(hub)}"
            )
        args, hf_split = spec.hf_path, split
    source = f"hf:{'/'.join(args)}:{hf_split}"
    try:
        ds = datasets.load_dataset(*args, split=hf_split)
    except Exception as exc:  # network, missing config, ... -> one clear message
        raise FileNotFoundError(
            f"could not load {source} from the Hugging Face hub ({type(exc).__name__}: {exc})"
        ) from exc
    texts, labels = _convert(enumerate(ds, start=1), spec, source)
    return texts, labels, source, split


def load_task(
    task: str | TaskSpec,
    split: str,
    data_dir: str | os.PathLike | None = None,
    limit: int | None = None,
    random_state: int | np.random.Generator | None = 0,
) -> TextExamples:
    """Load one split of a registered task.

    Parameters
    ----------
    task : str or TaskSpec
        A key of :data:`DATASETS` (``sst2``, ``qqp``, ``rotten_tomatoes``).
    split : str
        ``train``, ``validation``, ``test`` (rotten_tomatoes), ``advglue`` (sst2, qqp), or a
        subset name such as ``validation_half``. For QQP, ``train``/``validation`` fall back to
        ``train_10k``/``validation_half`` when the full file is absent; the name actually read
        is in the result's ``split``.
    data_dir : str or path-like, optional
        See :func:`resolve_data_dir`: argument, else ``$COULOMB_DATA_DIR``, else the shipped
        samples; ``"hf"`` loads from the hub.
    limit : int, optional
        Keep a uniformly random subset of this many rows (in file order), drawn with
        ``random_state``. Not the first rows: some files are sorted by label.
    random_state : int or numpy Generator, optional
        Seed of the subset draw (default 0, deterministic).

    Returns
    -------
    TextExamples
        ``texts`` (n tuples of 1 or 2 str), ``labels`` (n,) int64, ``source``, ``split``.

    Raises
    ------
    ValueError
        Unknown task (listing valid tasks); bad split name; truncated gzip, bad JSON line,
        missing column or bad label (naming file and line).
    FileNotFoundError
        When no file exists for the split (naming the path and the files that do exist).
    """
    spec = get_task(task)
    split = _check_split_name(split)
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit < 1:
            raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
    root = resolve_data_dir(data_dir)
    is_sample = False
    if root == HF:
        texts, labels, source, actual = _load_hf(spec, split)
        desc = f"{spec.name}/{actual} from the Hugging Face hub ({source})"
    else:
        path, actual = find_split_file(spec, split, root)
        texts, labels = _convert(read_rows(path), spec, str(path), path.name.endswith(".tsv"))
        source = str(path)
        desc = f"{spec.name}/{actual} from {path}"
        try:
            is_sample = path.resolve().is_relative_to(SAMPLES_DIR)
        except OSError:
            is_sample = False
        if is_sample:
            key = (spec.name, actual) if actual != ADVERSARIAL_SPLIT else ("advglue", spec.name)
            origin = SAMPLE_ORIGINS.get(key, f"{key[0]}/{key[1]}")
            desc = (
                f"{spec.name}/{actual}: SHIPPED SAMPLE of {len(texts)} rows drawn from {origin} "
                f"({path})"
            )
    notes = dict(spec.subset_notes)
    origin_split = actual
    if is_sample and (spec.name, actual) in SAMPLE_ORIGINS:
        origin_split = SAMPLE_ORIGINS[(spec.name, actual)].split("/")[-1]
    if origin_split in notes:
        desc += f" [{notes[origin_split]}]"
    n = len(texts)
    indices = None
    if limit is not None and limit < n:
        rng = np.random.default_rng(random_state)
        indices = np.sort(rng.choice(n, size=int(limit), replace=False))
        texts = [texts[i] for i in indices]
        labels = labels[indices]
        desc += f"; random subset of {len(texts)} of {n} rows (random_state={random_state!r})"
    return TextExamples(
        texts=texts,
        labels=labels,
        source=source,
        split=actual,
        task=spec.name,
        is_sample=is_sample,
        description=desc,
        indices=indices,
    )

"""The dataset registry and the data-directory resolution rule.

A task is described once, as a frozen :class:`TaskSpec` in :data:`DATASETS`; loaders read the
spec and never branch on a task name.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass

__all__ = [
    "ADVERSARIAL_SPLIT",
    "DATASETS",
    "DATA_DIR_ENV",
    "DATA_SOURCES",
    "HF",
    "SAMPLE_WARNING",
    "SAMPLES_DIR",
    "SAMPLE_ORIGINS",
    "TaskSpec",
    "data_source",
    "get_task",
    "resolve_data_dir",
]

#: Environment variable naming the data directory when no argument is given.
DATA_DIR_ENV = "COULOMB_DATA_DIR"
#: The data-directory value meaning "load from the Hugging Face hub".
HF = "hf"
#: The split name of the AdvGLUE adversarial dev set of a task (``<data_dir>/advglue/<task>``).
ADVERSARIAL_SPLIT = "advglue"
#: Small class-balanced samples shipped with the package (see ``samples/README.md``).
SAMPLES_DIR = pathlib.Path(__file__).resolve().parent / "samples"

#: Where each shipped sample file was drawn from, when that is not ``<task>/<split>`` of the
#: full data (QQP: only documented subsets exist on this machine). ``experiments/make_samples.py``
#: reads this table, so the code and the samples cannot disagree.
SAMPLE_ORIGINS: dict[tuple[str, str], str] = {
    ("qqp", "train"): "qqp/train_10k",
    ("qqp", "validation"): "qqp/validation_half",
}


@dataclass(frozen=True)
class TaskSpec:
    """Everything the loaders need to know about one classification task.

    Parameters
    ----------
    name : str
        Registry key and folder name under the data directory.
    text_fields : tuple of str
        Column(s) holding the text: one for single sentences, two for pairs.
    label_field : str
        Integer label column (values ``0 .. num_labels - 1``).
    num_labels : int
    eval_split : str
        Split on which final numbers are reported.
    select_split : str
        Split used for model selection / early stopping.
    hf_path : tuple of str
        ``datasets.load_dataset(*hf_path)`` arguments for ``data_dir="hf"``.
    train_split : str
    splits : tuple of str
        Splits of the full dataset (as on the hub), excluding the adversarial one.
    split_fallbacks : tuple of (str, tuple of str)
        For a split whose full file may be absent, the documented subset files tried next, in
        order. The name actually read is recorded in :attr:`TextExamples.split`.
    label_aliases : tuple of str
        Other names of the label column in raw files (GLUE's QQP ``.tsv`` uses ``is_duplicate``).
    hf_adversarial : tuple of str or None
        ``load_dataset`` arguments of the AdvGLUE set (its split is ``validation``), or None if
        the task has no adversarial set.
    dir_aliases : tuple of str
        Other folder names tried after ``name`` (the GLUE download script's ``SST-2``, ``QQP``),
        so ``data_dir`` can point straight at an unpacked ``glue_data`` folder.
    subset_notes : tuple of (str, str)
        For each documented subset split, how reports must name it (added to
        :attr:`TextExamples.description`).
    """

    name: str
    text_fields: tuple[str, ...]
    label_field: str = "label"
    num_labels: int = 2
    eval_split: str = "validation"
    select_split: str = "validation"
    hf_path: tuple[str, ...] = ()
    train_split: str = "train"
    splits: tuple[str, ...] = ("train", "validation")
    split_fallbacks: tuple[tuple[str, tuple[str, ...]], ...] = ()
    label_aliases: tuple[str, ...] = ()
    hf_adversarial: tuple[str, ...] | None = None
    dir_aliases: tuple[str, ...] = ()
    subset_notes: tuple[tuple[str, str], ...] = ()

    @property
    def is_pair(self) -> bool:
        """True for sentence-pair tasks (two text fields)."""
        return len(self.text_fields) == 2

    @property
    def has_adversarial(self) -> bool:
        """True when an AdvGLUE set exists for the task (split ``"advglue"``)."""
        return self.hf_adversarial is not None

    def candidates(self, split: str) -> tuple[str, ...]:
        """File stems to try for ``split``: the split itself, then its documented fallbacks."""
        fallbacks = dict(self.split_fallbacks).get(split, ())
        return (split, *fallbacks)

    def valid_splits(self) -> tuple[str, ...]:
        """All split names this task knows about (full splits, subsets, adversarial)."""
        names = list(self.splits)
        for _, subs in self.split_fallbacks:
            names.extend(s for s in subs if s not in names)
        if self.has_adversarial:
            names.append(ADVERSARIAL_SPLIT)
        return tuple(names)


DATASETS: dict[str, TaskSpec] = {
    "sst2": TaskSpec(
        name="sst2",
        text_fields=("sentence",),
        eval_split="validation",
        select_split="validation",
        hf_path=("glue", "sst2"),
        splits=("train", "validation"),
        hf_adversarial=("adv_glue", "adv_sst2"),
        dir_aliases=("SST-2",),
    ),
    "qqp": TaskSpec(
        name="qqp",
        text_fields=("question1", "question2"),
        eval_split="validation",
        select_split="validation",
        hf_path=("glue", "qqp"),
        splits=("train", "validation"),
        split_fallbacks=(("train", ("train_10k",)), ("validation", ("validation_half",))),
        label_aliases=("is_duplicate",),
        hf_adversarial=("adv_glue", "adv_qqp"),
        dir_aliases=("QQP",),
        subset_notes=(
            (
                "validation_half",
                "QQP dev, BabyLM-2025 half (20,215 of 40,430 pairs); not a GLUE QQP dev score",
            ),
            ("train_10k", "QQP train, BabyLM-2025 random subset (10,000 of 363,846 pairs)"),
        ),
    ),
    "rotten_tomatoes": TaskSpec(
        name="rotten_tomatoes",
        text_fields=("text",),
        eval_split="test",
        select_split="validation",
        hf_path=("rotten_tomatoes",),
        splits=("train", "validation", "test"),
    ),
}


def get_task(task: str | TaskSpec) -> TaskSpec:
    """Return the :class:`TaskSpec` of ``task``; unknown names raise ``ValueError`` listing
    the valid ones."""
    if isinstance(task, TaskSpec):
        return task
    if not isinstance(task, str) or task not in DATASETS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(sorted(DATASETS))}")
    return DATASETS[task]


def resolve_data_dir(value: str | os.PathLike | None = None) -> pathlib.Path | str:
    """Decide where data is read from.

    Order: ``value`` if given (non-empty), else the environment variable ``COULOMB_DATA_DIR``,
    else the small samples shipped with the package (:data:`SAMPLES_DIR`). The string ``"hf"``
    means the Hugging Face hub and is returned as is.

    Returns
    -------
    pathlib.Path or str
        An existing directory, or ``"hf"``.

    Raises
    ------
    FileNotFoundError
        If the chosen path does not exist; NotADirectoryError if it is a file.
    """
    origin = "argument data_dir"
    if value is None or (isinstance(value, str) and value.strip() == ""):
        env = os.environ.get(DATA_DIR_ENV, "").strip()
        if env:
            value, origin = env, f"environment variable {DATA_DIR_ENV}"
        else:
            return SAMPLES_DIR
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"data_dir must be a path or 'hf', got {type(value).__name__}")
    if isinstance(value, str) and value.strip().lower() == HF:
        return HF
    path = pathlib.Path(value).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"data directory {str(path)!r} (from {origin}) does not exist")
    if not path.is_dir():
        raise NotADirectoryError(f"data directory {str(path)!r} (from {origin}) is not a folder")
    return path


#: Said (at the start and again after the result) by every command that reads task data from
#: the shipped samples because no data directory was given.
SAMPLE_WARNING = ("WARNING: no data directory given (--data-dir or $COULOMB_DATA_DIR): this run "
                  "uses the SHIPPED SAMPLE (a few hundred rows, for smoke tests); its numbers "
                  "are not results. Real data: --data-dir DIR (here ../shared/data) or "
                  "--data-dir hf.")
#: the values of :func:`data_source`'s ``"source"``
DATA_SOURCES = ("samples", "dir", "hf")


def data_source(value: str | os.PathLike | None = None) -> dict[str, str | None]:
    """Where the task data of a run comes from, for its result file:
    ``{"source": "samples" | "dir" | "hf", "path": str or None}`` (:func:`resolve_data_dir`'s
    choice: ``path`` is the directory, None for the hub). A directory inside the shipped
    samples counts as ``"samples"``. Result files written before this field existed lack it;
    readers take its absence as unknown."""
    root = resolve_data_dir(value)
    if root == HF:
        return {"source": "hf", "path": None}
    path = pathlib.Path(root).resolve()
    sample = path == SAMPLES_DIR or path.is_relative_to(SAMPLES_DIR)
    return {"source": "samples" if sample else "dir", "path": str(path)}

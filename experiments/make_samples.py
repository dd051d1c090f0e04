"""Rebuild the small class-balanced samples shipped in ``coulomb_attention/data/samples``.

    .venv/bin/python experiments/make_samples.py --data-dir /work/shared/data

For every (task, split) it reads the full file (QQP: the documented subsets, see
``SAMPLE_ORIGINS``), draws ``--train-per-class`` (train) or ``--eval-per-class`` (other splits)
rows per label without replacement with ``numpy.random.default_rng(seed)``, keeps them in file
order and writes them unchanged (same JSON keys and values) as gzip JSON lines with mtime 0, so
a rebuild gives the same bytes. The AdvGLUE sets are tiny and are copied whole. The long texts
(``shakespeare/``) are the first works of each split, each cut to its first 24,000 characters.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import pathlib

import numpy as np

from coulomb_attention.data import DATASETS, SAMPLE_ORIGINS, SAMPLES_DIR
from coulomb_attention.data.loaders import read_rows

ADVGLUE = ("sst2", "qqp")
#: the long texts' sample (causal language models): the first works of each split, each cut to
#: its first LONG_TEXT_CHARS characters
LONG_TEXT_WORKS = {"train": 2, "validation": 1, "test": 1}
LONG_TEXT_CHARS = 24000


def write_jsonl_gz(path: pathlib.Path, rows: list[dict]) -> int:
    """Write rows as gzip JSON lines (mtime 0, no file name) and return the size in bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        for row in rows:
            gz.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
    path.write_bytes(buf.getvalue())
    return path.stat().st_size


def balanced_sample(rows: list[dict], per_class: int, seed: int) -> list[dict]:
    """``per_class`` rows of each label (all of a smaller class), drawn without replacement,
    returned in file order."""
    rng = np.random.default_rng(seed)
    labels = np.array([int(r["label"]) for r in rows])
    keep = []
    for c in np.unique(labels):
        where = np.flatnonzero(labels == c)
        keep.append(rng.choice(where, size=min(per_class, len(where)), replace=False))
    return [rows[i] for i in np.sort(np.concatenate(keep))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default="/work/shared/data")
    ap.add_argument("--out", default=str(SAMPLES_DIR))
    ap.add_argument("--train-per-class", type=int, default=256)
    ap.add_argument("--eval-per-class", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    src, out = pathlib.Path(args.data_dir), pathlib.Path(args.out)
    total = 0
    lines = []
    for task, spec in DATASETS.items():
        for split in spec.splits:
            origin = SAMPLE_ORIGINS.get((task, split), f"{task}/{split}")
            rows = [r for _, r in read_rows(src / f"{origin}.jsonl.gz")]
            per_class = args.train_per_class if split == spec.train_split else args.eval_per_class
            sample = balanced_sample(rows, per_class, args.seed)
            size = write_jsonl_gz(out / task / f"{split}.jsonl.gz", sample)
            lines.append((f"{task}/{split}", origin, len(rows), sample, size))
    for task in ADVGLUE:
        rows = [r for _, r in read_rows(src / "advglue" / f"{task}.jsonl.gz")]
        size = write_jsonl_gz(out / "advglue" / f"{task}.jsonl.gz", rows)
        lines.append((f"advglue/{task}", f"advglue/{task}", len(rows), rows, size))
    long = 0
    for split, n_works in LONG_TEXT_WORKS.items():  # the long texts: prefixes of a few works
        rows = [r for _, r in read_rows(src / "shakespeare" / f"{split}.jsonl.gz")][:n_works]
        rows = [{**r, "text": r["text"][:LONG_TEXT_CHARS]} for r in rows]
        long += write_jsonl_gz(out / "shakespeare" / f"{split}.jsonl.gz", rows)
    print("| sample file | drawn from | source rows | rows | label=1 | bytes |")
    print("|---|---|---:|---:|---:|---:|")
    for name, origin, n_src, sample, size in lines:
        pos = sum(int(r["label"]) == 1 for r in sample)
        print(f"| {name}.jsonl.gz | {origin} | {n_src} | {len(sample)} | {pos} | {size} |")
        total += size
    print(f"total: {total} bytes (and {long} bytes of long texts in shakespeare/)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

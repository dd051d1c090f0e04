"""``coulomb-attention suite``: every attention x kernel variant over tasks and seeds.

Each run writes ``RESULTS/<task>/<attention>-<kernel>/seed<S>/metrics.json``. The suite is
resumable: a run whose ``metrics.json`` holds the same configuration is skipped
(:func:`coulomb_attention.results.is_done`; a changed configuration is refused with the keys
that differ, or re-run with ``--rerun``), a run with checkpoints continues from them. The
vanilla and learned runs of one attention share the identical warm-up (it does not depend on
the kernel), so the second one copies the first one's warm-up checkpoint.
``RESULTS/suite.json`` lists every run with its status and wall time.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from .._validation import check_choice
from ..config import to_dict
from ..data.registry import DATASETS
from ..results import atomic_write_json, is_done
from ._args import list_arg
from .train import add_common_arguments, build_config, setup_runtime

__all__ = ["VARIANTS", "add_arguments", "run", "run_dir", "run_suite"]

# (attention, kernel): the three particle maps with fixed and learned features, the two
# references without particles, and the no-mixing control (``none``: the report's attention
# contribution, softmax minus none, says whether a task can rank kernels at all).
VARIANTS: tuple[tuple[str, str], ...] = (
    ("softmax", "vanilla"),
    ("none", "vanilla"),
    ("elu", "vanilla"),
    ("favor", "vanilla"),
    ("favor", "learned"),
    ("porf_softplus", "vanilla"),
    ("porf_softplus", "learned"),
    ("softmax_feat", "vanilla"),
    ("softmax_feat", "learned"),
)


def run_dir(results: str | Path, task: str, attention: str, kernel: str, seed: int) -> Path:
    """``RESULTS/<task>/<attention>-<kernel>/seed<S>``."""
    return Path(results) / task / f"{attention}-{kernel}" / f"seed{seed}"


def _parse_variants(names: list[str] | None) -> list[tuple[str, str]]:
    if not names:
        return list(VARIANTS)
    valid = {f"{a}-{k}": (a, k) for a, k in VARIANTS}
    return [valid[check_choice("variant", name.strip(), valid)] for name in names]


def run_suite(args: argparse.Namespace, log=print) -> list[dict]:
    """Run (or skip) every task x variant x seed; returns the status rows."""
    from ..train.run import RESOLVED_KEYS, checkpoint_config
    from ..train.run import run as run_pipeline

    tasks = [check_choice("task", t.strip(), DATASETS) for t in args.tasks]
    seeds = list(args.seeds)
    variants = _parse_variants(args.variants)
    runtime = setup_runtime(args)
    results = Path(args.out)
    results.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for task in tasks:
        for seed in seeds:
            for attention, kernel in variants:
                out = run_dir(results, task, attention, kernel, seed)
                row = {"task": task, "attention": attention, "kernel": kernel, "seed": seed,
                       "dir": str(out.relative_to(results))}
                config = build_config(args, {"task": task, "attention": attention,
                                             "kernel": kernel, "seed": seed})
                if is_done(out, to_dict(config), on_mismatch="rerun" if args.rerun else "raise",
                           ignore=RESOLVED_KEYS, normalize=checkpoint_config):
                    row["status"] = "skipped (done, same config)"
                    log(f"skip {row['dir']}: done with the same configuration")
                    rows.append(row)
                    continue
                sibling = run_dir(results, task, attention,
                                  "vanilla" if kernel == "learned" else "learned", seed)
                t0 = time.perf_counter()
                if args.rerun and (out / "ckpt").exists():
                    shutil.rmtree(out / "ckpt")  # checkpoints of the old configuration
                run_pipeline(config, out, runtime, data_dir=args.data_dir, resume="auto",
                             warmup_from=sibling if sibling.exists() else None, log=log)
                row.update(status="done", wall_s=time.perf_counter() - t0)
                rows.append(row)
                atomic_write_json(results / "suite.json", {"runs": rows})
    atomic_write_json(results / "suite.json", {"runs": rows})
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    list_arg(parser, "--tasks", default=["sst2", "qqp", "rotten_tomatoes"], help="tasks")
    list_arg(parser, "--seeds", type=int, default=[0, 1, 2, 3, 4], help="seeds")
    list_arg(parser, "--variants", default=None, metavar="ATTENTION-KERNEL",
             help=f"ATTENTION-KERNEL names (default: all {len(VARIANTS)}: "
                  + ", ".join(f"{a}-{k}" for a, k in VARIANTS) + ")")
    parser.add_argument("--out", default="runs/suite", help="results directory")
    parser.add_argument("--rerun", action="store_true",
                        help="re-run finished runs whose stored configuration differs "
                             "(default: refuse with the differing keys)")
    add_common_arguments(parser)


def run(args: argparse.Namespace) -> int:
    rows = run_suite(args)
    done = sum(r["status"] == "done" for r in rows)
    print(f"suite: {done} run(s) done, {len(rows) - done} skipped -> {args.out}/suite.json")
    return 0

"""Choose the teacher route's default objective by held-out accuracy (docs/recall.md).

Seed 5 (not among the measured seeds 0-4), easy level, FAVOR+ and PORF-softplus,
M = 16 and 64, omega fitted by Adam (the arena's ``gradient`` variant) on each objective;
one JSON line per run in ``OUT/selection.jsonl`` (resumable). Usage:

    python experiments/recall_objective_selection.py OUT
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from coulomb_attention.results import append_jsonl, read_jsonl
from coulomb_attention.studies.ablation_mqar import spec_config
from coulomb_attention.train.recall import run_recall

OBJECTIVES = ("teacher", "teacher_query", "indicator")


def main(out: Path) -> None:
    torch.set_num_threads(1)
    path = out / "selection.jsonl"
    done = {(r["setting"], r["M"], r["seed"], r["objective"])
            for r in read_jsonl(path, repair=True)}
    for seed in (5,):
        for att in ("favor", "porf_softplus"):
            for m in (16, 64):
                spec = {"arena": "mqar", "setting": f"easy/{att}", "variant": "gradient",
                        "params": {"lr": 0.03}, "M": m, "seed": seed}
                for objective in OBJECTIVES:
                    key = (spec["setting"], m, seed, objective)
                    if key in done:
                        continue
                    cfg = dataclasses.replace(spec_config(spec), objective=objective)
                    t0 = time.perf_counter()
                    row = run_recall(cfg, teacher_dir=out / "mqar_teachers")
                    rec = {"setting": spec["setting"], "M": m, "seed": seed,
                           "objective": objective, "accuracy": row["accuracy"],
                           "fit_accuracy": row["fit_accuracy"],
                           "swap_accuracy": row["swap_accuracy"],
                           "holdout_kl_after": row["alignment"][0]["holdout_kl_after"],
                           "time_s": time.perf_counter() - t0}
                    append_jsonl(path, rec)
                    print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""Pilot of the MQAR weighted variant's reaction step tau on seed 5 (outside the measured
seeds 0-4): easy level, M = 16, FAVOR+ and PORF-softplus, Coulomb lam 1 as the reference.

    python experiments/ablation_mqar_weighted_pilot.py OUT [--M 16] [--taus 0.02 0.05 0.2]
        [--w-min 0.1]

Appends one JSON line per run to ``OUT/pilot.jsonl`` (teachers cached in OUT/mqar_teachers).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from coulomb_attention.studies import ablation_mqar as arena


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--M", type=int, default=16)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--maps", nargs="+", default=list(arena.MAPS))
    p.add_argument("--taus", nargs="+", type=float, default=[0.02, 0.05, 0.2])
    p.add_argument("--w-min", type=float, default=None, help="override the death threshold")
    p.add_argument("--no-reference", action="store_true", help="skip the Coulomb run")
    a = p.parse_args()
    torch.set_num_threads(1)
    a.out.mkdir(parents=True, exist_ok=True)
    for att in a.maps:
        base = {"arena": "mqar", "setting": f"easy/{att}", "M": a.M, "seed": a.seed}
        runs = [] if a.no_reference else [("coulomb", {"lam": 1.0, "beta": 1e6})]
        runs += [("weighted", {"lam": 1.0, "beta": 1e6, "tau": t}) for t in a.taus]
        for variant, params in runs:
            spec = {**base, "variant": variant, "params": params}
            config = arena.spec_config(spec)
            if variant == "weighted" and a.w_min is not None:
                from dataclasses import replace

                config = replace(config, fit=replace(config.fit, w_min=a.w_min))
            t0 = time.time()
            from coulomb_attention.train.recall import run_recall

            row = run_recall(config, teacher_dir=a.out / "mqar_teachers")
            fit = row["alignment"][0]
            out = {"att": att, "M": a.M, "seed": a.seed, "variant": variant, "params": params,
                   "w_min": config.fit.w_min if variant == "weighted" else None,
                   "score": row["accuracy"], "fit_acc": row.get("fit_accuracy"),
                   "kl_fit": [fit["kl_before"], fit["kl_after"]],
                   "kl_holdout": [fit["holdout_kl_before"], fit["holdout_kl_after"]],
                   "ess": fit.get("ess"), "births": fit.get("births"),
                   "time_s": time.time() - t0}
            print(json.dumps(out), flush=True)
            with open(a.out / "pilot.jsonl", "a") as f:
                f.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()

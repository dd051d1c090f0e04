"""The conversion arena of the ablation study at a custom (reduced) budget, then its report.

The command's ``--quick`` and full plans have fixed budgets; this runs the same arena
(:mod:`coulomb_attention.studies.ablation_convert`) with other steps and sizes, its setting
names tagged with ``--tag`` (so the runs never share a key with another budget's), into
``OUT/records.jsonl`` (resumable) and ``OUT/report.md``::

    python experiments/ablation_convert_budget.py --settings 64 256 --features 16 64 \\
        --seeds 0 1 2 --steps 40 --refine-steps 40 --eval-sentences 256 --tag b40 \\
        --data-dir /work/shared/data --out runs/ablation_convert_b40
"""

from __future__ import annotations

import argparse

import torch

from coulomb_attention.reports.ablation import write_ablation_report
from coulomb_attention.studies.ablation import run_plan
from coulomb_attention.studies.ablation_convert import VARIANTS, Budget, plan_with


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", type=int, nargs="+", default=[64, 256])
    p.add_argument("--features", type=int, nargs="+", default=[16, 64])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--lams", type=float, nargs="+", default=[0.1])
    p.add_argument("--adam-lrs", type=float, nargs="+", default=[],
                   help="further layer-wise learning rates of gradient and hedgehog (params "
                        "{lr}; the refinement's scales with it); the budget's lr always runs")
    p.add_argument("--particle-map", choices=("favor", "hedgehog"), default="favor",
                   help="hedgehog: gradient / langevin / coulomb move untied particles of "
                        "Hedgehog's map (params {map}); only those variants are planned")
    p.add_argument("--eta-scales", type=float, nargs="+", default=[],
                   help="further step-size multipliers of langevin and coulomb (params "
                        "{eta_scale}: layer-wise and refinement eta and eta_end); 1 always runs")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--refine-steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--eval-sentences", type=int, default=256)
    p.add_argument("--tag", required=True)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    budget = Budget(steps=a.steps, refine_steps=a.refine_steps, batch_size=a.batch_size,
                    holdout=32, eval_sentences=a.eval_sentences, lams=tuple(a.lams), tag=a.tag)
    plan = plan_with(budget, a.seeds, a.features, settings=tuple(a.settings),
                     variants=tuple(a.variants))
    base = list(plan)
    plan += [{**s, "params": {"lr": lr}} for lr in a.adam_lrs for s in base
             if s["variant"] in ("gradient", "hedgehog") and lr != budget.lr]
    plan += [{**s, "params": {**s["params"], "eta_scale": c}} for c in a.eta_scales
             for s in base if s["variant"] in ("langevin", "coulomb") and c != 1.0]
    if a.particle_map != "favor":
        plan = [{**s, "params": {**s["params"], "map": a.particle_map}} for s in plan
                if s["variant"] in ("gradient", "langevin", "coulomb")]
    print(run_plan(plan, a.out, data_dir=a.data_dir), flush=True)
    print(f"wrote {write_ablation_report(a.out)}")


if __name__ == "__main__":
    main()

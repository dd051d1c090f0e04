"""The MQAR arena's ``end2end`` reference with a faster omega: phase B trains omega at
``omega_lr_scale`` times the fine-tuning learning rate (the planned ``end2end`` uses 1).

Checks that the end-to-end reference is not weak only because omega barely moves at the
fine-tuning rate. Runs append to ``OUT/records.jsonl`` (resumable, the study's run keys; the
teachers cached there are reused), then ``OUT/report.md`` is written (the ablation report:
scores, paired differences, learned at M - fixed at 2M and 4M)::

    python experiments/ablation_mqar_end2end_lr.py --scales 10 30 --features 16 64 \\
        --seeds 0 1 2 3 4 --out runs/mqar_e2e
"""

from __future__ import annotations

import argparse

from coulomb_attention.reports.ablation import write_ablation_report
from coulomb_attention.studies.ablation import make_plan, run_plan


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scales", type=float, nargs="+", default=[10.0])
    p.add_argument("--features", type=int, nargs="+", default=[16, 64])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--settings", nargs="+", default=["easy"])
    p.add_argument("--out", required=True)
    a = p.parse_args()
    base = make_plan(["mqar"], seeds=a.seeds, features=a.features, variants=["end2end"],
                     settings=a.settings)
    plan = [{**s, "params": {**s["params"], "omega_lr_scale": float(c)}}
            for c in a.scales for s in base]
    print(run_plan(plan, a.out), flush=True)
    print(f"wrote {write_ablation_report(a.out)}")


if __name__ == "__main__":
    main()

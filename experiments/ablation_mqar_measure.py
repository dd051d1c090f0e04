"""Run a filtered MQAR-arena plan into ``OUT/records.jsonl`` (resumable by run key), until the
ablation framework's ``coulomb-attention ablation --arena mqar`` lands on this branch.

    python experiments/ablation_mqar_measure.py OUT --levels easy --seeds 0 1 2 3 4 \\
        --features 16 64 --variants fixed gradient langevin [--maps favor] [--shard 0/2]

``--shard i/n`` runs every n-th (setting, seed) group starting at i (two processes, one file:
lines are appended atomically).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from coulomb_attention.results import append_jsonl, read_jsonl
from coulomb_attention.studies import ablation_mqar as arena


def key(spec: dict) -> str:
    return json.dumps({k: spec[k] for k in ("arena", "setting", "variant", "params", "M",
                                            "seed")}, sort_keys=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--levels", nargs="+", default=["easy"])
    p.add_argument("--maps", nargs="+", default=list(arena.MAPS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--features", nargs="+", type=int, default=[16, 64])
    p.add_argument("--variants", nargs="+", default=None)
    p.add_argument("--shard", default="0/1")
    a = p.parse_args()
    torch.set_num_threads(1)
    i, n = (int(x) for x in a.shard.split("/"))
    specs = [s for s in arena.plan(False, a.seeds, a.features)
             if s["setting"].split("/")[0] in a.levels and s["setting"].split("/")[1] in a.maps
             and (a.variants is None or s["variant"] in a.variants)]
    groups = sorted({(s["setting"], s["seed"]) for s in specs}, key=lambda g: (g[1], g[0]))
    mine = set(groups[i::n])
    records = a.out / "records.jsonl"
    for s in specs:
        if (s["setting"], s["seed"]) not in mine:
            continue
        done = {key(r) for r in read_jsonl(records, repair=True)}
        if key(s) in done:
            continue
        t0 = time.perf_counter()
        rec = arena.run(s, run_dir=str(a.out / "runs" / "x"))
        append_jsonl(records, rec)
        print(f"{s['setting']} {s['variant']} {s['params']} M={s['M']} seed={s['seed']}: "
              f"{rec['score']:.4f} (fit {rec['fit_accuracy']:.4f}, "
              f"{time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()

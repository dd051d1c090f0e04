"""The conversion comparison as a study: one base conversion, varied over M, seeds, variants
and repulsion strengths, each run in its own folder (reused when finished with the same
configuration), then ``OUT/grid.jsonl`` and ``OUT/grid.md``
(:mod:`coulomb_attention.reports.convert`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..results import atomic_write_text, config_diff

if TYPE_CHECKING:
    from ..convert import ConvertConfig

__all__ = ["run_convert_grid"]


def run_convert_grid(base: ConvertConfig, features: Sequence[int], seeds: Sequence[int],
                     variants: Sequence[str], lams: Sequence[float], out: str | Path, *,
                     data_dir=None, progress: bool = False) -> Path:
    """The softmax teacher, then every variant at every M and seed (the particles variant at
    every repulsion strength in ``lams``) under ``OUT/grid/<name>/``; returns ``OUT/grid.md``.

    A finished run is reused only when its stored configuration equals this one (else
    ``ValueError`` naming the differences).
    """
    from ..convert import config_json, convert_encoder
    from ..convert.artifact import Artifact, find_results
    from ..reports.convert import write_grid_report

    out = Path(out)
    runs = [("softmax", dataclasses.replace(base, variant="softmax"))]
    for m in features:
        for seed in seeds:
            for variant in variants:
                cfg = dataclasses.replace(base, n_features=m, seed=seed, variant=variant)
                if variant == "particles":
                    for lam in lams:
                        runs.append((f"particles-lam{lam:g}-M{m}-s{seed}", dataclasses.replace(
                            cfg, distill=dataclasses.replace(base.distill, lam=lam))))
                elif variant != "softmax":
                    runs.append((f"{variant}-M{m}-s{seed}", cfg))
    results = []
    for name, cfg in runs:
        run = Artifact(out / "grid" / name)
        run_dir = run.root
        if run.has_result():
            res = run.read_result()
            differ = config_diff(res.get("config"), config_json(cfg))
            if differ:  # a finished run is reused only with the same configuration
                raise ValueError(f"{run_dir} holds a conversion of another configuration "
                                 f"(differs in {', '.join(differ[:6])}); use another --out or "
                                 "delete it")
        else:
            print(f"[grid] {name}", flush=True)
            res = convert_encoder(cfg, run_dir, data_dir=data_dir, progress=progress)
        fid = res["fidelity"]
        print(f"[grid] {name}: cos {fid['cos_mean']:.4f} (p5 {fid['cos_p5']:.4f}), Spearman "
              f"{fid['spearman']:.4f}, distil {res['distill_s']:.0f} s", flush=True)
        results.append(res)
    # the report covers every finished run of OUT/grid made with this base configuration
    # (earlier invocations with other M, seeds, variants or lam included); runs of another
    # base configuration are left out and named
    grid_keys = {"n_features", "seed", "variant", "distill.lam"}
    base_json, every, other = config_json(base), [], []
    for run_dir in find_results(out / "grid"):
        res = Artifact(run_dir).read_result()
        if set(config_diff(res.get("config"), base_json)) <= grid_keys:
            every.append(res)
        else:
            other.append(run_dir.name)
    if other:
        print(f"[grid] left out of the report (another base configuration): "
              f"{', '.join(other)}", flush=True)
    atomic_write_text(out / "grid.jsonl", "".join(json.dumps(r) + "\n" for r in every))
    report = write_grid_report(out)
    print(f"wrote {report}")
    return report

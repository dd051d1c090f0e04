"""The MQAR arena of the ablation study (issue 24; contract in docs/ablation.md).

Every variant of a setting starts from the same softmax teacher (one per seed, trained once
and cached, :func:`coulomb_attention.train.recall.train_teacher`): its weights are copied
into a kernel-attention model of the same architecture, omega of the retrieval layer is
treated by the variant, then every weight but omega is fine-tuned by cross-entropy with the
same budget (:func:`coulomb_attention.train.recall.run_recall`, ``init="teacher"``). The
score is the exact-match accuracy over the queried positions of 1,000 held-out sequences.

Settings: ``"<level>/<map>"`` with level ``easy`` or ``hard``
(:data:`coulomb_attention.train.recall.RECALL_LEVELS`) and map ``favor`` or ``porf_softplus``.
Variants (omega of the retrieval layer; the objective is :data:`OBJECTIVE` for all learned
ones, settings :class:`~coulomb_attention.train.recall_teacher.RecallFitConfig`):

- ``fixed``     the map's own random draw (the same draw every variant starts from)
- ``gradient``  Adam on the objective, no noise, no repulsion (``params = {"lr"}``)
- ``langevin``  projected Langevin, ``lam = 0``, finite ``beta`` (``params = {"lam", "beta"}``)
- ``coulomb``   projected Langevin with Riesz repulsion, ``lam`` in :data:`COULOMB_LAMS`
- ``hedgehog``  Hedgehog's map at the same feature count (Adam on ``W``); the map of the
                setting only supplies the initial draw (both maps draw the same orthogonal
                omega), so it runs in the ``favor`` settings only
- ``weighted``  WFR weighted particles (``method="weighted"``): positions by the Coulomb
                variant's transport (same ``eta`` schedule, ``beta``, ``lam`` =
                :data:`WEIGHTED_LAM`), masses by the Fisher-Rao reaction (``tau`` =
                :data:`WEIGHTED_TAU`) with birth-death; the masses scale the features in the
                objective and in the layer (``params = {"lam", "beta", "tau"}``)
- ``end2end``   ``gradient``, then phase B trains omega of every layer too, by the same
                cross-entropy (``tune_omega``; ``params = {"lr"}``): not the method but its
                reference point, what M features of the map reach when the task loss itself
                moves them at this budget (docs/ablation.md, "Is learned 16 >= fixed 64
                reachable?")

Diagnostics: :func:`~coulomb_attention.dynamics.diagnostics.particle_diagnostics` of the final
omega with its features of the held-out queries (per head group, averaged).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

__all__ = ["ARENA", "COULOMB_LAMS", "MAPS", "OBJECTIVE", "PENDING_VARIANTS", "WEIGHTED_LAM",
           "WEIGHTED_TAU", "cache_group", "plan", "run", "spec_config"]

ARENA = "mqar"
MAPS = ("favor", "porf_softplus")
#: the learned variants' objective (chosen by held-out accuracy: docs/recall.md, "The teacher
#: route")
OBJECTIVE = "indicator"
LANGEVIN_BETA = 1e6
COULOMB_LAMS = (1.0, 10.0)
ADAM_LR = 0.03
DEFAULT_FEATURES = (8, 16, 32, 64, 128)
#: the weighted variant: the Coulomb variant's transport at its first strength, plus the
#: reaction step of the masses (docs/ablation.md, "Weighted particles in MQAR")
WEIGHTED_LAM = COULOMB_LAMS[0]
WEIGHTED_TAU = 0.05
#: variants this arena does not plan (none left)
PENDING_VARIANTS: tuple[str, ...] = ()
#: where the teachers are cached when ``run`` gets no ``run_dir`` (else ``<out>/mqar_teachers``)
TEACHER_DIR = Path("runs/ablation/mqar_teachers")

# the teacher route per level: the teacher's training and the fine-tuning budget (phase B);
# small overrides of RECALL_LEVELS
# (2 epochs at lr 1e-3 left fixed PORF-softplus at M = 64 at 0.46 and fixed FAVOR+ at 0.81,
# seed 0: too little for the fixed maps to adapt the teacher's weights to their kernel; 4
# epochs at 3e-3 give fixed FAVOR+ 0.945)
ROUTE: dict[str, dict] = {
    "easy": {"teacher_train": {"epochs": 6, "lr": 6e-3}, "train": {"epochs": 4, "lr": 3e-3}},
    "hard": {"teacher_train": {"epochs": 14, "lr": 6e-3}, "train": {"epochs": 4, "lr": 3e-3}},
}
QUICK = {"n_train": 2000, "n_eval": 500, "teacher_train": {"epochs": 4},
         "train": {"epochs": 1}, "fit": {"steps": 60, "n_examples": 512, "holdout": 128}}


def _variant_overrides(variant: str, params: dict[str, Any]) -> dict[str, Any]:
    """RecallRunConfig overrides of one variant: the vocabulary's particle fit
    (:mod:`coulomb_attention.dynamics.variants`) as ``fit``; ``end2end`` also trains omega in
    phase B (optional param ``omega_lr_scale``: omega's phase-B learning rate / lr)."""
    from ..dynamics.variants import particle_overrides

    if variant in PENDING_VARIANTS:
        raise ValueError(f"variant {variant!r} is not implemented in the MQAR arena yet")
    fit = particle_overrides(variant, params)  # ValueError for an unknown name
    if fit is None:
        if variant != "fixed":
            raise ValueError(f"variant {variant!r} does not run in the MQAR arena")
        return {"kernel": "vanilla"}
    over = {"kernel": "learned", "objective": OBJECTIVE, "fit": fit}
    if variant == "end2end":
        over.update(tune_omega=True,
                    **{k: params[k] for k in ("omega_lr_scale",) if k in params})
    return over


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


def spec_config(spec: dict[str, Any]):
    """The :class:`~coulomb_attention.train.recall.RecallRunConfig` of a run spec."""
    from ..config import from_dict
    from ..train.recall import RECALL_LEVELS, RecallRunConfig

    level, _, att = str(spec["setting"]).partition("/")
    if level not in RECALL_LEVELS or att not in MAPS:
        raise ValueError(f"setting must be '<level>/<map>' with level in {list(RECALL_LEVELS)} "
                         f"and map in {list(MAPS)}, got {spec['setting']!r}")
    over = _merge(RECALL_LEVELS[level], ROUTE[level])
    if spec.get("quick"):
        over = _merge(over, QUICK)
    over = _merge(over, {"init": "teacher", "seed": int(spec["seed"]),
                         "model": {"attention": att, "n_features": int(spec["M"])}})
    over = _merge(over, _variant_overrides(spec["variant"], spec["params"]))
    return from_dict(RecallRunConfig, over)


def cache_group(spec: dict[str, Any]) -> str:
    """The runs sharing one cached softmax teacher: the level and seed (and the quick budget);
    the map and M do not enter the teacher."""
    level = str(spec["setting"]).partition("/")[0]
    return f"{level}/seed{int(spec['seed'])}" + ("/quick" if spec.get("quick") else "")


def plan(quick: bool, seeds: list[int], features: list[int] | None) -> list[dict]:
    """Run specs: settings x seeds x M x variants (the variants of one seed and M together,
    so the teacher of a seed is trained once, at its first run). Quick: the easy level,
    FAVOR+, one Coulomb strength, a small data budget (a few minutes)."""
    ms = [int(m) for m in (features or ([16] if quick else DEFAULT_FEATURES))]
    if any(m < 2 or m % 2 for m in ms):
        raise ValueError(f"feature counts must be even and >= 2 (Hedgehog halves them), got {ms}")
    levels = ["easy"] if quick else ["easy", "hard"]
    maps = ["favor"] if quick else list(MAPS)
    lams = COULOMB_LAMS[:1] if quick else COULOMB_LAMS
    specs = []
    for level in levels:
        for seed in seeds:
            for att in maps:
                for m in ms:
                    variants = [("fixed", {}), ("gradient", {"lr": ADAM_LR}),
                                ("langevin", {"lam": 0.0, "beta": LANGEVIN_BETA})]
                    variants += [("coulomb", {"lam": lam, "beta": LANGEVIN_BETA})
                                 for lam in lams]
                    variants.append(("weighted", {"lam": WEIGHTED_LAM, "beta": LANGEVIN_BETA,
                                                  "tau": WEIGHTED_TAU}))
                    if att == "favor":
                        variants.append(("hedgehog", {"lr": ADAM_LR}))
                    variants.append(("end2end", {"lr": ADAM_LR}))
                    for variant, params in variants:
                        spec = {"arena": ARENA, "setting": f"{level}/{att}", "variant": variant,
                                "params": params, "M": m, "seed": int(seed)}
                        if quick:
                            spec["quick"] = True
                        specs.append(spec)
    return specs


def run(spec: dict, run_dir: str | None = None) -> dict:
    """Run one spec (module doc) and return its record. The teachers are cached in
    ``<out>/mqar_teachers`` (``run_dir`` is ``<out>/runs/<slug>``), else :data:`TEACHER_DIR`."""
    from ..train.recall import run_recall

    t0 = time.perf_counter()
    config = spec_config(spec)
    teacher_dir = Path(run_dir).parents[1] / "mqar_teachers" if run_dir else TEACHER_DIR
    row = run_recall(config, teacher_dir=teacher_dir)
    fit = row["alignment"][0] if row["alignment"] else {}
    return {
        **spec,
        "metric": "accuracy",
        "score": row["accuracy"],
        "diagnostics": row["diagnostics"],
        "energy_trace": fit.get("energy_trace", []),
        "time_s": time.perf_counter() - t0,
        "teacher_accuracy": row["teacher_accuracy"],
        "swap_accuracy": row["swap_accuracy"],
        "fit_accuracy": row.get("fit_accuracy", row["swap_accuracy"]),
        "holdout_kl_before": fit.get("holdout_kl_before"),
        "holdout_kl_after": fit.get("holdout_kl_after"),
        **{f"fit_{k}": fit[k] for k in ("births", "ess") if k in fit},  # weighted only
        "sequence_accuracy": row["sequence_accuracy"],
        "teacher_cached": row["teacher"]["cached"],
        "config": row["config"],
    }

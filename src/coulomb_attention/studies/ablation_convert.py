"""The conversion arena of the ablation study: distil MiniLM's attention into M features per
head in the low-data regime, one variant of how the features are obtained at a time.

Setting ``fit<n>``: the layer-wise distillation (:func:`~coulomb_attention.convert.distill.
distill_attention`, row KL to the softmax rows) and the joint refinement
(:func:`~coulomb_attention.convert.distill.refine_encoder`, ``1 - cos`` to the teacher's sentence
embeddings) fit on the same ``n`` training sentences (64 or 256, pre-declared); the score is
the mean cosine of the converted sentence embeddings to the teacher's on held-out sentences of
the evaluation splits (:func:`~coulomb_attention.convert.embedding_fidelity`). Variants, all
on FAVOR+ particles per head except ``hedgehog``, same seeds, sentences and steps:

=========  ==================================================================================
fixed      the fresh FAVOR+ draw of ``seed`` (no fit)
gradient   omega by Adam on the same objectives (``method="adam"``): lam 0, no noise, the ball
langevin   projected Langevin, lam 0, finite ``beta`` (the method's defaults)
coulomb    projected Langevin with Riesz repulsion ``lam`` > 0 at the same ``beta``
hedgehog   Hedgehog's map ``[softmax(W x), softmax(-W x)]`` at the same M, Adam
weighted   WFR particles (``method="weighted"``): the Coulomb variant's transport at
           ``lam`` = :data:`WEIGHTED_LAM` plus masses (reaction ``tau`` = :data:`WEIGHTED_TAU`,
           birth-death); the refinement moves positions with the masses held
=========  ==================================================================================

Every run writes its
converted encoder to ``run_dir/checkpoint`` (:func:`~coulomb_attention.nn.families.bert.
load_pretrained_encoder` reads it, the Hedgehog map included), so any comparison can be
re-scored on other sentences. A setting's name carries its budget (``fit64`` full,
``fit64-quick`` quick, ``fit64-<tag>`` a custom :class:`Budget`), so runs of different budgets
never share a key.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ARENA", "Budget", "FULL", "QUICK", "SETTINGS", "plan", "plan_with", "run"]

ARENA = "convert"
#: fit sentences of each setting (the pre-declared low-data regime)
SETTINGS = (64, 256)
VARIANTS = ("fixed", "gradient", "langevin", "coulomb", "hedgehog", "weighted")
BETA = 1e6  # the distillation's default inverse temperature (langevin and coulomb)
#: the weighted variant: the middle Coulomb strength's transport plus masses, so weighted -
#: coulomb(lam = WEIGHTED_LAM) isolates what the masses buy
WEIGHTED_LAM = 0.1
WEIGHTED_TAU = 0.05


@dataclass(frozen=True)
class Budget:
    """Steps and sizes of one conversion (the same for every variant of a setting).

    Attributes
    ----------
    steps : int            layer-wise steps per layer (all heads of a layer move together)
    refine_steps : int     steps of the joint refinement (0: none)
    batch_size : int       sentences per step
    rows : int             query rows sampled per sentence
    holdout : int          further training sentences, only to measure the layers' row KL
    eval_sentences : int   held-out sentences of the score (evaluation splits)
    diag_sentences : int   held-out sentences whose queries feed the effective rank
    lr, refine_lr : float  Adam learning rates (gradient and hedgehog)
    lams : tuple           the Coulomb variant's repulsion strengths (a small sweep)
    max_length : int       tokens per sentence
    tag : str              appended to the setting's name (``""``: none)
    """

    steps: int = 150
    refine_steps: int = 200
    batch_size: int = 64
    rows: int = 16
    holdout: int = 64
    eval_sentences: int = 512
    diag_sentences: int = 32
    lr: float = 0.02
    refine_lr: float = 0.01
    lams: tuple[float, ...] = (0.03, 0.1, 0.3)
    max_length: int = 64
    tag: str = ""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_sentences", "diag_sentences", "max_length"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        object.__setattr__(self, "lams", tuple(float(x) for x in self.lams))
        if not self.lams or min(self.lams) <= 0:
            raise ValueError(f"lams must be positive, got {self.lams!r}")


FULL = Budget()
QUICK = Budget(steps=10, refine_steps=10, batch_size=32, rows=8, holdout=16, eval_sentences=64,
               diag_sentences=16, lams=(0.1,), tag="quick")
FULL_FEATURES = (16, 32, 64, 128)
QUICK_FEATURES = (16,)


def _params(variant: str, budget: Budget) -> list[dict[str, float]]:
    if variant in ("langevin",):
        return [{"beta": BETA}]
    if variant == "coulomb":
        return [{"beta": BETA, "lam": lam} for lam in budget.lams]
    if variant == "weighted":
        return [{"beta": BETA, "lam": WEIGHTED_LAM, "tau": WEIGHTED_TAU}]
    return [{}]


def plan_with(budget: Budget, seeds, features, *, settings=SETTINGS, variants=VARIANTS,
              encoder: str = "minilm") -> list[dict[str, Any]]:
    """Specs of ``settings`` x ``features`` x ``seeds`` x ``variants`` at ``budget`` (setting,
    M and seed outermost, so a partial study holds whole paired comparisons)."""
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise ValueError(f"unknown variant {bad[0]!r} of the convert arena; valid: "
                         f"{', '.join(VARIANTS)}")
    if any(int(m) < 2 or int(m) % 2 for m in features):
        raise ValueError(f"feature counts must be even (Hedgehog's map), got {list(features)}")
    specs = []
    for n in settings:
        setting = f"fit{n}" + (f"-{budget.tag}" if budget.tag else "")
        for m in features:
            for seed in seeds:
                for variant in variants:
                    for params in _params(variant, budget):
                        specs.append({"arena": ARENA, "setting": setting, "variant": variant,
                                      "params": params, "M": int(m), "seed": int(seed),
                                      "n_fit": int(n), "encoder": encoder,
                                      "budget": dataclasses.asdict(budget)})
    return specs


def plan(quick: bool, seeds: list[int], features: list[int] | None) -> list[dict[str, Any]]:
    """The arena's plan: full (``fit64``/``fit256``, M 16 32 64 128, three Coulomb strengths)
    or quick (``fit64-quick``, M 16, 10 + 10 steps, 64 held-out sentences)."""
    if quick:
        return plan_with(QUICK, seeds, features or QUICK_FEATURES, settings=(64,))
    return plan_with(FULL, seeds, features or FULL_FEATURES)


# ---------------------------------------------------------------------------- one run


def _particle_map(spec: dict[str, Any]) -> str:
    """The feature map the particles of ``spec`` move in: ``favor`` (default) or, with
    ``params {"map": "hedgehog"}`` (variants gradient, langevin, coulomb), Hedgehog's
    ``[softmax(A x), softmax(B x)]`` started from the tied draw ``B = -A`` and moved *untied*
    (every row of omega a particle): is Hedgehog's lead its map or its optimiser?"""
    name = spec["params"].get("map", "favor")
    if name not in ("favor", "hedgehog"):
        raise ValueError(f"params map must be favor or hedgehog, got {name!r}")
    if name == "hedgehog" and spec["variant"] not in ("gradient", "langevin", "coulomb"):
        raise ValueError(f"params map applies to gradient, langevin and coulomb, not "
                         f"{spec['variant']!r}")
    return name


def _distill_config(spec: dict[str, Any], budget: Budget):
    from ..convert.distill import DistillConfig
    from ..dynamics.variants import particle_overrides

    p, v = spec["params"], spec["variant"]
    # optional params {"lr"} of the Adam variants (gradient, hedgehog): a learning-rate sweep;
    # the refinement's rate scales with it (the budget's ratio refine_lr / lr)
    lr = float(p.get("lr", budget.lr)) if v in ("gradient", "hedgehog") else budget.lr
    if not lr > 0:
        raise ValueError(f"params lr must be > 0, got {p!r}")
    base = DistillConfig(n_examples=spec["n_fit"], holdout=budget.holdout,
                         batch_size=budget.batch_size, rows_per_sequence=budget.rows,
                         steps=budget.steps, refine_steps=budget.refine_steps,
                         refine_examples=spec["n_fit"], lr=lr,
                         refine_lr=budget.refine_lr * lr / budget.lr)
    # the vocabulary's particle fit (dynamics.variants) over this arena's defaults; "lr" is
    # already in base (with the refinement's rate), "map" and "eta_scale" are read here
    defaults = {"langevin": {"beta": BETA}, "coulomb": {"beta": BETA},
                "weighted": {"lam": WEIGHTED_LAM, "beta": BETA, "tau": WEIGHTED_TAU}}
    over = particle_overrides(v, {**defaults.get(v, {}), **{
        k: x for k, x in p.items() if k not in ("lr", "map", "eta_scale")}})
    cfg = dataclasses.replace(base, **over) if over is not None else base
    if "eta_scale" in p:  # optional param of the Langevin variants: a step-size sweep
        c = float(p["eta_scale"])
        if v not in ("langevin", "coulomb") or not c > 0:
            raise ValueError(f"params eta_scale must be > 0 and of langevin or coulomb, got "
                             f"{v!r} {p!r}")
        cfg = dataclasses.replace(cfg, eta=c * cfg.eta, eta_end=c * cfg.eta_end,
                                  refine_eta=c * cfg.refine_eta,
                                  refine_eta_end=c * cfg.refine_eta_end)
    return cfg


def _data(t: dict) -> float:
    """A stored trace entry's data term (``data``; ``kl`` in records written before the one
    trace format), 0.0 when absent."""
    return t.get("data", t.get("kl")) or 0.0


def _mean_trace(traces: list[list[dict]]) -> list[dict[str, float]]:
    """The per-layer traces averaged step by step: ``{step, energy, data, repulsion}``."""
    by_step: dict[int, list[dict]] = {}
    for trace in traces:
        for t in trace:
            by_step.setdefault(int(t["step"]), []).append(t)
    out = []
    for step in sorted(by_step):
        ts = by_step[step]
        mean = {k: sum(float(_data(t) if k == "data" else t[k] or 0.0) for t in ts) / len(ts)
                for k in ("energy", "data", "repulsion")}
        out.append({"step": step, "energy": mean["energy"], "data": mean["data"],
                    "repulsion": mean["repulsion"]})
    return out


def _diagnostics(model, ids, mask) -> dict[str, float]:
    """:func:`particle_diagnostics` of every layer's and head's particles, with the features of
    that head's held-out queries, averaged over layers and heads."""
    import torch

    from ..convert.distill import capture_teacher_batches
    from ..dynamics.diagnostics import particle_diagnostics

    sums: dict[str, float] = {}
    count = 0
    for li, layer in enumerate(model.attention_layers):
        if not layer.has_features:
            continue
        batches = capture_teacher_batches(model, li, ids, mask, batch_size=ids.shape[0],
                                          rows_per_sequence=0, with_values=False)
        omega = layer.omega.detach().double()  # (H, M, dh)
        scale = layer.feature_scale()  # (H, M) sqrt(M mass) of a weighted layer, else None
        for h in range(omega.shape[0]):
            u = torch.cat([b.q[:, h][b.row_mask] for b in batches]).double()  # (n, dh)
            feats = layer.feature(u, omega[h])
            if scale is not None:
                feats = feats * scale[h]
            d = particle_diagnostics(omega[h], feats)
            for k, v in d.items():
                sums[k] = sums.get(k, 0.0) + v
            count += 1
    return {k: v / count for k, v in sums.items()}


def run(spec: dict[str, Any], *, run_dir: str | Path | None = None,
        data_dir: str | Path | None = None) -> dict[str, Any]:
    """One conversion of ``spec`` (see :func:`plan_with`); writes ``run_dir/checkpoint`` and
    returns the record: the spec plus ``metric`` "cosine", ``score`` (held-out mean cosine),
    ``score_p5``, ``spearman``, ``score_train`` (mean cosine on the fit sentences),
    ``holdout_kl`` (mean over layers and heads of the held-out row KL after the layer-wise
    stage), ``refine`` (cosines before/after), ``diagnostics``, ``energy_trace`` (the layer-wise
    stage, mean over layers), ``refine_trace``, ``checkpoint``, ``time_s``."""
    import torch

    from ..convert import embed, embedding_fidelity, load_sentences
    from ..convert.artifact import Artifact
    from ..convert.distill import distill_attention, refine_encoder, split_examples
    from ..nn.families.bert import (
        load_pretrained_encoder,
        load_pretrained_tokenizer,
        resolve_checkpoint_dir,
        save_pretrained_encoder,
    )

    t0 = time.perf_counter()
    budget = Budget(**{**spec["budget"], "lams": tuple(spec["budget"]["lams"])})
    m, seed, variant = int(spec["M"]), int(spec["seed"]), spec["variant"]
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")
    directory = resolve_checkpoint_dir(spec.get("encoder", "minilm"))
    tok = load_pretrained_tokenizer(directory)
    teacher = load_pretrained_encoder(directory, "softmax")
    # the particle dynamics on Hedgehog's map (untied) is the registry's hedgehog entry: its
    # fresh draw is [W; -W] from the first half of the FAVOR+ draw of the same generator, as
    # `convert --feature-map hedgehog` loads it
    model = load_pretrained_encoder(directory, _particle_map(spec), m, share_features=False,
                                    generator=seed)
    tasks = tuple(spec.get("tasks", ("sst2", "rotten_tomatoes", "qqp")))
    sentences = load_sentences(tasks, "train", data_dir, spec["n_fit"] + budget.holdout, seed)
    held = load_sentences(tasks, "eval", data_dir, budget.eval_sentences, 10_000 + seed)
    ids, mask = tok.encode_batch([(s,) for s in sentences], max_length=budget.max_length)[:2]
    layer_records: list[dict] = []
    refine = None
    cfg = _distill_config(spec, budget)
    fit_idx = split_examples(len(sentences), cfg, torch.Generator().manual_seed(seed))[0]
    if variant != "fixed":
        layer_records = distill_attention(model, ids, mask, cfg, keep_trace=50,
                                          generator=torch.Generator().manual_seed(seed))
        if cfg.refine_steps:
            refine = refine_encoder(model, teacher, ids, mask, cfg, keep_trace=50,
                                    generator=torch.Generator().manual_seed(seed))
    fit_time = time.perf_counter() - t0
    ckpt = None
    if run_dir is not None:
        ckpt = save_pretrained_encoder(
            model, Artifact(run_dir).checkpoint, vocab_from=directory,
            extra={"variant": variant, "params": spec["params"], "seed": seed,
                   "arena": ARENA, "setting": spec["setting"]})
    fid = embedding_fidelity(embed(teacher, tok, held, budget.max_length),
                             embed(model, tok, held, budget.max_length))
    fit_texts = [sentences[i] for i in fit_idx.tolist()]  # the distillation's fit split
    fit_fid = embedding_fidelity(embed(teacher, tok, fit_texts, budget.max_length),
                                 embed(model, tok, fit_texts, budget.max_length))
    d_ids, d_mask = tok.encode_batch([(s,) for s in held[:budget.diag_sentences]],
                                     max_length=budget.max_length)[:2]
    with torch.no_grad():
        diagnostics = _diagnostics(model, d_ids, d_mask)
    kls = [r["holdout_kl_after"] for r in layer_records if r["holdout_kl_after"] is not None]
    traces = {}
    for r in layer_records:  # one trace per layer (all head groups of a layer share the run)
        traces.setdefault(r["layer"], r.pop("trace", []))
    return {
        **spec, "metric": "cosine", "score": fid["cos_mean"], "score_p5": fid["cos_p5"],
        "spearman": fid["spearman"], "score_train": fit_fid["cos_mean"],
        "n_fit": len(fit_texts), "n_eval": fid["n"],
        "holdout_kl": sum(kls) / len(kls) if kls else None,
        "refine": None if refine is None else {
            k: refine[k] for k in ("cos_before", "cos_after", "holdout_cos_before",
                                   "holdout_cos_after", "omega_shift")},
        "diagnostics": diagnostics,
        "energy_trace": _mean_trace(list(traces.values())),
        "refine_trace": [] if refine is None else [
            {"step": t["step"], "energy": t["energy"], "data": t.get("data", t.get("kl")),
             "repulsion": t["repulsion"]} for t in refine.get("trace", [])],
        "checkpoint": None if ckpt is None else str(ckpt),
        "fit_s": fit_time, "time_s": time.perf_counter() - t0,
    }

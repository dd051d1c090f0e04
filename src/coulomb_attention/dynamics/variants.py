"""The ablation's variant vocabulary: one table from a variant's name to the particle fit it
means, read by every arena (synthetic estimators, MQAR's teacher route, the conversion) and by
the report (``docs/ablation.md``, "The contract").

A variant fixes some :class:`~coulomb_attention.dynamics.ParticleConfig` fields (``overrides``)
and lets a run's ``params`` set others (``params``); an arena lays the result over its own
learner config (``DistillConfig``, ``RecallFitConfig``) or translates it to the estimator's
keyword names (:func:`estimator_kwargs`). Params that are no ``ParticleConfig`` field (a map,
an ``eta_scale``, ``omega_lr_scale``, ``transport``) belong to the arena that reads them.

==========  ======================================================  ===========================
variant     what moves the particles                                overrides (params)
==========  ======================================================  ===========================
fixed       nothing: fixed random features, a fresh draw per seed   (no fit)
gradient    projected Adam on the same objective: the reviewer's     method adam, lam 0, no
            "same parameters by plain gradient descent"              noise (lr)
langevin    projected Langevin without interaction                  method langevin, lam 0
                                                                    (beta)
coulomb     projected Langevin with Riesz repulsion (the method)    method langevin (lam > 0,
                                                                    beta)
weighted    Wasserstein-Fisher-Rao particles: masses, reaction,      method weighted (lam, beta,
            birth-death                                             tau, w_min)
importance  fixed features with importance weights (synthetic)     (no fit)
hedgehog    Hedgehog's tied map ``[W; -W]`` fitted by Adam           method hedgehog, lam 0 (lr)
end2end     ``gradient``, then omega trained by the task loss in     method adam, lam 0, no
            phase B too (the arena sets that part)                  noise (lr)
==========  ======================================================  ===========================
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .config import ParticleConfig

__all__ = ["VARIANTS", "Variant", "estimator_kwargs", "particle_overrides"]


@dataclass(frozen=True)
class Variant:
    """One entry of the vocabulary: ``overrides`` (None: no particle fit) and the
    :class:`ParticleConfig` fields a run's params may set."""

    doc: str
    overrides: Mapping[str, Any] | None
    params: tuple[str, ...] = ()


_PLAIN = {"method": "adam", "lam": 0.0, "beta": 0.0}  # beta 0 reads as infinity: no noise

#: the variants in the order the studies plan them and the report shows them
VARIANTS: dict[str, Variant] = {
    "fixed": Variant("fixed random features, a fresh draw per seed", None),
    "gradient": Variant("projected Adam on the same objective: no interaction, no noise",
                        _PLAIN, ("lr",)),
    "langevin": Variant("projected Langevin without interaction",
                        {"method": "langevin", "lam": 0.0}, ("beta",)),
    "coulomb": Variant("projected Langevin with Riesz repulsion lam > 0 (the method)",
                       {"method": "langevin"}, ("lam", "beta")),
    "weighted": Variant("Wasserstein-Fisher-Rao particles (masses, reaction, birth-death)",
                        {"method": "weighted"}, ("lam", "beta", "tau", "w_min")),
    "importance": Variant("fixed features with importance weights", None),
    "hedgehog": Variant("Hedgehog's tied map [W; -W] fitted by Adam",
                        {"method": "hedgehog", "lam": 0.0}, ("lr",)),
    "end2end": Variant("gradient, then omega trained by the task loss in phase B too",
                       _PLAIN, ("lr",)),
}
_FIELDS = frozenset(f.name for f in dataclasses.fields(ParticleConfig))


def particle_overrides(variant: str, params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The :class:`ParticleConfig` overrides of ``variant`` with a run's ``params`` (None for a
    variant without a particle fit). A params entry that is a ``ParticleConfig`` field the
    variant does not take is an error, unless it equals the variant's own value (``langevin``
    with ``lam 0``); entries that are no such field are the arena's and are left out."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")
    v = VARIANTS[variant]
    if v.overrides is None:
        return None
    over = dict(v.overrides)
    for key, value in params.items():
        if key in v.params:
            over[key] = value
        elif key in _FIELDS and over.get(key) != value:
            raise ValueError(f"variant {variant!r} takes params {list(v.params)} of the particle "
                             f"fit, not {key}={value!r}")
    if variant == "coulomb" and not float(over.get("lam", 0.0)) > 0:
        raise ValueError(f"the coulomb variant needs params lam > 0, got {dict(params)!r}")
    return over


def estimator_kwargs(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``ParticleFeatures`` keyword arguments of :func:`particle_overrides`' result (its names:
    ``optimizer``, ``weighted``; ``beta`` 0 is infinity there too)."""
    over = dict(overrides)
    method = over.pop("method")
    out: dict[str, Any] = {"optimizer": "adam" if method == "adam" else "langevin"}
    if method == "weighted":
        out["weighted"] = True
    if method == "hedgehog":
        raise ValueError("ParticleFeatures has no Hedgehog map: the hedgehog variant runs in the "
                         "attention arenas")
    if "beta" in over:
        beta = float(over.pop("beta"))
        out["beta"] = math.inf if beta == 0 else beta
    return {**out, **over}

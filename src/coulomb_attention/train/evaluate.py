"""Evaluation of a trained classifier: metrics on the evaluation split, under test-time
corruptions, and on the adversarial (AdvGLUE) set. Reads a model and encoded data; writes
nothing (the pipeline stores what it returns)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import metrics as M
from .._validation import check_choice
from ..data import CORRUPTIONS, corrupt_tokens
from .loop import EncodedDataset, predict_proba

__all__ = ["RobustConfig", "evaluate", "metrics_of"]


@dataclass(frozen=True)
class RobustConfig:
    """Test-time corruptions (each kind at each rate, fixed seed) and the AdvGLUE set."""

    kinds: tuple[str, ...] = CORRUPTIONS
    rates: tuple[float, ...] = (0.1, 0.2)
    seed: int = 1234
    advglue: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", tuple(self.kinds))
        object.__setattr__(self, "rates", tuple(float(r) for r in self.rates))
        for k in self.kinds:
            check_choice("corruption", k, CORRUPTIONS)
        for r in self.rates:
            if not 0 <= r <= 1:
                raise ValueError(f"corruption rates must be in [0, 1], got {r}")


def metrics_of(probs: torch.Tensor, labels: np.ndarray) -> dict[str, float]:
    """Accuracy, MCC, F1, ECE, log-loss, Brier of predicted probabilities ``(n, C)``."""
    return {k: float(v) for k, v in M.classification_metrics(probs.numpy(), labels).items()}


def evaluate(model, ev_set: EncodedDataset, tokenizer, robust: RobustConfig,
             adv_set: EncodedDataset | None = None, batch_size: int = 256) -> dict[str, Any]:
    """Every evaluation of one model.

    Returns
    -------
    dict with ``metrics`` (clean evaluation split), ``reliability`` (bins; NaN -> None),
    ``robust`` (``"<kind>@<rate>"`` and ``"advglue"`` -> metrics) and
    ``inference_s_per_example`` (clean split).
    """
    labels = ev_set.labels.numpy()
    t0 = time.perf_counter()
    probs = predict_proba(model, ev_set, batch_size)
    per_example = (time.perf_counter() - t0) / len(labels)
    reliability = {k: [None if isinstance(x, float) and math.isnan(x) else x for x in v]
                   for k, v in M.reliability_bins(probs.numpy(), labels).items()}
    out: dict[str, Any] = {}
    for kind in robust.kinds:
        for rate in robust.rates:
            ids, mask = corrupt_tokens(ev_set.input_ids, ev_set.attention_mask, kind, rate,
                                       seed=robust.seed, special_ids=tokenizer.special_ids,
                                       unk_id=tokenizer.unk_id, pad_id=tokenizer.pad_id)
            p = predict_proba(model, EncodedDataset(ids, mask, ev_set.labels), batch_size)
            out[f"{kind}@{rate:g}"] = metrics_of(p, labels)
    if adv_set is not None:
        adv_labels = adv_set.labels.numpy()
        out["advglue"] = metrics_of(predict_proba(model, adv_set, batch_size), adv_labels)
        out["advglue"]["n"] = len(adv_labels)
    return {"metrics": metrics_of(probs, labels), "reliability": reliability, "robust": out,
            "inference_s_per_example": per_example}

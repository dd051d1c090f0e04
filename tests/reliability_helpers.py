"""Shared helpers of the reliability tests (bad-input recording, tiny data and models)."""


from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from coulomb_attention.estimators import ParticleFeatures
from coulomb_attention.nn.attention import KernelAttention
from coulomb_attention.nn.model import ModelConfig, TransformerClassifier
from coulomb_attention.train.loop import EncodedDataset

USER_ERRORS = (ValueError, TypeError, FileNotFoundError)



# ----------------------------------------------------------------------------- recording


def _record(kind: str, case: str, outcome: str) -> None:
    """Append what a bad input got to ``$RELIABILITY_LOG`` (JSON lines) when set."""
    path = os.environ.get("RELIABILITY_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"kind": kind, "case": case, "outcome": outcome}) + "\n")


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:220]


def assert_user_error(kind, case, fn, exc_types, pattern):
    """Call ``fn``; it must raise one of ``exc_types`` whose message matches ``pattern``."""
    import re

    try:
        result = fn()
    except BaseException as exc:  # noqa: BLE001 (recorded, then judged)
        _record(kind, case, _describe(exc))
        assert isinstance(exc, exc_types), f"{case}: expected {exc_types}, got {_describe(exc)}"
        assert re.search(pattern, str(exc), re.I), (
            f"{case}: message does not name the problem ({pattern!r}): {exc}"
        )
        return exc
    _record(kind, case, f"no error (returned {type(result).__name__})")
    pytest.fail(f"{case}: no error raised (returned {type(result).__name__})")


# ----------------------------------------------------------------------------- data


def _xy(n=40, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    y = (X[:, 0] > 0).astype(int)
    y[:2] = [0, 1]
    return X, y


X, Y = _xy()
X_NAN = X.copy()
X_NAN[3, 1] = np.nan
X_INF = X.copy()
X_INF[3, 1] = np.inf


def _pf(**kw):
    kw.setdefault("n_steps", 2)
    return ParticleFeatures(8, **kw)


def _ka(**kw):
    kw.setdefault("generator", 0)
    return KernelAttention(8, 2, n_features=4, **kw)


def _fitted_pf():
    return _pf(random_state=0).fit(X, Y)


def _tiny_model(attention="favor", seed=0, **kw):
    cfg = ModelConfig(vocab_size=50, num_labels=2, dim=16, layers=1, heads=2, n_features=8,
                      max_len=16, attention=attention, **kw)
    return TransformerClassifier(cfg, generator=torch.Generator().manual_seed(seed))


def _tiny_dataset(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, (n, 10), generator=g)
    mask = torch.ones(n, 10, dtype=torch.bool)
    mask[::2, 7:] = False
    labels = torch.randint(0, 2, (n,), generator=g)
    return EncodedDataset(ids, mask, labels)



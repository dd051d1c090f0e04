"""Reliability and security (issue 7): bad input, numerical faults, crashes, untrusted files.

* a table of bad inputs to the public API, each of which must raise ``ValueError``/``TypeError``
  (or ``FileNotFoundError``) whose message names the problem;
* overflow: exp-type attention features stay finite for large-norm inputs in float32, float16,
  bfloat16 (modules and ``torch.autocast``) and stay inside the convex hull of the values;
* non-finite energies/losses stop Langevin and training with a clear error, nothing is written;
* crashes lose nothing: atomic writes, and a ``train`` run killed with SIGKILL and resumed ends
  with the metrics of an uninterrupted run;
* untrusted files: crafted pickles are never executed by the project's loaders;
* hypothesis properties of the estimators and of ``KernelAttention``.

Defects found in other helpers' files are marked ``xfail(strict=True, reason="defect: ...")``.
Set ``RELIABILITY_LOG=path.jsonl`` to record what every bad input got (used for
docs/reliability.md).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coulomb_attention import dynamics, energy, features
from coulomb_attention import metrics as M
from coulomb_attention.data import load_task
from coulomb_attention.data.registry import SAMPLES_DIR
from coulomb_attention.estimators import ImportanceFeatures, ParticleFeatures, RandomFeatures
from coulomb_attention.meanfield import Grid
from coulomb_attention.nn.attention import ATTENTION_FEATURES, KernelAttention
from coulomb_attention.nn.model import ModelConfig, TransformerClassifier
from coulomb_attention.train import checkpoint as ckpt
from coulomb_attention.train.loop import EncodedDataset, TrainConfig, fit
from coulomb_attention.train.phases import AlignConfig, align_features, collect_queries

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


# ----------------------------------------------------------------------------- bad-input table

BAD_INPUTS = [
    # --- estimators (scikit-learn side)
    ("RandomFeatures.fit X with NaN", lambda: RandomFeatures(8).fit(X_NAN), "NaN"),
    ("ParticleFeatures.fit X with inf", lambda: _pf().fit(X_INF, Y), "infinity"),
    ("ParticleFeatures.fit y with NaN", lambda: _pf().fit(X, np.where(Y, 1.0, np.nan)), "NaN"),
    ("ParticleFeatures.fit one class", lambda: _pf().fit(X, np.zeros(40)), "2 classes"),
    ("ImportanceFeatures.fit one class", lambda: ImportanceFeatures(8).fit(X, np.ones(40)),
     "2 classes"),
    ("ParticleFeatures.fit len(X) != len(y)", lambda: _pf().fit(X, Y[:-1]),
     "inconsistent numbers of samples"),
    ("ParticleFeatures.fit empty X", lambda: _pf().fit(np.empty((0, 3)), np.empty(0)),
     "0 sample"),
    ("ParticleFeatures.fit 1-D X", lambda: _pf().fit(X[:, 0], Y), "2D array"),
    ("ParticleFeatures.fit 3-D X", lambda: _pf().fit(X[:, :, None], Y), "dim 3"),
    ("ParticleFeatures.fit 2-D y", lambda: _pf().fit(X, np.stack([Y, Y], 1)), "1d array"),
    ("ParticleFeatures.fit string X", lambda: _pf().fit(np.full((40, 3), "a"), Y), "string"),
    ("ParticleFeatures.fit complex X", lambda: _pf().fit(X + 1j, Y), "complex"),
    ("ParticleFeatures n_components=0", lambda: ParticleFeatures(0).fit(X, Y),
     "n_components must be a positive integer"),
    ("ParticleFeatures n_components=-3", lambda: ParticleFeatures(-3).fit(X, Y),
     "n_components must be a positive integer"),
    ("ParticleFeatures n_components=8.5", lambda: ParticleFeatures(8.5).fit(X, Y),
     "n_components must be a positive integer"),
    ("ParticleFeatures beta=0", lambda: _pf(beta=0).fit(X, Y), "beta must be positive"),
    ("ParticleFeatures beta=-1", lambda: _pf(beta=-1.0).fit(X, Y), "beta must be positive"),
    ("ParticleFeatures radius=0", lambda: _pf(radius=0).fit(X, Y), "radius must be a positive"),
    ("ParticleFeatures s=-1", lambda: _pf(s=-1.0).fit(X, Y), "s must be a finite number >= 0"),
    ("ParticleFeatures eta=0", lambda: _pf(eta=0).fit(X, Y), "eta must be a positive"),
    ("ParticleFeatures gamma=nan", lambda: _pf(gamma=float("nan")).fit(X, Y), "gamma"),
    ("ParticleFeatures n_steps=0", lambda: ParticleFeatures(8, n_steps=0).fit(X, Y), "n_steps"),
    ("ParticleFeatures feature_map='nope'", lambda: _pf(feature_map="nope").fit(X, Y),
     "unknown feature_map 'nope'; valid: positive, rff, softmax, softplus"),
    ("ParticleFeatures potential='nope'", lambda: _pf(potential="nope").fit(X, Y),
     "unknown potential 'nope'; valid: coulomb, log, riesz"),
    ("ParticleFeatures projection='nope'", lambda: _pf(projection="nope").fit(X, Y),
     "unknown projection 'nope'; valid: ball, box"),
    ("RandomFeatures sampler='nope'", lambda: RandomFeatures(8, sampler="nope").fit(X),
     "unknown sampler 'nope'; valid: gaussian, orthogonal"),
    ("ImportanceFeatures rho=-1", lambda: ImportanceFeatures(8, rho=-1.0).fit(X, Y), "rho"),
    ("ImportanceFeatures pool_size=0", lambda: ImportanceFeatures(8, pool_size=0).fit(X, Y),
     "pool_size"),
    ("transform with wrong n_features", lambda: _fitted_pf().transform(X[:, :2]),
     "2 features.*expecting 3"),
    ("transform X with NaN", lambda: _fitted_pf().transform(X_NAN), "NaN"),
    ("transform before fit", lambda: ParticleFeatures(8).transform(X), "not fitted"),
    # --- attention layer
    ("KernelAttention feature_map='nope'", lambda: _ka(feature_map="nope"),
     "unknown feature_map 'nope'; valid: elu, favor, porf_softplus, softmax, softmax_feat"),
    ("KernelAttention dim % heads != 0", lambda: KernelAttention(8, 3), "not divisible"),
    ("KernelAttention n_features=0", lambda: KernelAttention(8, 2, n_features=0), "n_features"),
    ("KernelAttention heads=0", lambda: KernelAttention(8, 0), "heads"),
    ("KernelAttention dropout=1.5", lambda: _ka(dropout=1.5), "dropout"),
    ("KernelAttention x 2-D", lambda: _ka()(torch.randn(3, 8)), r"shape \(B, T, 8\)"),
    ("KernelAttention x last dim 7", lambda: _ka()(torch.randn(2, 3, 7)), r"shape \(B, T, 8\)"),
    ("KernelAttention x numpy", lambda: _ka()(np.ones((2, 3, 8))), "torch.Tensor"),
    ("KernelAttention float mask", lambda: _ka()(torch.randn(2, 3, 8), torch.ones(2, 3)),
     "torch.bool"),
    ("KernelAttention mask shape", lambda: _ka()(torch.randn(2, 3, 8),
                                                 torch.ones(2, 4, dtype=torch.bool)),
     r"mask must have shape \(2, 3\)"),
    ("KernelAttention.load_features_ shape", lambda: _ka().load_features_(torch.randn(3, 4)),
     "omega must have shape"),
    ("KernelAttention.load_features_ NaN",
     lambda: _ka().load_features_(torch.full((4, 4), float("nan"))), "NaN"),
    ("KernelAttention.load_features_ int",
     lambda: _ka().load_features_(torch.ones(4, 4, dtype=torch.long)), "floating"),
    # --- features, energy, dynamics (core)
    ("features.sample('nope')", lambda: features.sample("nope", 4, 2),
     "unknown sampler 'nope'; valid: gaussian, orthogonal"),
    ("features.sample n=0", lambda: features.sample("gaussian", 0, 2), "n_features"),
    ("features.get_feature_map('nope')", lambda: features.get_feature_map("nope"),
     "unknown feature_map 'nope'; valid"),
    ("features.rff without bias", lambda: features.rff(torch.randn(2, 3), torch.randn(4, 3)),
     "bias"),
    ("features.positive d mismatch", lambda: features.positive(torch.randn(2, 3),
                                                               torch.randn(4, 5)), "d=5"),
    ("energy.make_potential('nope')", lambda: energy.make_potential("nope", s=1.0),
     "unknown potential 'nope'; valid: coulomb, log, riesz"),
    ("energy.make_potential s=-1", lambda: energy.make_potential("riesz", s=-1.0), "s must"),
    ("energy.make_potential eps=-1", lambda: energy.make_potential("riesz", s=1.0, eps=-1),
     "eps"),
    ("energy.encode_labels one class", lambda: energy.encode_labels(np.zeros(5)), "2 classes"),
    ("energy.encode_labels empty", lambda: energy.encode_labels(np.zeros(0)), "2 classes"),
    ("energy.alignment len mismatch",
     lambda: energy.alignment(torch.randn(5, 3), torch.randn(4, 1)), "same B"),
    ("dynamics.Ball(0)", lambda: dynamics.Ball(0), "radius"),
    ("dynamics.Box(-1)", lambda: dynamics.Box(-1), "half_width"),
    ("dynamics.make_projection('nope')", lambda: dynamics.make_projection("nope", 1.0),
     "unknown projection 'nope'; valid: ball, box"),
    ("projected_langevin eta=0",
     lambda: dynamics.projected_langevin(None, dynamics.Ball(1.0), eta=0), "eta"),
    ("projected_langevin beta=0",
     lambda: dynamics.projected_langevin(None, dynamics.Ball(1.0), beta=0), "beta"),
    ("dynamics.make_schedule('nope')", lambda: dynamics.make_schedule("nope", 1.0),
     "unknown schedule 'nope'; valid: constant, cosine, geometric"),
    ("meanfield.Grid dim=3", lambda: Grid(3, 1.0, 16), "dim must be 1 or 2"),
    ("meanfield.Grid half_width=0", lambda: Grid(1, 0.0, 16), "half_width"),
    # --- training
    ("TrainConfig epochs=0", lambda: TrainConfig(epochs=0), "epochs"),
    ("TrainConfig lr=-1", lambda: TrainConfig(lr=-1.0), "lr"),
    ("TrainConfig lr=nan", lambda: TrainConfig(lr=float("nan")), "lr"),
    ("TrainConfig schedule='nope'", lambda: TrainConfig(schedule="nope"),
     "unknown schedule 'nope'; valid: constant, cosine, linear"),
    ("AlignConfig steps=0", lambda: AlignConfig(steps=0), "steps"),
    ("AlignConfig radius=0", lambda: AlignConfig(radius=0.0), "radius"),
    ("AlignConfig s=-1", lambda: AlignConfig(s=-1.0), "s must"),
    ("AlignConfig potential='nope'", lambda: AlignConfig(potential="nope"),
     "unknown potential 'nope'; valid"),
    ("ModelConfig attention='nope'", lambda: ModelConfig(attention="nope"),
     "unknown attention 'nope'; valid"),
    ("EncodedDataset labels length", lambda: EncodedDataset(
        torch.zeros(4, 3, dtype=torch.long), torch.ones(4, 3, dtype=torch.bool),
        torch.zeros(5)), r"labels must have shape \(4,\)"),
    ("fit(config=dict)", lambda: fit(_tiny_model(), _tiny_dataset(), {"epochs": 1}, seed=0),
     "TrainConfig"),
    # --- data and metrics
    ("load_task('nope')", lambda: load_task("nope", "train"),
     "unknown task 'nope'; valid tasks: qqp, rotten_tomatoes, sst2"),
    ("load_task split '../x'", lambda: load_task("sst2", "../x"), "plain name"),
    ("load_task missing data_dir", lambda: load_task("sst2", "train", "/nonexistent/dir"),
     "/nonexistent/dir.*does not exist"),
    ("classification_metrics NaN probs",
     lambda: M.classification_metrics(np.array([[0.5, 0.5], [np.nan, 0.5]]), np.array([0, 1])),
     "NaN"),
    ("classification_metrics length mismatch",
     lambda: M.classification_metrics(np.array([[0.5, 0.5]]), np.array([0, 1])), "rows"),
    ("classification_metrics label out of range",
     lambda: M.classification_metrics(np.full((2, 2), 0.5), np.array([0, 2])), "labels"),
]


@pytest.mark.parametrize("case,fn,pattern", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_public_api(case, fn, pattern):
    assert_user_error("api", case, fn, USER_ERRORS, pattern)


# Defects: each test shows the bad input and the error a user should get.


def test_kernel_attention_integer_input_is_type_error():
    assert_user_error("api", "KernelAttention x int64", lambda: _ka()(torch.ones(2, 3, 8,
                                                                           dtype=torch.long)),
                 (TypeError,), "floating")


def test_encode_labels_rejects_nan():
    assert_user_error("api", "energy.encode_labels with NaN",
                 lambda: energy.encode_labels(np.array([0.0, 1.0, np.nan])), USER_ERRORS, "NaN")


def test_encode_labels_rejects_label_outside_classes():
    assert_user_error("api", "energy.encode_labels label 5 not in classes [0, 1]",
                 lambda: energy.encode_labels(np.array([0, 1, 5]), np.array([0, 1])),
                 USER_ERRORS, "5")


def test_string_and_bool_labels_are_encoded():
    """Labels that are not numbers but are classes (strings, bools) are fine."""
    for labels in (np.where(Y, "spam", "ham"), Y.astype(bool), np.where(Y, 3, 7)):
        phi = _pf(random_state=0).fit(X, labels).transform(X)
        assert phi.shape == (40, 8) and np.isfinite(phi).all()


# ----------------------------------------------------------------------------- data files


def _write_gz(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))


GOOD = json.dumps({"sentence": "a fine film", "label": 1})
CORRUPT_FILES = [
    ("truncated gzip", None, r"train\.jsonl\.gz.*truncated or corrupt gzip"),
    ("missing column", [GOOD, json.dumps({"text": "x", "label": 0})],
     r"train\.jsonl\.gz, line 2: missing column 'sentence'"),
    ("label not a class", [GOOD, GOOD, json.dumps({"sentence": "x", "label": 7})],
     r"train\.jsonl\.gz, line 3: label 7 is out of range"),
    ("label is a word", [json.dumps({"sentence": "x", "label": "good"})],
     r"train\.jsonl\.gz, line 1: label must be an integer"),
    ("invalid JSON line", [GOOD, "{not json"], r"train\.jsonl\.gz, line 2: invalid JSON"),
    ("empty file", [], r"train\.jsonl\.gz: no examples"),
]


@pytest.mark.parametrize("case,lines,pattern", CORRUPT_FILES, ids=[c[0] for c in CORRUPT_FILES])
def test_corrupt_data_files_name_file_and_line(tmp_path, case, lines, pattern):
    path = tmp_path / "sst2" / "train.jsonl.gz"
    if lines is None:  # a real file cut in the middle of its gzip stream
        data = (SAMPLES_DIR / "sst2" / "train.jsonl.gz").read_bytes()
        path.parent.mkdir(parents=True)
        path.write_bytes(data[: len(data) // 2])
    else:
        _write_gz(path, lines)
    assert_user_error("data file", case, lambda: load_task("sst2", "train", tmp_path), USER_ERRORS,
                 pattern)


# ----------------------------------------------------------------------------- overflow

MODES = ("float32", "float64", "bf16-autocast", "fp16-autocast", "float16", "bfloat16")
PARTICLE_MAPS = ("favor", "porf_softplus", "softmax_feat", "elu")


def _run_mode(ka, q, k, v, mask, mode):
    """``ka.attend`` in one precision mode; returns the output as float64."""
    with torch.no_grad():
        if mode in ("float16", "bfloat16", "float64"):
            dt = getattr(torch, mode)
            ka = ka.to(dt)
            return ka.attend(q.to(dt), k.to(dt), v.to(dt), mask).double(), dt
        if mode.endswith("autocast"):
            dt = torch.bfloat16 if mode.startswith("bf16") else torch.float16
            with torch.autocast("cpu", dtype=dt):
                # the layer's projections run under autocast: inputs arrive in low precision
                out = ka.attend(q.to(dt), k.to(dt), v.to(dt), mask)
            return out.double(), dt
        return ka.attend(q, k, v, mask).double(), torch.float32


OVERFLOW_CASES = [
    pytest.param(name, mode, id=f"{name}-{mode}") for name in PARTICLE_MAPS for mode in MODES
]


@pytest.mark.parametrize("name,mode", OVERFLOW_CASES)
def test_attention_large_norm_inputs_stay_finite_and_convex(name, mode):
    """Queries/keys of norm up to ~1e4 (exp(|q|^2/2) far beyond every float range) give finite
    outputs that are convex combinations of the real keys' values (all maps here have
    non-negative features), also for a fully padded sequence."""
    g = torch.Generator().manual_seed(0)
    ka = KernelAttention(32, 2, feature_map=name, n_features=16, generator=0)
    B, H, T, dh = 3, 2, 9, 16
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 6:] = False
    mask[2, :] = False  # no real key at all: output must be finite (zero)
    v = torch.randn(B, H, T, dh, generator=g)
    worst = 0.0
    for scale in (1.0, 1e2, 1e4):
        q = torch.randn(B, H, T, dh, generator=g) * scale
        k = torch.randn(B, H, T, dh, generator=g) * scale
        out, dt = _run_mode(ka, q, k, v, mask, mode)
        assert out.shape == (B, H, T, dh)
        if not torch.isfinite(out).all():
            _record("overflow", f"{name} / {mode}", f"NON-FINITE output "
                    f"({int((~torch.isfinite(out)).sum())} of {out.numel()}) at scale {scale:g}")
            pytest.fail(f"{name}/{mode}: non-finite output at scale {scale}")
        vv = v.to(dt).double()
        m = mask[:2, None, :, None]
        hi = torch.where(m, vv[:2], -math.inf).amax(2, keepdim=True)
        lo = torch.where(m, vv[:2], math.inf).amin(2, keepdim=True)
        tol = 1e-4 if dt in (torch.float32, torch.float64) else 3e-2
        excess = float(torch.maximum(out[:2] - hi, lo - out[:2]).max())
        worst = max(worst, excess)
        assert excess <= tol * (1 + float(vv.abs().max())), (
            f"{name}/{mode}/scale {scale}: output leaves the convex hull of the values by {excess}"
        )
    _record("overflow", f"{name} / {mode}", f"finite, inside the value hull (worst excess "
            f"{worst:.2e}) at |q|,|k| scales 1, 1e2, 1e4")


@pytest.mark.parametrize("mode", ("float32", "bf16-autocast", "float16"))
def test_transformer_forward_finite_under_large_embeddings(mode):
    """A whole classifier with embeddings scaled by 1e3 gives finite logits (LayerNorm +
    shifted features) in float32, bf16 autocast and float16."""
    model = _tiny_model("favor")
    with torch.no_grad():
        model.embeddings.word_embeddings.weight.mul_(1e3)
    ds = _tiny_dataset(8)
    with torch.no_grad():
        if mode == "float16":
            logits = model.half()(ds.input_ids, ds.attention_mask)
        elif mode == "bf16-autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(ds.input_ids, ds.attention_mask)
        else:
            logits = model(ds.input_ids, ds.attention_mask)
    assert torch.isfinite(logits).all()
    _record("overflow", f"TransformerClassifier(favor) embeddings x1e3 / {mode}", "finite logits")


def test_phase_a_large_norm_queries_never_writes_nan():
    """Phase A on queries of norm > 30 (exp(-|q|^2/2) underflows float32): the particles end
    finite and the alignments are finite (or a clear FloatingPointError is raised and the
    particles are untouched)."""
    model = _tiny_model("favor")
    layer = model.attention_layers[0]
    with torch.no_grad():
        layer.q_proj.weight.mul_(400.0)
        layer.q_proj.bias.mul_(400.0)
    ds = _tiny_dataset()
    (q, _, _), _ = collect_queries(model, 0, ds, 16)[0]  # what phase A sees
    assert float(q.norm(dim=-1).median()) > 30  # the regime under test is reached
    before = layer.omega.clone()
    try:
        records = align_features(model, ds, AlignConfig(n_examples=48, holdout=16,
                                                        batch_size=16, steps=3),
                                 generator=torch.Generator().manual_seed(1))
    except FloatingPointError as exc:
        assert "non-finite" in str(exc)
        assert torch.equal(layer.omega, before)
        _record("overflow", "phase A, |q| > 30", _describe(exc))
        return
    assert torch.isfinite(layer.omega).all()
    for r in records:
        assert math.isfinite(r["train_before"]) and math.isfinite(r["train_after"])
    _record("overflow", "phase A, |q| > 30", f"finite: alignment {records[0]['train_before']:.4f}"
            f" -> {records[0]['train_after']:.4f}")


@pytest.mark.parametrize("name", ("positive", "softplus", "softmax", "rff"))
def test_estimators_large_scale_inputs_finite(name):
    """Inputs scaled by 1e6 with a fixed gamma=1 (exp-features far out of range) still give
    finite features; ParticleFeatures either learns finite particles or stops clearly."""
    Xl = X * 1e6
    phi = RandomFeatures(8, feature_map=name, gamma=1.0, random_state=0).fit(Xl).transform(Xl)
    assert np.isfinite(phi).all()
    try:
        pf = _pf(feature_map=name, gamma=1.0, random_state=0).fit(Xl, Y)
    except FloatingPointError as exc:
        _record("overflow", f"ParticleFeatures({name}) X*1e6", _describe(exc))
        assert "non-finite" in str(exc)
        return
    assert np.isfinite(pf.omega_).all() and np.isfinite(pf.transform(Xl)).all()
    _record("overflow", f"ParticleFeatures({name}) X*1e6, gamma=1", "finite features/particles")


# ----------------------------------------------------------------------------- non-finite stops


def test_langevin_stops_on_non_finite_energy():
    calls = {"n": 0}

    def energy_grad(omega, batch):
        calls["n"] += 1
        e = torch.tensor(float("nan") if calls["n"] == 3 else 1.0, dtype=omega.dtype)
        return e, torch.zeros_like(omega), {}

    init_fn, step_fn = dynamics.projected_langevin(energy_grad, dynamics.Ball(5.0), eta=0.1)
    state = init_fn(torch.randn(4, 2, generator=torch.Generator().manual_seed(0)),
                    torch.Generator().manual_seed(1))
    seen = []
    with pytest.raises(dynamics.NonFiniteEnergyError, match="non-finite energy.*step 2") as ei:
        dynamics.run(state, step_fn, 10, callback=lambda s, info: seen.append(s.omega.clone()))
    assert len(seen) == 2 and all(torch.isfinite(o).all() for o in seen)
    _record("non-finite", "Langevin energy NaN at step 2 (run of 10 steps)",
            f"{_describe(ei.value)}; the 2 finite states before it were kept")


def test_langevin_stops_on_infinite_gradient():
    def energy_grad(omega, batch):
        g = torch.zeros_like(omega)
        g[0, 0] = math.inf
        return torch.tensor(0.0), g, {}

    init_fn, step_fn = dynamics.projected_langevin(energy_grad, dynamics.Ball(5.0), eta=0.1)
    with pytest.raises(FloatingPointError, match="non-finite"):
        step_fn(init_fn(torch.zeros(3, 2), torch.Generator()))


class _NaNAfter(torch.nn.Module):
    """Logits become NaN from the ``after``-th forward call on."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(1, 2)
        self.after, self.calls = after, 0

    def forward(self, ids, mask):
        self.calls += 1
        out = self.lin(ids[:, :1].float())
        return out * float("nan") if self.calls > self.after else out


def test_training_stops_on_nan_loss_and_writes_nothing_for_that_epoch(tmp_path):
    ds = _tiny_dataset()  # 64 examples, batch 16: 4 steps per epoch
    with pytest.raises(FloatingPointError, match="non-finite training loss.*epoch 2") as ei:
        fit(_NaNAfter(6), ds, TrainConfig(epochs=3, batch_size=16), seed=0,
            checkpoint_dir=tmp_path)
    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == "epoch-001"  # epoch 2 was never written
    meta, _ = ckpt.load_checkpoint(latest)
    assert all(math.isfinite(h["train_loss"]) for h in meta["history"])
    _record("non-finite", "training loss NaN in epoch 2 (fit, 3 epochs, checkpoints on)",
            f"{_describe(ei.value)}; latest checkpoint stays epoch-001, nothing written for "
            "epoch 2")


def test_atomic_json_refuses_nan_and_keeps_previous(tmp_path):
    path = tmp_path / "metrics.json"
    ckpt.atomic_write_json(path, {"accuracy": 0.5})
    with pytest.raises(FloatingPointError, match="non-finite value at accuracy"):
        ckpt.atomic_write_json(path, {"accuracy": float("nan")})
    assert json.loads(path.read_text()) == {"accuracy": 0.5}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


# ----------------------------------------------------------------------------- crashes


def test_atomic_write_crash_keeps_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.json"
    ckpt.atomic_write_json(path, {"v": 1})

    def boom(src, dst):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(ckpt.os, "replace", boom)
    with pytest.raises(OSError, match="simulated crash"):
        ckpt.atomic_write_json(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]  # no temp left


def test_checkpoint_crash_mid_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    model = _tiny_model("elu")
    ckpt.save_checkpoint(tmp_path, "epoch-001", model, {"epoch": 1}, {"x": torch.ones(2)})
    real = ckpt.save_file

    def crash_on_state(tensors, path, *a, **k):
        if path.endswith("state.safetensors"):
            raise OSError("simulated crash while writing state.safetensors")
        return real(tensors, path, *a, **k)

    monkeypatch.setattr(ckpt, "save_file", crash_on_state)
    with pytest.raises(OSError, match="simulated crash"):
        ckpt.save_checkpoint(tmp_path, "epoch-002", model, {"epoch": 2}, {"x": torch.ones(2)})
    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest.name == "epoch-001"
    meta, tensors = ckpt.load_checkpoint(latest)
    assert meta == {"epoch": 1} and torch.equal(tensors["x"], torch.ones(2))
    assert not (tmp_path / "epoch-002").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


class _CrashingJson:
    """Stand-in for a module's ``json``: serialising a result dies half-way (a crash while
    the result file is being written)."""

    def __init__(self):
        self.real = json

    def __getattr__(self, name):
        return getattr(self.real, name)

    def dump(self, obj, fh, **kw):
        fh.write(self.real.dumps(obj, **kw)[:25])
        raise OSError("simulated crash while writing")

    def dumps(self, obj, **kw):
        raise OSError("simulated crash while writing")


def test_bench_langevin_result_never_half_written(tmp_path, monkeypatch):
    from coulomb_attention.commands import bench_langevin as bl

    args = Namespace(out=str(tmp_path), quick=False, N=[4, 8], n=[8, 16], d=2, repeats=1,
                     threads=1, dtype="float64")
    monkeypatch.setattr(bl, "plot", lambda *a, **k: None)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    assert bl.run(args) == 0
    path = tmp_path / "langevin_step.json"
    first = json.loads(path.read_text())
    monkeypatch.setattr(bl, "json", _CrashingJson())
    with pytest.raises(OSError, match="simulated crash"):
        bl.run(args)
    try:
        again = json.loads(path.read_text())
    except json.JSONDecodeError:
        _record("crash", "bench langevin: crash while writing langevin_step.json",
                "file left truncated (not valid JSON)")
        raise
    assert again["rows"][0]["N"] == first["rows"][0]["N"]


TRAIN_ARGS = [
    "train", "--task", "sst2", "--attention", "favor", "--kernel", "learned",
    "--epochs", "3", "--warmup-epochs", "1", "--dim", "16", "--layers", "1", "--heads", "2",
    "--n-features", "8", "--train-limit", "256", "--eval-limit", "64", "--align-steps", "5",
    "--align-examples", "64", "--vocab-size", "300", "--max-length", "32",
    "--batch-size", "16", "--no-progress", "--threads", "1", "--seed", "3",
    "--data-dir", str(SAMPLES_DIR),
]


def _comparable(metrics: dict) -> dict:
    """metrics.json without wall times (which differ between runs)."""
    drop = {"timings", "time_s", "train_time_s"}

    def clean(obj):
        if isinstance(obj, dict):
            return {k: clean(v) for k, v in obj.items() if k not in drop}
        if isinstance(obj, list):
            return [clean(v) for v in obj]
        return obj

    return clean(metrics)


@pytest.mark.slow
def test_train_killed_with_sigkill_and_resumed_matches_uninterrupted(tmp_path, capsys):
    """`train` killed by SIGKILL right after its first fine-tuning checkpoint, then rerun with
    --resume, ends with exactly the metrics.json (minus wall times) of an uninterrupted run."""
    from coulomb_attention.cli import main

    killed = tmp_path / "killed"
    small = tmp_path / "small.json"  # fewer robustness evaluations (not under test here)
    small.write_text(json.dumps({"robust": {"kinds": ["delete"], "rates": [0.2],
                                            "advglue": False}}))
    args = [*TRAIN_ARGS, "--config", str(small)]
    env = {k: v for k, v in os.environ.items() if k != "COULOMB_DATA_DIR"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "coulomb_attention.cli", *args,
                             "--out", str(killed)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    threads = torch.get_num_threads()
    first = killed / "ckpt" / "finetune" / "latest.json"
    watch = {}

    def kill_after_first_checkpoint():
        deadline = time.monotonic() + 240
        while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        watch["seen"] = first.exists()
        proc.send_signal(signal.SIGKILL)

    watcher = threading.Thread(target=kill_after_first_checkpoint, daemon=True)
    watcher.start()
    try:
        # HF's WordPiece trainer breaks frequency ties in per-process hash order (docs/data.md),
        # so the reference uses the killed run's tokenizer file (its cache is keyed by the texts)
        tok = killed / "tokenizer.json"
        deadline = time.monotonic() + 240
        while not tok.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tok.exists(), f"no tokenizer written: {proc.stderr.read().decode()[-2000:]}"
        time.sleep(0.2)  # written atomically; let the writer finish its rename
        (tmp_path / "reference").mkdir()
        (tmp_path / "reference" / "tokenizer.json").write_bytes(tok.read_bytes())
        # the uninterrupted reference runs in this process meanwhile (same --threads 1)
        assert main([*args, "--out", str(tmp_path / "reference")]) == 0
        watcher.join(240)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        torch.set_num_threads(threads)
    assert watch.get("seen"), f"no checkpoint appeared: {proc.stderr.read().decode()[-2000:]}"
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "metrics.json").exists(), "the run finished before it was killed"
    state = json.loads((ckpt.latest_checkpoint(killed / "ckpt" / "finetune")
                        / "state.json").read_text())
    killed_at = state["epoch"]
    assert killed_at < 3
    try:
        assert main([*args, "--out", str(killed), "--resume"]) == 0
    finally:
        torch.set_num_threads(threads)
    ref = json.loads((tmp_path / "reference" / "metrics.json").read_text())
    res = json.loads((killed / "metrics.json").read_text())
    assert _comparable(res) == _comparable(ref)
    assert len(res["history"]["finetune"]) == 3
    capsys.readouterr()
    _record("crash", "train killed by SIGKILL after fine-tuning epoch "
            f"{killed_at} of 3, rerun with --resume",
            f"metrics.json identical to the uninterrupted run except wall times (accuracy "
            f"{res['accuracy']:.4f}, log_loss {res['log_loss']:.6f}); test wall time "
            f"{time.perf_counter() - t0:.0f} s")


# ----------------------------------------------------------------------------- untrusted files


class _Evil:
    """Unpickling this object runs ``touch MARKER`` (what a malicious checkpoint would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil_pickle(marker: Path) -> bytes:
    return pickle.dumps({"weight": _Evil(marker)})


def _evil_torch_zip(path: Path, marker: Path) -> None:
    torch.save({"weight": _Evil(marker)}, path)  # torch's zip format with a pickle inside


def _loaders(tmp_path: Path, payload_writer):
    """(name, callable) for each project loader, with the crafted file where it reads."""
    out = []
    # 1. model weights of a checkpoint
    d1 = tmp_path / "model"
    d1.mkdir()
    payload_writer(d1 / "model.safetensors")
    out.append(("checkpoint model.safetensors (load_model_file)",
                lambda: ckpt.load_model_file(d1 / "model.safetensors", _tiny_model("elu"))))
    # 2. optimizer/RNG state of a training checkpoint, found through latest.json
    root = tmp_path / "ckpt"
    ckpt.save_checkpoint(root, "epoch-001", _tiny_model("elu"), {"epoch": 1},
                         {"x": torch.ones(1)})
    payload_writer(root / "epoch-001" / "state.safetensors")
    out.append(("checkpoint state.safetensors (load_checkpoint)",
                lambda: ckpt.load_checkpoint(ckpt.latest_checkpoint(root))))
    # 3. resuming training from that checkpoint
    out.append(("fit(resume=True) on that checkpoint",
                lambda: fit(_tiny_model(), _tiny_dataset(), TrainConfig(epochs=2), seed=0,
                            checkpoint_dir=root, resume=True)))
    # 4. a pretrained BERT/MiniLM directory with pytorch_model.bin
    from coulomb_attention.nn import pretrained

    d4 = tmp_path / "bert"
    d4.mkdir()
    (d4 / "config.json").write_text(json.dumps({  # a valid config, so the weights are read
        "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 32, "vocab_size": 50, "max_position_embeddings": 16}))
    payload_writer(d4 / "pytorch_model.bin")
    out.append(("pretrained pytorch_model.bin (load_bert_state_dict)",
                lambda: pretrained.load_bert_state_dict(d4)))
    return out


@pytest.mark.parametrize("fmt", ("raw pickle", "torch.save zip"))
def test_crafted_pickle_is_never_executed(tmp_path, fmt):
    marker = tmp_path / "PWNED"

    def write(path: Path) -> None:
        if fmt == "raw pickle":
            path.write_bytes(_evil_pickle(marker))
        else:
            _evil_torch_zip(path, marker)

    assert not marker.exists()
    for name, load in _loaders(tmp_path, write):
        try:
            load()
        except Exception as exc:  # noqa: BLE001 (the loader must refuse; which error is below)
            _record("untrusted file", f"{fmt} as {name}", f"refused, {_describe(exc)}; "
                    f"marker file created: {marker.exists()}")
        else:
            _record("untrusted file", f"{fmt} as {name}", "loaded without error")
            pytest.fail(f"{name}: a crafted pickle loaded without error")
        assert not marker.exists(), f"{name}: unpickling executed code"


def test_crafted_checkpoint_gives_clear_error(tmp_path):
    marker = tmp_path / "PWNED"
    for name, load in _loaders(tmp_path, lambda p: p.write_bytes(_evil_pickle(marker)))[:3]:
        assert_user_error("untrusted file", f"clear error: {name}", load, (ValueError,),
                     r"safetensors|\.safetensors")


def test_crafted_pretrained_bin_gives_clear_error(tmp_path):
    marker = tmp_path / "PWNED"
    name, load = _loaders(tmp_path, lambda p: p.write_bytes(_evil_pickle(marker)))[3]
    exc = assert_user_error("untrusted file", f"clear error: {name}", load, (ValueError,),
                       "pytorch_model.bin")
    assert "weights_only=False" not in str(exc)


def test_corrupt_checkpoint_json_names_the_file(tmp_path):
    root = tmp_path / "ckpt"
    ckpt.save_checkpoint(root, "epoch-001", _tiny_model("elu"), {"epoch": 1})
    (root / "latest.json").write_text('{"name": "epo')  # torn write by an older tool
    assert_user_error("crash", "truncated latest.json", lambda: ckpt.latest_checkpoint(root),
                 USER_ERRORS, "latest.json")


def test_particles_round_trip_through_safetensors_only(tmp_path):
    """Learned particles travel in the model's safetensors file, bit-exact, and loading checks
    keys (a file of another architecture is refused)."""
    model = _tiny_model("favor")
    layer = model.attention_layers[0]
    layer.load_features_(torch.randn(8, 8, generator=torch.Generator().manual_seed(5)))
    ckpt.save_model_file(tmp_path / "m.safetensors", model)
    other = _tiny_model("favor", seed=1)
    ckpt.load_model_file(tmp_path / "m.safetensors", other)
    assert torch.equal(other.attention_layers[0].omega, layer.omega)
    with pytest.raises(RuntimeError, match="Missing key|Unexpected key|size mismatch"):
        ckpt.load_model_file(tmp_path / "m.safetensors", _tiny_model("elu"))
    with pytest.raises(FileNotFoundError, match="no model file"):
        ckpt.load_model_file(tmp_path / "absent.safetensors", other)


# ----------------------------------------------------------------------------- hypothesis

FAST = settings(max_examples=12, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FAST
@given(
    n=st.integers(4, 30),
    d=st.integers(1, 5),
    n_comp=st.integers(1, 12),
    log_scale=st.floats(-3, 3),
    label_kind=st.sampled_from(["int", "str", "bool", "float", "multiclass"]),
    feature_map=st.sampled_from(["rff", "positive", "softplus", "softmax"]),
    particles=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_estimators_finite_and_shaped(n, d, n_comp, log_scale, label_kind,
                                               feature_map, particles, seed):
    rng = np.random.default_rng(seed)
    Xh = rng.standard_normal((n, d)) * 10.0**log_scale
    base = np.arange(n) % (3 if label_kind == "multiclass" else 2)
    if label_kind == "str":
        y = np.array(["neg", "pos"])[base]
    elif label_kind == "bool":
        y = base.astype(bool)
    elif label_kind == "float":
        y = base * 2.5 - 1.0
    else:
        y = base
    if particles:
        est = ParticleFeatures(n_comp, feature_map=feature_map, n_steps=3, batch_size=8,
                               random_state=seed)
    else:
        est = RandomFeatures(n_comp, feature_map=feature_map, random_state=seed)
    phi = est.fit(Xh, y).transform(Xh)
    assert phi.shape == (n, n_comp) and phi.dtype == np.float64
    assert np.isfinite(phi).all()
    assert np.isfinite(est.omega_).all() and est.omega_.shape == (n_comp, d)
    if particles:
        assert all(math.isfinite(h["energy"]) for h in est.history_)


@FAST
@given(
    name=st.sampled_from(sorted(ATTENTION_FEATURES)),
    log_scale=st.floats(-2, 3),
    dtype=st.sampled_from(["float32", "float64", "bf16-autocast", "float16"]),
    lengths=st.lists(st.integers(1, 7), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_property_attention_finite_and_mask_invariant(name, log_scale, dtype, lengths, seed):
    """Finite outputs at every scale/precision; the outputs at real positions do not depend
    on what the padded positions hold, and equal each sequence run alone (float64)."""
    g = torch.Generator().manual_seed(seed)
    ka = KernelAttention(16, 2, feature_map=name, n_features=8, generator=seed).eval()
    T = max(lengths)
    x = torch.randn(len(lengths), T, 16, generator=g) * 10.0**log_scale
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    with torch.no_grad():
        if dtype == "bf16-autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = ka(x, mask)
        else:
            dt = getattr(torch, dtype)
            out = ka.to(dt)(x.to(dt), mask)
    assert out.shape == x.shape and torch.isfinite(out).all()
    # mask invariance in float64 (exact up to rounding)
    ka = ka.double()
    x = x.double()
    garbage = torch.where(mask[..., None], x, torch.randn(x.shape, generator=g,
                                                          dtype=torch.float64) * 1e3)
    with torch.no_grad():
        a = ka(x, mask)
        b = ka(garbage, mask)
        for i, L in enumerate(lengths):
            alone = ka(x[i:i + 1, :L], None)[0]
            scale = float(alone.abs().max()) + 1e-12
            assert float((a[i, :L] - b[i, :L]).abs().max()) <= 1e-9 * scale + 1e-9
            assert float((a[i, :L] - alone).abs().max()) <= 1e-7 * scale + 1e-9

"""Bad input to the public API and corrupt data files: a clear error naming the problem.

(Reliability, issue 7, issue 7; see docs/reliability.md.)
"""


from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from coulomb_attention import dynamics, energy, features
from coulomb_attention import metrics as M
from coulomb_attention.data import load_task
from coulomb_attention.data.registry import SAMPLES_DIR
from coulomb_attention.estimators import ImportanceFeatures, ParticleFeatures, RandomFeatures
from coulomb_attention.meanfield import Grid
from coulomb_attention.nn.attention import KernelAttention
from coulomb_attention.nn.model import ModelConfig
from coulomb_attention.train.loop import EncodedDataset, TrainConfig, fit
from coulomb_attention.train.phases import AlignConfig
from reliability_helpers import (
    USER_ERRORS,
    X_INF,
    X_NAN,
    X,
    Y,
    _fitted_pf,
    _ka,
    _pf,
    _tiny_dataset,
    _tiny_model,
    assert_user_error,
)

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
     "unknown feature_map 'nope'; valid: elu, favor, "),
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



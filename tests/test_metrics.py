"""Metrics against scikit-learn and closed forms, and their input checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sklearn.metrics as skm
from hypothesis import given, settings
from hypothesis import strategies as st

from coulomb_attention import metrics as M


def _random_probs(rng, n, c, concentration=1.0):
    return rng.dirichlet(np.full(c, concentration), size=n)


@pytest.mark.parametrize("c", [2, 3, 5])
@pytest.mark.parametrize("seed", [0, 1])
def test_against_sklearn(c, seed):
    rng = np.random.default_rng(seed)
    n = 400
    y = rng.integers(0, c, n)
    # informative but imperfect predictions
    logits = rng.normal(size=(n, c))
    logits[np.arange(n), y] += 1.0
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    pred = p.argmax(1)
    m = M.classification_metrics(p, y)
    assert set(m) == {"accuracy", "mcc", "f1", "ece", "log_loss", "brier"}
    assert all(isinstance(v, float) for v in m.values())
    assert m["accuracy"] == pytest.approx(skm.accuracy_score(y, pred), abs=1e-12)
    assert m["mcc"] == pytest.approx(skm.matthews_corrcoef(y, pred), abs=1e-12)
    if c == 2:
        ref_f1 = skm.f1_score(y, pred, pos_label=1, average="binary")
        # binary Brier over both classes is twice the usual (p1 - y)^2 form
        assert m["brier"] == pytest.approx(2 * skm.brier_score_loss(y, p[:, 1]), abs=1e-12)
    else:
        ref_f1 = skm.f1_score(y, pred, average="macro", labels=list(range(c)), zero_division=0)
    assert m["f1"] == pytest.approx(ref_f1, abs=1e-12)
    assert m["log_loss"] == pytest.approx(skm.log_loss(y, p, labels=list(range(c))), abs=1e-10)
    onehot = np.eye(c)[y]
    assert m["brier"] == pytest.approx(np.mean(np.sum((p - onehot) ** 2, 1)), abs=1e-12)


@pytest.mark.filterwarnings("ignore:A single label was found")
@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 60),
    c=st.integers(2, 4),
)
def test_mcc_f1_match_sklearn_property(seed, n, c):
    rng = np.random.default_rng(seed)
    p = _random_probs(rng, n, c, concentration=0.3)
    y = rng.integers(0, c, n)
    pred = p.argmax(1)
    assert M.matthews_corrcoef(p, y) == pytest.approx(skm.matthews_corrcoef(y, pred), abs=1e-9)
    if c == 2:
        ref = skm.f1_score(y, pred, pos_label=1, zero_division=0)
    else:
        ref = skm.f1_score(y, pred, average="macro", labels=list(range(c)), zero_division=0)
    assert M.f1(p, y) == pytest.approx(ref, abs=1e-12)


def test_mcc_closed_forms():
    y = np.array([0, 1, 0, 1, 1, 0])
    perfect = np.eye(2)[y]
    assert M.matthews_corrcoef(perfect, y) == pytest.approx(1.0)
    assert M.matthews_corrcoef(perfect[:, ::-1], y) == pytest.approx(-1.0)
    constant = np.tile([0.8, 0.2], (len(y), 1))  # always predicts class 0: undefined -> 0
    assert M.matthews_corrcoef(constant, y) == 0.0
    assert M.f1(constant, y) == 0.0  # no positive predictions


def test_ece_constant_confidence_closed_form():
    # confidence 0.9 on every example, 60% correct -> ECE = |0.6 - 0.9| = 0.3
    n = 1000
    y = np.zeros(n, dtype=np.int64)
    y[600:] = 1
    p = np.tile([0.9, 0.1], (n, 1))
    assert M.expected_calibration_error(p, y) == pytest.approx(0.3, abs=1e-12)
    bins = M.reliability_bins(p, y)
    full = [i for i, k in enumerate(bins["count"]) if k > 0]
    assert full == [13]  # 0.9 lies in (13/15, 14/15]
    assert bins["confidence"][13] == pytest.approx(0.9)
    assert bins["accuracy"][13] == pytest.approx(0.6)


def test_ece_perfectly_calibrated_is_near_zero():
    rng = np.random.default_rng(0)
    n = 200_000
    conf = rng.uniform(0.5, 1.0, n)
    correct = rng.uniform(size=n) < conf
    y = np.where(correct, 0, 1)  # the predicted class is 0 with probability conf
    p = np.stack([conf, 1 - conf], axis=1)
    ece = M.expected_calibration_error(p, y)
    assert ece < 0.01
    # a miscalibrated model (true accuracy 10 points lower) is clearly detected
    correct2 = rng.uniform(size=n) < conf - 0.1
    assert M.expected_calibration_error(p, np.where(correct2, 0, 1)) == pytest.approx(0.1, abs=0.01)


def test_ece_matches_naive_loop_and_bins_add_up():
    rng = np.random.default_rng(3)
    n, c, n_bins = 500, 3, 15
    p = _random_probs(rng, n, c, 0.5)
    y = rng.integers(0, c, n)
    conf, pred = p.max(1), p.argmax(1)
    naive = 0.0
    edges = np.linspace(0, 1, n_bins + 1)
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        sel = (conf > lo) & (conf <= hi)
        if sel.any():
            naive += sel.mean() * abs((pred[sel] == y[sel]).mean() - conf[sel].mean())
    assert M.expected_calibration_error(p, y, n_bins) == pytest.approx(naive, abs=1e-12)
    bins = M.reliability_bins(p, y, n_bins)
    assert all(len(v) == n_bins for v in bins.values())
    assert sum(bins["count"]) == n
    assert bins["lower"][0] == 0.0 and bins["upper"][-1] == 1.0
    ece = sum(
        k / n * abs(a - cf)
        for k, a, cf in zip(bins["count"], bins["accuracy"], bins["confidence"], strict=True)
        if k
    )
    assert ece == pytest.approx(naive, abs=1e-12)
    empty = [i for i, k in enumerate(bins["count"]) if k == 0]
    assert empty, "with C=3 the bins below 1/3 must be empty"
    assert all(math.isnan(bins["accuracy"][i]) for i in empty)


def test_bin_edges_are_right_closed():
    # confidence exactly on an edge k/15 belongs to the bin that ends there
    conf = np.array([9 / 15, 14 / 15, 1.0, 0.5])
    p = np.stack([conf, 1 - conf], axis=1)
    bins = M.reliability_bins(p, np.zeros(4, dtype=int))
    assert [i for i, k in enumerate(bins["count"]) if k] == [7, 8, 13, 14]
    assert bins["upper"][8] == pytest.approx(9 / 15)


def test_torch_inputs_accepted():
    torch = pytest.importorskip("torch")
    logits = torch.randn(50, 3, requires_grad=True)
    y = torch.randint(0, 3, (50,))
    out = M.classification_metrics(torch.softmax(logits, -1), y)
    ref = M.classification_metrics(torch.softmax(logits, -1).detach().numpy(), y.numpy())
    assert out == ref


def test_log_loss_is_clipped():
    p = np.array([[1.0, 0.0], [0.5, 0.5]])
    y = np.array([1, 0])
    expected = (-math.log(1e-15) - math.log(0.5)) / 2
    assert M.log_loss(p, y) == pytest.approx(expected)
    assert math.isfinite(M.classification_metrics(p, y)["log_loss"])


def test_brier_closed_form():
    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    y = np.array([0, 1])
    expected = ((0.3**2 + 0.2**2 + 0.1**2) + (0.1**2 + 0.9**2 + 0.8**2)) / 2
    assert M.brier_score(p, y) == pytest.approx(expected)


def test_float32_probs_accepted():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(100, 2)).astype(np.float32)
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    y = rng.integers(0, 2, 100)
    out = M.classification_metrics(p, y)
    assert 0 <= out["accuracy"] <= 1


@pytest.mark.parametrize(
    "probs, labels, match",
    [
        (np.array([0.2, 0.8]), np.array([0, 1]), "shape"),  # 1-D
        (np.ones((2, 2, 2)) / 2, np.array([0, 1]), "shape"),
        (np.ones((2, 1)), np.array([0, 0]), "2 columns"),
        (np.array([[np.nan, 1.0], [0.5, 0.5]]), np.array([0, 1]), "NaN"),
        (np.array([[0.6, 0.6], [0.5, 0.5]]), np.array([0, 1]), "sum to 1"),
        (np.array([[1.2, -0.2], [0.5, 0.5]]), np.array([0, 1]), r"\[0, 1\]"),
        (np.array([[0.5, 0.5], [0.5, 0.5]]), np.array([0, 2]), "0..1"),
        (np.array([[0.5, 0.5], [0.5, 0.5]]), np.array([-1, 0]), "0..1"),
        (np.array([[0.5, 0.5], [0.5, 0.5]]), np.array([0, 1, 1]), "2 rows"),
        (np.array([[0.5, 0.5], [0.5, 0.5]]), np.array([[0, 1]]), "shape"),
        (np.zeros((0, 2)), np.zeros(0, dtype=int), "empty"),
    ],
)
@pytest.mark.parametrize(
    "fn",
    [
        M.classification_metrics,
        M.expected_calibration_error,
        M.reliability_bins,
        M.accuracy,
        M.log_loss,
        M.brier_score,
    ],
)
def test_bad_input_raises_value_error(fn, probs, labels, match):
    with pytest.raises(ValueError, match=match):
        fn(probs, labels)


def test_bad_types():
    p = np.array([[0.5, 0.5], [0.5, 0.5]])
    with pytest.raises(TypeError, match="labels must be integers"):
        M.classification_metrics(p, np.array([0.5, 1.0]))
    with pytest.raises(TypeError, match="probs"):
        M.classification_metrics(np.array([["a", "b"]]), np.array([0]))
    with pytest.raises(ValueError, match="n_bins"):
        M.expected_calibration_error(p, np.array([0, 1]), n_bins=0)

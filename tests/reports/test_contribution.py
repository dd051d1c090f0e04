"""attention_contribution: softmax minus the no-mixing control, paired over seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from coulomb_attention.reports.contribution import attention_contribution


def _rows(task, att, accs, kernel="vanilla"):
    return [{"task": task, "attention": att, "kernel": kernel, "seed": s, "accuracy": a}
            for s, a in enumerate(accs)]


def test_contribution_is_the_paired_t_interval():
    soft = [0.80, 0.79, 0.81, 0.805, 0.795]
    none = [0.70, 0.71, 0.69, 0.705, 0.70]
    rows = _rows("a", "softmax", soft) + _rows("a", "none", none)
    rows += _rows("a", "favor", [0.0] * 5) + _rows("a", "favor", [1.0] * 5, kernel="learned")
    (res,) = attention_contribution(rows)
    d = np.array(soft) - np.array(none)
    half = stats.t.ppf(0.975, 4) * d.std(ddof=1) / math.sqrt(5)
    assert res["n_pairs"] == 5 and res["seeds"] == [0, 1, 2, 3, 4]
    assert abs(res["diff_mean"] - d.mean()) < 1e-12
    assert abs(res["diff_low"] - (d.mean() - half)) < 1e-12
    assert abs(res["diff_high"] - (d.mean() + half)) < 1e-12
    assert abs(res["reference_mean"] - np.mean(soft)) < 1e-12
    assert res["can_rank_kernels"] is True


def test_a_task_within_noise_cannot_rank_kernels():
    rows = (_rows("qqp", "softmax", [0.722, 0.720, 0.724, 0.721])
            + _rows("qqp", "none", [0.721, 0.723, 0.720, 0.722, 0.5]))  # seed 4 has no pair
    (res,) = attention_contribution(rows)
    assert res["n_pairs"] == 4 and res["diff_low"] < 0 < res["diff_high"]
    assert res["can_rank_kernels"] is False
    # one pair: no interval, no verdict of a contribution
    (one,) = attention_contribution(_rows("x", "softmax", [0.9]) + _rows("x", "none", [0.1]))
    assert math.isnan(one["diff_low"]) and one["can_rank_kernels"] is False
    # attention that hurts beyond noise does not rank kernels either
    (neg,) = attention_contribution(_rows("y", "softmax", [0.5, 0.51, 0.49])
                                    + _rows("y", "none", [0.7, 0.71, 0.69]))
    assert neg["diff_high"] < 0 and neg["can_rank_kernels"] is False


def test_tasks_are_separate_and_duplicates_raise():
    rows = (_rows("b", "softmax", [0.9, 0.8]) + _rows("b", "none", [0.1, 0.2])
            + _rows("a", "softmax", [0.5, 0.6]) + _rows("c", "softmax", [0.5]))
    res = attention_contribution(rows)
    assert [r["task"] for r in res] == ["b"]  # task a and c have no control
    with pytest.raises(ValueError, match="two softmax rows"):
        attention_contribution(rows + _rows("b", "softmax", [0.7]))

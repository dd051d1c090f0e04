import math

import numpy as np
import pytest
from scipy import stats as sps

from coulomb_attention.stats import loglog_fit, loglog_slope, mean_interval, paired_difference


def test_paired_difference_matches_scipy_t_interval():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=7), rng.normal(size=7)
    mean, low, high, n = paired_difference(a, b)
    d = a - b
    lo, hi = sps.t.interval(0.95, 6, loc=d.mean(), scale=sps.sem(d))
    assert n == 7 and mean == pytest.approx(d.mean())
    assert low == pytest.approx(lo) and high == pytest.approx(hi)


def test_paired_difference_small_and_bad_input():
    assert math.isnan(paired_difference([1.0], [0.5])[1])
    assert paired_difference([1.0], [0.5])[0] == pytest.approx(0.5)
    assert paired_difference([], [])[3] == 0
    with pytest.raises(ValueError, match="equal length"):
        paired_difference([1, 2], [1])


def test_mean_interval_drops_nan_and_covers_mean():
    mean, low, high, n = mean_interval([1.0, 2.0, float("nan"), 3.0])
    assert n == 3 and mean == pytest.approx(2.0) and low < 2.0 < high


def test_loglog_slope_recovers_power_law():
    x = np.array([16, 32, 64, 128.0])
    assert loglog_slope(x, 3 * x**-0.5) == pytest.approx(-0.5)
    assert math.isnan(loglog_slope([1.0, 1.0], [1.0, 2.0]))
    assert math.isnan(loglog_slope([1.0, 2.0], [-1.0, 2.0]))


def test_loglog_fit_returns_the_intercept_too():
    x = np.array([2.0, 4.0, 8.0, 16.0])
    slope, intercept = loglog_fit(x, 3 * x**-0.5)
    assert slope == pytest.approx(-0.5) and intercept == pytest.approx(math.log(3.0))
    assert all(math.isnan(v) for v in loglog_fit([1.0], [1.0]))

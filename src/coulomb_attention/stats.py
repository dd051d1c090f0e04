"""Statistics every report uses: means with intervals, paired differences, log-log slopes.

One home for the small statistics of the studies and reports (the seed-paired comparisons of
fair kernel comparisons, ``docs/DESIGN.md``): reports and studies import from here instead of
keeping their own copies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["loglog_fit", "loglog_slope", "mean_interval", "paired_difference", "t_quantile"]


def t_quantile(n: int, level: float = 0.95) -> float:
    """Two-sided Student-t quantile for ``n`` observations (``n - 1`` degrees of freedom)."""
    from scipy import stats

    if n < 2:
        return math.nan
    return float(stats.t.ppf(0.5 + level / 2, n - 1))


def _t_interval(v: np.ndarray, level: float) -> tuple[float, float, float, int]:
    """Mean of the 1-D sample ``v`` and its t-interval ``(mean, low, high, n)``."""
    n = int(v.size)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    mean = float(v.mean())
    if n < 2:
        return mean, math.nan, math.nan, n
    half = t_quantile(n, level) * float(v.std(ddof=1)) / math.sqrt(n)
    return mean, mean - half, mean + half, n


def mean_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float, int]:
    """Mean of the finite ``values`` and its t-interval: ``(mean, low, high, n)``.

    NaN values are dropped; with fewer than 2 values the interval is ``(nan, nan)``.
    """
    v = np.asarray([x for x in values if not math.isnan(float(x))], dtype=float)
    return _t_interval(v, level)


def paired_difference(a: Sequence[float], b: Sequence[float],
                      level: float = 0.95) -> tuple[float, float, float, int]:
    """Mean of ``a - b`` (paired, same order) and its t-interval ``(mean, low, high, n)``.

    With fewer than 2 pairs the interval is ``(nan, nan)``.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired samples must be 1-D of equal length, got {a.shape} and {b.shape}")
    return _t_interval(a - b, level)


def loglog_fit(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit ``log y = slope * log x + intercept`` over the positive, finite pairs;
    returns ``(slope, intercept)``.

    ``(nan, nan)`` with fewer than two usable points or fewer than two distinct ``x``.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"x and y must be 1-D of the same length, got {x.shape} and {y.shape}")
    ok = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 2 or np.unique(x[ok]).size < 2:
        return math.nan, math.nan
    slope, intercept = np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)
    return float(slope), float(intercept)


def loglog_slope(x: Sequence[float], y: Sequence[float]) -> float:
    """The slope of :func:`loglog_fit` (NaN where it has none)."""
    return loglog_fit(x, y)[0]

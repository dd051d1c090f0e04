"""Classification metrics as pure numpy functions of predicted probabilities and labels.

Every function takes ``probs`` of shape (n, C) (rows are probability vectors, C >= 2) and
integer ``labels`` of shape (n,) in ``0 .. C-1``, and checks them: wrong shapes, NaN/inf,
negative entries, rows not summing to 1, out-of-range labels and mismatched lengths raise
``ValueError`` (non-numeric input raises ``TypeError``).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "accuracy",
    "brier_score",
    "check_probs_labels",
    "classification_metrics",
    "expected_calibration_error",
    "f1",
    "log_loss",
    "matthews_corrcoef",
    "reliability_bins",
]

_SUM_TOL = 1e-3  # float32 softmax rows sum to 1 within ~1e-6; this only catches real mistakes


def check_probs_labels(
    probs, labels, *, sum_tol: float = _SUM_TOL
) -> tuple[np.ndarray, np.ndarray]:
    """Validate and convert ``probs`` (n, C) float64 and ``labels`` (n,) int64.

    Raises
    ------
    TypeError
        Non-numeric probs, non-integer labels.
    ValueError
        Shape, NaN/inf, negative or > 1 entries, rows not summing to 1 (within ``sum_tol``),
        labels outside ``0..C-1``, different numbers of rows, empty input.
    """
    if hasattr(probs, "detach"):  # torch tensors (also on GPU or requiring grad)
        probs = probs.detach().cpu().numpy()
    if hasattr(labels, "detach"):
        labels = labels.detach().cpu().numpy()
    p = np.asarray(probs)
    if p.dtype == object or p.dtype.kind not in "biuf" or p.dtype.kind == "b":
        raise TypeError(f"probs must be a real floating array, got dtype {p.dtype}")
    p = p.astype(np.float64, copy=False)
    if p.ndim != 2:
        raise ValueError(
            f"probs must have shape (n, C) with C >= 2 columns, got shape {p.shape}"
            + ("; for binary P(y=1) use np.stack([1 - p, p], axis=1)" if p.ndim == 1 else "")
        )
    n, c = p.shape
    if c < 2:
        raise ValueError(f"probs must have at least 2 columns (classes), got shape {p.shape}")
    if n == 0:
        raise ValueError("probs is empty (0 rows)")
    if not np.isfinite(p).all():
        raise ValueError(f"probs contains {int((~np.isfinite(p)).sum())} NaN or infinite value(s)")
    if (p < -1e-12).any() or (p > 1 + 1e-12).any():
        raise ValueError(f"probs must lie in [0, 1]; got min {p.min():.4g}, max {p.max():.4g}")
    row_err = np.abs(p.sum(axis=1) - 1.0)
    if (row_err > sum_tol).any():
        i = int(np.argmax(row_err))
        raise ValueError(
            f"rows of probs must sum to 1; {int((row_err > sum_tol).sum())} row(s) do not "
            f"(row {i} sums to {p[i].sum():.6g}); apply softmax to logits first"
        )
    y = np.asarray(labels)
    if y.dtype == object or y.dtype.kind not in "iu":
        if y.dtype.kind == "f" and np.isfinite(y).all() and (y == np.round(y)).all():
            y = y.astype(np.int64)
        else:
            raise TypeError(f"labels must be integers, got dtype {y.dtype}")
    if y.ndim != 1:
        raise ValueError(f"labels must have shape (n,), got shape {y.shape}")
    if y.shape[0] != n:
        raise ValueError(f"probs has {n} rows but labels has {y.shape[0]} entries")
    if y.min() < 0 or y.max() >= c:
        raise ValueError(
            f"labels must be in 0..{c - 1} (probs has {c} columns); got min {y.min()}, "
            f"max {y.max()}"
        )
    return np.clip(p, 0.0, 1.0), y.astype(np.int64, copy=False)


def _confusion(pred: np.ndarray, y: np.ndarray, c: int) -> np.ndarray:
    """Confusion matrix (C, C): rows true class, columns predicted class."""
    return np.bincount(y * c + pred, minlength=c * c).reshape(c, c)


def accuracy(probs, labels) -> float:
    """Fraction of examples whose argmax class equals the label."""
    p, y = check_probs_labels(probs, labels)
    return float(np.mean(p.argmax(axis=1) == y))


def matthews_corrcoef(probs, labels) -> float:
    """Matthews correlation of the argmax predictions (multiclass R_K of Gorodkin 2004).

    Returns 0.0 when it is undefined (a constant prediction or a single true class), as
    scikit-learn does.
    """
    p, y = check_probs_labels(probs, labels)
    c = p.shape[1]
    cm = _confusion(p.argmax(axis=1), y, c).astype(np.float64)
    t = cm.sum(axis=1)  # true counts per class
    q = cm.sum(axis=0)  # predicted counts per class
    s = cm.sum()
    correct = np.trace(cm)
    cov_ytyp = correct * s - t @ q
    cov_ypyp = s * s - q @ q
    cov_ytyt = s * s - t @ t
    denom = cov_ytyt * cov_ypyp
    if denom == 0:
        return 0.0
    return float(cov_ytyp / np.sqrt(denom))


def f1(probs, labels) -> float:
    """F1 of the argmax predictions: of class 1 when C = 2, else the macro average over all C
    classes. A class with no true and no predicted examples has F1 = 0 (scikit-learn's
    ``zero_division=0``)."""
    p, y = check_probs_labels(probs, labels)
    c = p.shape[1]
    cm = _confusion(p.argmax(axis=1), y, c).astype(np.float64)
    tp = np.diag(cm)
    denom = cm.sum(axis=0) + cm.sum(axis=1)  # 2TP + FP + FN
    per_class = np.divide(2 * tp, denom, out=np.zeros(c), where=denom > 0)
    return float(per_class[1] if c == 2 else per_class.mean())


def log_loss(probs, labels, eps: float = 1e-15) -> float:
    """Mean negative log-probability of the true class, with probabilities clipped to
    ``[eps, 1]`` so a confident mistake costs at most ``-log(eps)``."""
    p, y = check_probs_labels(probs, labels)
    if not 0 < eps < 1:
        raise ValueError(f"eps must be in (0, 1), got {eps!r}")
    py = np.clip(p[np.arange(len(y)), y], eps, 1.0)
    return float(-np.mean(np.log(py)))


def brier_score(probs, labels) -> float:
    """Mean over examples of sum_c (p_c - onehot_c)^2 (in [0, 2])."""
    p, y = check_probs_labels(probs, labels)
    onehot = np.zeros_like(p)
    onehot[np.arange(len(y)), y] = 1.0
    return float(np.mean(np.sum((p - onehot) ** 2, axis=1)))


def _bin_stats(p: np.ndarray, y: np.ndarray, n_bins: int):
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}")
    conf = p.max(axis=1)
    correct = (p.argmax(axis=1) == y).astype(np.float64)
    # bins (edges[i], edges[i+1]] exactly as reported by reliability_bins; a confidence of 0
    # (impossible for C >= 2) would go to bin 0
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    idx = np.clip(np.searchsorted(edges, conf, side="left") - 1, 0, n_bins - 1)
    count = np.bincount(idx, minlength=n_bins)
    sum_conf = np.bincount(idx, weights=conf, minlength=n_bins)
    sum_acc = np.bincount(idx, weights=correct, minlength=n_bins)
    return count, sum_conf, sum_acc


def expected_calibration_error(probs, labels, n_bins: int = 15) -> float:
    """ECE with ``n_bins`` equal-width bins on the max probability (confidence):
    sum_b (n_b / n) |accuracy_b - confidence_b|."""
    p, y = check_probs_labels(probs, labels)
    count, sum_conf, sum_acc = _bin_stats(p, y, n_bins)
    return float(np.sum(np.abs(sum_acc - sum_conf)) / len(y))


def reliability_bins(probs, labels, n_bins: int = 15) -> dict[str, list]:
    """Per-bin statistics of a reliability diagram.

    Returns
    -------
    dict
        Lists of length ``n_bins``: ``lower``, ``upper`` (bin edges; bins are (lower, upper]),
        ``confidence`` (mean max probability), ``accuracy`` (fraction correct), ``count``
        (int). Empty bins have count 0 and NaN confidence and accuracy.
    """
    p, y = check_probs_labels(probs, labels)
    count, sum_conf, sum_acc = _bin_stats(p, y, n_bins)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        conf = np.where(count > 0, sum_conf / np.maximum(count, 1), np.nan)
        acc = np.where(count > 0, sum_acc / np.maximum(count, 1), np.nan)
    return {
        "lower": edges[:-1].tolist(),
        "upper": edges[1:].tolist(),
        "confidence": conf.tolist(),
        "accuracy": acc.tolist(),
        "count": [int(v) for v in count],
    }


def classification_metrics(probs, labels, n_bins: int = 15) -> dict[str, float]:
    """All six metrics at once.

    Parameters
    ----------
    probs : np.ndarray, shape (n, C)
        Predicted class probabilities (rows sum to 1).
    labels : np.ndarray, shape (n,)
        Integer labels in ``0..C-1``.
    n_bins : int
        ECE bins.

    Returns
    -------
    dict
        ``accuracy, mcc, f1, ece, log_loss, brier`` as Python floats.
    """
    p, y = check_probs_labels(probs, labels)
    return {
        "accuracy": accuracy(p, y),
        "mcc": matthews_corrcoef(p, y),
        "f1": f1(p, y),
        "ece": expected_calibration_error(p, y, n_bins=n_bins),
        "log_loss": log_loss(p, y),
        "brier": brier_score(p, y),
    }

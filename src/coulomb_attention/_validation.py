"""Input validation and randomness conversion, in one place.

Public functions raise ``ValueError``/``TypeError`` that name the problem; ``assert`` is only
for internal invariants.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that need it: the CLI's --help paths import this
# module and should not pay for torch (1-3 s).

__all__ = [
    "as_float_tensor",
    "check_choice",
    "check_finite_tensor",
    "check_positive",
    "check_nonnegative",
    "torch_generator",
]


def check_positive(name: str, value, *, allow_inf: bool = False, integer: bool = False):
    """Return ``value`` if it is a positive number, else raise ``ValueError``/``TypeError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if integer and not float(value).is_integer():
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if math.isnan(value) or value <= 0 or (math.isinf(value) and not allow_inf):
        kind = "a positive integer" if integer else "a positive finite number"
        if allow_inf:
            kind = "positive (inf allowed)"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    return int(value) if integer else value


def check_nonnegative(name: str, value):
    """Return ``value`` if it is a finite number >= 0, else raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def check_choice(name: str, value: str, valid: Iterable[str]) -> str:
    """Raise ``ValueError`` listing the valid names when ``value`` is not one of them."""
    valid = sorted(valid)
    if not isinstance(value, str) or value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")
    return value


def check_finite_tensor(name: str, x: torch.Tensor) -> torch.Tensor:
    """Raise ``ValueError`` if ``x`` holds NaN or inf."""
    import torch

    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        n_bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"{name} contains {n_bad} NaN or infinite value(s)")
    return x


def as_float_tensor(
    name: str,
    x,
    *,
    ndim: int | Sequence[int] | None = None,
    dtype: torch.dtype | None = None,
    allow_empty: bool = False,
) -> torch.Tensor:
    """Convert array-like ``x`` to a finite floating tensor with a checked number of dims.

    Parameters
    ----------
    name : str
        Name used in error messages.
    x : array-like or torch.Tensor
    ndim : int or sequence of int, optional
        Allowed numbers of dimensions.
    dtype : torch.dtype, optional
        Target floating dtype; by default float64 for numpy float64 input, else float32.
    """
    import torch

    if isinstance(x, torch.Tensor):
        t = x
    else:
        try:
            arr = np.asarray(x)
        except Exception as exc:  # ragged lists etc.
            raise TypeError(f"{name} could not be converted to an array: {exc}") from exc
        if arr.dtype == object or arr.dtype.kind in "USV":
            try:
                arr = arr.astype(np.float64)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"{name} must be numeric, got dtype {arr.dtype}") from exc
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"{name} must be numeric, got dtype {arr.dtype}")
        t = torch.from_numpy(np.ascontiguousarray(arr))
    if t.is_complex() or t.dtype == torch.bool and dtype is None:
        raise TypeError(f"{name} must be a real numeric array, got dtype {t.dtype}")
    if dtype is None:
        dtype = t.dtype if t.is_floating_point() else torch.float32
    t = t.to(dtype)
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.ndim not in allowed:
            raise ValueError(
                f"{name} must have {' or '.join(map(str, allowed))} dimension(s), "
                f"got shape {tuple(t.shape)}"
            )
    if not allow_empty and t.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(t.shape)})")
    return check_finite_tensor(name, t)


def torch_generator(random_state=None, device: str | torch.device = "cpu") -> torch.Generator:
    """The one place where a user's ``random_state`` becomes a ``torch.Generator``.

    ``None`` draws fresh entropy, an ``int`` seeds deterministically, a numpy
    ``RandomState``/``Generator`` is consumed for a seed, a ``torch.Generator`` is returned as is.
    """
    import torch

    if isinstance(random_state, torch.Generator):
        return random_state
    g = torch.Generator(device=device)
    if random_state is None:
        seed = int(np.random.SeedSequence().generate_state(1, dtype=np.uint64)[0] >> 1)
    elif isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        if random_state < 0:
            raise ValueError(f"random_state must be >= 0, got {random_state}")
        seed = int(random_state)
    elif isinstance(random_state, np.random.RandomState):
        seed = int(random_state.randint(0, 2**31 - 1))
    elif isinstance(random_state, np.random.Generator):
        seed = int(random_state.integers(0, 2**63 - 1))
    else:
        raise TypeError(
            "random_state must be None, an int, a numpy RandomState/Generator or a "
            f"torch.Generator, got {type(random_state).__name__}"
        )
    g.manual_seed(seed)
    return g

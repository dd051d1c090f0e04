"""Attention ops (re-exported from :mod:`coulomb_attention.nn.ops`, where each idea lives in
its own module): FAVOR+ with the order picked by cost, linear attention from features, causal
modes, the naive twins and exact softmax attention."""

from .ops import *  # noqa: F403  (the public ops, one list: ops.__all__)
from .ops import __all__  # noqa: F401

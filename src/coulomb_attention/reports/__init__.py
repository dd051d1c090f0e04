"""Reports and plots, built from result files only (never by re-running anything).

:func:`pyplot` is the one place that selects matplotlib's non-interactive backend.
"""

from __future__ import annotations

__all__ = ["pyplot"]


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt

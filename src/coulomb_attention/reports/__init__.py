"""Reports and plots, built from result files only (never by re-running anything).

:func:`pyplot` is the one place that selects matplotlib's non-interactive backend.
"""

from __future__ import annotations

__all__ = ["data_note", "pyplot"]


def data_note(data: dict | None) -> str:
    """One line on where a result's task data came from (``data.data_source``'s record):
    the shipped samples (loud: smoke tests only), a directory, or the Hugging Face hub;
    ``None`` (a result file written before the field existed): not recorded."""
    if not data:
        return "data: not recorded (a result file from before the data source was recorded)"
    source, path = data.get("source"), data.get("path")
    if source == "samples":
        return ("data: the SHIPPED SAMPLE of the package (no --data-dir): smoke tests only, "
                "not a result")
    if source == "hf":
        return "data: the Hugging Face hub (--data-dir hf)"
    return f"data: {path}"


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt

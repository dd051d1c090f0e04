"""The one layer-wise driver: the particles of each attention layer fitted in order, one
checkpoint hook after every layer, one way to resume (:func:`run_phase_a`), and the particle
system a config describes (:func:`langevin_setup`).

A conversion's distillation (:func:`coulomb_attention.convert.distill.distill_attention`) is
its main user; the training pipeline's phase A (label alignment, ``train.phases``) and the
MQAR fits (``train.recall``, ``train.recall_teacher``) supply their own ``fit_layer`` to the
same loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..dynamics import ParticleConfig
from ..energy import make_potential

__all__ = ["langevin_setup", "run_phase_a"]


def langevin_setup(config: ParticleConfig, dh: int):
    """The particle system a phase-A config describes, for head dimension ``dh``.

    ``config`` is a :class:`~coulomb_attention.dynamics.ParticleConfig` (``AlignConfig``,
    ``DistillConfig``, ``FitConfig``): returns ``(potential, projection, schedule)``, the pair
    potential (None when ``lam == 0``), the ball of radius ``radius * sqrt(dh)`` and the cosine
    step-size schedule ``eta -> eta_end`` over ``steps``.
    """
    potential = (make_potential(config.potential, s=config.s, eps=config.eps, dim=dh)
                 if config.lam > 0 else None)
    return potential, config.projection(dh), config.schedule()


def run_phase_a(
    layer_indices: Iterable[int],
    fit_layer: Callable[[int], list[dict[str, Any]]],
    *,
    generator: torch.Generator | None = None,
    resume: dict[str, Any] | None = None,
    on_layer_done: Callable[[int, list[dict], torch.Tensor], None] | None = None,
) -> list[dict[str, Any]]:
    """The one phase-A driver: fit the particles of the given layers in order, with one
    checkpoint hook after each layer and one way to resume.

    Every phase A (label alignment :func:`align_features`, attention distillation
    ``convert.distill.distill_attention``, MQAR's token-pair and teacher-route fits in
    ``train.recall`` / ``train.recall_teacher``) supplies only ``fit_layer``; the loop over
    layers, the timing, the checkpoint and the resume live here.

    Parameters
    ----------
    layer_indices : the layers, in order (a layer ``fit_layer`` skips returns ``[]``)
    fit_layer : ``fit_layer(li) -> records`` of layer ``li``; moves its ``omega`` in place
    generator : the run's generator (its state is checkpointed and restored on resume)
    resume : ``{"next_layer", "records", "generator_state"}`` from ``on_layer_done``: layers
        before ``next_layer`` are skipped and the run continues exactly as if uninterrupted
    on_layer_done : ``on_layer_done(next_layer, records, generator_state)`` after every layer

    Returns
    -------
    list of dict: all layers' records, each with ``time_s`` (its layer's wall time)
    """
    records: list[dict[str, Any]] = []
    start = 0
    if resume is not None:
        if generator is None:
            raise ValueError("resuming phase A needs the run's generator")
        records = [dict(r) for r in resume["records"]]
        start = int(resume["next_layer"])
        generator.set_state(resume["generator_state"])
    for li in layer_indices:
        if li < start:
            continue
        t0 = time.perf_counter()
        layer_records = fit_layer(li)
        elapsed = time.perf_counter() - t0
        for r in layer_records:
            r["time_s"] = elapsed
        records.extend(layer_records)
        if on_layer_done is not None:
            on_layer_done(li + 1, records,
                          generator.get_state() if generator is not None else None)
    return records

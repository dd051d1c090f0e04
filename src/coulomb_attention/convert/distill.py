"""Attention distillation: learn a pretrained encoder's particles from its own softmax attention.

In a pretrained encoder the queries and keys are fixed, so the kernel is everything. Layers are
converted in order; for layer ``l`` the inputs ``h`` are computed with the already-converted
layers ``< l`` (:func:`coulomb_attention.convert.capture.layer_inputs`), the teacher row of a
query is the layer's own softmax row ``softmax_s(q_t . k_s)`` on those inputs, and the
particles of each head group move by the one particle fit
(:func:`coulomb_attention.dynamics.fit_particles`, the method ``config.method``) on

    H(Omega) = D_teacher(Omega) + lam W_{N,s}(Omega)

with ``D_teacher`` the mean row KL (+ optional output MSE) of
:class:`coulomb_attention.energy.TeacherAttention`. Only ``omega`` changes (the method); every
projection stays as pretrained.

Scalings (see docs/convert.md): queries/keys are scaled by ``d_head**-0.25`` as in
:class:`~coulomb_attention.nn.KernelAttention`; the data term is a *mean* over sampled query
rows (of all sequences and heads of the group), so it is O(1) whatever the number of rows;
the driver's drift is ``eta * N * grad`` (``N * grad_i`` is O(1) for a mean loss), capped at
``max_drift`` per particle and step (default 0.3, in the particles' units, ``|omega| ~
sqrt(d_head)``): a clipped gradient flow in which particles with small gradients still move
(``normalize_drift=True`` divides by a running RMS over all particles instead, which on MiniLM
let a few particles with huge gradients freeze the rest: measured worse); the ball radius is
``radius * sqrt(d_head)``; ``beta`` (default 1e6, 0 = infinity) sets the Langevin noise
``sqrt(2 eta / beta)``.

The baseline ``method="hedgehog"`` (Zhang et al. 2024, "The Hedgehog & the Porcupine"): a
learned linear map inside the exponential, ``phi(x) = [softmax(W x), softmax(-W x)]`` with
``W`` of shape ``(M/2, d_head)`` (so ``M`` features), trained with Adam on the same loss and the
same batches; stored in ``omega`` as ``[W; -W]``.

``method="weighted"``: Wasserstein-Fisher-Rao particles
(:mod:`coulomb_attention.dynamics.weighted`). Each head group's particles carry masses (uniform
at the start); the row KL sees features scaled by ``sqrt(M w_i)``
(:class:`~coulomb_attention.energy.TeacherAttention` with ``weights=``); positions follow the
same projected Langevin transport as ``langevin`` (same ``eta``, ``beta``, ``lam``, one run per
head group), masses the Fisher-Rao reaction (``tau``) with birth-death below ``w_min / M``.
The masses go into the layer (``KernelAttention.load_masses_``) and into its checkpoint; the
joint refinement then moves the positions only, with the masses held.

:func:`align_to_softmax` (the earlier Pearson-alignment phase) is kept as a thin option over
:func:`distill_attention` for existing callers.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._validation import check_choice, check_nonnegative, check_positive
from ..dynamics import (
    ParticleConfig,
    adam_fit,
    cycle,
    fit_particles,
    subsample_trace,
)
from ..energy import (
    POTENTIALS,
    EmbeddingTeacher,
    Hamiltonian,
    TeacherAttention,
    TeacherBatch,
    WindowWeights,
    per_head,
)

# the Hedgehog map lives with the attention layers (a loaded checkpoint switches to it too)
from ..nn.attention import use_hedgehog_map_
from .capture import layer_inputs
from .driver import langevin_setup, run_phase_a

__all__ = [
    "DistillConfig",
    "WindowFitConfig",
    "align_to_softmax",
    "capture_teacher_batches",
    "distill_attention",
    "embedding_data",
    "refine_encoder",
    "split_examples",
]

DTYPES = {"float64": torch.float64, "float32": torch.float32}


@dataclass(frozen=True)
class DistillConfig(ParticleConfig):
    """Hyper-parameters of attention distillation (one run over all layers): the particle
    system's (:class:`~coulomb_attention.dynamics.ParticleConfig`) with this stage's defaults,
    and what is the distillation's own.

    Attributes
    ----------
    n_examples : int        sequences the particles are fitted on (no labels)
    holdout : int           further sequences, only to measure the row KL / output MSE
    batch_size : int        sequences per step (one cached mini-batch)
    rows_per_sequence : int query rows sampled per sequence (0: every real row)
    steps : int             steps per layer and head group
    method : str            ``langevin`` (the method), ``hedgehog`` (baseline, Adam) or ``adam``
                            (the same omega by Adam on the same loss: no noise, no repulsion,
                            the same ball; the plain-gradient ablation) or ``weighted`` (WFR
                            particles: positions and masses, module doc); moved by
                            :func:`~coulomb_attention.dynamics.fit_particles`
    eta, eta_end : float    Langevin step size, cosine schedule eta -> eta_end
    beta : float            inverse temperature (0: infinity, projected gradient descent)
    lam : float             Riesz repulsion strength (0: none)
    potential : str         riesz, coulomb or log
    s, eps : float          Riesz exponent and softening
    radius : float          ball radius in units of sqrt(head_dim)
    max_drift : float       cap on one particle's drift per step (0: none)
    normalize_drift : bool  scale-free steps (running RMS of the drift)
    output_weight : float   weight of the output MSE in the data term (0: row KL only)
    lr : float              Adam learning rate of the ``hedgehog`` and ``adam`` methods
    dtype : str             float64 (default) or float32 for the data term
    tau : float             reaction step of the masses (``weighted``; normalised: the RMS
                            change of ``log w_i`` per step, following the eta schedule)
    w_min : float           death threshold of a mass in units of ``1/M`` (``weighted``)
    layers : tuple or None  layer indices to convert (None: all with particles)
    refine_steps : int      steps of the joint refinement after the layer-wise distillation
                            (all layers' particles against the teacher's sentence embeddings,
                            :func:`refine_encoder`; 0: none)
    refine_eta, refine_eta_end : float  its step size (cosine schedule)
    refine_max_drift : float            its cap on one particle's drift per step
    refine_lr : float       Adam learning rate of the ``hedgehog``/``adam`` refinement
    refine_examples : int   sequences the refinement fits on (the distillation's and further
                            ones; the held-out ones are never among them)
    pairs : bool            ``convert`` only: a pair task's (QQP's) training text is distilled
                            on as whole pairs ``[CLS] a [SEP] b [SEP]`` (attention across the
                            pair), not each side on its own (the default)
    """

    n_examples: int = 1024
    holdout: int = 256
    batch_size: int = 64
    rows_per_sequence: int = 16
    steps: int = 150
    eta: float = 3.0
    eta_end: float = 0.3
    beta: float = 1e6
    lam: float = 0.0
    potential: str = "riesz"
    s: float = 1.0
    eps: float = 0.1
    radius: float = 3.0
    max_drift: float = 0.3
    output_weight: float = 0.0
    dtype: str = "float64"
    layers: tuple[int, ...] | None = None
    refine_steps: int = 200
    refine_eta: float = 1.0
    refine_eta_end: float = 0.1
    refine_max_drift: float = 0.05
    refine_lr: float = 0.01
    refine_examples: int = 4096
    pairs: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("n_examples", "batch_size", "refine_examples"):
            check_positive(name, getattr(self, name), integer=True)
        for name in ("holdout", "rows_per_sequence", "refine_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if not isinstance(self.pairs, bool):
            raise ValueError(f"pairs must be true or false, got {self.pairs!r}")
        check_choice("potential", self.potential, POTENTIALS)
        check_choice("dtype", self.dtype, DTYPES)
        for name in ("refine_eta", "refine_eta_end", "refine_lr"):
            check_positive(name, getattr(self, name))
        for name in ("output_weight", "refine_max_drift"):
            check_nonnegative(name, getattr(self, name))
        if self.layers is not None:
            layers = tuple(self.layers)
            if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in layers):
                raise ValueError(f"layers must be non-negative layer indices, got {self.layers!r}")
            object.__setattr__(self, "layers", layers)


@dataclass(frozen=True)
class WindowFitConfig:
    """How the window weights of a hybrid student (``KernelAttention.set_window_``) are
    learned: in each stage the particles move by the stage's method with the weights held,
    then the weights (``sigmoid`` of a logit per head) by Adam
    (:func:`~coulomb_attention.dynamics.adam_fit`) on the same data term with the particles
    held.

    Attributes
    ----------
    steps : int          Adam steps per layer in the layer-wise stage (row KL of the hybrid)
    lr : float           their learning rate (on the logits)
    refine_steps : int   Adam steps on all layers' logits after the joint refinement
                         (the embedding objective; 0: none)
    refine_lr : float
    """

    steps: int = 100
    lr: float = 0.05
    refine_steps: int = 50
    refine_lr: float = 0.02

    def __post_init__(self) -> None:
        for name in ("steps", "refine_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        for name in ("lr", "refine_lr"):
            check_positive(name, getattr(self, name))


# ---------------------------------------------------------------------------- caching


def capture_teacher_batches(
    model: nn.Module,
    layer_index: int,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    batch_size: int = 64,
    rows_per_sequence: int = 16,
    generator: torch.Generator | None = None,
    with_values: bool = True,
) -> list[TeacherBatch]:
    """Scaled queries (sampled rows), keys and values of one attention layer, all heads.

    The inputs of the layer come from :func:`~coulomb_attention.convert.capture.layer_inputs`
    (the model as it is now: earlier layers already converted). ``rows_per_sequence`` real query
    positions are drawn per sequence without replacement (0: all real rows).

    Returns
    -------
    list of :class:`~coulomb_attention.energy.TeacherBatch` (float32; ``q`` (B, H, R, dh),
    ``k``/``v`` (B, H, S, dh), trimmed to the longest real sequence of each batch)
    """
    layer = model.attention_layers[layer_index]
    device = next(model.parameters()).device
    chunks = []
    for start in range(0, input_ids.shape[0], batch_size):
        mask = attention_mask[start:start + batch_size].bool()
        t = max(int(mask.sum(1).max()), 1)
        chunks.append((input_ids[start:start + batch_size, :t], mask[:, :t]))
    out = []
    for (h, _), (_, mask) in zip(layer_inputs(model, layer_index, chunks, device), chunks,
                                 strict=True):
        with torch.no_grad():
            # grouped KV heads are repeated to the query heads: the data term sees every
            # query head with its group's keys (and per_head gives it its group's particles)
            q, k = layer.queries(h), layer.expand_kv(layer.keys(h))  # (B, H, T, dh)
            v = layer.expand_kv(layer.values(h)) if with_values else None
        mask = mask.to("cpu")
        r = mask.shape[1] if rows_per_sequence == 0 else min(rows_per_sequence, mask.shape[1])
        noise = torch.rand(mask.shape, generator=generator, dtype=torch.float64)
        order = torch.argsort(noise + 2.0 * (~mask), dim=1)[:, :r]  # (B, R): real rows first
        row_mask = torch.gather(mask, 1, order)
        q = q.float().cpu()
        idx = order[:, None, :, None].expand(-1, q.shape[1], -1, q.shape[-1])
        window = dict(window=layer.window, row_index=order,
                      gamma=torch.sigmoid(layer.window_logit.detach().double()).cpu(),
                      window_linear=layer.window_linear,
                      sinks=layer.sinks) if layer.window else {}
        if layer.causal:  # a causal row sees the keys at or before it only
            window["row_pos"] = order
        out.append(TeacherBatch(torch.gather(q, 2, idx), k.float().cpu(), mask, row_mask,
                                None if v is None else v.float().cpu(), **window))
    return out


# ---------------------------------------------------------------------------- distillation


def _evaluate(term, omega, batches, comm, weights=None):
    if not batches:
        return {"kl": None, "mse": None}
    r = term.evaluate(omega, batches, comm, weights=weights)
    return {"kl": r["kl"], "mse": r["mse"]}


def split_examples(n: int, config: DistillConfig, generator: torch.Generator
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Indices ``(fit, holdout, rest)`` of ``n`` sequences: the ``n_examples`` fitted by the
    layer-wise distillation, the ``holdout`` held out, and the remaining ones (which the
    refinement also fits on, up to ``refine_examples``); a random permutation, the first draw
    of ``generator``. The distillation and the refinement of one conversion draw it from
    same-seeded generators, so they share the split."""
    n_fit = min(config.n_examples, n)
    n_hold = min(config.holdout, n - n_fit)
    perm = torch.randperm(n, generator=generator)
    return perm[:n_fit], perm[n_fit:n_fit + n_hold], perm[n_fit + n_hold:]


def distill_attention(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    config: DistillConfig,
    *,
    generator: torch.Generator,
    progress: bool = False,
    comm=None,
    on_layer_done: Callable[[int, list[dict], torch.Tensor], None] | None = None,
    resume: dict[str, Any] | None = None,
    keep_trace: int = 0,
    window_fit: WindowFitConfig | None = None,
) -> list[dict[str, Any]]:
    """Convert the model's attention layers in place, in order, by attention distillation.

    Layers with a window (``KernelAttention.set_window_``, the sliding-window hybrid) are
    fitted on the hybrid's rows (window part ``gamma exp(q . k)``, the kernel outside, one
    denominator): the particles by the method with the window weights held, then the weights
    by :class:`WindowFitConfig` (default one) with the particles held; the window alone
    (``linear=False``) has nothing to fit (no features, and ``gamma`` cancels).

    Parameters
    ----------
    model : module with ``attention_layers`` (:class:`KernelAttention` with particles) and
        ``model(ids, mask)``; only the ``omega`` buffers change
    input_ids, attention_mask : (n, T) unlabelled sequences; ``n_examples`` + ``holdout`` are
        drawn (a random permutation from ``generator``, drawn first, so a resumed run with a
        same-seeded generator uses the same sequences)
    config : DistillConfig
    generator : torch.Generator
        Draws the split, the query rows, the batch order and, per layer, the seed of the
        Langevin noise (drawn first, so ranks with the same seed share the noise).
    progress : show a progress bar per head group and print one line per layer
    comm : optional :class:`~coulomb_attention.energy.Comm` (exact data parallelism: each
        rank passes its own sequences; statistics and gradients are all-reduced)
    on_layer_done : ``on_layer_done(next_layer, records, generator_state)`` after each layer
        (a checkpoint hook: save the model's omega, the records and the state)
    resume : ``{"next_layer", "records", "generator_state"}`` from ``on_layer_done``: continue
        with layer ``next_layer`` (the model must already hold the converted earlier layers)
    keep_trace : when > 0, each record also holds ``trace``: at most this many steps of its
        run (:func:`~coulomb_attention.dynamics.subsample_trace`: ``{step, energy, data,
        repulsion}``, ``data`` the row KL)

    Returns
    -------
    list of dict, one per (layer, head group): ``layer``, ``heads`` ([start, stop)),
    ``method``, ``kl_before``/``kl_after`` and ``mse_before``/``mse_after`` (fit sequences),
    ``holdout_kl_before``/``..._after``, ``holdout_mse_before``/``..._after`` (held-out; None
    without holdout), ``run_energy_first``/``run_energy_last`` (the energy of the run that moved
    the group: with the langevin method all groups of a layer move in one run, so this is the
    layer's energy, the mean over its groups; the group's own fit are ``kl_before/after``),
    ``omega_shift``
    (``|omega - omega0| / |omega0|``), ``n_fit``, ``n_holdout``, ``steps``, ``time_s``;
    ``weighted`` adds ``ess`` (the group's masses' effective sample size over M).
    """
    if not isinstance(config, DistillConfig):
        raise TypeError(f"config must be a DistillConfig, got {type(config).__name__}")
    layers = list(getattr(model, "attention_layers", []))
    if not any(layer.has_features for layer in layers):
        raise ValueError("the model has no attention layer with particles to distil "
                         "(load it with attention='favor', 'softmax_feat', ...)")
    if input_ids.ndim != 2 or input_ids.shape != attention_mask.shape:
        raise ValueError(f"input_ids and attention_mask must have the same shape (n, T), got "
                         f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}")
    n = input_ids.shape[0]
    if n == 0:
        raise ValueError("no sequences to distil on (input_ids is empty)")
    if config.layers is not None and max(config.layers) >= len(layers):
        raise ValueError(f"layers {config.layers} out of range for {len(layers)} layers")
    fit_idx, hold_idx, _ = split_examples(n, config, generator)
    n_fit, n_hold = len(fit_idx), len(hold_idx)
    dtype = DTYPES[config.dtype]

    def fit_layer(li: int) -> list[dict[str, Any]]:
        layer = layers[li]
        if not layer.has_features or (config.layers is not None and li not in config.layers):
            return []
        t0 = time.perf_counter()
        # the Langevin noise of this layer has its own stream, drawn before anything whose
        # consumption depends on this process's sequences: ranks of a data-parallel run (same
        # seed) then draw the same noise and keep identical particles
        noise = torch.Generator().manual_seed(
            int(torch.randint(0, 2**62, (1,), generator=generator)))
        if config.method == "hedgehog":
            use_hedgehog_map_(layer)
        kw = dict(batch_size=config.batch_size, rows_per_sequence=config.rows_per_sequence,
                  generator=generator)
        fit_b = capture_teacher_batches(model, li, input_ids[fit_idx],
                                        attention_mask[fit_idx], **kw)
        hold_b = (capture_teacher_batches(model, li, input_ids[hold_idx],
                                          attention_mask[hold_idx], **kw) if n_hold else [])
        omega_all = layer.omega.detach().to("cpu", dtype).clone()  # (G, M, dh)
        groups, _, dh = omega_all.shape
        per = layer.heads // groups
        new_omega = omega_all.clone()
        term = TeacherAttention(layer.feature, output_weight=config.output_weight, dtype=dtype)
        potential, projection, schedule = langevin_setup(config, dh)
        parts = [slice(g * per, (g + 1) * per) for g in range(groups)]
        fit_g = [[b.heads(h) for b in fit_b] for h in parts]
        hold_g = [[b.heads(h) for b in hold_b] for h in parts]
        before = [(_evaluate(term, omega_all[g], fit_g[g], comm),
                   _evaluate(term, omega_all[g], hold_g[g], comm)) for g in range(groups)]
        # the method (dynamics.fit_particles): langevin moves all head groups in ONE run
        # (batched over heads: Hamiltonian(groups=G), repulsion within each group only, the
        # data term the mean of the per-group terms), weighted one run per group (its own
        # masses), adam / hedgehog one Adam run of all groups
        order = torch.randperm(len(fit_b), generator=generator).tolist()
        fit = fit_particles(
            TeacherAttention(per_head(layer.feature), output_weight=config.output_weight,
                             dtype=dtype), term, omega_all, fit_b, order, config=config,
            lift=lambda t, g: Hamiltonian(t, potential, lam=config.lam, groups=g),
            projection=projection, schedule=schedule, noise=noise,
            group_batches=lambda g: fit_g[g], comm=comm,
            progress=f"layer {li} ({groups} head group(s))" if progress else False)
        new_omega, masses, traces = fit.omega.to(dtype), fit.masses, fit.traces
        window_rec = {}
        if layer.window and layer.window_linear:  # the hybrid's weights, particles held
            wf = window_fit or WindowFitConfig()
            wterm = WindowWeights(TeacherAttention(
                per_head(layer.feature) if groups > 1 else layer.feature,
                output_weight=config.output_weight, dtype=dtype),
                new_omega if groups > 1 else new_omega[0])
            logit0 = layer.window_logit.detach().to("cpu", dtype)
            order = torch.randperm(len(fit_b), generator=generator).tolist()
            logits, wtrace = adam_fit(wterm, logit0, cycle(fit_b, order), wf.steps, wf.lr,
                                      comm=comm) if wf.steps else (logit0, [])
            with torch.no_grad():
                layer.window_logit.copy_(logits.to(layer.window_logit))
            gamma = torch.sigmoid(logits.double())
            fit_b = [dataclasses.replace(b, gamma=gamma) for b in fit_b]
            hold_b = [dataclasses.replace(b, gamma=gamma) for b in hold_b]
            fit_g = [[b.heads(h) for b in fit_b] for h in parts]
            hold_g = [[b.heads(h) for b in hold_b] for h in parts]
            window_rec = {"window": layer.window, "window_weight": gamma.tolist(),
                          "window_kl_first": wtrace[0]["kl"] if wtrace else None,
                          "window_kl_last": wtrace[-1]["kl"] if wtrace else None}
        layer_records = []
        for g, heads in enumerate(parts):
            omega0, omega = omega_all[g], new_omega[g]
            mass = None if masses is None else masses[g]
            after = _evaluate(term, omega, fit_g[g], comm, mass)
            hold_after = _evaluate(term, omega, hold_g[g], comm, mass)
            layer_records.append({
                "layer": li, "heads": [heads.start, heads.stop], "method": config.method,
                "kl_before": before[g][0]["kl"], "kl_after": after["kl"],
                "mse_before": before[g][0]["mse"], "mse_after": after["mse"],
                "holdout_kl_before": before[g][1]["kl"], "holdout_kl_after": hold_after["kl"],
                "holdout_mse_before": before[g][1]["mse"],
                "holdout_mse_after": hold_after["mse"],
                "run_energy_first": traces[g][0]["energy"],
                "run_energy_last": traces[g][-1]["energy"],
                "omega_shift": float((omega - omega0).norm() / omega0.norm().clamp_min(1e-30)),
                "n_fit": n_fit, "n_holdout": n_hold, "steps": config.steps, **window_rec,
            })
            if mass is not None:
                layer_records[-1]["ess"] = float(1 / (mass * mass).sum()) / mass.shape[0]
            if keep_trace:
                layer_records[-1]["trace"] = subsample_trace(traces[g], keep_trace)
        layer.load_features_(new_omega.to(layer.omega.dtype))
        layer.load_masses_(masses)
        elapsed = time.perf_counter() - t0
        if progress:
            kb = sum(r["kl_before"] for r in layer_records) / len(layer_records)
            ka = sum(r["kl_after"] for r in layer_records) / len(layer_records)
            msg = f"  distil layer {li}: row KL {kb:.4f} -> {ka:.4f}"
            if n_hold:
                hb_ = sum(r["holdout_kl_before"] for r in layer_records) / len(layer_records)
                ha_ = sum(r["holdout_kl_after"] for r in layer_records) / len(layer_records)
                msg += f" (held-out {hb_:.4f} -> {ha_:.4f})"
            print(msg + f", {elapsed:.0f} s", flush=True)
        return layer_records

    return run_phase_a(range(len(layers)), fit_layer, generator=generator, resume=resume,
                       on_layer_done=on_layer_done)


# ---------------------------------------------------------------------------- refinement


def _embedding_batches(teacher, input_ids, attention_mask, batch_size, targets=None):
    """``((ids, mask), teacher embedding)`` batches of sequences of similar length, and the
    teacher embeddings in row order (``targets``, when given, are those: not recomputed)."""
    lengths = attention_mask.bool().sum(1)
    order = torch.argsort(lengths, stable=True)
    device = next(teacher.parameters()).device
    out, rows = [], [None] * len(order)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        t = max(int(lengths[idx].max()), 1)
        ids, mask = input_ids[idx, :t].to(device), attention_mask[idx, :t].to(device)
        if targets is None:
            with torch.no_grad():
                target = teacher.sentence_embedding(ids, mask)
        else:
            target = targets[idx.to(targets.device)]
        out.append(((ids, mask), target))
        for i, row in zip(idx.tolist(), target, strict=True):
            rows[i] = row
    return out, torch.stack(rows) if rows else None


def embedding_data(teacher: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   config: DistillConfig, generator: torch.Generator) -> dict[str, Any]:
    """The end-to-end stages' data: the split of :func:`split_examples` (drawn from
    ``generator``, seeded as the distillation's, so its fit and held-out sequences are kept)
    and the teacher's sentence embeddings, as ``((ids, mask), target (B, D))`` batches of
    similar length.

    Returns ``{"fit_idx", "hold_idx", "train_idx", "train", "fit", "holdout"}``: the fit
    sequences and the rest up to ``refine_examples`` (``train``, what the refinement and the
    low-rank finishing fit on), the layer-wise fit sequences (``fit``) and the held-out ones
    (``holdout``), each teacher embedding computed once."""
    fit_idx, hold_idx, rest = split_examples(input_ids.shape[0], config, generator)
    train_idx = torch.cat([fit_idx, rest])[:max(config.refine_examples, len(fit_idx))]
    train_b, train_targets = _embedding_batches(teacher, input_ids[train_idx],
                                                attention_mask[train_idx], config.batch_size)
    # the fit sequences lead train_idx: their teacher embeddings are already computed
    fit_b, _ = _embedding_batches(teacher, input_ids[fit_idx], attention_mask[fit_idx],
                                  config.batch_size, targets=train_targets[:len(fit_idx)])
    hold_b, _ = _embedding_batches(teacher, input_ids[hold_idx], attention_mask[hold_idx],
                                   config.batch_size)
    return {"fit_idx": fit_idx, "hold_idx": hold_idx, "train_idx": train_idx,
            "train": train_b, "fit": fit_b, "holdout": hold_b}


class _SentenceEmbedding(nn.Module):
    """``forward(ids, mask)`` = ``model.sentence_embedding(ids, mask)``: the method as a module
    call, so :func:`torch.func.functional_call` can run it with substituted buffers."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model.sentence_embedding(input_ids, attention_mask)


class _ParticlesOf:
    """``embed(omega, (ids, mask))``: the model's sentence embeddings with the particles of
    ``layers`` replaced by ``omega`` (``(len(layers) * G, M, dh)``, differentiable), through
    :func:`torch.func.functional_call`; the model itself (its weights and stored particles) is
    never modified."""

    def __init__(self, model, layers):
        self.embed = _SentenceEmbedding(model)
        names = {id(m): name for name, m in model.named_modules()}
        self.names = [f"model.{names[id(layer)]}.omega" for layer in layers]
        self.dtypes = [layer.omega.dtype for layer in layers]
        self.groups = layers[0].omega.shape[0]

    def __call__(self, omega, inputs):
        G = self.groups
        swap = {name: omega[j * G:(j + 1) * G].to(dtype)
                for j, (name, dtype) in enumerate(zip(self.names, self.dtypes, strict=True))}
        return torch.func.functional_call(self.embed, swap, tuple(inputs))


class _WindowLogitsOf(_ParticlesOf):
    """``embed(logits, (ids, mask))``: the sentence embeddings with the window logits of
    ``layers`` replaced by ``logits`` (len(layers), H) (differentiable)."""

    def __init__(self, model, layers):
        super().__init__(model, layers)
        self.names = [n[:-len("omega")] + "window_logit" for n in self.names]

    def __call__(self, logits, inputs):
        swap = {name: logits[j] for j, name in enumerate(self.names)}
        return torch.func.functional_call(self.embed, swap, tuple(inputs))


def refine_encoder(
    model: nn.Module,
    teacher: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    config: DistillConfig,
    *,
    generator: torch.Generator,
    progress: bool = False,
    comm=None,
    keep_trace: int = 0,
    data: dict[str, Any] | None = None,
    window_fit: WindowFitConfig | None = None,
) -> dict[str, Any]:
    """Joint refinement: move the particles of all converted layers together so the converted
    encoder's sentence embeddings match the teacher's (hybrid layers: then their window
    weights, by Adam on the same objective, :class:`WindowFitConfig`).

    After the layer-wise distillation every layer copies its own softmax rows, so the errors of
    the layers add up (each layer alone keeps an embedding cosine of 0.98-0.996 on MiniLM, all
    six together 0.945). Here the particles of every layer are one system of ``L G`` groups
    (``Hamiltonian(groups=L G)``: repulsion within each head's particles) with the data term
    :class:`~coulomb_attention.energy.EmbeddingTeacher`, the mean of ``1 - cos`` between the
    student's and the teacher's sentence embeddings, moved by the one driver
    (``config.refine_steps`` steps, ``refine_eta -> refine_eta_end``, drift cap
    ``refine_max_drift``, the same ball, ``beta`` and ``lam``). Only ``omega`` changes. The
    ``hedgehog`` baseline gets the same refinement with Adam (``refine_lr``) on its ``W``;
    ``weighted`` layers keep their masses (the layers' buffers) and move their positions by
    the same Langevin run.

    ``input_ids``/``attention_mask`` are the distillation's sequences (and more: the split of
    :func:`split_examples`, drawn from ``generator`` seeded as the distillation's, keeps its
    fit and held-out sequences; the refinement fits on the fit sequences and the rest, up to
    ``refine_examples``: with 1,024 sentences the 6 x 12 x 64 particles of MiniLM overfit,
    fit cosine 0.985 vs held-out 0.961 after 100 steps). Returns a record: ``stage``
    "refine", ``cos_before``/``cos_after`` (on the distillation's fit sequences),
    ``holdout_cos_before``/``..._after``, ``energy_first``/``energy_last``, ``omega_shift``,
    ``steps``, ``time_s`` (and ``trace``, at most ``keep_trace`` steps, when > 0). ``data``:
    :func:`embedding_data` of the same split, when the caller computed it already (the low-rank
    finishing reuses it); the split is still drawn.
    """
    if not isinstance(config, DistillConfig):
        raise TypeError(f"config must be a DistillConfig, got {type(config).__name__}")
    if config.refine_steps <= 0:
        raise ValueError("refine_steps must be > 0 to refine")
    layers = [layer for i, layer in enumerate(model.attention_layers)
              if layer.has_features and (config.layers is None or i in config.layers)]
    if not layers:
        raise ValueError("the model has no attention layer with particles to refine")
    if len({tuple(layer.omega.shape) for layer in layers}) != 1:
        raise ValueError("refinement needs the same particle shape in every layer")
    t0 = time.perf_counter()
    if data is None:
        data = embedding_data(teacher, input_ids, attention_mask, config, generator)
    else:
        split_examples(input_ids.shape[0], config, generator)  # the same draw as above
    fit_idx, hold_idx, train_idx = data["fit_idx"], data["hold_idx"], data["train_idx"]
    train_b, fit_b, hold_b = data["train"], data["fit"], data["holdout"]
    noise = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
    was_training = model.training
    model.eval()
    G, _, dh = layers[0].omega.shape
    omega0 = torch.cat([layer.omega.detach() for layer in layers])  # (L G, M, dh)
    term = EmbeddingTeacher(_ParticlesOf(model, layers))

    def cos(omega, batches):
        return term.evaluate(omega, batches, comm)["cos"] if batches else None

    before = (cos(omega0, fit_b), cos(omega0, hold_b))
    order = torch.randperm(len(train_b), generator=generator).tolist()
    # the refinement's steps and step sizes; the driver's drift normalisation stays off here
    # (as before ParticleConfig held normalize_drift), weighted layers move positions only
    rconfig = dataclasses.replace(
        config, steps=config.refine_steps, eta=config.refine_eta, eta_end=config.refine_eta_end,
        max_drift=config.refine_max_drift, lr=config.refine_lr, normalize_drift=False)
    potential, projection, schedule = langevin_setup(rconfig, dh)
    fit = fit_particles(
        term, term, omega0, train_b, order, config=rconfig,
        lift=lambda t, g: Hamiltonian(t, potential, lam=config.lam, groups=g),
        projection=projection, schedule=schedule, noise=noise, comm=comm,
        progress="refine (all layers)" if progress else False, positions_only=True)
    omega, trace = fit.omega, fit.trace
    for j, layer in enumerate(layers):
        layer.load_features_(omega[j * G:(j + 1) * G])
    wf = window_fit or WindowFitConfig()
    hybrid = [layer for layer in layers if layer.window and layer.window_linear]
    window_rec = {}
    if hybrid and wf.refine_steps:  # the window weights, particles held
        wterm = EmbeddingTeacher(_WindowLogitsOf(model, hybrid))
        logit0 = torch.stack([layer.window_logit.detach() for layer in hybrid])  # (L, H)
        logits, wtrace = adam_fit(wterm, logit0, cycle(train_b, order), wf.refine_steps,
                                  wf.refine_lr, comm=comm)
        with torch.no_grad():
            for j, layer in enumerate(hybrid):
                layer.window_logit.copy_(logits[j].to(layer.window_logit))
        window_rec = {"window_weight": torch.sigmoid(logits.double()).tolist(),
                      "window_energy_first": wtrace[0]["energy"],
                      "window_energy_last": wtrace[-1]["energy"]}
    after = (cos(omega, fit_b), cos(omega, hold_b))
    model.train(was_training)
    record = {
        "stage": "refine", "method": config.method, "layers": len(layers),
        "cos_before": before[0], "cos_after": after[0],
        "holdout_cos_before": before[1], "holdout_cos_after": after[1],
        "energy_first": trace[0]["energy"], "energy_last": trace[-1]["energy"],
        "omega_shift": float((omega - omega0).norm() / omega0.norm().clamp_min(1e-30)),
        "n_fit": len(fit_idx), "n_refine": len(train_idx), "n_holdout": len(hold_idx),
        "steps": config.refine_steps, **window_rec,
        "time_s": time.perf_counter() - t0,
    }
    if keep_trace:
        record["trace"] = subsample_trace(trace, keep_trace)
    if progress:
        msg = f"  refine: embedding cosine {before[0]:.4f} -> {after[0]:.4f}"
        if hold_b:
            msg += f" (held-out {before[1]:.4f} -> {after[1]:.4f})"
        print(msg + f", {record['time_s']:.0f} s", flush=True)
    return record


def align_to_softmax(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    config,
    *,
    generator: torch.Generator,
    rows_per_sequence: int = 8,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """The earlier softmax-alignment phase, now attention distillation with the same budget.

    ``config`` is a :class:`coulomb_attention.train.phases.AlignConfig` (``n_examples``,
    ``holdout``, ``batch_size``, ``steps``, ``eta``/``eta_end``, ``beta``, ``lam``,
    ``potential``, ``s``, ``eps``, ``radius``, ``max_drift``); the particles are learned by
    :func:`distill_attention`. Each record also holds ``train_before``/``train_after`` and
    ``holdout_before``/``holdout_after``: the row KL to the softmax teacher (lower is better).
    """
    fields = {f.name for f in dataclasses.fields(DistillConfig)}
    cfg = DistillConfig(**{k: v for k, v in dataclasses.asdict(config).items() if k in fields},
                        rows_per_sequence=rows_per_sequence)
    records = distill_attention(model, input_ids, attention_mask, cfg, generator=generator,
                                progress=progress)
    for r in records:
        r.update(objective="teacher", train_before=r["kl_before"], train_after=r["kl_after"],
                 holdout_before=r["holdout_kl_before"], holdout_after=r["holdout_kl_after"])
    return records

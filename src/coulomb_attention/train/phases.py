"""The phases of two-phase kernel learning, as thin functions over the core.

* warm-up and phase B (fine-tuning) are :func:`coulomb_attention.train.loop.fit` (particles
  are buffers, so cross-entropy never moves them);
* phase A (:func:`align_features`) moves the particles of each attention layer by projected
  Langevin dynamics on ``H = -A + lam W`` (:class:`coulomb_attention.energy.Hamiltonian` with
  the :class:`~coulomb_attention.energy.LabelAlignment` data term, moved by
  :func:`coulomb_attention.dynamics.learn_particles`)
  with the sequence kernel of docs/DESIGN.md::

      phibar(S) = mean over real tokens t (and heads sharing omega) of phi(q_t; omega)   (N,)
      k(S, S')  = phibar(S) . phibar(S')

  where ``q_t = layer.queries(h)_t`` and ``h`` is the input of the attention module (captured
  with a forward pre-hook). Layers are aligned in order, each on representations computed
  with the already-aligned earlier layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils.data import DataLoader

from .._validation import check_choice, check_nonnegative, check_positive
from ..convert.capture import layer_inputs
from ..convert.driver import langevin_setup, run_phase_a
from ..dynamics import ParticleConfig, cycle, learn_particles
from ..energy import (
    POTENTIALS,
    AlignmentStats,
    Comm,
    Hamiltonian,
    LabelAlignment,
    alignment_from_stats,
    alignment_stats,
    encode_labels,
)
from .loop import EncodedDataset, collate

__all__ = ["AlignConfig", "align_features", "collect_queries", "probe_init_head",
           "sequence_features"]


@dataclass(frozen=True)
class AlignConfig(ParticleConfig):
    """Phase A (alignment) hyper-parameters: the particle system's
    (:class:`~coulomb_attention.dynamics.ParticleConfig`: ``steps``, ``eta``, ``eta_end``,
    ``beta``, ``lam``, ``potential``, ``s``, ``eps``, ``radius``, ``max_drift``) with this
    phase's defaults, and its data.

    Attributes
    ----------
    n_examples : int         training examples whose query representations are cached
    holdout : int            further training examples, only to measure the alignment
    batch_size : int         examples per Langevin step (one cached mini-batch)
    center : bool            centered alignment

    The particles move by projected Langevin dynamics only (``method`` langevin; ``lr``,
    ``tau`` and ``w_min`` of the other methods do not apply); ``normalize_drift`` applies.
    """

    methods: ClassVar[tuple[str, ...]] = ("langevin",)

    n_examples: int = 4096
    holdout: int = 1024
    batch_size: int = 256
    steps: int = 100
    eta: float = 0.05
    eta_end: float = 0.005
    beta: float = 1e5
    lam: float = 0.5
    potential: str = "riesz"
    s: float = 1.0
    eps: float = 0.1
    radius: float = 3.0
    max_drift: float = 0.5
    center: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("n_examples", "batch_size"):
            check_positive(name, getattr(self, name), integer=True)
        check_nonnegative("holdout", self.holdout)
        check_choice("potential", self.potential, POTENTIALS)


def collect_queries(
    model: nn.Module,
    layer_index: int,
    dataset: EncodedDataset,
    batch_size: int,
    device: torch.device | str = "cpu",
) -> list[tuple[tuple[torch.Tensor, torch.Tensor, int], torch.Tensor]]:
    """Queries of the real tokens of attention layer ``layer_index``, batch by batch.

    Returns a list of ``((q (n_tok, H, dh) float32, seq (n_tok,) long, B), labels (B,))`` in
    dataset order: ``q = layer.queries(h)`` at the unpadded positions, ``h`` the layer's
    input in eval mode, and ``seq`` the index of each token's sequence inside the batch
    (padding is dropped here, so phase A never spends time on it).
    """
    layer = model.attention_layers[layer_index]
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate)
    out = []
    labels = [lab for _, _, lab in loader]
    pairs = ((ids, mask) for ids, mask, _ in loader)
    for (x, m), lab in zip(layer_inputs(model, layer_index, pairs, device), labels, strict=True):
        with torch.no_grad():
            q = layer.queries(x).detach().to("cpu", torch.float32)  # (B, H, T, dh)
        m = torch.ones(q.shape[0], q.shape[2], dtype=torch.bool) if m is None else m.cpu()
        seq, pos = m.bool().nonzero(as_tuple=True)  # real tokens, row-major
        q_tok = q.permute(0, 2, 1, 3)[seq, pos].contiguous()  # (n_tok, H, dh)
        out.append(((q_tok, seq, int(q.shape[0])), lab))
    return out


def sequence_features(layer: nn.Module, heads: slice):
    """``features((q (n_tok, H, dh), seq (n_tok,), B), omega (N, dh)) -> phibar (B, N)``.

    The mean over each sequence's real tokens and over the heads in ``heads`` of
    ``layer.feature(q, omega)`` (unshifted; the statistics are accumulated in float64).
    """

    def features(inputs, omega: torch.Tensor) -> torch.Tensor:
        q, seq, n_seq = inputs
        q = q[:, heads]  # (n_tok, h, dh)
        phi = layer.feature(q, omega.to(q.dtype)).sum(1)  # (n_tok, N)
        total = phi.new_zeros(n_seq, phi.shape[1]).index_add(0, seq, phi)  # (B, N)
        count = torch.bincount(seq, minlength=n_seq).to(phi.dtype) * q.shape[1]  # (B,)
        return total / count.clamp_min(1.0)[:, None]

    return features


@torch.no_grad()
def _alignment(omega, batches, features, center, comm=None) -> float:
    """Exact centered alignment of all ``batches`` (streamed statistics, no gradient)."""
    stats = None
    for inputs, y in batches:
        s = alignment_stats(features(inputs, omega), y)
        stats = s if stats is None else stats + s
    if comm is not None:
        stats = AlignmentStats.from_tensors(comm.reduce(stats.tensors()))
    return float(alignment_from_stats(stats, center=center))


def align_features(
    model: nn.Module,
    train_set: EncodedDataset,
    config: AlignConfig,
    *,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
    progress: bool = False,
    comm: Comm | None = None,
    on_layer_done=None,
    resume: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Phase A: learn the particles of every attention layer that has them, in place.

    Parameters
    ----------
    model : TransformerClassifier (any module with ``attention_layers``)
    train_set : EncodedDataset; ``config.n_examples`` + ``config.holdout`` examples are drawn
        from it with ``generator`` (without replacement)
    config : AlignConfig
    generator : torch.Generator
        Draws the examples, their order, and the Langevin noise.
    device : where the model runs while the representations are collected
    progress : print one line per layer
    comm : optional :class:`~coulomb_attention.energy.Comm` (``torch.distributed``): each
        process passes its shard of the data and the same-seeded generator; statistics and
        gradients are summed, the pair sum is split by rows (exact data parallelism).
    on_layer_done : optional ``callback(next_layer, records, generator_state)`` called after
        every aligned layer (the model's ``omega`` buffers are already updated): a checkpoint.
    resume : optional ``{"next_layer", "records", "generator_state"}`` from such a checkpoint
        (with the model's earlier layers already loaded): layers before ``next_layer`` are
        skipped and the run continues exactly as if it had not been interrupted.

    Returns
    -------
    list of dict, one per (layer, head group): ``layer``, ``heads``, ``train_before``,
    ``train_after``, ``holdout_before``, ``holdout_after`` (centered alignments), ``energy``
    and ``repulsion`` at the first and last step, ``boundary_fraction``, ``time_s``.
    Only the ``omega`` buffers change; ``load_features_`` writes them.
    """
    if not isinstance(config, AlignConfig):
        raise TypeError(f"config must be an AlignConfig, got {type(config).__name__}")
    n = len(train_set)
    n_fit = min(config.n_examples, n)
    n_hold = min(config.holdout, n - n_fit)
    perm = torch.randperm(n, generator=generator)
    fit_idx, hold_idx = perm[:n_fit], perm[n_fit:n_fit + n_hold]

    def subset(idx):
        return EncodedDataset(train_set.input_ids[idx], train_set.attention_mask[idx],
                              train_set.labels[idx])

    fit_set, hold_set = subset(fit_idx), subset(hold_idx) if n_hold else None
    y_all, classes = encode_labels(train_set.labels.numpy())
    del y_all

    def with_targets(batches):
        out = []
        for inputs, labels in batches:
            y, _ = encode_labels(labels.numpy(), classes)
            out.append((inputs, y))
        return out

    def fit_layer(li: int) -> list[dict[str, Any]]:
        layer = model.attention_layers[li]
        if not layer.has_features:
            return []
        records: list[dict[str, Any]] = []
        fit_batches = with_targets(collect_queries(model, li, fit_set, config.batch_size, device))
        hold_batches = (with_targets(collect_queries(model, li, hold_set, config.batch_size,
                                                     device)) if hold_set else [])
        omega_all = layer.omega.detach().to("cpu", torch.float32).clone()  # (G, N, dh)
        n_groups, _, dh = omega_all.shape
        h = fit_batches[0][0][0].shape[1] // n_groups  # heads per omega group
        new_omega = omega_all.clone()
        for g in range(n_groups):
            heads = slice(g * h, (g + 1) * h)
            features = sequence_features(layer, heads)
            potential, projection, schedule = langevin_setup(config, dh)
            ham = Hamiltonian(LabelAlignment(features, center=config.center), potential,
                              lam=config.lam)
            omega0 = omega_all[g]
            before = _alignment(omega0, fit_batches, features, config.center, comm)
            hold_before = (_alignment(omega0, hold_batches, features, config.center, comm)
                           if hold_batches else None)
            order = torch.randperm(len(fit_batches), generator=generator).tolist()
            result = learn_particles(
                ham, omega0, schedule, cycle(fit_batches, order), projection=projection,
                generator=generator, comm=comm, normalize_drift=config.normalize_drift,
                progress=f"phase A layer {li} heads {heads.start}:{heads.stop}"
                if progress else False)
            state, trace = result.state, result.trace
            after = _alignment(state.omega, fit_batches, features, config.center, comm)
            hold_after = (_alignment(state.omega, hold_batches, features, config.center, comm)
                          if hold_batches else None)
            new_omega[g] = state.omega
            records.append({
                "layer": li,
                "heads": [heads.start, heads.stop],
                "train_before": before,
                "train_after": after,
                "holdout_before": hold_before,
                "holdout_after": hold_after,
                "n_fit": n_fit,
                "n_holdout": n_hold,
                "steps": config.steps,
                "energy_first": trace[0]["energy"],
                "energy_last": trace[-1]["energy"],
                "repulsion_first": trace[0]["repulsion"],
                "repulsion_last": trace[-1]["repulsion"],
                "boundary_fraction": trace[-1]["boundary_fraction"],
                "omega_shift": float((state.omega - omega0).norm() / omega0.norm()),
            })
            if progress:
                print(f"  phase A layer {li} heads {heads.start}:{heads.stop}: alignment "
                      f"{before:.4f} -> {after:.4f}"
                      + (f" (held-out {hold_before:.4f} -> {hold_after:.4f})"
                         if hold_batches else ""), flush=True)
        layer.load_features_(new_omega.to(layer.omega.dtype))
        return records

    return run_phase_a(range(len(model.attention_layers)), fit_layer, generator=generator,
                       resume=resume, on_layer_done=on_layer_done)


@torch.no_grad()
def probe_init_head(model: nn.Module, dataset: EncodedDataset, batch_size: int) -> float:
    """Linear probing before fine-tuning (LP-FT): fit the head by L2-regularised logistic
    regression (sklearn, lbfgs, C=1) on the pooled features of ``dataset`` in eval mode.

    Returns the probe's training accuracy. Only ``model.head`` changes.
    """
    from sklearn.linear_model import LogisticRegression

    was_training = model.training
    model.eval()
    feats = []
    for start in range(0, len(dataset), batch_size):
        ids = dataset.input_ids[start:start + batch_size]
        mask = dataset.attention_mask[start:start + batch_size]
        feats.append(model.pool(model.encode(ids, mask), mask).double())
    x = torch.cat(feats).numpy()
    y = dataset.labels.numpy()
    clf = LogisticRegression(C=1.0, max_iter=2000).fit(x, y)
    coef = torch.as_tensor(clf.coef_)
    bias = torch.as_tensor(clf.intercept_)
    if coef.shape[0] == 1:  # binary: logit difference w.x + b -> two symmetric rows
        coef, bias = torch.cat([-coef / 2, coef / 2]), torch.cat([-bias / 2, bias / 2])
    model.head.weight.copy_(coef.to(model.head.weight))
    model.head.bias.copy_(bias.to(model.head.bias))
    model.train(was_training)
    return float(clf.score(x, y))

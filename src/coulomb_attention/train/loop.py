"""The one cross-entropy training loop (warm-up and phase B both call :func:`fit`).

Everything random flows from one seed: the data order comes from a ``torch.Generator`` whose
state is checkpointed, and dropout draws from torch's default generator inside a
``torch.random.fork_rng`` block (seeded at the start of a fit, its state checkpointed and
restored on resume; the caller's global RNG is left untouched). Resuming after epoch ``k``
therefore ends with exactly the metrics of an uninterrupted run.

Distributed training plugs in through :class:`Runtime`: ``wrap`` (e.g. DDP), ``sampler``
(e.g. ``DistributedSampler`` + ``set_epoch``), ``is_main`` (only rank 0 checkpoints and shows
progress), ``barrier`` and ``all_reduce_sum`` (for the epoch's mean loss).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler, Sampler
from tqdm.auto import tqdm

from .._validation import check_choice, check_nonnegative, check_positive
from ..config import to_dict
from ..progress import Ticker
from .checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    load_model_file,
    optimizer_from_flat,
    optimizer_to_flat,
    save_checkpoint,
)

__all__ = [
    "EncodedDataset",
    "FitResult",
    "LengthGroupedSampler",
    "Runtime",
    "SCHEDULES",
    "TrainConfig",
    "collate",
    "fit",
    "lr_factor",
    "predict_proba",
]

SCHEDULES = ("linear", "cosine", "constant")


@dataclass(frozen=True)
class TrainConfig:
    """Cross-entropy training hyper-parameters (one :func:`fit` call).

    Attributes
    ----------
    epochs : int
    batch_size : int
    lr : float                peak learning rate of AdamW
    weight_decay : float      decoupled weight decay (not on biases, LayerNorms, embeddings' pad)
    warmup_fraction : float   fraction of the steps with a linear learning-rate warm-up
    schedule : str            decay after warm-up: linear, cosine or constant
    grad_clip : float         max global gradient norm (0: no clipping)
    label_smoothing : float
    eval_batch_size : int
    length_grouping : int     group this many batches of the epoch's permutation and sort
        each group by length (less padding, same examples per epoch); 0 or 1: off
    """

    epochs: int = 3
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_fraction: float = 0.1
    schedule: str = "linear"
    grad_clip: float = 1.0
    label_smoothing: float = 0.0
    eval_batch_size: int = 256
    length_grouping: int = 20

    def __post_init__(self) -> None:
        check_nonnegative("length_grouping", self.length_grouping)
        check_positive("epochs", self.epochs, integer=True)
        check_positive("batch_size", self.batch_size, integer=True)
        check_positive("eval_batch_size", self.eval_batch_size, integer=True)
        check_positive("lr", self.lr)
        check_nonnegative("weight_decay", self.weight_decay)
        check_nonnegative("grad_clip", self.grad_clip)
        check_choice("schedule", self.schedule, SCHEDULES)
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")


def lr_factor(step: int, total: int, warmup_fraction: float, schedule: str) -> float:
    """Multiplier of the peak learning rate at optimisation step ``step`` (0-based)."""
    warm = int(round(warmup_fraction * total))
    if step < warm:
        return (step + 1) / warm
    if schedule == "constant":
        return 1.0
    t = (step - warm) / max(total - warm, 1)
    if schedule == "linear":
        return max(1.0 - t, 0.0)
    return 0.5 * (1.0 + math.cos(math.pi * min(t, 1.0)))


class EncodedDataset(Dataset):
    """Tokenised examples: ``input_ids`` (n, L) long, ``attention_mask`` (n, L) bool,
    ``labels`` (n,) long. Items are ``(ids (L,), mask (L,), label ())``."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 labels: torch.Tensor) -> None:
        if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"input_ids (n, L) and attention_mask of the same shape expected, got "
                f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}"
            )
        labels = torch.as_tensor(labels, dtype=torch.long)
        if labels.shape != (input_ids.shape[0],):
            raise ValueError(f"labels must have shape ({input_ids.shape[0]},), got "
                             f"{tuple(labels.shape)}")
        self.input_ids = input_ids.long()
        self.attention_mask = attention_mask.bool()
        self.labels = labels

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def __getitem__(self, i):
        return self.input_ids[i], self.attention_mask[i], self.labels[i]


class LengthGroupedSampler(Sampler):
    """Reorder a base sampler's indices so batches hold sequences of similar length.

    The base order (e.g. a random permutation, or one rank's shard of it) is cut into groups
    of ``group_batches * batch_size`` indices; each group is sorted by length, split into
    batches, and the batches of the group are shuffled with ``generator``. Every index of the
    base order is yielded exactly once.
    """

    def __init__(self, base: Sampler, lengths: torch.Tensor, batch_size: int,
                 group_batches: int, generator: torch.Generator) -> None:
        self.base, self.lengths = base, lengths
        self.batch_size, self.group_batches, self.generator = batch_size, group_batches, generator

    def __len__(self) -> int:
        return len(self.base)

    def __iter__(self):
        order = torch.as_tensor(list(iter(self.base)), dtype=torch.long)
        size = self.batch_size * self.group_batches
        for start in range(0, len(order), size):
            group = order[start:start + size]
            group = group[torch.argsort(self.lengths[group], stable=True)]
            batches = list(group.split(self.batch_size))
            for i in torch.randperm(len(batches), generator=self.generator).tolist():
                yield from batches[i].tolist()


def collate(items) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stack items and drop the columns that are padding in every row of the batch."""
    ids = torch.stack([it[0] for it in items])
    mask = torch.stack([it[1] for it in items])
    labels = torch.stack([it[2] for it in items])
    t = max(int(mask.sum(1).max()), 1)
    return ids[:, :t], mask[:, :t], labels


@dataclass
class Runtime:
    """Where and how the loop runs; a distributed runtime overrides the methods.

    Attributes
    ----------
    device : torch.device
    rank, world_size : int
    progress : bool     show a tqdm bar (only on the main process)
    """

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    rank: int = 0
    world_size: int = 1
    progress: bool = True

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module the loop calls for the forward pass (DDP wraps here)."""
        return model

    def sampler(self, dataset: Dataset, generator: torch.Generator, epoch: int,
                order: Sampler | None = None) -> Sampler:
        """Order of one epoch: ``order`` (the global order of the epoch) or a random
        permutation; a distributed runtime returns this process's share of it."""
        return order if order is not None else RandomSampler(dataset, generator=generator)

    def barrier(self) -> None:
        """Synchronise processes (no-op here)."""

    def all_reduce_sum(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Sum tensors over processes (identity here)."""
        return tensors

    def main_process_first(self) -> contextlib.AbstractContextManager:
        """Rank 0 runs the block first, the others then (one process: just runs it)."""
        return contextlib.nullcontext()

    @property
    def comm(self):
        """The particle driver's cross-process hook (:class:`~coulomb_attention.energy.Comm`),
        ``None`` with one process."""
        if self.world_size == 1:
            return None
        from ..energy import Comm

        return Comm(self.all_reduce_sum, self.rank, self.world_size)


@dataclass
class FitResult:
    """History (one dict per epoch: train_loss, lr, time_s, eval metrics) and timings."""

    history: list[dict[str, Any]]
    train_time_s: float
    resumed_from_epoch: int

    @property
    def final(self) -> dict[str, Any]:
        return self.history[-1] if self.history else {}


def _param_groups(model: nn.Module, weight_decay: float,
                  omega_lr_scale: float = 1.0) -> list[dict]:
    """AdamW groups: decayed weights, undecayed ones (biases, norms, embeddings) and, when the
    particles are trainable (the end-to-end ablation), omega in a group of its own, never
    decayed, its learning rate ``omega_lr_scale`` times the schedule's (key ``lr_scale``)."""
    decay, no_decay, omega = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name.endswith("omega"):
            omega.append(p)
            continue
        plain = p.ndim < 2 or "embeddings" in name
        (no_decay if plain else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if omega:
        groups.append({"params": omega, "weight_decay": 0.0, "lr_scale": float(omega_lr_scale)})
    return groups


@torch.no_grad()
def predict_proba(model: nn.Module, dataset: EncodedDataset, batch_size: int = 256,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """Class probabilities ``(n, C)`` (float64) of ``model`` in eval mode, in dataset order.

    Examples are batched by length (less padding); the result is in the original order.
    """
    was_training = model.training
    model.eval()
    order = torch.argsort(dataset.attention_mask.sum(1), stable=True)
    out = []
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        ids, mask, _ = collate([dataset[int(i)] for i in idx])
        logits = model(ids.to(device), mask.to(device))
        out.append(torch.softmax(logits.double(), dim=-1).cpu())
    model.train(was_training)
    probs = torch.empty(len(order), out[0].shape[1], dtype=torch.float64)
    probs[order] = torch.cat(out)
    return probs


def _rng_devices(device: torch.device) -> list:
    return [device] if device.type == "cuda" else []


def fit(
    model: nn.Module,
    train_set: Dataset,
    config: TrainConfig,
    *,
    seed: int,
    evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
    runtime: Runtime | None = None,
    checkpoint_dir: str | Path | None = None,
    resume: bool = False,
    run_config: dict | None = None,
    desc: str = "train",
    stop_after: int | None = None,
    omega_lr_scale: float = 1.0,
) -> FitResult:
    """Train ``model`` with cross-entropy for ``config.epochs`` epochs.

    Parameters
    ----------
    model : nn.Module
        ``model(input_ids (B, T), attention_mask (B, T)) -> logits (B, C)``; parameters with
        ``requires_grad=False`` and buffers (the particles) are not optimised.
    train_set : Dataset of ``(ids, mask, label)`` items (e.g. :class:`EncodedDataset`)
    config : TrainConfig
    seed : int
        Seeds the data order generator and (inside ``fork_rng``) dropout.
    evaluate : callable, optional
        ``evaluate(model) -> dict`` of finite floats, called after every epoch (model in
        eval mode); stored in the history.
    runtime : Runtime, optional
    checkpoint_dir : path, optional
        A checkpoint is written after every epoch (main process only).
    resume : bool
        Continue from the latest checkpoint in ``checkpoint_dir`` if there is one.
    run_config : dict, optional
        Stored in every checkpoint; on resume it must equal the stored one.
    desc : str
        Label of the progress bar.
    stop_after : int, optional
        Return after this many epochs in total (the checkpoint is written; a later call with
        ``resume=True`` continues). The learning-rate schedule still spans ``config.epochs``.
    omega_lr_scale : float
        Multiplier of the learning rate of trainable particles (parameters named ``*omega``,
        e.g. inside :func:`~coulomb_attention.nn.trainable_omega`); 1: the same as the rest.

    Returns
    -------
    FitResult

    Raises
    ------
    FloatingPointError
        When the loss becomes NaN/inf (nothing is written for that epoch).
    """
    runtime = runtime or Runtime()
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    if resume and checkpoint_dir is None:
        raise ValueError("resume=True needs a checkpoint_dir")
    device = runtime.device
    model.to(device)
    data_gen = torch.Generator().manual_seed(int(seed))
    check_positive("omega_lr_scale", omega_lr_scale)
    optimizer = torch.optim.AdamW(_param_groups(model, config.weight_decay, omega_lr_scale),
                                  lr=config.lr)
    stored_config = {"train": to_dict(config), "run": run_config or {}}

    history: list[dict[str, Any]] = []
    start_epoch, step, train_time = 0, 0, 0.0
    dropout_state = None
    ckpt = latest_checkpoint(checkpoint_dir) if (resume and checkpoint_dir) else None
    if ckpt is not None:
        meta, tensors = load_checkpoint(ckpt)
        if meta["config"] != _jsonable(stored_config):
            raise ValueError(
                f"checkpoint {ckpt} was written with a different configuration; use a new "
                "output directory or the same settings"
            )
        load_model_file(ckpt / "model.safetensors", model)
        model.to(device)
        optimizer_from_flat(optimizer, tensors, meta["optimizer"])
        data_gen.set_state(tensors["rng.data"])
        dropout_state = tensors["rng.torch"]
        start_epoch, step = meta["epoch"], meta["step"]
        history, train_time = meta["history"], meta["train_time_s"]

    # Batches per epoch on this process (a DistributedSampler gives ceil(n / world) examples).
    loader_batches = math.ceil(math.ceil(len(train_set) / runtime.world_size) / config.batch_size)
    total_steps = config.epochs * loader_batches
    net = runtime.wrap(model)
    with torch.random.fork_rng(devices=_rng_devices(device)):
        if dropout_state is None:
            torch.manual_seed(int(seed))
        else:
            torch.set_rng_state(dropout_state)
        last = config.epochs if stop_after is None else min(stop_after, config.epochs)
        for epoch in range(start_epoch, last):
            t0 = time.perf_counter()
            order = None
            if config.length_grouping > 1 and hasattr(train_set, "attention_mask"):
                # grouped on the global order and global batch, then dealt out to the
                # processes: K processes run the one-process batches of K * batch_size
                order = LengthGroupedSampler(RandomSampler(train_set, generator=data_gen),
                                             train_set.attention_mask.sum(1),
                                             config.batch_size * runtime.world_size,
                                             config.length_grouping, data_gen)
            sampler = runtime.sampler(train_set, data_gen, epoch, order=order)
            loader = DataLoader(train_set, batch_size=config.batch_size, sampler=sampler,
                                collate_fn=collate)
            net.train()
            loss_sum = torch.zeros((), dtype=torch.float64)
            n_seen = torch.zeros((), dtype=torch.float64)
            bar = tqdm(loader, desc=f"{desc} {epoch + 1}/{config.epochs}", leave=False,
                       disable=not (runtime.progress and runtime.is_main), mininterval=2.0)
            tick = Ticker(f"{desc} {epoch + 1}/{config.epochs}", total=len(loader),
                          enabled=runtime.progress and runtime.is_main)  # lines: every 30 s
            for batch_i, (ids, mask, labels) in enumerate(bar, 1):
                ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
                lr = config.lr * lr_factor(step, total_steps, config.warmup_fraction,
                                           config.schedule)
                for group in optimizer.param_groups:
                    group["lr"] = lr * group.get("lr_scale", 1.0)
                logits = net(ids, mask)
                loss = nn.functional.cross_entropy(logits.float(), labels,
                                                   label_smoothing=config.label_smoothing)
                if not bool(torch.isfinite(loss)):
                    raise FloatingPointError(
                        f"non-finite training loss ({float(loss.detach())}) at epoch "
                        f"{epoch + 1}, step {step}; lower the learning rate or check the inputs"
                    )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if config.grad_clip > 0:
                    nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
                optimizer.step()
                step += 1
                loss_sum += float(loss.detach()) * labels.shape[0]
                n_seen += labels.shape[0]
                bar.set_postfix(loss=f"{float(loss.detach()):.4f}", lr=f"{lr:.2e}", refresh=False)
                tick.update(batch_i, loss=float(loss.detach()))
            bar.close()
            loss_sum, n_seen = runtime.all_reduce_sum([loss_sum, n_seen])
            epoch_time = time.perf_counter() - t0
            train_time += epoch_time
            record: dict[str, Any] = {
                "epoch": epoch + 1,
                "train_loss": float(loss_sum / n_seen.clamp_min(1)),
                "lr": lr,
                "time_s": epoch_time,
            }
            if evaluate is not None:
                model.eval()
                record.update(evaluate(model))
                model.train()
            history.append(record)
            if checkpoint_dir is not None and runtime.is_main:
                tensors, opt_meta = optimizer_to_flat(optimizer)
                tensors["rng.data"] = data_gen.get_state()
                tensors["rng.torch"] = torch.get_rng_state()
                meta = {
                    "epoch": epoch + 1,
                    "step": step,
                    "history": history,
                    "train_time_s": train_time,
                    "config": _jsonable(stored_config),
                    "optimizer": opt_meta,
                }
                save_checkpoint(checkpoint_dir, f"epoch-{epoch + 1:03d}", model, meta, tensors)
            runtime.barrier()
    model.eval()
    return FitResult(history=history, train_time_s=train_time, resumed_from_epoch=start_epoch)


def _jsonable(obj: Any) -> Any:
    """Round-trip through JSON types (tuples -> lists) so stored and fresh configs compare."""
    import json

    return json.loads(json.dumps(obj))

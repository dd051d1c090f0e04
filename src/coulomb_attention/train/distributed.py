"""Data-parallel training on ``torch.distributed`` (launched with ``torchrun``).

Both phases scale out by data parallelism, with the particles and the model replicated:

* Phase A (alignment) is *exactly* data-parallel. The alignment sees the data only through
  sums (``n, sum Phi, sum Y, Phi^T Phi, Phi^T Y, Y^T Y`` and the gradient pulled back through
  them), so each rank streams its shard and :func:`all_reduce_sum` adds the statistics and the
  gradient: every rank then holds what one process would compute on all the data. The
  Langevin noise comes from a generator with the same seed on every rank (:func:`shared_seed`),
  so every rank takes the same step and the particles stay identical without broadcasting
  them. The hook is :attr:`DistributedRuntime.comm` (a :class:`~coulomb_attention.energy.Comm`),
  passed as ``comm=`` to :func:`~coulomb_attention.dynamics.learn_particles`; the Hamiltonian
  then also splits the O(N^2) Riesz pair sum by rows across ranks.
* Phase B (fine-tuning) uses ``DistributedDataParallel`` (gradients averaged over ranks) and
  a :class:`ShardedEpochSampler`: the single-process epoch order dealt round-robin. The batch
  size is per process (PyTorch's convention, and the loop's): the ranks' batches of ``b``
  partition the single-process batches of ``K * b``, and with the mean cross-entropy on every
  rank (equal local batch sizes) each step equals the single-process step on the
  concatenated batch. To train the one-process model with ``--batch-size B`` on ``K``
  processes, pass ``--batch-size B/K``.

:class:`DistributedRuntime` is the ``runtime`` of :func:`coulomb_attention.train.loop.fit`:
``wrap`` (DDP), ``sampler`` (:class:`ShardedEpochSampler` + ``set_epoch``), ``is_main`` (rank 0
writes checkpoints), ``barrier``, ``all_reduce_sum`` (also the phase-A hook).

Launch (same CLI as one process; gloo on CPU, nccl on GPU)::

    torchrun --nproc-per-node=2 -m coulomb_attention.cli train ...
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, RandomSampler, Sampler, Subset

from .._validation import check_positive
from .loop import Runtime

__all__ = [
    "BACKENDS",
    "DistributedRuntime",
    "ShardedEpochSampler",
    "all_reduce_sum",
    "barrier",
    "broadcast_module_",
    "env_info",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "is_distributed",
    "shard",
    "shard_indices",
    "shared_seed",
]

BACKENDS = ("gloo", "nccl")
_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


# --------------------------------------------------------------------------- process group


def env_info() -> tuple[int, int, int]:
    """``(rank, local_rank, world_size)`` from the torchrun environment (``(0, 0, 1)`` without
    ``WORLD_SIZE``).

    Raises
    ------
    ValueError
        When the variables are partly set, not integers, or inconsistent.
    """
    if "WORLD_SIZE" not in os.environ:  # a stray LOCAL_RANK alone means one process
        return 0, 0, 1
    if "RANK" not in os.environ:
        present = [k for k in _ENV if k in os.environ]
        raise ValueError(
            f"incomplete torchrun environment: {', '.join(present)} set but RANK and WORLD_SIZE "
            "are both needed; launch with torchrun"
        )
    try:
        rank = int(os.environ["RANK"])
        world = int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
    except ValueError as exc:
        raise ValueError(f"RANK/WORLD_SIZE/LOCAL_RANK must be integers: {exc}") from exc
    if world < 1 or not 0 <= rank < world or local < 0:
        raise ValueError(f"inconsistent torchrun environment: RANK={rank}, WORLD_SIZE={world}, "
                         f"LOCAL_RANK={local}")
    return rank, local, world


def is_distributed() -> bool:
    """True inside an initialised process group with more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    """Rank of this process (0 outside a process group)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_world_size() -> int:
    """Number of processes (1 outside a process group)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def barrier() -> None:
    """Wait for every process (no-op outside a process group)."""
    if is_distributed():
        dist.barrier()


def _comm_device(tensor: torch.Tensor) -> torch.device:
    # nccl reduces CUDA tensors only; gloo reduces CPU tensors (and CUDA ones by staging).
    if dist.get_backend() == "nccl" and tensor.device.type != "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return tensor.device


def all_reduce_sum(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Sum each tensor over all processes; returns new tensors (inputs are not modified).

    Tensors of the same dtype and device are packed into one flat buffer, so a call costs one
    collective per dtype. Outside a process group (or with one process) the tensors are
    returned as they are. Every rank receives the same bits.

    Parameters
    ----------
    tensors : sequence of Tensor, any shapes (0-d included)

    Returns
    -------
    list of Tensor, same shapes, dtypes and devices
    """
    tensors = list(tensors)
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"all_reduce_sum expects tensors, got {type(t).__name__} at {i}")
    if not is_distributed() or not tensors:
        return tensors
    out: list[torch.Tensor | None] = [None] * len(tensors)
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.dtype, t.device), []).append(i)
    for (_, device), idx in groups.items():
        flat = torch.cat([tensors[i].detach().reshape(-1) for i in idx])
        comm = _comm_device(flat)
        flat = flat.to(comm)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat = flat.to(device)
        offset = 0
        for i in idx:
            n = tensors[i].numel()
            out[i] = flat[offset:offset + n].view(tensors[i].shape)
            offset += n
    return out  # type: ignore[return-value]


def shared_seed(seed: int | None) -> int:
    """A seed equal on every rank: ``seed`` if given, else rank 0's fresh entropy broadcast.

    Use it for every generator whose draws must agree across ranks (Langevin noise, particle
    initialisation, the data order).
    """
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little") >> 2
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int or None, got {seed!r}")
    if not is_distributed():
        return seed
    box = [seed]
    dist.broadcast_object_list(box, src=0)
    return int(box[0])


@torch.no_grad()
def broadcast_module_(module: nn.Module, src: int = 0) -> nn.Module:
    """Copy rank ``src``'s parameters and buffers (the particles included) to every rank."""
    if not is_distributed():
        return module
    for t in list(module.parameters()) + list(module.buffers()):
        comm = _comm_device(t)
        buf = t.detach().to(comm).contiguous()
        dist.broadcast(buf, src=src)
        t.copy_(buf.to(t.device))
    return module


# --------------------------------------------------------------------------------- sharding


def shard_indices(n: int, rank: int | None = None, world_size: int | None = None) -> range:
    """Contiguous, balanced shard of ``range(n)`` for ``rank`` (sizes differ by at most 1).

    The shards of all ranks partition ``range(n)``: no example is repeated or dropped, which is
    what makes the all-reduced alignment statistics exact.
    """
    rank = get_rank() if rank is None else rank
    world_size = get_world_size() if world_size is None else world_size
    check_positive("world_size", world_size, integer=True)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if n < world_size:
        raise ValueError(f"cannot shard {n} examples over {world_size} processes (every rank "
                         "needs at least one)")
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def _shard_positions(n: int, rank: int | None, world_size: int | None, strided: bool,
                     equal: bool) -> list[int]:
    rank = get_rank() if rank is None else rank
    world_size = get_world_size() if world_size is None else world_size
    if not strided and not equal:
        return list(shard_indices(n, rank, world_size))
    shard_indices(n, rank, world_size)  # validates rank, world_size and n >= world_size
    used = n - n % world_size if equal else n
    if strided:
        return list(range(rank, used, world_size))
    per = used // world_size
    return list(range(rank * per, (rank + 1) * per))


def shard(data, rank: int | None = None, world_size: int | None = None, *,
          strided: bool = False, equal: bool = False):
    """This rank's shard of ``data``.

    Parameters
    ----------
    data : Tensor (sharded along dim 0), tuple of tensors with the same first dimension
        (sharded alike), list / tuple / range, an ``EncodedDataset``-like object (attributes
        ``input_ids``, ``attention_mask``, ``labels``; returns the same type) or any
        ``Dataset`` (returns a ``Subset``).
    rank, world_size : default: this process in the current group
    strided : rank ``r`` takes positions ``r, r + W, ...`` (robust to sorted data) instead of
        a contiguous block (:func:`shard_indices`)
    equal : drop the last ``n % W`` examples so every rank gets ``n // W`` (needed where
        ranks must take the same number of steps, e.g. phase A on per-rank mini-batches)

    Without ``equal`` the shards partition the data (exact all-reduced statistics).
    """
    if isinstance(data, tuple) and data and all(isinstance(t, torch.Tensor) for t in data):
        n = data[0].shape[0]
        if any(t.shape[0] != n for t in data):
            raise ValueError(f"tensors to shard together must share the first dimension, got "
                             f"{[tuple(t.shape) for t in data]}")
        idx = torch.tensor(_shard_positions(n, rank, world_size, strided, equal))
        return tuple(t[idx] for t in data)
    if isinstance(data, torch.Tensor):
        idx = torch.tensor(_shard_positions(data.shape[0], rank, world_size, strided, equal))
        return data[idx]
    if all(hasattr(data, a) for a in ("input_ids", "attention_mask", "labels")):
        idx = torch.tensor(_shard_positions(len(data), rank, world_size, strided, equal))
        return type(data)(data.input_ids[idx], data.attention_mask[idx], data.labels[idx])
    if isinstance(data, Dataset):
        return Subset(data, _shard_positions(len(data), rank, world_size,  # type: ignore
                                             strided, equal))
    if isinstance(data, (list, tuple, range, np.ndarray)):
        pos = _shard_positions(len(data), rank, world_size, strided, equal)
        if isinstance(data, np.ndarray):
            return data[np.asarray(pos, dtype=np.int64)]
        picked = [data[i] for i in pos]
        return tuple(picked) if isinstance(data, tuple) else picked
    raise TypeError(f"cannot shard a {type(data).__name__}; pass a tensor, list, tuple of "
                    "tensors or Dataset")


# ------------------------------------------------------------------------------ the runtime


class ShardedEpochSampler(Sampler[int]):
    """One rank's share of the single-process epoch order.

    The order is what ``RandomSampler(dataset, generator=generator)`` yields in one process
    (it consumes ``generator`` identically, so the loop's checkpointed data generator advances
    as in one process); like ``DistributedSampler`` it is padded by wrapping around to
    ``ceil(n / W) * W`` (at most ``W - 1`` examples seen twice per epoch, none when ``W``
    divides ``n``) and dealt round-robin: rank ``r`` gets positions ``r, r + W, r + 2W, ...``.

    Consecutive per-rank batches of ``b`` examples therefore partition the consecutive
    single-process batches of ``W * b`` examples; every rank has ``ceil(n / W)`` examples
    (the same number of steps, equal batch sizes), so DDP's average of the ranks' mean losses
    is the mean loss of the global batch: when ``W`` divides ``n``, a run with ``W`` processes
    and ``--batch-size b`` is the one-process run with ``--batch-size W*b``, step for step.
    (``DistributedSampler`` would use its own permutation, so it matches only in distribution.)

    ``order``: a global epoch order to deal out instead (e.g. a length-grouped one built on
    the global batch ``W * b``, so the grouped batches are also the one-process batches).
    """

    def __init__(self, dataset: Dataset, generator: torch.Generator, rank: int,
                 world_size: int, order: Sampler | None = None) -> None:
        n = len(dataset)  # type: ignore[arg-type]
        if n < 1:
            raise ValueError("cannot shard an empty dataset")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        if order is not None and len(order) != n:  # type: ignore[arg-type]
            raise ValueError(f"order yields {len(order)} indices for {n} examples")  # type: ignore
        self._order = RandomSampler(dataset, generator=generator) if order is None else order
        self.rank, self.world_size, self.n = rank, world_size, n
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Record the epoch (the order already changes every epoch with the generator)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return math.ceil(self.n / self.world_size)

    def __iter__(self) -> Iterator[int]:
        order = list(self._order)  # (n,) consumes the generator like one process
        total = len(self) * self.world_size
        while len(order) < total:  # wrap around (more than once only if n < world_size)
            order += order[: total - len(order)]
        return iter(order[self.rank:total:self.world_size])


@dataclass
class DistributedRuntime(Runtime):
    """Runtime of :func:`~coulomb_attention.train.loop.fit` for ``torch.distributed``.

    Build it with :func:`init_distributed`. With ``world_size == 1`` it behaves exactly like
    the single-process :class:`~coulomb_attention.train.loop.Runtime`.

    Attributes
    ----------
    device : torch.device      ``cuda:LOCAL_RANK`` with nccl, else cpu
    rank, world_size, local_rank : int
    backend : str | None       ``gloo`` / ``nccl`` (``None``: no process group)
    find_unused_parameters : bool   passed to DDP
    """

    local_rank: int = 0
    backend: str | None = None
    find_unused_parameters: bool = False
    owns_group: bool = field(default=False, repr=False)

    # ---- the loop's Runtime protocol
    def wrap(self, model: nn.Module) -> nn.Module:
        """``DistributedDataParallel(model)`` (identity with one process).

        Buffers (the particles) are not re-broadcast at every forward: they are identical on
        every rank (phase A is replicated) and DDP copies rank 0's parameters and buffers once
        when it wraps the model.
        """
        if self.world_size == 1:
            return model
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel
        # no buffer broadcast at every forward (torch >= 2.13 renames the flag)
        no_sync = ({"forward_sync_buffers": False}
                   if "forward_sync_buffers" in inspect.signature(ddp.__init__).parameters
                   else {"broadcast_buffers": False})
        return ddp(model, device_ids=device_ids,
                   find_unused_parameters=self.find_unused_parameters, **no_sync)

    def sampler(self, dataset: Dataset, generator: torch.Generator, epoch: int,
                order: Sampler | None = None) -> Sampler:
        """This rank's share of epoch ``epoch`` (a :class:`ShardedEpochSampler`).

        The epoch order is the single-process one (drawn from the loop's data generator,
        seeded identically and checkpointed on every rank), dealt out round-robin: with a
        per-rank batch of ``b`` the ranks' batches partition the single-process batches of
        ``world_size * b``. ``order``: a global order to deal out instead of the permutation.
        """
        if self.world_size == 1:
            return order if order is not None else super().sampler(dataset, generator, epoch)
        sampler = ShardedEpochSampler(dataset, generator, self.rank, self.world_size, order)
        sampler.set_epoch(epoch)
        return sampler

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def all_reduce_sum(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return all_reduce_sum(tensors)

    # ---- helpers for phase A and the CLI
    @property
    def reduce(self) -> Callable[[list[torch.Tensor]], list[torch.Tensor]] | None:
        """The phase-A ``reduce=`` hook (``None`` with one process)."""
        return all_reduce_sum if self.world_size > 1 else None

    def shard(self, data, *, strided: bool = False, equal: bool = False):
        """This rank's shard of ``data`` (see :func:`shard`)."""
        return shard(data, self.rank, self.world_size, strided=strided, equal=equal)

    def shared_seed(self, seed: int | None) -> int:
        """See :func:`shared_seed`."""
        return shared_seed(seed)

    def broadcast_module_(self, module: nn.Module) -> nn.Module:
        """See :func:`broadcast_module_`."""
        return broadcast_module_(module)

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Rank 0 runs the block first (e.g. writes a tokenizer cache), the others then."""
        if not self.is_main:
            self.barrier()
        try:
            yield
        finally:
            if self.is_main:
                self.barrier()

    def close(self) -> None:
        """Destroy the process group if this runtime created it."""
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_group = False

    def __enter__(self) -> DistributedRuntime:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def init_distributed(
    backend: str | None = None,
    *,
    timeout_s: float = 1800.0,
    progress: bool = True,
) -> DistributedRuntime:
    """Join the process group described by the torchrun environment and return the runtime.

    Outside torchrun (no ``RANK``/``WORLD_SIZE``) or with ``WORLD_SIZE=1`` no group is created
    and the runtime is the single-process one. Calling it again in an initialised process
    returns a runtime for the existing group.

    Parameters
    ----------
    backend : ``gloo`` | ``nccl`` | None
        ``None``: nccl when CUDA is available, else gloo (CPU).
    timeout_s : float
        Collective timeout: a hung peer raises instead of blocking forever.
    progress : bool
        Progress bars (shown by rank 0 only).

    Returns
    -------
    DistributedRuntime
    """
    check_positive("timeout_s", timeout_s)
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    rank, local_rank, world = env_info()
    use_cuda = torch.cuda.is_available() and backend != "gloo"
    if backend is None:
        backend = "nccl" if use_cuda and dist.is_nccl_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend 'nccl' needs CUDA; use 'gloo' on CPU")
    device = torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1)) if (
        use_cuda) else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    owns = False
    if world > 1 and not dist.is_initialized():
        if not dist.is_available():
            raise ImportError("this torch build has no torch.distributed")
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            if key not in os.environ:
                raise ValueError(f"{key} is not set; launch with torchrun (it sets it)")
        dist.init_process_group(backend=backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        owns = True
    if dist.is_initialized():
        rank, world, backend = dist.get_rank(), dist.get_world_size(), dist.get_backend()
    else:
        backend = None
    return DistributedRuntime(device=device, rank=rank, world_size=world, progress=progress,
                              local_rank=local_rank, backend=backend, owns_group=owns)

"""Data-parallel training on ``torch.distributed`` (launched with ``torchrun``).

Both phases scale out by data parallelism, with the particles and the model replicated:

* Phase A (alignment) is *exactly* data-parallel. The alignment sees the data only through
  sums (``n, sum Phi, sum Y, Phi^T Phi, Phi^T Y, Y^T Y`` and the gradient pulled back through
  them), so each rank streams its shard and :func:`all_reduce_sum` adds the statistics and the
  gradient: every rank then holds what one process would compute on all the data. The
  Langevin noise comes from a generator with the same seed on every rank (:func:`shared_seed`),
  so every rank takes the same step and the particles stay identical without broadcasting
  them. The hook is :func:`make_reduce` (or :attr:`DistributedRuntime.reduce`), passed as
  ``reduce=`` to :class:`~coulomb_attention.energy.Hamiltonian`. :class:`DistributedHamiltonian`
  also splits the O(N^2) Riesz pair sum by rows across ranks.
* Phase B (fine-tuning) uses ``DistributedDataParallel`` (gradients averaged over ranks) and a
  ``DistributedSampler`` (a disjoint shard of every epoch's permutation per rank). With
  ``global_batch_size = world_size * local_batch_size`` and the mean cross-entropy on every
  rank, one step equals the single-process step on the concatenated batch.

:class:`DistributedRuntime` is the ``runtime`` of :func:`coulomb_attention.train.loop.fit`:
``wrap`` (DDP), ``sampler`` (``DistributedSampler`` + ``set_epoch``), ``is_main`` (rank 0 writes
checkpoints), ``barrier`` and ``all_reduce_sum``.

Launch (same CLI as one process; gloo on CPU, nccl on GPU)::

    torchrun --nproc-per-node=2 -m coulomb_attention.cli train ...
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, DistributedSampler, Sampler, Subset

from .._validation import check_positive
from ..energy.alignment import alignment_value_and_grad
from ..energy.hamiltonian import Hamiltonian
from ..energy.riesz import PairPotential
from .loop import Runtime

__all__ = [
    "BACKENDS",
    "DistributedHamiltonian",
    "DistributedRuntime",
    "all_reduce_sum",
    "barrier",
    "broadcast_module_",
    "env_info",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "is_distributed",
    "is_main_process",
    "make_reduce",
    "shard",
    "shard_indices",
    "sharded_riesz_energy_and_grad",
    "shared_seed",
]

BACKENDS = ("gloo", "nccl")
_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


# --------------------------------------------------------------------------- process group


def env_info() -> tuple[int, int, int]:
    """``(rank, local_rank, world_size)`` from the torchrun environment (``(0, 0, 1)`` if unset).

    Raises
    ------
    ValueError
        When the variables are partly set, not integers, or inconsistent.
    """
    present = [k for k in _ENV if k in os.environ]
    if not present:
        return 0, 0, 1
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
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


def is_main_process() -> bool:
    """True on rank 0 (and in a single process): the one that writes files and prints."""
    return get_rank() == 0


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


def make_reduce() -> Callable[[list[torch.Tensor]], list[torch.Tensor]] | None:
    """The phase-A hook: ``reduce=`` for :func:`~coulomb_attention.energy.alignment_value_and_grad`
    and :class:`~coulomb_attention.energy.Hamiltonian` (``None`` in a single process)."""
    return all_reduce_sum if is_distributed() else None


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


def shard(data, rank: int | None = None, world_size: int | None = None):
    """This rank's contiguous shard of ``data`` (see :func:`shard_indices`).

    Tensors and sequences are sliced along the first dimension; a ``Dataset`` becomes a
    ``Subset``; a tuple of equally long tensors (e.g. ``(inputs, labels)``) is sharded
    element-wise.
    """
    if isinstance(data, tuple) and data and all(isinstance(t, torch.Tensor) for t in data):
        n = data[0].shape[0]
        if any(t.shape[0] != n for t in data):
            raise ValueError(f"tensors to shard together must share the first dimension, got "
                             f"{[tuple(t.shape) for t in data]}")
        r = shard_indices(n, rank, world_size)
        return tuple(t[r.start:r.stop] for t in data)
    if isinstance(data, torch.Tensor):
        r = shard_indices(data.shape[0], rank, world_size)
        return data[r.start:r.stop]
    if isinstance(data, Dataset):
        r = shard_indices(len(data), rank, world_size)  # type: ignore[arg-type]
        return Subset(data, list(r))
    if isinstance(data, (list, tuple, range, np.ndarray)):
        r = shard_indices(len(data), rank, world_size)
        return data[r.start:r.stop]
    raise TypeError(f"cannot shard a {type(data).__name__}; pass a tensor, list, tuple of "
                    "tensors or Dataset")


# ------------------------------------------------------------------ sharded Riesz repulsion


def sharded_riesz_energy_and_grad(
    omega: torch.Tensor,
    potential: PairPotential,
    rank: int | None = None,
    world_size: int | None = None,
    reduce: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``W_{N,s}`` and its gradient with the pair sum split by rows across ranks.

    Rank ``r`` computes rows ``i`` in its :func:`shard_indices` block of
    ``W = (1/N^2) sum_{i != j} g(|w_i - w_j|^2)`` and the matching gradient rows
    ``grad_i W = (4/N^2) sum_j g'(r2_ij) (w_i - w_j)``; ``reduce`` (default
    :func:`all_reduce_sum`) adds the partial energies and the zero-padded gradients. Memory and
    time per rank are O(N^2 d / world_size).

    Parameters
    ----------
    omega : Tensor, shape (N, d)   replicated particles (identical on every rank)
    potential : PairPotential

    Returns
    -------
    energy : Tensor, shape ()
    grad : Tensor, shape (N, d)
    """
    rank = get_rank() if rank is None else rank
    world_size = get_world_size() if world_size is None else world_size
    reduce = all_reduce_sum if reduce is None else reduce
    omega = omega.detach()
    n = omega.shape[0]
    if n < 2:
        return omega.new_zeros(()), torch.zeros_like(omega)
    if n < world_size:
        rows = range(rank, rank + 1) if rank < n else range(0)
    else:
        rows = shard_indices(n, rank, world_size)
    w_rows = omega[rows.start:rows.stop]  # (R, d)
    sq = (omega * omega).sum(1)  # (N,)
    r2 = (sq[rows.start:rows.stop, None] + sq[None, :] - 2.0 * w_rows @ omega.T).clamp_min(0.0)
    self_pair = torch.zeros_like(r2, dtype=torch.bool)  # (R, N): the diagonal i == j
    self_pair[torch.arange(len(rows)), torch.arange(rows.start, rows.stop)] = True
    r2 = r2.masked_fill(self_pair, 0.0)
    g = potential.value(r2).masked_fill(self_pair, 0.0)
    dg = potential.dvalue(r2).masked_fill(self_pair, 0.0)  # (R, N)
    energy = g.sum() / n**2
    grad = torch.zeros_like(omega)
    grad[rows.start:rows.stop] = (4.0 / n**2) * (w_rows * dg.sum(1, keepdim=True) - dg @ omega)
    energy, grad = reduce([energy, grad])
    return energy, grad


@dataclass
class DistributedHamiltonian(Hamiltonian):
    """:class:`~coulomb_attention.energy.Hamiltonian` with the Riesz pair sum split across ranks.

    The data term is the core's (``reduce`` all-reduces its statistics and gradient); the
    repulsion comes from :func:`sharded_riesz_energy_and_grad` when ``shard_repulsion`` and
    more than one process, else from the core. Both give the same energy and gradient (to
    float round-off); sharding pays off when ``N^2 d`` is comparable to the data term's
    ``n N (N + d)``.
    """

    shard_repulsion: bool = True
    rank: int | None = None
    world_size: int | None = None

    def value_and_grad(self, omega, batches):
        rank = get_rank() if self.rank is None else self.rank
        world = get_world_size() if self.world_size is None else self.world_size
        if (not self.shard_repulsion or world == 1 or self.potential is None
                or self.lam == 0):
            return super().value_and_grad(omega, batches)
        a, grad_a = alignment_value_and_grad(
            omega, batches, self.features, center=self.center, reduce=self.reduce
        )
        w, grad_w = sharded_riesz_energy_and_grad(omega, self.potential, rank, world,
                                                  reduce=self.reduce)
        grad = -grad_a + self.lam * grad_w
        energy = -a.to(omega.dtype) + self.lam * w.to(omega.dtype)
        return energy, grad, {"alignment": float(a), "repulsion": float(w)}

    __call__ = value_and_grad


# ------------------------------------------------------------------------------ the runtime


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
        return nn.parallel.DistributedDataParallel(
            model, device_ids=device_ids, broadcast_buffers=False,
            find_unused_parameters=self.find_unused_parameters,
        )

    def sampler(self, dataset: Dataset, generator: torch.Generator, epoch: int) -> Sampler:
        """This rank's part of epoch ``epoch``'s permutation (``DistributedSampler``).

        The permutation seed is drawn from ``generator`` (the loop's data generator, seeded
        identically and checkpointed on every rank), so all ranks shuffle alike and a resumed
        run continues the same sequence. Ranks get ``ceil(n / world_size)`` examples each (a
        few repeated when ``n`` is not divisible), so every rank takes the same number of steps.
        """
        if self.world_size == 1:
            return super().sampler(dataset, generator, epoch)
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        s = DistributedSampler(dataset, num_replicas=self.world_size, rank=self.rank, shuffle=True,
                          seed=seed, drop_last=False)
        s.set_epoch(epoch)
        return s

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

    def local_batch_size(self, global_batch_size: int) -> int:
        """Per-rank batch size for a global batch (must divide evenly)."""
        check_positive("batch_size", global_batch_size, integer=True)
        if global_batch_size % self.world_size:
            raise ValueError(f"batch_size {global_batch_size} is not divisible by the "
                             f"{self.world_size} processes")
        return global_batch_size // self.world_size

    def shard(self, data):
        """This rank's contiguous shard of ``data`` (tensor, sequence, tuple, Dataset)."""
        return shard(data, self.rank, self.world_size)

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

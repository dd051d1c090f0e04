"""The one particle driver: projected Langevin dynamics of a Hamiltonian over a schedule.

Every place that moves particles calls :func:`learn_particles` (the estimators, phase A of
the Transformer, the conversion of a pretrained encoder, the mean-field particle system and
the benchmarks); none calls :func:`~coulomb_attention.dynamics.projected_langevin` itself.

    omega_i <- Proj_K( omega_i - eta_k * N * grad_i H + sqrt(2 eta_k / beta_k) xi_i )

with ``eta_k`` and ``beta_k`` from a :class:`LangevinSchedule`, one batch per step from
``batches`` (cycled), the cross-process hook ``comm`` handed to the Hamiltonian (exact data
parallelism: every rank holds the same particles, the noise comes from a same-seeded
generator), and per-step callbacks (history, progress, checkpoint).

Two options change what moves, not the loop: ``reaction=`` (a :class:`~.weighted.Reaction`)
gives the particles masses (Wasserstein-Fisher-Rao transport + reaction + birth-death,
:mod:`coulomb_attention.dynamics.weighted`), and ``method="adam"`` replaces the Langevin step
by projected Adam with learning rate ``lr`` (:mod:`coulomb_attention.dynamics.adam`, the
plain-optimiser ablation; ``method="hedgehog"``: the same Adam on ``W`` with ``omega = [W; -W]``
along the particle axis, Hedgehog's map). The grouped fits of the learners (one method name
for each, head groups, one trace format) are :func:`coulomb_attention.dynamics.fit.fit_particles`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from .._validation import check_choice, check_positive
from ..names import LEARN_METHODS as METHODS
from ..progress import Ticker
from .adam import projected_adam
from .langevin import SCHEDULES, LangevinState, make_schedule, projected_langevin
from .weighted import Reaction, ReactionNormalizer, weighted_langevin

__all__ = ["DriftNormalizer", "LangevinSchedule", "METHODS", "ParticleRun", "cycle",
           "learn_particles"]

ADAM_METHODS = ("adam", "hedgehog")  # no noise, Adam's learning rate ``lr``


@dataclass(frozen=True)
class LangevinSchedule:
    """Steps, step size and temperature of one run of the dynamics.

    Attributes
    ----------
    steps : int                number of Langevin steps
    eta : float                (initial) step size
    eta_end : float or None    final step size (``eta_schedule`` cosine / geometric)
    eta_schedule : str         constant, cosine or geometric
    beta : float               (final) inverse temperature; ``inf`` (or 0, read as inf): no noise
    beta_start : float or None initial inverse temperature for ``beta_schedule`` geometric
    beta_schedule : str        constant or geometric (annealing beta_start -> beta)
    max_drift : float or None  cap on one particle's drift per step (None or 0: none)
    """

    steps: int = 100
    eta: float = 1e-2
    eta_end: float | None = None
    eta_schedule: str = "constant"
    beta: float = math.inf
    beta_start: float | None = None
    beta_schedule: str = "constant"
    max_drift: float | None = None

    def __post_init__(self) -> None:
        check_positive("steps", self.steps, integer=True)
        check_positive("eta", self.eta)
        check_choice("eta_schedule", self.eta_schedule, SCHEDULES)
        check_choice("beta_schedule", self.beta_schedule, ("constant", "geometric"))
        if self.beta == 0:  # 0 reads as infinity (no noise), as in the configs
            object.__setattr__(self, "beta", math.inf)
        check_positive("beta", self.beta, allow_inf=True)
        if self.max_drift == 0:
            object.__setattr__(self, "max_drift", None)
        if self.eta_schedule != "constant" and self.eta_end is None:
            raise ValueError(f"eta_schedule {self.eta_schedule!r} needs eta_end")
        if self.beta_schedule == "geometric" and self.beta_start is None:
            raise ValueError("beta_schedule 'geometric' needs beta_start")

    def eta_fn(self) -> Callable[[int], float]:
        return make_schedule(self.eta_schedule, self.eta, self.eta_end, self.steps)

    def beta_fn(self) -> Callable[[int], float] | None:
        if self.beta_schedule == "constant":
            return None
        return make_schedule("geometric", self.beta_start, self.beta, self.steps)


class DriftNormalizer:
    """Divides the gradient by a running RMS of the per-particle drift ``N |grad_i|``.

    The core drift ``eta * N * grad`` then has a per-particle RMS of about ``eta`` (in the
    particles' units) whatever the scale of the energy: a scale-free step size.
    """

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        self.sq: float | None = None

    def __call__(self, grad: torch.Tensor) -> torch.Tensor:
        n = grad.shape[0]
        sq = float((n * grad).pow(2).sum(1).mean())
        self.sq = sq if self.sq is None else self.decay * self.sq + (1 - self.decay) * sq
        return grad / math.sqrt(max(self.sq, 1e-300))


@dataclass
class ParticleRun:
    """The result of :func:`learn_particles`.

    Attributes
    ----------
    omega : Tensor (N, d)   final particles
    trace : list of dict    one per step (energy, data-term parts, repulsion, boundary
                            fraction, gradient norm, eta, beta, what callbacks added)
    state : LangevinState   final state (its generator continues the noise stream)
    weights : Tensor (N,) or None   final masses of a weighted run (``reaction=``)
    """

    omega: torch.Tensor
    trace: list[dict] = field(default_factory=list)
    state: LangevinState | None = None
    weights: torch.Tensor | None = None


def cycle(batches: Sequence, order: Sequence[int] | None = None) -> Iterator:
    """Endless iterator over ``batches`` in ``order`` (default: as given)."""
    if not batches:
        raise ValueError("no data: batches is empty")
    order = list(range(len(batches))) if order is None else list(order)
    while True:
        for i in order:
            yield batches[i]


def learn_particles(
    hamiltonian,
    omega0: torch.Tensor,
    schedule: LangevinSchedule,
    batches: Iterable | None = None,
    *,
    projection: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None,
    generator: torch.Generator,
    comm=None,
    normalize_drift: bool = False,
    callbacks: Sequence[Callable[[LangevinState, dict], None]] = (),
    progress: bool | str = False,
    start_step: int = 0,
    method: str = "langevin",
    reaction: Reaction | None = None,
    weights0: torch.Tensor | None = None,
    lr: float | None = None,
) -> ParticleRun:
    """Run the projected Langevin dynamics of ``hamiltonian`` from ``omega0``.

    Parameters
    ----------
    hamiltonian : an object with ``value_and_grad(omega, batches, comm)``
        (:class:`~coulomb_attention.energy.Hamiltonian`)
    omega0 : Tensor, shape (N, d)   initial particles (projected first); ``adam``: any shape
        ``(..., N, d)`` (e.g. ``(G, M, d)`` head groups; without a projection any shape at all),
        ``hedgehog``: ``(..., 2 N', d)``
    schedule : LangevinSchedule
    batches : iterator (or sequence, then cycled) yielding one item per step; a step's energy
        sees ``[item]``, or the item itself when it is a ``list`` of batches (streamed together,
        e.g. ``itertools.repeat(all_batches)`` for exact full-data steps). ``None``: the data
        term sees no batches (``[]``).
    projection : ``omega -> (projected omega, on-boundary mask (N,))`` (Ball, Box, ...); None
        (``adam`` only): no constraint; ``hedgehog`` takes none
    generator : torch.Generator of the Langevin noise (same seed on every rank)
    comm : optional :class:`~coulomb_attention.energy.Comm`, the all-reduce hook
    normalize_drift : divide the gradient by a running RMS of the drift (:class:`DriftNormalizer`)
    callbacks : ``callback(state, info)`` after every step (may add keys to ``info``)
    progress : show a progress bar (a string: its description)
    start_step : the schedule's step to start at (a resumed run)
    method : ``"langevin"`` (default), ``"adam"`` (projected Adam, no noise: needs
        ``schedule.beta = inf``; ``normalize_drift`` and ``max_drift`` do not apply, Adam is
        scale free) or ``"hedgehog"`` (Adam on ``W``, ``omega = [W; -W]`` along dim -2)
    reaction : a :class:`~coulomb_attention.dynamics.weighted.Reaction`: weighted particles
        (masses, Fisher-Rao reaction, birth-death); the Hamiltonian then gets ``weights=``.
        ``normalize_drift`` then acts on the drift ``grad_i H / w_i``.
    weights0 : initial masses (N,) of a weighted run (default uniform)
    lr : Adam's learning rate (``adam``/``hedgehog``, required there); step ``k`` uses
        ``lr * eta_k / eta_0``, the shape of the schedule (a constant schedule: ``lr``)

    Returns
    -------
    ParticleRun
    """
    check_choice("method", method, METHODS)
    adam = method in ADAM_METHODS
    if omega0.ndim != 2 and not (adam and (omega0.ndim > 2 or projection is None)):
        raise ValueError(f"omega0 must have shape (N, d), got {tuple(omega0.shape)}")
    if not isinstance(schedule, LangevinSchedule):
        raise TypeError(f"schedule must be a LangevinSchedule, got {type(schedule).__name__}")
    if reaction is not None and not isinstance(reaction, Reaction):
        raise TypeError(f"reaction must be a Reaction, got {type(reaction).__name__}")
    if adam and reaction is not None:
        raise ValueError(f"method={method!r} moves unweighted particles; drop reaction=")
    if adam and lr is None:
        raise ValueError(f"method={method!r} needs lr (Adam's learning rate)")
    if not adam and lr is not None:
        raise ValueError(f"lr is Adam's learning rate; method={method!r} takes eta (schedule)")
    if projection is None and not adam:
        raise ValueError("the Langevin dynamics needs a projection")
    if weights0 is not None and reaction is None:
        raise ValueError("weights0 needs reaction= (a weighted run)")
    if batches is not None and isinstance(batches, Sequence):
        batches = cycle(batches)
    normalizer = DriftNormalizer() if normalize_drift else None

    def seen_of(batch):
        return [] if batch is None else batch if isinstance(batch, list) else [batch]

    def energy_grad(omega, batch):
        energy, grad, info = hamiltonian.value_and_grad(omega, seen_of(batch), comm)
        if normalizer is not None:
            grad = normalizer(grad)
        return energy, grad, info

    eta_fn, beta_fn = schedule.eta_fn(), schedule.beta_fn()
    extra = {}
    if reaction is not None:
        v_normalizer = ReactionNormalizer() if reaction.normalize else None
        n = omega0.shape[0]

        def weighted_energy_grad(omega, weights, batch):
            energy, (grad, v), info = hamiltonian.value_and_grad(
                omega, seen_of(batch), comm, weights=weights)
            if normalizer is not None:  # normalise the drift grad_i / w_i, i.e. N grad_i at 1/N
                scale = n * weights.unsqueeze(1)
                grad = normalizer(grad / scale) * scale
            if v_normalizer is not None:
                v = v_normalizer(v, weights)
            return energy, (grad, v), info

        init_fn, step_fn = weighted_langevin(
            weighted_energy_grad, projection, eta=schedule.eta, beta=schedule.beta,
            tau=reaction.tau, w_min=reaction.w_min, jitter=reaction.jitter,
            max_drift=schedule.max_drift, transport=reaction.transport)
        state = init_fn(omega0, generator, weights0)
        eta0 = schedule.eta
        tau_fn = (lambda k: reaction.tau * eta_fn(k) / eta0)  # noqa: E731
    elif adam:
        if math.isfinite(schedule.beta) or beta_fn is not None:
            raise ValueError(f"method={method!r} has no noise: the schedule needs beta=inf")
        init_fn, step_fn = projected_adam(
            lambda omega, batch: hamiltonian.value_and_grad(omega, seen_of(batch), comm),
            projection, lr=lr, tied_dim=-2 if method == "hedgehog" else None)
        state = init_fn(omega0, generator)
        tau_fn = None
        eta0 = schedule.eta
    else:
        init_fn, step_fn = projected_langevin(energy_grad, projection, eta=schedule.eta,
                                              beta=schedule.beta, max_drift=schedule.max_drift)
        state = init_fn(omega0, generator)
        tau_fn = None
    state.step = int(start_step)
    bar = None
    desc = progress if isinstance(progress, str) else "Langevin"
    # off a terminal (the CLI's lines mode) a line at least every 30 s instead of the bar
    tick = Ticker(desc, total=schedule.steps, enabled=bool(progress))
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=schedule.steps, initial=state.step, desc=desc, leave=False)
    trace: list[dict] = []
    try:
        while state.step < schedule.steps:
            batch = next(batches) if batches is not None else None
            kwargs = ({"lr": lr * (eta_fn(state.step) / eta0)} if adam
                      else {"eta": eta_fn(state.step)})
            if beta_fn is not None:
                kwargs["beta"] = beta_fn(state.step)
            if tau_fn is not None:
                kwargs["tau"] = tau_fn(state.step)
            state, info = step_fn(state, batch, **kwargs)
            for cb in callbacks:
                cb(state, info)
            trace.append(info)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(energy=f"{info['energy']:.4g}", refresh=False)
                tick.update(state.step, energy=float(info["energy"]))
    finally:
        if bar is not None:
            bar.close()
    if reaction is not None:
        extra["weights"] = state.weights
    return ParticleRun(omega=state.omega, trace=trace, state=state, **extra)

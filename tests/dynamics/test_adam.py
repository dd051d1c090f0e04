"""The one Adam loop (:func:`projected_adam`) and the one grouped particle fit
(:func:`fit_particles`): Adam against torch.optim.Adam by hand, the tied (Hedgehog)
parametrisation against the untied one, grouped Langevin against per-group runs, the trace
format."""

from __future__ import annotations

import math

import pytest
import torch

from coulomb_attention.dynamics import (
    Ball,
    LangevinSchedule,
    ParticleConfig,
    cycle,
    fit_particles,
    learn_particles,
    projected_adam,
    subsample_trace,
)


class Quadratic:
    """``E(omega) = 1/2 sum_i |A_g (omega_gi - c_g)|^2 / G`` over a batch of targets ``c`` of the
    leading shape of omega; ``value_and_grad(omega, batches, comm)``."""

    def __init__(self, scale: torch.Tensor) -> None:
        self.scale = scale

    def value_and_grad(self, omega, batches, comm=None):
        c = batches[0] if batches else torch.zeros_like(omega)
        r = self.scale * (omega - c)
        return 0.5 * (r * r).sum(), self.scale * r, {"kl": float((r * r).mean())}


def _targets(shape, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(n)]


def test_adam_is_torch_adam_by_hand_with_projection_and_lr_per_step():
    shape = (2, 5, 3)  # (G, M, d): any leading group shape
    g = torch.Generator().manual_seed(1)
    omega = 2.0 * torch.randn(shape, generator=g, dtype=torch.float64)
    term = Quadratic(torch.linspace(0.5, 2.0, 3, dtype=torch.float64))
    ball = Ball(2.5)
    batches = _targets(shape)
    init_fn, step_fn = projected_adam(lambda om, b: term.value_and_grad(om, [b]), ball, lr=0.1)
    state = init_fn(omega)
    p = ball(omega.clone().view(-1, 3))[0].view(shape).requires_grad_(True)
    opt = torch.optim.Adam([p], lr=0.1)
    for k in range(12):
        lr = 0.1 / (1 + k)
        state, info = step_fn(state, batches[k % 3], lr=lr)
        _, grad, _ = term.value_and_grad(p.detach(), [batches[k % 3]])
        opt.param_groups[0]["lr"] = lr
        p.grad = grad
        opt.step()
        with torch.no_grad():
            p.copy_(ball(p.view(-1, 3))[0].view(shape))
        assert info["step"] == k and info["lr"] == lr
    assert torch.equal(state.omega, p.detach())
    assert float(state.omega.reshape(-1, 3).norm(dim=1).max()) <= 2.5 + 1e-12
    with pytest.raises(ValueError, match="beta"):
        step_fn(state, batches[0], beta=1.0)


def test_tied_adam_equals_untied_adam_on_w_of_the_folded_energy():
    # omega = [W; -W] along the particle axis: Adam on W of E([W; -W]) is the tied fit
    g = torch.Generator().manual_seed(2)
    W0 = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    term = Quadratic(torch.tensor(1.5, dtype=torch.float64))
    targets = _targets((2, 6, 4))

    def folded(w, batches):
        e, grad, info = term.value_and_grad(torch.cat([w, -w], 1), batches)
        return e, grad[:, :3] - grad[:, 3:], info

    tied = learn_particles(term, torch.cat([W0, -W0], 1), LangevinSchedule(steps=15),
                           cycle(targets), projection=None, generator=torch.Generator(),
                           method="hedgehog", lr=0.05)
    free = learn_particles(type("F", (), {"value_and_grad": staticmethod(
        lambda w, b, comm=None: folded(w, b))})(), W0, LangevinSchedule(steps=15),
        cycle(targets), projection=None, generator=torch.Generator(), method="adam", lr=0.05)
    assert torch.equal(tied.omega[:, :3], free.omega) and torch.equal(tied.omega[:, 3:],
                                                                      -free.omega)
    with pytest.raises(ValueError, match="untied"):
        projected_adam(folded, Ball(1.0), lr=0.1, tied_dim=0)


def test_adam_lr_follows_the_shape_of_the_schedule():
    term = Quadratic(torch.tensor(1.0, dtype=torch.float64))
    omega = torch.ones(4, 2, dtype=torch.float64)
    sched = LangevinSchedule(steps=5, eta=0.2, eta_end=0.02, eta_schedule="cosine")
    run = learn_particles(term, omega, sched, None, projection=Ball(9.0),
                          generator=torch.Generator(), method="adam", lr=0.1)
    eta = sched.eta_fn()
    assert [t["lr"] for t in run.trace] == pytest.approx([0.1 * eta(k) / 0.2 for k in range(5)])
    with pytest.raises(ValueError, match="lr"):
        learn_particles(term, omega, sched, None, projection=Ball(9.0),
                        generator=torch.Generator(), method="adam")


class PerGroup:
    """A grouped data term: the mean over groups of ``Quadratic`` per group (omega (G, M, d)
    or, one group, (M, d)); the Langevin noise-free drift of each group is its own."""

    def __init__(self, scales):
        self.scales = scales

    def value_and_grad(self, omega, batches, comm=None):
        shape = omega.shape
        om, c = omega.view(-1, *shape[-2:]), batches[0].view(-1, *shape[-2:])
        r = self.scales[:, None, None] * (om - c)
        G = om.shape[0]
        grad = self.scales[:, None, None] * r / G
        return 0.5 * (r * r).sum() / G, grad.view(shape), {"kl": 0.0}


class Lift:
    def __init__(self, term, groups):
        self.term, self.groups = term, groups

    def value_and_grad(self, omega, batches, comm=None):
        G = self.groups
        e, grad, info = self.term.value_and_grad(omega.view(G, -1, omega.shape[1]), batches)
        return e, grad.reshape(omega.shape), info


@pytest.mark.parametrize("method", ["langevin", "adam"])
def test_the_grouped_fit_equals_each_group_fitted_alone(method):
    # langevin: the drift is eta * N * grad with N = G M particles and a data term divided by
    # G, i.e. eta * M * grad of the group's own energy; without noise and without a drift cap
    # the grouped run is the per-group runs. adam: invariant to the 1/G scale (up to eps).
    G, M, d = 3, 4, 2
    g = torch.Generator().manual_seed(3)
    omega0 = torch.randn(G, M, d, generator=g, dtype=torch.float64)
    scales = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    batches = _targets((G, M, d), n=2, seed=4)
    cfg = ParticleConfig(steps=20, eta=0.05, eta_end=0.01, beta=0.0, max_drift=0.0,
                         method=method, lr=0.05)
    ball = Ball(10.0)
    kw = dict(config=cfg, lift=Lift, projection=ball, schedule=cfg.schedule(),
              noise=torch.Generator().manual_seed(0))
    whole = fit_particles(PerGroup(scales), None, omega0, batches, [1, 0], **kw)
    for k in range(G):
        alone = fit_particles(None, PerGroup(scales[k:k + 1]), omega0[k:k + 1],
                              [b[k] for b in batches], [1, 0], **kw)
        assert torch.allclose(whole.omega[k], alone.omega[0], rtol=0,
                              atol=1e-12 if method == "langevin" else 1e-6)
    assert whole.masses is None and len(whole.traces) == G
    trace = subsample_trace(whole.trace, 5)
    assert [t["step"] for t in trace] == [0, 5, 10, 14, 19]
    assert all(set(t) == {"step", "energy", "data", "repulsion"} for t in trace)


def test_the_trace_format_reads_every_data_term():
    trace = [{"energy": 1.0, "kl": 0.5, "repulsion": float("nan")},
             {"energy": 2.0, "cos": 0.75}, {"energy": math.inf, "alignment": 0.25}]
    assert subsample_trace(trace, 10) == [
        {"step": 0, "energy": 1.0, "data": 0.5, "repulsion": None},
        {"step": 1, "energy": 2.0, "data": 0.25, "repulsion": 0.0},
        {"step": 2, "energy": None, "data": -0.25, "repulsion": 0.0}]
    assert subsample_trace(trace, 0) == [] and subsample_trace([], 5) == []


def test_the_config_holds_the_method_and_validates_it():
    with pytest.raises(ValueError, match="method"):
        ParticleConfig(method="sgd")
    with pytest.raises(ValueError, match="lr"):
        ParticleConfig(lr=0.0)
    with pytest.raises(ValueError, match="w_min"):
        ParticleConfig(w_min=1.5)
    with pytest.raises(TypeError, match="normalize_drift"):
        ParticleConfig(normalize_drift=1)

"""The one transport step (dynamics/transport.py): the old formula of both drivers, bit for
bit, and both drivers move their particles through it."""

import math

import pytest
import torch

from coulomb_attention.dynamics import (
    Ball,
    Box,
    cap_drift,
    langevin,
    projected_langevin,
    transport_step,
    uniform_weights,
    weighted,
    weighted_langevin,
)


def _old_step(omega, drift, projection, eta, beta, generator, max_drift):
    """The step as written twice before (dynamics/langevin.py and dynamics/weighted.py)."""
    if max_drift is not None:
        length = drift.norm(dim=1, keepdim=True)
        drift = drift * (max_drift / length.clamp_min(max_drift))
    proposal = omega + drift
    if math.isfinite(beta):
        noise = torch.randn(omega.shape, generator=generator, dtype=omega.dtype)
        proposal = proposal + math.sqrt(2.0 * eta / beta) * noise
    return projection(proposal)


@pytest.mark.parametrize("beta", [3.0, math.inf])
@pytest.mark.parametrize("max_drift", [None, 0.05])
@pytest.mark.parametrize("projection", [Ball(1.0), Box(0.8)], ids=["ball", "box"])
def test_the_step_is_the_old_formula_bit_for_bit(beta, max_drift, projection):
    g = torch.Generator().manual_seed(0)
    omega = torch.randn(16, 3, generator=g, dtype=torch.float64) * 0.5
    drift = torch.randn(16, 3, generator=g, dtype=torch.float64) * 0.2
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    new, edge = transport_step(omega, drift, projection, eta=0.05, beta=beta, generator=g1,
                               max_drift=max_drift)
    old, old_edge = _old_step(omega, drift, projection, 0.05, beta, g2, max_drift)
    assert torch.equal(new, old) and torch.equal(edge, old_edge)
    # the generator advanced alike (no draw at beta = inf)
    assert torch.equal(g1.get_state(), g2.get_state())
    assert not torch.equal(new, omega)


def test_the_cap_shortens_long_drifts_only():
    drift = torch.tensor([[3.0, 4.0], [0.03, 0.04]], dtype=torch.float64)
    capped = cap_drift(drift, 1.0)
    assert torch.allclose(capped.norm(dim=1), torch.tensor([1.0, 0.05], dtype=torch.float64))
    assert torch.equal(capped[1], drift[1]) and cap_drift(drift, None) is drift


def test_both_drivers_call_the_one_step(monkeypatch):
    calls = []

    def spy(omega, drift, projection, **kw):
        calls.append(kw["eta"])
        return transport_step(omega, drift, projection, **kw)

    monkeypatch.setattr(langevin, "transport_step", spy)
    monkeypatch.setattr(weighted, "transport_step", spy)
    omega0 = torch.randn(8, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def grad_fn(omega, batch):
        return (omega ** 2).sum(), 2 * omega, {}

    def weighted_grad_fn(omega, w, batch):
        return (omega ** 2).sum(), (2 * omega * w[:, None], (omega ** 2).sum(1)), {}

    init, step = projected_langevin(grad_fn, Ball(2.0), eta=0.01, beta=5.0)
    step(init(omega0, torch.Generator().manual_seed(2)))
    init, step = weighted_langevin(weighted_grad_fn, Ball(2.0), eta=0.02, beta=5.0, tau=0.0)
    step(init(omega0, torch.Generator().manual_seed(2), uniform_weights(8)))
    assert calls == [0.01, 0.02]

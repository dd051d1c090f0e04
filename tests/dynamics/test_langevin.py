import math

import pytest
import torch

from coulomb_attention import dynamics as D


def _zero_force(omega, batch):
    return omega.new_zeros(()), torch.zeros_like(omega), {}


def _quadratic(omega, batch):
    # H = (1/N) sum_i |w_i|^2 / 2  =>  N grad_i H = w_i, Gibbs law N(0, 1/beta)
    n = omega.shape[0]
    return 0.5 * (omega**2).sum() / n, omega / n, {}


class _Energy:
    """An energy function as the driver's Hamiltonian (``value_and_grad(omega, batches, comm)``):
    the physics tests run through :func:`~coulomb_attention.dynamics.learn_particles`, the
    driver every learner uses."""

    def __init__(self, fn):
        self.fn = fn

    def value_and_grad(self, omega, batches, comm=None):
        return self.fn(omega, batches)


def _drive(fn, omega0, steps, eta, beta, projection, seed):
    return D.learn_particles(_Energy(fn), omega0, D.LangevinSchedule(steps=steps, eta=eta,
                                                                      beta=beta),
                             projection=projection, generator=torch.Generator().manual_seed(seed))


def test_zero_force_reproduces_diffusion_variance():
    eta, beta, steps = 0.01, 2.0, 50
    run = _drive(_zero_force, torch.zeros(4000, 3, dtype=torch.float64), steps, eta, beta,
                 D.Ball(1e6), 0)
    state, trace = run.state, run.trace
    expected = 2 * eta * steps / beta  # Var = 2 t / beta with t = eta * steps
    assert abs(state.omega.var().item() / expected - 1) < 0.05
    assert len(trace) == steps and trace[-1]["boundary_fraction"] == 0.0


def test_quadratic_potential_gives_gibbs_variance():
    eta, beta = 0.02, 4.0
    # relaxation time 1/eta = 50 steps
    state = _drive(_quadratic, torch.zeros(2000, 2, dtype=torch.float64), 600, eta, beta,
                   D.Ball(1e6), 1).state
    # Exact stationary variance of the Euler chain: (2 eta / beta) / (1 - (1 - eta)^2)
    exact_chain = (2 * eta / beta) / (1 - (1 - eta) ** 2)
    assert abs(exact_chain * beta - 1) < 0.011  # the chain is within O(eta) of 1/beta
    assert abs(state.omega.var().item() * beta - 1) < 0.05


@pytest.mark.parametrize("proj", [D.Ball(0.5), D.Box(0.3)])
def test_projection_keeps_particles_inside(proj):
    init, step = D.projected_langevin(_zero_force, proj, eta=0.5, beta=1.0)
    state = init(3 * torch.randn(500, 4, dtype=torch.float64), torch.Generator().manual_seed(2))
    assert proj.contains(state.omega).all()
    for _ in range(5):
        state, info = step(state)
        assert proj.contains(state.omega).all()
        assert info["boundary_fraction"] > 0.5


def test_projection_is_euclidean():
    w = torch.tensor([[3.0, 4.0], [0.1, 0.2]])
    p, out = D.Ball(1.0)(w)
    assert torch.allclose(p[0], torch.tensor([0.6, 0.8])) and torch.equal(p[1], w[1])
    assert out.tolist() == [True, False]
    p, out = D.Box(0.5)(w)
    assert torch.allclose(p, torch.tensor([[0.5, 0.5], [0.1, 0.2]]))


def test_deterministic_for_seed_and_gradient_descent_at_infinite_beta():
    w0 = torch.randn(10, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    a, b, c = (_drive(_quadratic, w0, 7, 0.1, 3.0, D.Ball(10.0), seed).omega
               for seed in (9, 9, 10))
    assert torch.equal(a, b) and not torch.equal(a, c)
    s = _drive(_quadratic, w0, 7, 0.1, math.inf, D.Ball(10.0), 0).omega
    assert torch.allclose(s, w0 * 0.9**7)


def test_schedules_and_per_step_override():
    cos = D.make_schedule("cosine", 1.0, 0.0, total=11)
    assert cos(0) == pytest.approx(1.0) and cos(10) == pytest.approx(0.0) and cos(5) == 0.5
    geo = D.make_schedule("geometric", 1.0, 100.0, total=3)
    assert geo(1) == pytest.approx(10.0)
    seen = []
    init, step = D.projected_langevin(_zero_force, D.Ball(1.0), eta=0.1, beta=1.0)
    state = init(torch.zeros(2, 2), torch.Generator())
    for k in range(3):  # eta and beta overridden per step, as the driver's schedules do
        state, info = step(state, eta=0.1 / (k + 1), beta=geo(k))
        seen.append((info["eta"], info["beta"]))
    assert seen[1] == (pytest.approx(0.05), pytest.approx(10.0))
    seen = []
    sched = D.LangevinSchedule(steps=3, eta=1.0, eta_end=0.25, eta_schedule="cosine",
                               beta=100.0, beta_start=1.0, beta_schedule="geometric")
    D.learn_particles(_Energy(_zero_force), torch.zeros(2, 2), sched, projection=D.Ball(1.0),
                      generator=torch.Generator(),
                      callbacks=[lambda s, info: seen.append((info["eta"], info["beta"]))])
    assert [e for e, _ in seen] == pytest.approx([1.0, 0.625, 0.25])
    assert [b for _, b in seen] == pytest.approx([1.0, 10.0, 100.0])
    with pytest.raises(ValueError, match="valid: constant, cosine, geometric"):
        D.make_schedule("linear", 1.0, 2.0)


def test_non_finite_energy_stops_with_clear_error():
    def bad(omega, batch):
        return torch.tensor(float("nan")), torch.zeros_like(omega), {}

    init, step = D.projected_langevin(bad, D.Ball(1.0), eta=0.1)
    with pytest.raises(D.NonFiniteEnergyError, match="step 0"):
        step(init(torch.zeros(2, 2), torch.Generator()))


def test_invalid_hyperparameters():
    with pytest.raises(ValueError, match="beta"):
        D.projected_langevin(_zero_force, D.Ball(1.0), beta=0.0)
    with pytest.raises(ValueError, match="eta"):
        D.projected_langevin(_zero_force, D.Ball(1.0), eta=-1.0)
    with pytest.raises(ValueError, match="radius"):
        D.Ball(0.0)
    with pytest.raises(ValueError, match="valid: ball, box"):
        D.make_projection("sphere", 1.0)
    with pytest.raises(ValueError, match="shape"):
        init, _ = D.projected_langevin(_zero_force, D.Ball(1.0))
        init(torch.zeros(3), torch.Generator())

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


def test_zero_force_reproduces_diffusion_variance():
    eta, beta, steps = 0.01, 2.0, 50
    init, step = D.projected_langevin(_zero_force, D.Ball(1e6), eta=eta, beta=beta)
    state = init(torch.zeros(4000, 3, dtype=torch.float64), torch.Generator().manual_seed(0))
    state, trace = D.run(state, step, steps)
    expected = 2 * eta * steps / beta  # Var = 2 t / beta with t = eta * steps
    assert abs(state.omega.var().item() / expected - 1) < 0.05
    assert len(trace) == steps and trace[-1]["boundary_fraction"] == 0.0


def test_quadratic_potential_gives_gibbs_variance():
    eta, beta = 0.02, 4.0
    init, step = D.projected_langevin(_quadratic, D.Ball(1e6), eta=eta, beta=beta)
    state = init(torch.zeros(2000, 2, dtype=torch.float64), torch.Generator().manual_seed(1))
    state, _ = D.run(state, step, 600)  # relaxation time 1/eta = 50 steps
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
    init, step = D.projected_langevin(_quadratic, D.Ball(10.0), eta=0.1, beta=3.0)
    w0 = torch.randn(10, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    a, _ = D.run(init(w0, torch.Generator().manual_seed(9)), step, 7)
    b, _ = D.run(init(w0, torch.Generator().manual_seed(9)), step, 7)
    c, _ = D.run(init(w0, torch.Generator().manual_seed(10)), step, 7)
    assert torch.equal(a.omega, b.omega) and not torch.equal(a.omega, c.omega)
    init, step = D.projected_langevin(_quadratic, D.Ball(10.0), eta=0.1, beta=math.inf)
    s, _ = D.run(init(w0, torch.Generator()), step, 7)
    assert torch.allclose(s.omega, w0 * 0.9**7)


def test_schedules_and_per_step_override():
    cos = D.make_schedule("cosine", 1.0, 0.0, total=11)
    assert cos(0) == pytest.approx(1.0) and cos(10) == pytest.approx(0.0) and cos(5) == 0.5
    geo = D.make_schedule("geometric", 1.0, 100.0, total=3)
    assert geo(1) == pytest.approx(10.0)
    seen = []
    init, step = D.projected_langevin(_zero_force, D.Ball(1.0), eta=0.1, beta=1.0)
    D.run(init(torch.zeros(2, 2), torch.Generator()), step, 3,
          eta_schedule=lambda k: 0.1 / (k + 1), beta_schedule=geo,
          callback=lambda s, info: seen.append((info["eta"], info["beta"])))
    assert seen[1] == (pytest.approx(0.05), pytest.approx(10.0))
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

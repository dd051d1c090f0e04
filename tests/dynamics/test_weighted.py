"""Weighted (Wasserstein-Fisher-Rao) particles: energies with masses, the WFR step, birth-death,
and the projected-Adam ablation of the driver."""

import math

import pytest
import torch

from coulomb_attention.dynamics import (
    Ball,
    LangevinSchedule,
    Reaction,
    birth_death,
    learn_particles,
    uniform_weights,
    weighted_langevin,
)
from coulomb_attention.energy import (
    Hamiltonian,
    LabelAlignment,
    LinearPotential,
    make_potential,
    riesz_energy,
    riesz_energy_naive,
    riesz_grad,
    riesz_weight_grad,
)
from coulomb_attention.features import feature_fn
from helpers import rel_err


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _problem(n=60, d=3, N=12, seed=0):
    """Inputs with a constant column (learned rff phases), +-1 labels, particles, masses."""
    g = torch.Generator().manual_seed(seed)
    x = torch.cat([torch.randn(n, d, generator=g, dtype=torch.float64),
                   torch.ones(n, 1, dtype=torch.float64)], 1)
    y = torch.sign(x[:, :1] * x[:, 1:2]) + 0.0
    omega = torch.randn(N, d + 1, generator=g, dtype=torch.float64)
    w = torch.rand(N, generator=g, dtype=torch.float64) + 0.2
    return x, y, omega, w / w.sum(), g


def _features(x, omega):
    return feature_fn("rff", torch.zeros(omega.shape[0], dtype=omega.dtype))(x, omega)


def _naive_weighted_energy(x, y, omega, w, pot, lam):
    """``-A + lam sum_{i != j} w_i w_j g`` with the n x n matrices written out."""
    n, N = x.shape[0], omega.shape[0]
    phi = _features(x, omega) * (N * w).sqrt()  # (n, N): K = sum_i w_i phi_i phi_i^T
    H = torch.eye(n, dtype=x.dtype) - 1.0 / n
    K = H @ phi @ phi.T @ H
    T = H @ y @ y.T @ H
    a = (K * T).sum() / (K.norm() * T.norm())
    return -a + lam * riesz_energy_naive(omega, pot, w)


def test_weighted_riesz_matches_naive_and_autograd():
    _, _, omega, w, _ = _problem()
    pot = make_potential("riesz", s=1.0, eps=0.1)
    om = omega.clone().requires_grad_(True)
    wl = w.clone().requires_grad_(True)
    naive = riesz_energy_naive(om, pot, wl)
    g_om, g_w = torch.autograd.grad(naive, (om, wl))
    assert rel_err(riesz_energy(omega, pot, w), naive) < 1e-12
    assert rel_err(riesz_grad(omega, pot, w), g_om) < 1e-12
    assert rel_err(riesz_weight_grad(omega, pot, w), g_w) < 1e-12
    # uniform masses give the unweighted energy and gradient
    u = uniform_weights(omega.shape[0])
    assert rel_err(riesz_energy(omega, pot, u), riesz_energy(omega, pot)) < 1e-13
    assert rel_err(riesz_grad(omega, pot, u), riesz_grad(omega, pot)) < 1e-13


@pytest.mark.parametrize("lam", [0.0, 0.3])
def test_weighted_hamiltonian_gradients_match_autograd_of_the_naive_energy(lam):
    x, y, omega, w, _ = _problem()
    pot = make_potential("riesz", s=1.0, eps=0.1)
    ham = Hamiltonian(LabelAlignment(_features), pot, lam=lam)
    batches = [(x[:25], y[:25]), (x[25:], y[25:])]  # streamed statistics: exact over batches
    energy, (g_om, g_w), info = ham.value_and_grad(omega, batches, weights=w)
    om = omega.clone().requires_grad_(True)
    wl = w.clone().requires_grad_(True)
    naive = _naive_weighted_energy(x, y, om, wl, pot, lam)
    ref_om, ref_w = torch.autograd.grad(naive, (om, wl))
    assert abs(float(energy) - float(naive.detach())) < 1e-12
    assert rel_err(g_om, ref_om) < 1e-10
    assert rel_err(g_w, ref_w) < 1e-10
    # the alignment is scale invariant in the masses: sum_i w_i dA/dw_i = 0
    assert abs(float((w * (g_w - lam * riesz_weight_grad(omega, pot, w))).sum())) < 1e-12
    # uniform masses: the unweighted energy and gradient (to rounding)
    u = uniform_weights(omega.shape[0])
    e_u, (g_u, _), _ = ham.value_and_grad(omega, batches, weights=u)
    e_0, g_0, _ = ham.value_and_grad(omega, batches)
    assert abs(float(e_u - e_0)) < 1e-14 and rel_err(g_u, g_0) < 1e-12


def test_mass_is_kept_over_many_steps_with_birth_death():
    x, y, omega, _, g = _problem(N=24)
    ham = Hamiltonian(LabelAlignment(_features), make_potential("riesz", eps=0.1), lam=0.01)
    reaction = Reaction(tau=0.5, w_min=0.5, jitter=0.01)  # strong reaction: many deaths
    seen = []
    run = learn_particles(ham, omega, LangevinSchedule(steps=200, eta=0.05, beta=1e3),
                          [(x, y)], projection=Ball(5.0), generator=g, normalize_drift=True,
                          reaction=reaction, callbacks=[lambda s, i: seen.append(s.weights)])
    assert sum(t["births"] for t in run.trace) > 20
    for w in seen:
        assert abs(float(w.sum()) - 1.0) < 1e-13
        assert bool((w > 0).all())
    assert bool((run.weights >= 0.5 / 24 * (1 - 1e-12)).all())  # no particle left below w_min


def test_a_strong_reaction_without_birth_death_stays_finite():
    """Masses pushed apart by e^hundreds would underflow to 0 (then grad / w is NaN): floored."""
    g = torch.Generator().manual_seed(0)
    omega = torch.randn(20, 2, generator=g, dtype=torch.float64)
    a = torch.tensor([1.5, -0.7], dtype=torch.float64)
    ham = Hamiltonian(LinearPotential(lambda om: (om @ a) ** 2))
    run = learn_particles(ham, omega, LangevinSchedule(steps=100, eta=0.01, beta=math.inf),
                          None, projection=Ball(10.0), generator=g,
                          reaction=Reaction(tau=20.0, w_min=0.0))
    w = run.weights
    assert bool(torch.isfinite(run.omega).all()) and bool((w > 0).all())
    assert abs(float(w.sum()) - 1) < 1e-12
    floor = math.exp(math.log(torch.finfo(torch.float64).tiny) + 50)
    assert float(w.min()) < 1e-200 and float(w.min() / w.max()) >= floor * (1 - 1e-9)


def test_birth_death_moves_light_particles_onto_heavy_ones_keeping_mass():
    g = torch.Generator().manual_seed(1)
    omega = torch.arange(5, dtype=torch.float64).unsqueeze(1)  # (5, 1): particle i at i
    w = torch.tensor([0.001, 0.5, 0.001, 0.298, 0.2], dtype=torch.float64)
    new_omega, new_w, births = birth_death(omega, w, 0.01, g, jitter=0.0)
    assert births == 2
    assert abs(float(new_w.sum()) - 1.0) < 1e-15
    for i in (0, 2):  # each dead particle sits on a donor and shares its mass equally
        j = [k for k in (1, 3, 4) if float(new_omega[k]) == float(new_omega[i])]
        assert len(j) == 1 and float(new_w[i]) == float(new_w[j[0]])
    assert bool((new_w >= 0.01).all())


def test_pure_reaction_follows_the_closed_form_for_a_linear_potential():
    """Transport off (no drift, no noise): w_i(k) = w_i(0) exp(-k tau V_i) / Z."""
    g = torch.Generator().manual_seed(2)
    omega = torch.randn(50, 2, generator=g, dtype=torch.float64)
    w0 = torch.rand(50, generator=g, dtype=torch.float64) + 0.1
    w0 = w0 / w0.sum()
    a = torch.tensor([1.5, -0.7], dtype=torch.float64)
    term = LinearPotential(lambda om: om @ a)

    def energy_grad(om, w, batch):
        return term.value_and_grad(om, weights=w)

    tau, steps = 0.03, 100
    init_fn, step_fn = weighted_langevin(energy_grad, Ball(100.0), eta=0.1, beta=10.0, tau=tau,
                                         transport=False)
    state = init_fn(omega, g, w0)
    for _ in range(steps):
        state, _ = step_fn(state)
    closed = w0 * torch.exp(-steps * tau * (omega @ a))
    closed = closed / closed.sum()
    assert torch.equal(state.omega, omega)
    assert rel_err(state.weights, closed) < 1e-12
    assert rel_err(state.weights, w0) > 0.5  # the masses did move


def test_pure_transport_is_the_unweighted_langevin_driver():
    """Reaction off, uniform masses: identical to the unweighted driver (noise included)."""
    x, y, omega, _, _ = _problem(N=16)
    ham = Hamiltonian(LabelAlignment(_features), make_potential("riesz", eps=0.1), lam=0.05)
    schedule = LangevinSchedule(steps=40, eta=0.05, eta_schedule="cosine", eta_end=0.005,
                                beta=500.0, max_drift=0.5)
    runs = []
    for reaction in (None, Reaction(tau=0.0, w_min=0.0)):
        gen = torch.Generator().manual_seed(7)
        runs.append(learn_particles(ham, omega, schedule, [(x, y)], projection=Ball(3.0),
                                    generator=gen, normalize_drift=True, reaction=reaction))
    plain, weighted = runs
    assert rel_err(weighted.omega, plain.omega) < 1e-9
    assert rel_err(weighted.omega, omega) > 0.05  # the particles did move
    assert torch.equal(weighted.weights, uniform_weights(16))
    assert [t["energy"] for t in weighted.trace] == pytest.approx(
        [t["energy"] for t in plain.trace], rel=1e-9)


def test_wfr_matches_the_mean_field_gaussian_with_birth_death():
    """1-D, V(w) = a w, rho_0 = N(0, 1), transport + reaction with tau = eta (one time t).

    Mean field: transport moves rho at speed -a, the reaction tilts it by exp(-a w t); for a
    Gaussian both shift the mean by -a t and keep the variance, so rho_t = N(-2 a t, 1) (the
    two flows commute for a linear V, so the split step is exact). The particle estimate is a
    self-normalised importance-sampling average: its standard error is about
    sqrt(Var / ESS) for the mean and sqrt(2 Var^2 / ESS) for the variance; we allow 5 of them
    plus the mass moved by birth-death (each event moves < w_min of mass by < 10 units).
    """
    N, a, eta, steps = 20000, 1.0, 0.01, 100
    g = torch.Generator().manual_seed(3)
    omega = torch.randn(N, 1, generator=g, dtype=torch.float64)
    term = LinearPotential(lambda om: a * om[:, 0])
    ham = Hamiltonian(term)
    run = learn_particles(ham, omega, LangevinSchedule(steps=steps, eta=eta), None,
                          projection=Ball(1e3), generator=g,
                          reaction=Reaction(tau=eta, w_min=0.1, jitter=0.0, normalize=False))
    w, om = run.weights, run.omega[:, 0]
    births = sum(t["births"] for t in run.trace)
    assert births > 0
    t = eta * steps
    mean = float((w * om).sum())
    var = float((w * (om - mean) ** 2).sum())
    ess = float(1.0 / (w * w).sum())
    bd = births * 0.1 / N * 10.0
    assert abs(mean - (-2 * a * t)) < 5 * math.sqrt(1.0 / ess) + bd
    assert abs(var - 1.0) < 5 * math.sqrt(2.0 / ess) + bd


def test_adam_method_is_torch_adam_with_projection():
    x, y, omega, _, g = _problem(N=8)
    ham = Hamiltonian(LabelAlignment(_features))
    ball = Ball(1.5)
    lr = 0.05 / math.sqrt(omega.shape[1])  # the old eta 0.05 as Adam's learning rate
    run = learn_particles(ham, omega, LangevinSchedule(steps=30, eta=0.05), [(x, y)],
                          projection=ball, generator=g, method="adam", lr=lr)
    p = ball(omega.clone())[0].requires_grad_(True)
    opt = torch.optim.Adam([p], lr=lr)
    energies = []
    for _ in range(30):
        e, grad, _ = ham.value_and_grad(p.detach(), [(x, y)])
        energies.append(float(e))
        p.grad = grad
        opt.step()
        with torch.no_grad():
            p.copy_(ball(p)[0])
    assert rel_err(run.omega, p.detach()) < 1e-12
    assert energies[-1] < energies[0] - 0.05  # alignment rose
    with pytest.raises(ValueError, match="beta=inf"):
        learn_particles(ham, omega, LangevinSchedule(steps=3, beta=10.0), [(x, y)],
                        projection=ball, generator=g, method="adam", lr=lr)


def test_bad_weights_and_options_raise():
    x, y, omega, w, g = _problem()
    ham = Hamiltonian(LabelAlignment(_features))
    with pytest.raises(ValueError, match="weights"):
        ham.value_and_grad(omega, [(x, y)], weights=w[:-1])
    with pytest.raises(ValueError, match="w_min"):
        Reaction(w_min=1.5)
    with pytest.raises(ValueError, match="sum to 1"):
        learn_particles(ham, omega, LangevinSchedule(steps=2), [(x, y)], projection=Ball(3.0),
                        generator=g, reaction=Reaction(), weights0=2 * w)
    with pytest.raises(ValueError, match="method"):
        learn_particles(ham, omega, LangevinSchedule(steps=2), [(x, y)], projection=Ball(3.0),
                        generator=g, method="sgd")

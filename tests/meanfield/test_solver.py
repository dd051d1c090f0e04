import math

import numpy as np
import pytest
import torch
from scipy import integrate as sp_integrate
from scipy.special import erf
from scipy.stats import wasserstein_distance

from coulomb_attention import meanfield as M
from coulomb_attention.data.synthetic import make_meanfield_dataset
from coulomb_attention.dynamics import Box, LangevinSchedule, learn_particles
from coulomb_attention.energy import make_potential
from helpers import finite_diff_grad, rel_err


def _problem(dim=1, n=48, lam=0.5, beta=4.0, flux="sg", s=1.0, eps=0.3, R=3.0, track=True):
    grid = M.Grid(dim, R, n)
    x, y = make_meanfield_dataset(dim)
    pot = M.DataPotential(x, y)
    inter = M.GridInteraction(grid, make_potential("riesz", s=s, eps=eps))
    init, step = M.mckean_vlasov(grid, pot, interaction=inter, lam=lam, beta=beta, flux=flux,
                                 track_free_energy=track)
    rho0 = M.gaussian_density(grid, 0.3 if dim == 1 else [0.3, -0.5], 0.7)
    return grid, pot, inter, init, step, rho0


@pytest.mark.parametrize("dim", [1, 2])
@pytest.mark.parametrize("flux", ["sg", "upwind"])
def test_mass_conserved_and_positive(dim, flux):
    grid, _, _, init, step, rho0 = _problem(dim, n=40 if dim == 1 else 24, flux=flux)
    _, trace = M.integrate(init(rho0), step, [0.5])
    assert len(trace) > 10
    masses = np.array([i["mass"] for i in trace])
    assert np.abs(masses - 1.0).max() < 1e-12
    assert min(i["min_rho"] for i in trace) >= 0.0


@pytest.mark.parametrize("dim", [1, 2])
def test_free_energy_decreases(dim):
    grid, _, _, init, step, rho0 = _problem(dim, n=40 if dim == 1 else 24)
    state = init(rho0)
    _, trace = M.integrate(state, step, [0.25, 1.0])
    f = np.array([i["free_energy"] for i in trace])
    assert np.diff(f).max() <= 1e-12 * max(1.0, abs(f).max())
    assert f[-1] < f[0] - 0.05  # the flow really moved
    # the three terms add up
    last = trace[-1]
    assert math.isclose(last["free_energy"], last["potential"] + last["interaction"]
                        + last["entropy"], rel_tol=1e-12)


def _gibbs_quadratic(grid, a, centre, beta):
    """Continuous Gibbs density exp(-beta a/2 |w - c|^2)/Z on the box, at cell centres."""
    pts = grid.points()
    c = torch.as_tensor(centre, dtype=torch.float64)
    dens = torch.exp(-0.5 * beta * a * (pts - c).square().sum(1))
    z = 1.0
    sd = 1.0 / math.sqrt(beta * a)
    for k in range(grid.dim):
        ck = float(c[k] if c.numel() > 1 else c[0])
        lo, hi = (-grid.half_width - ck) / (sd * math.sqrt(2)), (grid.half_width - ck) / (
            sd * math.sqrt(2))
        z *= sd * math.sqrt(math.pi / 2) * (erf(hi) - erf(lo))
    return (dens / z).reshape(grid.shape)


@pytest.mark.parametrize("dim,flux,tol", [(1, "sg", 2e-3), (2, "sg", 5e-3), (1, "upwind", 0.05)])
def test_stationary_state_is_gibbs_quadratic(dim, flux, tol):
    grid = M.Grid(dim, 2.0, 48 if dim == 1 else 24)
    a, beta, centre = 2.0, 3.0, (0.4,) if dim == 1 else (0.4, -0.3)
    init, step = M.mckean_vlasov(grid, M.QuadraticPotential(a, centre), beta=beta, flux=flux,
                                 track_free_energy=False)
    rho0 = M.gaussian_density(grid, -1.0, 0.4)
    snaps, _ = M.integrate(init(rho0), step, [0.5, 4.0])
    gibbs = _gibbs_quadratic(grid, a, centre, beta)
    err = lambda r: float((r - gibbs).abs().max() / gibbs.max())  # noqa: E731
    assert err(snaps[0.5].rho) > 10 * tol  # not yet there at t=0.5 ...
    assert err(snaps[4.0].rho) < tol  # ... converged to exp(-beta V)/Z by t=4


def test_stationary_state_with_interaction_is_self_consistent():
    """rho* = exp(-beta (V + 2 lam g*rho*)) / Z, the stationary equation (SG is exact)."""
    lam, beta = 1.0, 1.0
    grid, pot, inter, init, step, rho0 = _problem(1, n=24, lam=lam, beta=beta, R=1.5,
                                                  track=False)
    snaps, _ = M.integrate(init(M.gaussian_density(grid, 0.3, 0.5)), step, [1.0, 6.0])

    def residual(rho):
        target = torch.exp(-beta * (step.v_grid + 2 * lam * inter(rho)))
        return rel_err(rho, target / grid.mass(target))

    assert residual(snaps[1.0].rho) > 1e-2
    assert residual(snaps[6.0].rho) < 1e-4
    # and not the Gibbs density of V alone (the interaction matters)
    plain = torch.exp(-beta * step.v_grid)
    assert rel_err(snaps[6.0].rho, plain / grid.mass(plain)) > 0.05


@pytest.mark.parametrize("dim", [1, 2])
def test_fft_interaction_matches_dense_twin(dim):
    grid = M.Grid(dim, 1.5, 20 if dim == 1 else 9)
    inter = M.GridInteraction(grid, make_potential("riesz", s=1.0, eps=0.1))
    g = torch.Generator().manual_seed(0)
    rho = torch.rand(grid.shape, generator=g, dtype=torch.float64)
    dense = (inter.dense_matrix() @ rho.reshape(-1)).reshape(grid.shape)
    assert rel_err(inter(rho), dense) < 1e-12


def test_interaction_is_the_convolution_integral():
    """(g * rho)(c_i) for rho uniform equals int g(c_i - w) rho(w) dw (scipy quad)."""
    grid = M.Grid(1, 1.0, 16)
    pair = make_potential("riesz", s=1.0, eps=0.05)
    inter = M.GridInteraction(grid, pair)
    rho = torch.full(grid.shape, 0.5, dtype=torch.float64)  # uniform on [-1, 1]
    got = inter(rho)
    for i in (0, 5, 11):
        c = float(grid.centres_1d()[i])
        f = lambda w, c=c: 0.5 * ((c - w) ** 2 + 0.05**2) ** -0.5  # noqa: E731
        ref = sp_integrate.quad(f, -1, 1, points=[c], limit=200)[0]
        assert abs(float(got[i]) - ref) < 1e-6 * ref


def test_data_potential_formula():
    x, y = make_meanfield_dataset(2, n_samples=5, random_state=3)
    pot = M.DataPotential(x, y, feature="rff", phase=0.7)
    w = torch.randn(7, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    phi = math.sqrt(2) * torch.cos(x @ w.T + 0.7)  # (n, M)
    assert rel_err(pot(w), -((y @ phi) / 5).square()) < 1e-12
    pos = M.DataPotential(x, y, feature="positive")
    phi = torch.exp(x @ w.T - 0.5 * x.square().sum(1, keepdim=True))
    assert rel_err(pos(w), -((y @ phi) / 5).square()) < 1e-12


def test_particle_energy_grad_matches_finite_differences():
    x, y = make_meanfield_dataset(2)
    pot = M.DataPotential(x, y)
    pair = make_potential("riesz", s=1.0, eps=0.2)
    fn = M.particle_hamiltonian(pot, pair, lam=0.7)
    w = torch.randn(6, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    energy, grad, info = fn(w)
    fd = finite_diff_grad(lambda v: fn(v)[0], w)
    assert rel_err(grad, fd) < 1e-6
    assert math.isclose(float(energy), info["data_term"] + 0.7 * info["repulsion"])


def test_w1_is_exact_against_scipy():
    grid = M.Grid(1, 2.0, 10)
    rho = torch.linspace(0.2, 1.0, 10, dtype=torch.float64)
    rho = rho / grid.mass(rho)
    g = torch.Generator().manual_seed(0)
    samples = M.sample_density(grid, rho, 300, g)
    # fine quantisation of the density: 2000 atoms per cell at sub-cell midpoints
    k = 2000
    sub = (grid.edges_1d()[:-1, None] + grid.h * (torch.arange(k) + 0.5) / k).reshape(-1)
    wts = (rho[:, None] * torch.ones(k, dtype=torch.float64)).reshape(-1)
    ref = wasserstein_distance(samples[:, 0].numpy(), sub.numpy(), v_weights=wts.numpy())
    got = M.w1_to_grid_density(grid, rho, samples)
    assert abs(got - ref) < 1e-4
    assert got > 0.005


@pytest.mark.parametrize("dim", [1, 2])
def test_mmd_against_quadrature_and_decreases_with_n(dim):
    grid = M.Grid(dim, 2.0, 12 if dim == 1 else 8)
    rho = M.gaussian_density(grid, 0.3, 0.8)
    g = torch.Generator().manual_seed(0)
    samples = M.sample_density(grid, rho, 200, g)
    # brute force: densities as many equal-weight atoms (q^dim per cell at sub-midpoints)
    q = 12 if dim == 1 else 6
    off = grid.h * ((torch.arange(q, dtype=torch.float64) + 0.5) / q - 0.5)
    if dim == 1:
        atoms = (grid.centres_1d()[:, None] + off).reshape(-1, 1)
        w = (rho[:, None].expand(-1, q)).reshape(-1)
    else:
        c = grid.points()
        ox, oy = torch.meshgrid(off, off, indexing="ij")
        atoms = (c[:, None, :] + torch.stack([ox.reshape(-1), oy.reshape(-1)], 1)).reshape(-1, 2)
        w = rho.reshape(-1, 1).expand(-1, q * q).reshape(-1)
    w = w / w.sum()
    k = lambda a, b: torch.exp(-torch.cdist(a, b).square() / (2 * 0.5**2))  # noqa: E731
    mmd2 = (k(samples, samples).mean() - 2 * (k(samples, atoms) @ w).mean()
            + w @ k(atoms, atoms) @ w)
    got = M.mmd_to_grid_density(grid, rho, samples, bandwidth=0.5)
    assert abs(got - math.sqrt(float(mmd2))) < 2e-3 * got
    big = M.sample_density(grid, rho, 2000, g)
    assert M.mmd_to_grid_density(grid, rho, big, bandwidth=0.5) < 0.6 * got


def test_sample_density_and_gaussian_density():
    grid = M.Grid(1, 3.0, 60)
    rho = M.gaussian_density(grid, 0.5, 0.6)
    assert abs(float(grid.mass(rho)) - 1) < 1e-12
    g = torch.Generator().manual_seed(0)
    s = M.sample_density(grid, rho, 20000, g)
    assert abs(float(s.mean()) - 0.5) < 0.02 and abs(float(s.std()) - 0.6) < 0.02
    assert bool((s.abs() <= 3.0).all())


def test_particles_match_pde_at_matched_time_1d():
    """The projected Langevin system of H_N = (1/N) sum V + lam W (core riesz_grad) and the
    PDE with drift V + 2 lam g*rho agree at t = eta * steps: W1 at Monte-Carlo level, and the
    histogram within multinomial noise; the PDE at the wrong time does not match."""
    R, beta, lam, eta, t_end, n = 3.0, 4.0, 0.5, 0.01, 0.3, 2000
    grid = M.Grid(1, R, 120)
    x, y = make_meanfield_dataset(1)
    pot = M.DataPotential(x, y)
    pair = make_potential("riesz", s=1.0, eps=0.3)
    init, step = M.mckean_vlasov(grid, pot, interaction=M.GridInteraction(grid, pair), lam=lam,
                                 beta=beta, track_free_energy=False)
    rho0 = M.gaussian_density(grid, 0.0, 0.5)
    snaps, _ = M.integrate(init(rho0), step, [t_end])
    rho_t = snaps[t_end].rho
    g = torch.Generator().manual_seed(1)
    omega = M.sample_density(grid, rho0, n, g)
    ham = M.particle_hamiltonian(pot, pair, lam, repulsion_energy=False)
    state = learn_particles(ham, omega, LangevinSchedule(steps=round(t_end / eta), eta=eta,
                                                         beta=beta),
                            projection=Box(R), generator=g)
    w1_match = M.w1_to_grid_density(grid, rho_t, state.omega)
    w1_stale = M.w1_to_grid_density(grid, rho0, state.omega)
    assert w1_match < 0.05, w1_match  # MC level ~ 0.5/sqrt(2000) ~ 0.01-0.02
    assert w1_stale > 3 * w1_match
    # histogram on 12 coarse bins (10 grid cells each) vs the PDE's bin masses
    counts = np.histogram(state.omega[:, 0].numpy(), bins=12, range=(-R, R))[0]
    p = (rho_t * grid.h).reshape(12, 10).sum(1).numpy()
    z = (counts / n - p) / np.sqrt(p * (1 - p) / n + 1e-12)
    assert np.abs(z).max() < 4.0, z


def test_validation_errors():
    grid = M.Grid(1, 1.0, 8)
    with pytest.raises(ValueError, match="dim"):
        M.Grid(3, 1.0, 8)
    with pytest.raises(ValueError, match="flux"):
        M.mckean_vlasov(grid, M.QuadraticPotential(), flux="central")
    with pytest.raises(ValueError, match="cfl"):
        M.mckean_vlasov(grid, M.QuadraticPotential(), cfl=1.5)
    init, _ = M.mckean_vlasov(grid, M.QuadraticPotential())
    with pytest.raises(ValueError, match="shape"):
        init(torch.ones(9, dtype=torch.float64))
    with pytest.raises(ValueError, match="negative"):
        init(-torch.ones(8, dtype=torch.float64))
    with pytest.raises(ValueError, match="NaN"):
        init(torch.full((8,), float("nan")))
    with pytest.raises(ValueError, match="feature"):
        M.DataPotential(torch.zeros(3, 1), torch.ones(3), feature="nope")
    with pytest.raises(ValueError, match="eps"):
        M.GridInteraction(grid, make_potential("riesz", s=1.0, eps=0.0))
    with pytest.raises(ValueError, match="distinct"):
        M.loglog_slope([8, 8], [1.0, 2.0])


def test_loglog_slope_recovers_power_law():
    ns = np.array([64, 128, 256, 512])
    slope, icpt = M.loglog_slope(ns, 3.0 * ns**-0.5)
    assert abs(slope + 0.5) < 1e-12 and abs(icpt - math.log(3.0)) < 1e-12

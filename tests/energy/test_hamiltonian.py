import math

import numpy as np
import pytest
import torch

from coulomb_attention import energy as E
from coulomb_attention import features as F
from helpers import finite_diff_grad, rel_err


def _data(n=40, d=3, classes=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = (x[:, 0] > 0).long() if classes == 2 else torch.randint(0, classes, (n,), generator=g)
    Y, _ = E.encode_labels(y.numpy())
    return x, Y, g


def _naive_alignment(phi, Y, center):
    K = phi @ phi.T
    T = Y @ Y.T
    if center:
        n = K.shape[0]
        H = torch.eye(n, dtype=K.dtype) - 1.0 / n
        K, T = H @ K @ H, H @ T @ H
    return (K * T).sum() / (K.norm() * T.norm())


@pytest.mark.parametrize("classes", [2, 3])
@pytest.mark.parametrize("center", [True, False])
def test_alignment_equals_n_by_n_formula(classes, center):
    x, Y, g = _data(classes=classes)
    om = torch.randn(9, 3, generator=g, dtype=torch.float64)
    phi = F.rff(x, om, F.draw_bias(9, generator=g, dtype=torch.float64))
    got = E.alignment(phi, Y, center=center)
    assert rel_err(got, _naive_alignment(phi, Y, center)) < 1e-10
    assert 0 <= float(got) <= 1 + 1e-12


def test_encode_labels():
    Y, classes = E.encode_labels(np.array(["b", "a", "b"]))
    assert classes.tolist() == ["a", "b"] and Y[:, 0].tolist() == [1.0, -1.0, 1.0]
    Y3, _ = E.encode_labels(np.array([0, 2, 1, 2]))
    assert Y3.shape == (4, 3) and Y3.sum().item() == 4
    with pytest.raises(ValueError, match="at least 2 classes"):
        E.encode_labels(np.array([1, 1, 1]))


def test_streamed_statistics_equal_full_batch():
    x, Y, g = _data(n=53)
    om = torch.randn(7, 3, generator=g, dtype=torch.float64)
    b = F.draw_bias(7, generator=g, dtype=torch.float64)
    phi_fn = F.feature_fn("rff", b)
    full = E.alignment(phi_fn(x, om), Y)
    stats = None
    for idx in torch.split(torch.arange(53), 10):
        s = E.alignment_stats(phi_fn(x[idx], om), Y[idx])
        stats = s if stats is None else stats + s
    assert abs(float(E.alignment_from_stats(stats)) - float(full)) < 1e-12
    # value-and-grad over batches == autograd on the full batch
    batches = [(x[idx], Y[idx]) for idx in torch.split(torch.arange(53), 10)]
    val, grad = E.alignment_value_and_grad(om, batches, phi_fn)
    w = om.clone().requires_grad_(True)
    ref = E.alignment(phi_fn(x, w), Y)
    ref.backward()
    assert abs(float(val) - float(ref.detach())) < 1e-12
    assert rel_err(grad, w.grad) < 1e-10


@pytest.mark.parametrize("name", ["rff", "positive", "softplus", "softmax"])
def test_alignment_gradient_matches_finite_differences(name):
    x, Y, g = _data(n=30)
    om = 0.7 * torch.randn(5, 3, generator=g, dtype=torch.float64)
    phi_fn = F.feature_fn(name, F.draw_bias(5, generator=g, dtype=torch.float64))
    _, grad = E.alignment_value_and_grad(om, [(x, Y)], phi_fn)
    fd = finite_diff_grad(lambda w: E.alignment(phi_fn(x, w), Y), om)
    assert rel_err(grad, fd) < 1e-6


@pytest.mark.parametrize(
    "name,kw", [("riesz", {"s": 1.5}), ("log", {}), ("coulomb", {"dim": 4}), ("riesz", {"s": 0.5})]
)
def test_riesz_energy_and_forces(name, kw):
    g = torch.Generator().manual_seed(3)
    om = torch.randn(8, 4, generator=g, dtype=torch.float64)
    pot = E.make_potential(name, eps=0.1, **kw)
    assert rel_err(E.riesz_energy(om, pot), E.riesz_energy_naive(om, pot)) < 1e-12
    fd = finite_diff_grad(lambda w: E.riesz_energy_naive(w, pot), om)
    assert rel_err(E.riesz_grad(om, pot), fd) < 1e-7
    if name == "coulomb":
        assert pot.s == 2.0


def test_riesz_closed_forms():
    # Two particles at distance r: W = 2 g(r) / 4.
    om = torch.tensor([[0.0, 0.0], [3.0, 4.0]], dtype=torch.float64)
    pot = E.make_potential("riesz", s=1.0, eps=0.0)
    assert abs(float(E.riesz_energy(om, pot)) - 2 * (1 / 5) / 4) < 1e-14
    log = E.make_potential("log", eps=0.0)
    assert abs(float(E.riesz_energy(om, log)) - 2 * (-math.log(5)) / 4) < 1e-14
    # Repulsive: the force on particle 0 points away from particle 1.
    grad = E.riesz_grad(om, pot)
    assert float(grad[0] @ (om[1] - om[0])) > 0


def test_potential_errors():
    with pytest.raises(ValueError, match="valid: coulomb, log, riesz"):
        E.make_potential("yukawa")
    with pytest.raises(ValueError, match="s must be"):
        E.make_potential("riesz", s=-1.0)
    with pytest.raises(ValueError, match="eps"):
        E.make_potential("log", eps=-0.1)
    with pytest.raises(ValueError, match="dim"):
        E.make_potential("coulomb")


def test_hamiltonian_composes_terms():
    x, Y, g = _data()
    om = torch.randn(6, 3, generator=g, dtype=torch.float64)
    phi_fn = F.feature_fn("rff", F.draw_bias(6, generator=g, dtype=torch.float64))
    pot = E.make_potential("riesz", s=1.0, eps=0.05)
    H = E.Hamiltonian(E.LabelAlignment(phi_fn), pot, lam=0.3)
    energy, grad, parts = H.value_and_grad(om, [(x, Y)])
    a, ga = E.alignment_value_and_grad(om, [(x, Y)], phi_fn)
    assert abs(float(energy) - (-float(a) + 0.3 * float(E.riesz_energy(om, pot)))) < 1e-12
    assert rel_err(grad, -ga + 0.3 * E.riesz_grad(om, pot)) < 1e-12
    assert parts["alignment"] == pytest.approx(float(a))
    fd = finite_diff_grad(
        lambda w: -E.alignment(phi_fn(x, w), Y) + 0.3 * E.riesz_energy(w, pot), om
    )
    assert rel_err(grad, fd) < 1e-6
    with pytest.raises(ValueError, match="lam"):
        E.Hamiltonian(E.LabelAlignment(phi_fn), pot, lam=-1.0)
    with pytest.raises(TypeError, match="value_and_grad"):
        E.Hamiltonian(phi_fn, pot, lam=0.3)  # a bare feature function is not a data term

"""The teacher-attention data term with particle masses (weighted / WFR particles): value
against the naive twin, the masses' gradient (autograd) against its closed form, the omega
gradient against finite differences, uniform masses against the unweighted term, and a WFR run
through the Hamiltonian."""

from __future__ import annotations

import pytest
import torch

from coulomb_attention import features
from coulomb_attention.dynamics import Ball, LangevinSchedule, Reaction, cycle, learn_particles
from coulomb_attention.energy import (
    Hamiltonian,
    TeacherAttention,
    TeacherBatch,
    make_potential,
    naive_teacher_value,
    per_head,
    teacher_mass_gradient,
)
from helpers import finite_diff_grad


def _batch(gen, B=3, H=2, R=4, S=6, dh=4, causal=False, indicator=False, scale=0.6):
    q = torch.randn(B, H, R, dh, generator=gen, dtype=torch.float64) * scale
    k = torch.randn(B, H, S, dh, generator=gen, dtype=torch.float64) * scale
    key_mask = torch.ones(B, S, dtype=torch.bool)
    key_mask[-1, 4:] = False  # a shorter sequence
    row_mask = torch.ones(B, R, dtype=torch.bool)
    row_mask[-1, 3:] = False
    row_pos = target = None
    if causal or indicator:
        row_pos = torch.stack([torch.randperm(4, generator=gen)[:R].sort().values
                               for _ in range(B)])
    if indicator:  # the one-hot row of a visible key
        star = (torch.rand(B, R, generator=gen) * (row_pos + 1)).long()
        target = torch.nn.functional.one_hot(star, S).double()
    return TeacherBatch(q, k, key_mask, row_mask, row_pos=row_pos, target=target)


def _masses(gen, n):
    w = torch.rand(n, generator=gen, dtype=torch.float64) + 0.1
    return w / w.sum()


@pytest.mark.parametrize("objective", ["softmax", "causal", "indicator"])
@pytest.mark.parametrize("phi", [features.positive, features.softplus])
def test_mass_gradient_autograd_equals_closed_form(phi, objective):
    gen = torch.Generator().manual_seed(0)
    kw = {"causal": objective == "causal", "indicator": objective == "indicator"}
    batches = [_batch(gen, **kw), _batch(gen, B=2, S=5, **kw)]
    omega = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    w = _masses(gen, 5)
    term = TeacherAttention(phi, chunk_elements=50)
    value, (g_omega, g_w), info = term.value_and_grad(omega, batches, weights=w)
    kl, _ = naive_teacher_value(phi, omega, batches, weights=w)
    assert abs(info["kl"] - kl) < 1e-10 * max(1.0, kl) and abs(float(value) - kl) < 1e-10
    exact = teacher_mass_gradient(phi, omega, w, batches)
    assert float((g_w - exact).norm() / exact.norm()) < 1e-10
    # the objective is invariant to a common factor on the masses: sum_i w_i dD/dw_i = 0
    assert abs(float((w * g_w).sum())) < 1e-10 * float(g_w.abs().max())
    # the omega gradient still matches finite differences at these masses
    fd = finite_diff_grad(lambda om: term.value_and_grad(om, batches, weights=w)[0], omega)
    assert float((g_omega - fd).norm() / fd.norm()) < 1e-6


def test_uniform_masses_give_the_unweighted_term():
    gen = torch.Generator().manual_seed(1)
    batches = [_batch(gen, causal=True)]
    omega = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    term = TeacherAttention(features.positive)
    v0, g0, _ = term.value_and_grad(omega, batches)
    v1, (g1, _), _ = term.value_and_grad(omega, batches, weights=torch.full((6,), 1 / 6,
                                                                           dtype=torch.float64))
    assert abs(float(v1 - v0)) < 1e-13 and float((g1 - g0).abs().max()) < 1e-13
    # a heavier feature changes the value (the masses enter the objective)
    w = torch.full((6,), 0.5 / 5, dtype=torch.float64)
    w[0] = 0.5
    assert abs(term.evaluate(omega, batches, weights=w)["kl"] - float(v0)) > 1e-4


def test_grouped_masses_equal_each_group_alone():
    gen = torch.Generator().manual_seed(2)
    b = _batch(gen, H=4)
    omega = torch.randn(2, 5, 4, generator=gen, dtype=torch.float64)
    w = torch.stack([_masses(gen, 5), _masses(gen, 5)])
    term = TeacherAttention(per_head(features.positive))
    _, (_, gw), info = term.value_and_grad(omega, [b], weights=w)
    single = TeacherAttention(features.positive)
    for g in range(2):
        part = [b.heads(slice(2 * g, 2 * g + 2))]
        _, (_, gw_g), info_g = single.value_and_grad(omega[g], part, weights=w[g])
        # the grouped term is the mean over groups: each group's gradient enters with 1/2
        assert float((gw[g] - gw_g / 2).abs().max()) < 1e-12
    with pytest.raises(ValueError, match="weights must have shape"):
        term.value_and_grad(omega, [b], weights=w[0])


def test_wfr_run_on_the_teacher_term_lowers_the_kl_and_keeps_the_mass():
    gen = torch.Generator().manual_seed(3)
    batches = [_batch(gen, B=4, R=4, S=6, indicator=True) for _ in range(3)]
    omega0 = torch.randn(8, 4, generator=gen, dtype=torch.float64)
    term = TeacherAttention(features.positive)
    ham = Hamiltonian(term, make_potential("riesz", s=1.0, eps=0.1), lam=0.1)
    schedule = LangevinSchedule(steps=60, eta=0.05, beta=float("inf"))
    run = learn_particles(ham, omega0, schedule, cycle([batches]), projection=Ball(3.0),
                          generator=torch.Generator().manual_seed(0),
                          reaction=Reaction(tau=0.1, w_min=0.1))
    assert abs(float(run.weights.sum()) - 1) < 1e-12 and bool((run.weights > 0).all())
    before = term.evaluate(omega0, batches)["kl"]
    after = term.evaluate(run.omega, batches, weights=run.weights)["kl"]
    assert after < before - 0.05
    assert float(run.weights.max() / run.weights.min()) > 1.5  # the masses moved

"""The teacher-attention data term (energy.teacher): value and gradient against the naive twin,
finite differences, exact all-reduce, and its limits."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from coulomb_attention import features
from coulomb_attention.dynamics import Ball, LangevinSchedule, cycle, learn_particles
from coulomb_attention.energy import (
    Comm,
    Hamiltonian,
    TeacherAttention,
    TeacherBatch,
    make_potential,
    naive_teacher_value,
    per_head,
)
from helpers import finite_diff_grad


def _batch(gen, B=3, H=2, R=4, S=6, dh=4, values=True, scale=0.6):
    q = torch.randn(B, H, R, dh, generator=gen, dtype=torch.float64) * scale
    k = torch.randn(B, H, S, dh, generator=gen, dtype=torch.float64) * scale
    v = torch.randn(B, H, S, dh, generator=gen, dtype=torch.float64) if values else None
    key_mask = torch.ones(B, S, dtype=torch.bool)
    key_mask[1, 4:] = False  # a shorter sequence
    key_mask[-1, 2:] = False
    row_mask = torch.ones(B, R, dtype=torch.bool)
    row_mask[-1, 2:] = False  # it has fewer rows too
    return TeacherBatch(q, k, key_mask, row_mask, v)


@pytest.mark.parametrize("phi", [features.positive, features.softmax, features.softplus])
@pytest.mark.parametrize("output_weight", [0.0, 0.7])
def test_value_matches_naive_twin_and_gradient_matches_finite_differences(phi, output_weight):
    gen = torch.Generator().manual_seed(0)
    batches = [_batch(gen), _batch(gen, B=2, S=5)]
    omega = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    term = TeacherAttention(phi, output_weight=output_weight, chunk_elements=50)
    value, grad, info = term.value_and_grad(omega, batches)
    kl, mse = naive_teacher_value(phi, omega, batches)
    assert abs(info["kl"] - kl) < 1e-10 * max(1.0, kl)
    assert abs(info["mse"] - mse) < 1e-10 * max(1.0, mse)
    assert abs(float(value) - (kl + output_weight * mse)) < 1e-10
    assert info["rows"] == 2 * (4 + 4 + 2) + 2 * (4 + 2)
    assert kl > 0
    # central finite differences in every coordinate
    fd = finite_diff_grad(lambda w: term.value_and_grad(w, batches)[0], omega)
    assert float((grad - fd).norm() / fd.norm()) < 1e-6


def test_chunking_does_not_change_the_result():
    gen = torch.Generator().manual_seed(1)
    batches = [_batch(gen, B=5)]
    omega = torch.randn(7, 4, generator=gen, dtype=torch.float64)
    v1, g1, _ = TeacherAttention(features.positive, chunk_elements=1).value_and_grad(omega, batches)
    v2, g2, _ = TeacherAttention(features.positive).value_and_grad(omega, batches)
    assert abs(float(v1 - v2)) < 1e-12 and float((g1 - g2).abs().max()) < 1e-12


def test_all_reduce_of_shards_equals_the_whole():
    """Rank r holds batch r; summing (KL, SE, rows, grad) over ranks gives the global mean."""
    gen = torch.Generator().manual_seed(2)
    shards = [_batch(gen, B=2), _batch(gen, B=3, S=4)]
    omega = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    term = TeacherAttention(features.positive, output_weight=0.3)
    whole = term.value_and_grad(omega, shards)
    per_rank = [term.sums(omega, [s]) for s in shards]
    for r in range(2):
        other = per_rank[1 - r]

        def reduce(tensors, other=other):  # a simulated all-reduce over the two ranks
            return [tensors[0] + other[0], tensors[1] + other[1]]

        v, g, info = term.value_and_grad(omega, [shards[r]], Comm(reduce, rank=r, world_size=2))
        assert abs(float(v - whole[0])) < 1e-12 and float((g - whole[1]).abs().max()) < 1e-12
        assert info["rows"] == whole[2]["rows"] and info["kl"] == pytest.approx(whole[2]["kl"])


def test_many_favor_features_approach_the_teacher_and_kl_vanishes_at_equality():
    """FAVOR+ is unbiased for exp(q.k): with many particles the row KL is near 0, with few it is
    far larger; a 'feature map' equal to the teacher's kernel has KL 0 exactly."""
    gen = torch.Generator().manual_seed(3)
    batches = [_batch(gen, B=4, dh=8, scale=0.5)]
    term = TeacherAttention(features.positive)
    many = term.evaluate(features.gaussian(20000, 8, generator=gen).double(), batches)["kl"]
    few = term.evaluate(features.gaussian(2, 8, generator=gen).double(), batches)["kl"]
    assert many < 2e-3 and few > 10 * many
    # exact kernel via a one-hot trick: phi(u) = exp(u . c) for each of the rows of omega is
    # the exact kernel only when S = 1; instead check KL(p, p) = 0 with dh-dim exp features
    b = batches[0]
    one_key = TeacherBatch(b.q, b.k[:, :, :1], b.key_mask[:, :1], b.row_mask)
    assert term.evaluate(torch.randn(3, 8, generator=gen, dtype=torch.float64),
                         [one_key])["kl"] == pytest.approx(0.0, abs=1e-14)


def test_hamiltonian_with_teacher_term_and_repulsion():
    gen = torch.Generator().manual_seed(4)
    batches = [_batch(gen)]
    omega = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    pot = make_potential("riesz", s=1.0, eps=0.1, dim=4)
    term = TeacherAttention(features.positive)
    e0, g0, i0 = Hamiltonian(term).value_and_grad(omega, batches)
    e1, g1, i1 = Hamiltonian(term, pot, lam=0.5).value_and_grad(omega, batches)
    assert math.isfinite(i1["repulsion"]) and abs(float(e1 - e0) - 0.5 * i1["repulsion"]) < 1e-10
    assert float((g1 - g0).norm()) > 0
    with pytest.raises(TypeError, match="TeacherBatch"):
        term.value_and_grad(omega, [(1, 2)])
    with pytest.raises(ValueError, match="key_mask"):
        TeacherBatch(batches[0].q, batches[0].k, batches[0].key_mask[:, :2], batches[0].row_mask)


@pytest.mark.parametrize("per", [1, 2])
def test_per_head_feature_equals_each_group_alone(per):
    gen = torch.Generator().manual_seed(6)
    b = _batch(gen, H=4)
    G = 4 // per
    omega = torch.randn(G, 5, 4, generator=gen, dtype=torch.float64)
    out = per_head(features.positive)(b.q, omega)
    for g in range(G):
        heads = slice(g * per, (g + 1) * per)
        assert torch.allclose(out[:, heads], features.positive(b.q[:, heads], omega[g]),
                              rtol=1e-13, atol=0)


@pytest.mark.parametrize("lam", [0.0, 0.3])
@pytest.mark.parametrize("per", [1, 2])
def test_grouped_hamiltonian_moves_each_group_as_its_own_run(lam, per):
    """All head groups in one particle run (Hamiltonian(groups=G)) equal G separate runs:
    the energy is the mean of the per-group energies and every particle's force N grad_i H is
    its own group's; without noise the Langevin trajectories coincide."""
    gen = torch.Generator().manual_seed(7)
    H, M, dh = 4, 5, 4
    G = H // per
    batches = [_batch(gen, H=H), _batch(gen, B=2, H=H, S=5)]
    omega = torch.randn(G, M, dh, generator=gen, dtype=torch.float64)
    pot = make_potential("riesz", s=1.0, eps=0.1, dim=dh)
    grouped = Hamiltonian(TeacherAttention(per_head(features.positive)), pot, lam=lam, groups=G)
    e, g, _ = grouped.value_and_grad(omega.reshape(G * M, dh), batches)
    alone = Hamiltonian(TeacherAttention(features.positive), pot, lam=lam)
    parts = [alone.value_and_grad(omega[i], [b.heads(slice(i * per, (i + 1) * per))
                                             for b in batches]) for i in range(G)]
    assert float(e) == pytest.approx(sum(float(p[0]) for p in parts) / G, rel=1e-12)
    for i, p in enumerate(parts):  # N grad (N = G M) equals M grad of the group alone
        assert torch.allclose(G * M * g[i * M:(i + 1) * M], M * p[1], rtol=1e-10, atol=1e-13)
    schedule = LangevinSchedule(steps=5, eta=0.05, beta=0.0)
    kw = dict(projection=Ball(1.5), generator=torch.Generator().manual_seed(0))
    run = learn_particles(grouped, omega.reshape(G * M, dh), schedule, cycle(batches), **kw)
    assert float((run.omega - omega.reshape(G * M, dh)).norm()) > 1e-3  # it moved
    for i in range(G):
        own = [b.heads(slice(i * per, (i + 1) * per)) for b in batches]
        ref = learn_particles(alone, omega[i], schedule, cycle(own), **kw)
        assert torch.allclose(run.omega[i * M:(i + 1) * M], ref.omega, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="divisible by groups"):
        grouped.value_and_grad(omega.reshape(G * M, dh)[:-1], batches)


def test_causal_hybrid_with_sinks_rows_are_the_streaming_op():
    """A causal window batch with sinks: the student's output in the output-MSE term is the
    streaming hybrid's output (nn/ops/streaming.py: window + sinks + linear rest), row by row,
    so the conversion fits exactly the attention that decodes."""
    from coulomb_attention.energy.teacher import _chunk_sums
    from coulomb_attention.nn.ops import naive_streaming_attention

    g = torch.Generator().manual_seed(3)
    B, H, L, d, M, W, S = 2, 2, 20, 4, 8, 5, 3
    q = 0.6 * torch.randn(B, H, L, d, generator=g, dtype=torch.float64)
    k = 0.6 * torch.randn(B, H, L, d, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, L, d, generator=g, dtype=torch.float64)
    omega = torch.randn(M, d, generator=g, dtype=torch.float64)
    gamma = torch.tensor([0.3, 2.0], dtype=torch.float64)
    rows = torch.arange(L)[None].expand(B, L)
    batch = TeacherBatch(q, k, torch.ones(B, L, dtype=torch.bool),
                         torch.ones(B, L, dtype=torch.bool), v, row_pos=rows, row_index=rows,
                         window=W, gamma=gamma, sinks=S)
    _, se, _ = _chunk_sums(features.positive, omega, batch, 0.0)
    student = naive_streaming_attention(q, k, v, gamma, W, S, omega=omega[None])
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    teacher = torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~causal, -math.inf), -1) @ v
    expected = ((student - teacher) ** 2).sum(-1).sum() / d
    assert torch.allclose(se, expected, rtol=1e-10)
    no_sinks = dataclasses.replace(batch, sinks=0)
    _, se0, _ = _chunk_sums(features.positive, omega, no_sinks, 0.0)
    assert not torch.allclose(se0, se)  # the sinks change the rows

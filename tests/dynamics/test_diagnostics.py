import math

import pytest
import torch

from coulomb_attention.dynamics.diagnostics import (
    effective_rank,
    nearest_neighbour_distances,
    particle_diagnostics,
)


def test_nearest_neighbour_distances_on_a_line():
    omega = torch.tensor([[0.0], [1.0], [3.0], [3.5]])
    assert nearest_neighbour_distances(omega).tolist() == pytest.approx([1.0, 1.0, 0.5, 0.5])


def test_effective_rank_closed_forms():
    assert effective_rank(torch.eye(5)) == pytest.approx(5.0)
    rank_one = torch.ones(6, 1) @ torch.randn(1, 4)
    assert effective_rank(rank_one) == pytest.approx(1.0, abs=1e-6)


def test_collapse_share_counts_duplicated_particles():
    g = torch.Generator().manual_seed(0)
    omega = torch.randn(8, 3, generator=g)
    omega = torch.cat([omega, omega[:2] + 1e-4])  # two near-duplicates: 4 of 10 in pairs
    diag = particle_diagnostics(omega, torch.randn(50, 10, generator=g))
    assert diag["collapsed_share"] == pytest.approx(0.4)
    assert diag["nn_min"] < 1e-3 < diag["nn_median"]
    assert 1.0 <= diag["effective_rank"] <= 10.0
    assert diag["effective_rank_share"] == pytest.approx(diag["effective_rank"] / 10)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="N >= 2"):
        nearest_neighbour_distances(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"\(n, M\)"):
        effective_rank(torch.zeros(3))
    assert math.isnan(effective_rank(torch.zeros(3, 3)))

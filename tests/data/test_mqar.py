"""The MQAR generator: every target is the value paired with the queried key earlier."""

from __future__ import annotations

import pytest
import torch

from coulomb_attention.data.mqar import IGNORE, MQARConfig, make_mqar


@pytest.mark.parametrize("cfg", [MQARConfig(), MQARConfig(vocab_size=40, n_pairs=12,
                                                          seq_len=40, n_queries=5)])
def test_targets_are_the_values_paired_with_the_queried_keys(cfg):
    data = make_mqar(cfg, 200, torch.Generator().manual_seed(0))
    P, L = cfg.n_pairs, cfg.seq_len
    assert data.inputs.shape == data.targets.shape == data.retrieve.shape == (200, L)
    half = cfg.vocab_size // 2
    for x, y, ret in zip(data.inputs.tolist(), data.targets.tolist(), data.retrieve.tolist(),
                         strict=True):
        keys, values = x[0:2 * P:2], x[1:2 * P:2]
        assert len(set(keys)) == P and all(1 <= k < half for k in keys)
        assert all(half <= v < cfg.vocab_size for v in values)
        pairs = dict(zip(keys, values, strict=True))
        queried = [t for t in range(L) if y[t] != IGNORE]
        assert len(queried) == cfg.n_queries
        assert len({x[t] for t in queried}) == cfg.n_queries  # distinct keys
        for t in range(L):
            if y[t] == IGNORE:
                assert ret[t] == -1
                continue
            assert t >= 2 * P and x[t] in pairs
            assert y[t] == pairs[x[t]]  # the value paired with that key earlier
            assert x[ret[t]] == y[t] and x[ret[t] - 1] == x[t] and ret[t] < t
            assert x[t + 1] == y[t]  # the answer is the next input (teacher forcing)
        # every other query-region token is filler
        region = [t for t in range(2 * P, L) if y[t] == IGNORE and y[t - 1] == IGNORE]
        assert all(x[t] == 0 for t in region)


def test_generator_is_reproducible_and_uses_the_values_uniformly():
    cfg = MQARConfig(vocab_size=16, n_pairs=4, seq_len=16, n_queries=4)
    a = make_mqar(cfg, 4000, torch.Generator().manual_seed(3))
    b = make_mqar(cfg, 4000, torch.Generator().manual_seed(3))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    tg = a.targets[a.targets != IGNORE]
    counts = torch.bincount(tg - 8, minlength=8).float()
    assert counts.shape == (8,) and (counts / counts.mean() - 1).abs().max() < 0.1
    assert abs(cfg.chance - 1 / 8) < 1e-12


def test_bad_configs_raise():
    with pytest.raises(ValueError, match="n_queries"):
        MQARConfig(n_pairs=4, n_queries=5)
    with pytest.raises(ValueError, match="seq_len"):
        MQARConfig(n_pairs=8, n_queries=8, seq_len=30)
    with pytest.raises(ValueError, match="keys"):
        MQARConfig(vocab_size=10, n_pairs=5, n_queries=1, seq_len=12)

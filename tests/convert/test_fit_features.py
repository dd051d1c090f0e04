"""fit_features: the recipe for learning the particles of one's own KernelAttention."""

import pytest
import torch

from coulomb_attention.convert.distill import DistillConfig
from coulomb_attention.convert.fit_features import fit_features
from coulomb_attention.nn import KernelAttention


def _layer():
    return KernelAttention(dim=32, heads=2, feature_map="favor", n_features=16,
                           share_features=False, generator=0)


def test_fit_moves_only_omega_and_lowers_held_out_kl():
    torch.manual_seed(0)
    attn = _layer()
    x = torch.randn(60, 12, 32)
    mask = torch.ones(60, 12, dtype=torch.bool)
    mask[::2, 9:] = False
    before = {k: v.clone() for k, v in attn.state_dict().items()}
    out = fit_features(attn, x, mask, config=DistillConfig(n_examples=48, holdout=12, steps=30,
                                                           refine_steps=0))
    assert out["holdout_kl_after"] < 0.6 * out["holdout_kl_before"]
    changed = {k for k, v in attn.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {"omega"}
    assert tuple(attn.omega.shape) == (2, 16, 16)


def test_bad_input_names_the_problem():
    attn = _layer()
    with pytest.raises(ValueError, match=r"shape \(n, T, 32\)"):
        fit_features(attn, torch.randn(4, 5, 31))
    with pytest.raises(ValueError, match="NaN"):
        fit_features(attn, torch.full((4, 5, 32), float("nan")))
    with pytest.raises(TypeError, match="float tensor"):
        fit_features(attn, torch.ones(4, 5, 32, dtype=torch.long))
    with pytest.raises(ValueError, match="mask must be"):
        fit_features(attn, torch.randn(4, 5, 32), torch.ones(4, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="with particles"):
        fit_features(KernelAttention(32, 2, "softmax"), torch.randn(4, 5, 32))

"""LoRA adapters on the encoder's attention projections: the identity at init, merged equals
unmerged, gradients reach only A and B, the parameter count, bad ranks and tampered files."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from coulomb_attention.nn.families.bert import PretrainedClassifier, load_pretrained_encoder
from coulomb_attention.nn.lora import (
    LoRALinear,
    add_lora_,
    count_lora_parameters,
    load_lora_,
    lora_modules,
    lora_parameters,
    merge_lora_,
    save_lora,
)
from helpers import rel_err
from test_pretrained import write_tiny_bert


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert-lora"), qk_scale=4.0)


def _model(tiny_dir):
    return load_pretrained_encoder(tiny_dir, "favor", 8, share_features=False, generator=0)


def _inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 40, (3, 7), generator=g)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 5:] = False
    return ids, mask


def _randomize_b_(model, seed=2):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, m in lora_modules(model):
            m.lora_b.copy_(torch.randn(m.lora_b.shape, generator=g) * 0.3)


def test_zero_b_at_init_leaves_the_model_unchanged_exactly(tiny_dir):
    ids, mask = _inputs()
    model = _model(tiny_dir)
    with torch.no_grad():
        before = model.sentence_embedding(ids, mask, normalize=False)
    adapters = add_lora_(model, 4, alpha=8, generator=torch.Generator().manual_seed(0))
    assert len(adapters) == 2 * 4
    assert all(float(a.lora_a.detach().abs().sum()) > 0 and not a.lora_b.any() for a in adapters)
    with torch.no_grad():
        after = model.sentence_embedding(ids, mask, normalize=False)
    assert torch.equal(before, after)


def test_merged_equals_unmerged_and_is_a_plain_encoder(tiny_dir):
    ids, mask = _inputs()
    model = _model(tiny_dir)
    keys = {k: v.shape for k, v in model.state_dict().items()}
    add_lora_(model, 3, generator=torch.Generator().manual_seed(0))
    _randomize_b_(model)
    with torch.no_grad():
        unmerged = model.sentence_embedding(ids, mask, normalize=False)
    base = _model(tiny_dir)
    with torch.no_grad():
        plain = base.sentence_embedding(ids, mask, normalize=False)
    assert rel_err(unmerged, plain) > 1e-2  # the adapters do change the model
    merge_lora_(model)
    assert type(model) is PretrainedClassifier and not lora_modules(model)
    assert {k: v.shape for k, v in model.state_dict().items()} == keys
    layer = model.attention_layers[0]
    assert all(type(getattr(layer, t)) is torch.nn.Linear
               for t in ("q_proj", "k_proj", "v_proj", "out_proj"))
    with torch.no_grad():
        merged = model.sentence_embedding(ids, mask, normalize=False)
    assert rel_err(merged, unmerged) < 1e-5


def test_lora_linear_matches_its_formula():
    lin = torch.nn.Linear(5, 4)
    ad = LoRALinear(lin, 2, alpha=6.0, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ad.lora_b.normal_()
    x = torch.randn(3, 5, dtype=torch.float64)
    w = lin.weight.double() + 3.0 * ad.lora_b.double() @ ad.lora_a.double()
    ref = x @ w.T + lin.bias.double()
    assert rel_err(ad(x.float()).double(), ref) < 1e-6
    assert ad.scaling == 3.0


def test_gradient_reaches_only_a_and_b(tiny_dir):
    ids, mask = _inputs()
    model = _model(tiny_dir)
    add_lora_(model, 2, generator=torch.Generator().manual_seed(0))
    _randomize_b_(model)  # with B = 0 the gradient of A is 0: make both non-trivial
    model.sentence_embedding(ids, mask).sum().backward()
    trainable = {id(p) for p in lora_parameters(model)}
    for name, p in model.named_parameters():
        if id(p) in trainable:
            assert p.requires_grad and p.grad is not None and float(p.grad.abs().sum()) > 0, name
        else:
            assert not p.requires_grad and p.grad is None, name
    assert all(not b.requires_grad for b in model.buffers())


@pytest.mark.parametrize("rank", [1, 4])
def test_parameter_count_is_rank_times_in_plus_out(tiny_dir, rank):
    model = _model(tiny_dir)
    add_lora_(model, rank, targets=("q_proj", "v_proj"))
    d = model.attention_layers[0].dim
    assert count_lora_parameters(model) == 2 * 2 * rank * (d + d)  # 2 layers x 2 projections
    assert count_lora_parameters(model) == sum(p.numel() for p in model.parameters()
                                               if p.requires_grad)


def test_ffn_adapters_merge_into_the_mlp_and_count_their_shapes(tiny_dir):
    ids, mask = _inputs()
    model = _model(tiny_dir)
    keys = {k: v.shape for k, v in model.state_dict().items()}
    add_lora_(model, 3, targets=("v_proj", "fc1", "fc2"),
              generator=torch.Generator().manual_seed(0))
    f, d = model.blocks[0].mlp.fc1.base.weight.shape
    assert f != d  # fc1 (F, D), fc2 (D, F): the count sees both shapes
    assert count_lora_parameters(model) == 2 * 3 * ((d + d) + (d + f) + (f + d))
    _randomize_b_(model)
    with torch.no_grad():
        unmerged = model.sentence_embedding(ids, mask, normalize=False)
        plain = _model(tiny_dir).sentence_embedding(ids, mask, normalize=False)
    assert rel_err(unmerged, plain) > 1e-2
    merge_lora_(model)
    assert not lora_modules(model) and type(model.blocks[1].mlp.fc2) is torch.nn.Linear
    assert {k: v.shape for k, v in model.state_dict().items()} == keys
    with torch.no_grad():
        merged = model.sentence_embedding(ids, mask, normalize=False)
    assert rel_err(merged, unmerged) < 1e-5


@pytest.mark.parametrize("rank", [0, -1, 17, 2.5, True])
def test_bad_rank_raises_naming_it(tiny_dir, rank):
    with pytest.raises(ValueError, match="rank"):
        add_lora_(_model(tiny_dir), rank)


def test_bad_targets_and_double_adapters_raise(tiny_dir):
    model = _model(tiny_dir)
    with pytest.raises(ValueError, match="targets"):
        add_lora_(model, 2, targets=("fc3",))
    with pytest.raises(ValueError, match="targets"):
        add_lora_(model, 2, targets=("fc1", "fc1"))
    add_lora_(model, 2)
    with pytest.raises(ValueError, match="already"):
        add_lora_(model, 2)


def test_merge_rejects_non_finite_adapters(tiny_dir):
    model = _model(tiny_dir)
    add_lora_(model, 2)
    with torch.no_grad():
        lora_modules(model)[0][1].lora_a[0, 0] = float("nan")
    with pytest.raises(ValueError, match="not finite"):
        merge_lora_(model)


def test_save_load_round_trip_and_tampered_files(tiny_dir, tmp_path):
    ids, mask = _inputs()
    model = _model(tiny_dir)
    add_lora_(model, 2, generator=torch.Generator().manual_seed(0))
    _randomize_b_(model)
    path = save_lora(model, tmp_path / "adapters.safetensors")
    other = _model(tiny_dir)
    add_lora_(other, 2, generator=torch.Generator().manual_seed(9))
    load_lora_(other, path)
    with torch.no_grad():
        assert torch.equal(other.sentence_embedding(ids, mask), model.sentence_embedding(ids, mask))
    tensors = load_file(str(path))
    name = sorted(tensors)[0]
    for label, bad, match in (
            ("shape", {**tensors, name: tensors[name][:, :-1].contiguous()}, "shape"),
            ("nan", {**tensors, name: torch.full_like(tensors[name], float("nan"))},
             "non-finite"),
            ("missing", {k: v for k, v in tensors.items() if k != name}, "missing")):
        p = tmp_path / f"{label}.safetensors"
        save_file(bad, str(p))
        fresh = _model(tiny_dir)
        add_lora_(fresh, 2)
        with pytest.raises(ValueError, match=match):
            load_lora_(fresh, p)
    wrong_rank = _model(tiny_dir)
    add_lora_(wrong_rank, 3)
    with pytest.raises(ValueError, match="shape"):
        load_lora_(wrong_rank, path)

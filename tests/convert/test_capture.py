import pytest
import torch

from coulomb_attention.convert.capture import layer_inputs
from test_train import synthetic_set, tiny_model


def test_layer_inputs_equal_the_hidden_states_entering_each_layer():
    model = tiny_model(layers=2)
    model.train()
    data = synthetic_set(n=12)
    ids, mask = data.input_ids[:6], data.attention_mask[:6]
    seen = []
    hooks = [layer.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(args[0] if args else kwargs["x"]), with_kwargs=True)
        for layer in model.attention_layers]
    model.eval()
    with torch.no_grad():
        model(ids, mask)
    for h in hooks:
        h.remove()
    model.train()
    for li in range(2):
        (x, m), = list(layer_inputs(model, li, [(ids, mask)]))
        assert torch.equal(x, seen[li]) and torch.equal(m, mask)
    assert model.training  # the mode is restored
    # the hook is removed: a plain forward pass runs to the end
    model.eval()
    assert model(ids, mask).shape == (6, 2)


def test_layer_inputs_stop_before_the_layer_runs():
    model = tiny_model(layers=2)
    calls = []
    model.attention_layers[1].register_forward_hook(lambda *a: calls.append(1))
    data = synthetic_set(n=4)
    out = list(layer_inputs(model, 1, [(data.input_ids, data.attention_mask)]))
    assert len(out) == 1 and calls == []  # layer 1 itself never ran
    with pytest.raises(IndexError):
        list(layer_inputs(model, 5, [(data.input_ids, data.attention_mask)]))

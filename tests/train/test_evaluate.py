from types import SimpleNamespace

import numpy as np
import pytest
import torch

from coulomb_attention import metrics as M
from coulomb_attention.train.evaluate import RobustConfig, evaluate, metrics_of
from coulomb_attention.train.loop import predict_proba
from test_train import synthetic_set, tiny_model

TOK = SimpleNamespace(special_ids=(0, 1, 2), unk_id=1, pad_id=0)


def test_metrics_of_is_the_metrics_module():
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    labels = np.array([0, 1, 1, 1])
    got = metrics_of(probs, labels)
    want = M.classification_metrics(probs.numpy(), labels)
    assert got.keys() == want.keys() and got["accuracy"] == pytest.approx(0.75)
    assert all(got[k] == pytest.approx(float(want[k])) for k in want)


def test_evaluate_clean_corrupted_and_adversarial():
    torch.manual_seed(0)
    model = tiny_model()
    model.eval()
    data = synthetic_set(n=40)
    robust = RobustConfig(kinds=("delete", "swap"), rates=(0.0, 0.5), seed=3)
    out = evaluate(model, data, TOK, robust, adv_set=synthetic_set(n=10, seed=1))
    clean = metrics_of(predict_proba(model, data), data.labels.numpy())
    assert out["metrics"] == pytest.approx(clean)
    assert set(out["robust"]) == {"delete@0", "delete@0.5", "swap@0", "swap@0.5", "advglue"}
    # rate 0 corrupts nothing: the same metrics as the clean split
    assert out["robust"]["delete@0"] == pytest.approx(clean)
    assert out["robust"]["advglue"]["n"] == 10
    assert out["inference_s_per_example"] > 0
    assert sum(out["reliability"]["count"]) == 40  # every example in one bin
    assert None not in out["reliability"]["count"]


def test_robust_config_rejects_bad_names_and_rates():
    with pytest.raises(ValueError, match="corruption"):
        RobustConfig(kinds=("shuffle-all",))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        RobustConfig(rates=(1.5,))


def test_monitor_subset_is_fixed_and_capped():
    """The per-epoch monitor reads every example of a small split, and a fixed subset (the
    same rows for every run) of a large one, in the split's order."""
    from coulomb_attention.train.run import monitor_subset

    data = synthetic_set(n=40)
    assert monitor_subset(data, limit=40) is data
    a, b = monitor_subset(data, limit=15), monitor_subset(synthetic_set(n=40), limit=15)
    assert len(a) == 15 and torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.labels, b.labels)
    # every row is a row of the split, no row twice, kept in the split's order
    rows = [next(i for i in range(40) if torch.equal(data.input_ids[i], a.input_ids[j])
                 and torch.equal(data.attention_mask[i], a.attention_mask[j])) for j in range(15)]
    assert len(set(rows)) == 15 and rows == sorted(rows)
    assert torch.equal(data.labels[rows], a.labels)

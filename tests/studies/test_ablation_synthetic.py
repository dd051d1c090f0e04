"""The synthetic arena of the ablation study: plan shape, records, and what the variants are."""

import json
import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from coulomb_attention._validation import torch_generator
from coulomb_attention.features import sample
from coulomb_attention.studies import ablation_synthetic as arena


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.mark.parametrize("quick", [True, False])
def test_plan_is_well_formed_and_paired(quick):
    specs = arena.plan(quick, [0, 1, 2], None)
    feats = arena.QUICK_FEATURES if quick else arena.FULL_FEATURES
    keys = set()
    cells = defaultdict(set)
    for s in specs:
        assert {"arena", "setting", "variant", "params", "M", "seed"} <= set(s)
        assert s["arena"] == arena.ARENA == "synthetic"
        assert isinstance(s["params"], dict) and isinstance(s["M"], int)
        assert s["M"] in feats and s["seed"] in (0, 1, 2)
        json.dumps(s, allow_nan=False)  # JSON-able, no inf
        key = (s["setting"], s["variant"], tuple(sorted(s["params"].items())), s["M"], s["seed"])
        assert key not in keys
        keys.add(key)
        cells[(s["setting"], s["M"], s["seed"])].add(s["variant"])
    # every (setting, M, seed) cell holds every variant: same seeds, data and budgets
    assert all(v == set(arena.VARIANTS) for v in cells.values())
    settings = {c[0] for c in cells}
    assert {f"xor-d10-n{n}" for n in arena.REGIMES} <= settings
    per_variant = {v: len(e if not quick else e[:1]) for v, e in arena.VARIANTS.items()}
    assert len(specs) == len(cells) * sum(per_variant.values())
    assert {s["M"] for s in arena.plan(quick, [0], [8, 32])} == {8, 32}


def test_setting_data_depends_on_setting_and_seed_only():
    a = arena.setting_data("xor-d10-n200", 3)
    b = arena.setting_data("xor-d10-n200", 3)
    c = arena.setting_data("xor-d10-n200", 4)
    assert a[0].shape == (200, 10) and a[2].shape == (arena.N_TEST, 10)
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a[0], c[0])
    with pytest.raises(ValueError, match="setting"):
        arena.setting_data("moons-200", 0)


def test_run_returns_every_contract_field():
    spec = {"arena": "synthetic", "setting": "xor-d10-n200", "variant": "weighted",
            "params": {"lam": 0.01, "tau": 0.2}, "M": 8, "seed": 0}
    rec = arena.run(spec)
    for k, v in spec.items():
        assert rec[k] == v
    assert rec["metric"] == "accuracy" and 0.0 <= rec["score"] <= 1.0
    assert {"nn_min", "nn_median", "collapsed_share", "effective_rank"} <= set(rec["diagnostics"])
    assert 1.0 <= rec["diagnostics"]["effective_rank"] <= 8.0
    assert 0 < len(rec["energy_trace"]) <= 50
    assert all(set(t) == {"step", "energy", "data", "repulsion"} for t in rec["energy_trace"])
    assert rec["energy_trace"][-1]["step"] == 149  # steps 0 .. n - 1 (dynamics.subsample_trace)
    assert rec["time_s"] > 0
    assert abs(rec["weights"]["ess_share"]) <= 1.0
    json.dumps(rec, allow_nan=False)


def test_gradient_variant_lowers_the_energy():
    spec = {"arena": "synthetic", "setting": "xor-d10-n200", "variant": "gradient",
            "params": {}, "M": 8, "seed": 1}
    trace = arena.run(spec)["energy_trace"]
    assert trace[-1]["energy"] < trace[0]["energy"] - 0.05
    assert all(t["repulsion"] == 0.0 for t in trace)  # lam = 0
    est = arena.make_estimator("gradient", {}, 8, 1)
    assert est.optimizer == "adam" and est.lam == 0.0 and math.isinf(est.beta)
    drift = arena.make_estimator("gradient", {"optimizer": "drift"}, 8, 1)
    assert drift.optimizer == "langevin" and drift.lam == 0.0 and math.isinf(drift.beta)


def test_fixed_variant_is_the_maps_draw():
    X_tr, y_tr, _, _ = arena.setting_data("xor-d10-n200", 2)
    est = arena.make_estimator("fixed", {}, 16, 2).fit(X_tr, y_tr)
    gamma = 1.0 / (X_tr.shape[1] * X_tr.var())
    draw = sample("gaussian", 16, 10, scale=math.sqrt(2 * gamma), generator=torch_generator(2),
                  dtype=torch.float64)
    np.testing.assert_array_equal(est.omega_, draw.numpy())
    rec = arena.run({"arena": "synthetic", "setting": "xor-d10-n200", "variant": "fixed",
                     "params": {}, "M": 16, "seed": 2})
    assert rec["energy_trace"] == []


def test_bad_variants_and_params_raise():
    with pytest.raises(ValueError, match="variant"):
        arena.make_estimator("hedgehog", {}, 8, 0)
    with pytest.raises(ValueError, match="params"):
        arena.make_estimator("fixed", {"lam": 0.1}, 8, 0)
    with pytest.raises(ValueError, match="lam > 0"):
        arena.make_estimator("coulomb", {"lam": 0.0}, 8, 0)

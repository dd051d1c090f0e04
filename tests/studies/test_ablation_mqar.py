"""The MQAR arena of the ablation study: the plan is well formed (keys, fairness across
variants), specs map to the right run configs, and one tiny run returns a contract record."""

from __future__ import annotations

import json

import pytest

from coulomb_attention.studies import ablation_mqar as arena

CONTRACT_VARIANTS = {"fixed", "gradient", "langevin", "coulomb", "weighted", "importance",
                     "hedgehog", "end2end"}


def _key(spec):
    return json.dumps({k: spec[k] for k in ("arena", "setting", "variant", "params", "M",
                                            "seed")}, sort_keys=True)


@pytest.mark.parametrize("quick", [False, True])
def test_plan_is_well_formed_and_fair(quick):
    specs = arena.plan(quick, [0, 1, 2], None if quick else [16, 64])
    assert specs and len({_key(s) for s in specs}) == len(specs)  # unique run keys
    for s in specs:
        assert s["arena"] == "mqar" and isinstance(s["params"], dict)
        assert s["variant"] in CONTRACT_VARIANTS and s["variant"] not in arena.PENDING_VARIANTS
        json.dumps(s)  # JSON-able
        level, att = s["setting"].split("/")
        assert level in ("easy", "hard") and att in arena.MAPS
        if s["variant"] == "langevin":
            assert s["params"]["lam"] == 0 and 0 < s["params"]["beta"] < float("inf")
        if s["variant"] == "coulomb":
            assert s["params"]["lam"] > 0
        if s["variant"] == "hedgehog":
            assert att == "favor"
    # every variant of a setting has the same seeds and feature counts
    grid: dict = {}
    for s in specs:
        grid.setdefault((s["setting"], s["variant"], json.dumps(s["params"])), set()).add(
            (s["M"], s["seed"]))
    cells = {}
    for (setting, _, _), ms in grid.items():
        cells.setdefault(setting, []).append(ms)
    for groups in cells.values():
        assert all(g == groups[0] for g in groups)
    settings = {s["setting"] for s in specs}
    if quick:
        assert settings == {"easy/favor"} and {s["M"] for s in specs} == {16}
        assert len(specs) <= 3 * 7
    else:
        assert settings == {"easy/favor", "easy/porf_softplus", "hard/favor",
                            "hard/porf_softplus"}
        assert {s["variant"] for s in specs} == {"fixed", "gradient", "langevin", "coulomb",
                                                 "hedgehog", "weighted", "end2end"}
    # weighted particles in every setting, at every M and seed, with the Coulomb transport
    weighted = [s for s in specs if s["variant"] == "weighted"]
    assert {(s["setting"], s["M"], s["seed"]) for s in weighted} == \
        {(s["setting"], s["M"], s["seed"]) for s in specs if s["variant"] == "fixed"}
    for s in weighted:
        assert s["params"]["lam"] == arena.COULOMB_LAMS[0] and s["params"]["tau"] > 0
        assert s["params"]["beta"] == arena.LANGEVIN_BETA
    with pytest.raises(ValueError, match="even"):
        arena.plan(False, [0], [15])


def test_specs_map_to_the_teacher_route():
    base = {"arena": "mqar", "setting": "easy/porf_softplus", "M": 16, "seed": 3}
    fixed = arena.spec_config({**base, "variant": "fixed", "params": {}})
    grad = arena.spec_config({**base, "variant": "gradient", "params": {"lr": 0.03}})
    coul = arena.spec_config({**base, "variant": "coulomb", "params": {"lam": 1.0, "beta": 1e6}})
    for c in (fixed, grad, coul):  # the same teacher, data and fine-tuning budget
        assert c.init == "teacher" and c.seed == 3 and c.model.n_features == 16
        assert c.model.attention == "porf_softplus"
        assert (c.task, c.train, c.teacher_train, c.n_train) == \
            (fixed.task, fixed.train, fixed.teacher_train, fixed.n_train)
    assert fixed.kernel == "vanilla"
    assert grad.kernel == "learned" and grad.fit.method == "adam"
    assert grad.objective == coul.objective == arena.OBJECTIVE
    assert coul.fit.method == "langevin" and coul.fit.lam == 1.0
    wfr = arena.spec_config({**base, "variant": "weighted",
                             "params": {"lam": 1.0, "beta": 1e6, "tau": 0.05}})
    assert wfr.kernel == "learned" and wfr.objective == arena.OBJECTIVE
    assert (wfr.fit.method, wfr.fit.lam, wfr.fit.beta, wfr.fit.tau) == ("weighted", 1.0, 1e6, 0.05)
    assert wfr.fit.w_min == 0.1  # birth-death at the default threshold unless params say
    no_bd = arena.spec_config({**base, "variant": "weighted",
                               "params": {"lam": 1.0, "beta": 1e6, "tau": 0.05, "w_min": 0.0}})
    assert no_bd.fit.w_min == 0.0 and no_bd.fit.tau == 0.05
    # the weighted transport is the Coulomb variant's (same schedule and projection)
    assert (wfr.fit.eta, wfr.fit.eta_end, wfr.fit.steps, wfr.fit.radius, wfr.fit.max_drift) == \
        (coul.fit.eta, coul.fit.eta_end, coul.fit.steps, coul.fit.radius, coul.fit.max_drift)
    e2e = arena.spec_config({**base, "variant": "end2end", "params": {"lr": 0.03}})
    assert e2e.tune_omega and not grad.tune_omega and not fixed.tune_omega
    # end2end is the gradient variant plus omega trained in phase B: nothing else differs
    from dataclasses import replace
    assert replace(e2e, tune_omega=False) == grad and e2e.omega_lr_scale == 1.0
    fast = arena.spec_config({**base, "variant": "end2end",
                              "params": {"lr": 0.03, "omega_lr_scale": 10.0}})
    assert fast.omega_lr_scale == 10.0 and replace(fast, omega_lr_scale=1.0) == e2e
    with pytest.raises(ValueError, match="unknown variant"):
        arena.spec_config({**base, "variant": "nope", "params": {}})
    with pytest.raises(ValueError, match="setting"):
        arena.spec_config({**base, "setting": "easy/elu", "variant": "fixed", "params": {}})


def test_one_tiny_run_returns_a_contract_record(tmp_path, monkeypatch):
    tiny = {"task": {"vocab_size": 16, "n_pairs": 2, "seq_len": 12, "n_queries": 2},
            "model": {"vocab_size": 16, "max_len": 12, "dim": 16, "mlp_dim": 16},
            "n_train": 64, "n_eval": 32, "teacher_train": {"epochs": 1, "batch_size": 16},
            "train": {"epochs": 1, "batch_size": 16},
            "fit": {"steps": 8, "n_examples": 32, "holdout": 16, "batch_size": 16}}
    monkeypatch.setattr(arena, "QUICK", tiny)
    run_dir = tmp_path / "runs" / "x"
    records = []
    for variant, params in [("fixed", {}), ("coulomb", {"lam": 1.0, "beta": 1e6})]:
        spec = {"arena": "mqar", "setting": "easy/favor", "variant": variant,
                "params": params, "M": 8, "seed": 0, "quick": True}
        records.append(arena.run(spec, run_dir=str(run_dir)))
    fixed, coul = records
    for r in records:
        assert r["metric"] == "accuracy" and 0 <= r["score"] <= 1
        assert {"nn_min", "nn_median", "collapsed_share", "effective_rank"} <= set(
            r["diagnostics"])
        assert r["time_s"] > 0 and r["teacher_accuracy"] == fixed["teacher_accuracy"]
        json.dumps(r)
    assert fixed["energy_trace"] == [] and not fixed["teacher_cached"]
    assert coul["teacher_cached"]  # one teacher per seed, under <out>/mqar_teachers
    assert list((tmp_path / "mqar_teachers").glob("*.safetensors"))
    assert 2 <= len(coul["energy_trace"]) <= 50
    assert all(t["repulsion"] > 0 for t in coul["energy_trace"])
    assert coul["holdout_kl_after"] < coul["holdout_kl_before"]


def test_cache_group_is_the_teacher_of_a_level_and_seed():
    from coulomb_attention.studies.ablation_mqar import cache_group, plan, spec_config
    from coulomb_attention.train.recall import _teacher_key

    specs = plan(False, [0, 1], [8, 16])
    by_group: dict = {}
    for s in specs:
        by_group.setdefault(cache_group(s), set()).add(
            json.dumps(_teacher_key(spec_config(s)), sort_keys=True))
    # one teacher per group, and different groups have different teachers
    assert sorted(by_group) == ["easy/seed0", "easy/seed1", "hard/seed0", "hard/seed1"]
    assert all(len(v) == 1 for v in by_group.values())
    assert len(set().union(*by_group.values())) == 4

"""The conversion arena (studies.ablation_convert) on a tiny random BERT: record fields, the
checkpoint re-scores to the recorded score, the plain-gradient (Adam) distillation, and the
Hedgehog checkpoint loading back with its map."""

from __future__ import annotations

import pytest
import torch

from coulomb_attention.convert import embed, embedding_fidelity, load_sentences
from coulomb_attention.convert.distill import DistillConfig, distill_attention
from coulomb_attention.nn.families.bert import (
    load_pretrained_encoder,
    load_pretrained_tokenizer,
    save_pretrained_encoder,
)
from coulomb_attention.studies import ablation_convert as arena
from coulomb_attention.studies.ablation import RECORD_KEYS, SPEC_KEYS, run_key
from test_pretrained import write_tiny_bert

TINY = arena.Budget(steps=4, refine_steps=2, batch_size=4, rows=4, holdout=4, eval_sentences=12,
                    diag_sentences=4, lams=(0.1,), max_length=16, tag="tiny")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert-ablation"), qk_scale=4.0)


def test_plan_shapes_and_names():
    full = arena.plan(False, [0, 1], None)
    assert {s["setting"] for s in full} == {"fit64", "fit256"}
    assert {s["M"] for s in full} == {16, 32, 64, 128}
    # fixed, gradient, langevin, hedgehog, weighted and three Coulomb strengths
    assert len(full) == 2 * 4 * 2 * 8 and len({run_key(s) for s in full}) == len(full)
    quick = arena.plan(True, [0, 1], None)
    assert {s["setting"] for s in quick} == {"fit64-quick"} and {s["M"] for s in quick} == {16}
    assert len(quick) == 2 * 6
    weighted = [s for s in full if s["variant"] == "weighted"]
    assert len(weighted) == 2 * 4 * 2  # every setting, M and seed
    assert all(s["params"] == {"beta": arena.BETA, "lam": arena.WEIGHTED_LAM,
                               "tau": arena.WEIGHTED_TAU} for s in weighted)
    assert arena.WEIGHTED_LAM in arena.FULL.lams  # paired with a Coulomb strength
    with pytest.raises(ValueError, match="valid: fixed, gradient, langevin, coulomb, hedgehog, "
                                         "weighted"):
        arena.plan_with(TINY, [0], [8], variants=("nope",))
    with pytest.raises(ValueError, match="even"):
        arena.plan_with(TINY, [0], [7])


def test_step_size_params_of_the_adam_and_langevin_variants():
    spec = {"n_fit": 64, "params": {}}
    base = arena._distill_config({**spec, "variant": "gradient"}, arena.FULL)
    assert (base.method, base.lr, base.refine_lr) == ("adam", arena.FULL.lr, arena.FULL.refine_lr)
    for variant in ("gradient", "hedgehog"):
        cfg = arena._distill_config({**spec, "variant": variant, "params": {"lr": 0.1}},
                                    arena.FULL)
        assert cfg.lr == 0.1  # the refinement's rate keeps the budget's ratio to it
        assert cfg.refine_lr == pytest.approx(0.1 * arena.FULL.refine_lr / arena.FULL.lr)
    langevin = arena._distill_config({**spec, "variant": "langevin",
                                      "params": {"beta": arena.BETA, "lr": 0.1}}, arena.FULL)
    assert langevin.lr == arena.FULL.lr  # lr is a param of the Adam variants only
    fast = arena._distill_config({**spec, "variant": "langevin",
                                  "params": {"beta": arena.BETA, "eta_scale": 2.0}}, arena.FULL)
    assert (fast.eta, fast.eta_end, fast.refine_eta, fast.refine_eta_end) == \
        tuple(2 * getattr(langevin, k) for k in ("eta", "eta_end", "refine_eta", "refine_eta_end"))
    with pytest.raises(ValueError, match="eta_scale"):
        arena._distill_config({**spec, "variant": "gradient", "params": {"eta_scale": 2.0}},
                              arena.FULL)
    assert arena._particle_map({**spec, "variant": "langevin"}) == "favor"
    with pytest.raises(ValueError, match="map"):
        arena._particle_map({**spec, "variant": "hedgehog", "params": {"map": "hedgehog"}})
    with pytest.raises(ValueError, match="map must be"):
        arena._particle_map({**spec, "variant": "langevin", "params": {"map": "elu"}})
    with pytest.raises(ValueError, match="lr must be > 0"):
        arena._distill_config({**spec, "variant": "gradient", "params": {"lr": 0.0}},
                              arena.FULL)


@pytest.mark.parametrize("variant", ["hedgehog", "coulomb", "gradient", "fixed", "weighted",
                                     "coulomb-on-hedgehog-map"])
def test_tiny_run_record_and_checkpoint(tiny_dir, tmp_path, variant):
    on_map = variant.endswith("-on-hedgehog-map")
    variant = variant.split("-")[0]
    (spec,) = arena.plan_with(TINY, [0], [8], settings=(8,), variants=(variant,),
                              encoder=str(tiny_dir))
    if on_map:
        spec["params"] = {**spec["params"], "map": "hedgehog"}
    rec = arena.run(dict(spec), run_dir=tmp_path / "run")
    for key in (*SPEC_KEYS, *RECORD_KEYS, "checkpoint", "score_train", "spearman", "n_eval"):
        assert key in rec, key
    assert run_key(rec) == run_key(spec) and rec["metric"] == "cosine"
    assert -1 <= rec["score"] <= 1 and rec["n_eval"] == 12 and rec["n_fit"] == 8
    assert set(rec["diagnostics"]) >= {"nn_min", "nn_median", "collapsed_share",
                                       "effective_rank"}
    assert 1 <= rec["diagnostics"]["effective_rank"] <= 8
    if variant == "fixed":
        assert rec["energy_trace"] == [] and rec["refine"] is None
    else:
        trace = rec["energy_trace"]
        assert [t["step"] for t in trace] == [0, 1, 2, 3] and len(rec["refine_trace"]) == 2
        assert set(trace[0]) == {"step", "energy", "data", "repulsion"}
        if variant == "coulomb":  # energy = data + lam * repulsion
            t = trace[-1]
            assert t["repulsion"] > 0
            assert t["energy"] == pytest.approx(t["data"] + 0.1 * t["repulsion"], rel=1e-6)
    # the checkpoint re-scores to the recorded score on the same held-out sentences
    model = load_pretrained_encoder(rec["checkpoint"])
    teacher = load_pretrained_encoder(tiny_dir, "softmax")
    tok = load_pretrained_tokenizer(tiny_dir)
    held = load_sentences(("sst2", "rotten_tomatoes", "qqp"), "eval", None, 12, 10_000)
    fid = embedding_fidelity(embed(teacher, tok, held, 16), embed(model, tok, held, 16))
    assert fid["cos_mean"] == pytest.approx(rec["score"], abs=1e-5)
    if variant == "hedgehog" or spec["params"].get("map") == "hedgehog":
        assert {la.feature_map for la in model.attention_layers} == {"hedgehog"}
    if spec["params"].get("map") == "hedgehog":  # untied: the halves no longer mirror
        omega = model.attention_layers[0].omega
        half = omega.shape[-2] // 2
        assert not torch.allclose(omega[..., half:, :], -omega[..., :half, :])
    # the masses of a weighted conversion are in its checkpoint (and only there)
    assert all((la.mass is not None) == (variant == "weighted") for la in model.attention_layers)


def test_adam_method_moves_untied_omega_and_lowers_the_kl(tiny_dir):
    tok = load_pretrained_tokenizer(tiny_dir)
    texts = load_sentences(("sst2",), "train", None, 12, 0)
    ids, mask = tok.encode_batch([(t,) for t in texts], max_length=16)[:2]
    model = load_pretrained_encoder(tiny_dir, "favor", 8, share_features=False, generator=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = DistillConfig(n_examples=9, holdout=3, batch_size=3, rows_per_sequence=0, steps=30,
                        method="adam", lr=0.05, refine_steps=0)
    recs = distill_attention(model, ids, mask, cfg, generator=torch.Generator().manual_seed(0),
                             keep_trace=5)
    assert all(r["kl_after"] < 0.8 * r["kl_before"] for r in recs), recs
    assert all(r["method"] == "adam" and len(r["trace"]) == 5 for r in recs)
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {"blocks.0.attn.omega", "blocks.1.attn.omega"}
    om = model.attention_layers[0].omega[0]
    assert model.attention_layers[0].feature_map == "favor"
    assert not torch.allclose(om[:4], -om[4:])  # not Hedgehog's tied [W; -W]


def test_weighted_distillation_fits_masses_per_head_and_lowers_the_kl(tiny_dir):
    tok = load_pretrained_tokenizer(tiny_dir)
    texts = load_sentences(("sst2",), "train", None, 12, 0)
    ids, mask = tok.encode_batch([(t,) for t in texts], max_length=16)[:2]
    model = load_pretrained_encoder(tiny_dir, "favor", 8, share_features=False, generator=0)
    cfg = DistillConfig(n_examples=9, holdout=3, batch_size=3, rows_per_sequence=0, steps=30,
                        method="weighted", tau=0.2, lam=0.1, eta=1.0, refine_steps=0)
    recs = distill_attention(model, ids, mask, cfg, generator=torch.Generator().manual_seed(0))
    assert all(r["kl_after"] < 0.9 * r["kl_before"] for r in recs), recs
    assert all(r["method"] == "weighted" and 0 < r["ess"] < 1 for r in recs)
    for layer in model.attention_layers:
        mass = layer.mass  # (heads, M): one set of masses per head, each summing to 1
        assert mass.shape == layer.omega.shape[:2]
        assert torch.allclose(mass.sum(-1), torch.ones(mass.shape[0], dtype=mass.dtype))
        assert float(mass.max() / mass.min()) > 1.2
    # a record's KL is that of the masses now in the layer (the masses enter the objective)
    from coulomb_attention.convert.distill import capture_teacher_batches, split_examples
    from coulomb_attention.energy import TeacherAttention

    fit_idx = split_examples(12, cfg, torch.Generator().manual_seed(0))[0]
    layer = model.attention_layers[1]
    rec = [r for r in recs if r["layer"] == 1 and r["heads"][0] == 0][0]
    b = capture_teacher_batches(model, 1, ids[fit_idx], mask[fit_idx], batch_size=3,
                                rows_per_sequence=0, generator=torch.Generator())
    term = TeacherAttention(layer.feature)
    om, w = layer.omega[0].double(), layer.mass[0].double()
    kl_w = term.evaluate(om, [x.heads(slice(0, 1)) for x in b], weights=w)["kl"]
    kl_u = term.evaluate(om, [x.heads(slice(0, 1)) for x in b])["kl"]
    assert kl_w == pytest.approx(rec["kl_after"], rel=1e-4) and abs(kl_w - kl_u) > 1e-4


def test_hedgehog_checkpoint_round_trip(tiny_dir, tmp_path):
    tok = load_pretrained_tokenizer(tiny_dir)
    texts = load_sentences(("sst2",), "train", None, 12, 0)
    ids, mask = tok.encode_batch([(t,) for t in texts], max_length=16)[:2]
    model = load_pretrained_encoder(tiny_dir, "favor", 8, share_features=False, generator=0)
    distill_attention(model, ids, mask, DistillConfig(n_examples=12, holdout=0, batch_size=4,
                                                      steps=3, method="hedgehog",
                                                      refine_steps=0),
                      generator=torch.Generator().manual_seed(0))
    save_pretrained_encoder(model, tmp_path / "ckpt", extra={"variant": "hedgehog"})
    back = load_pretrained_encoder(tmp_path / "ckpt")
    assert [la.feature_map for la in back.attention_layers] == ["hedgehog", "hedgehog"]
    with torch.no_grad():
        assert torch.allclose(back.sentence_embedding(ids, mask),
                              model.sentence_embedding(ids, mask), atol=1e-6)

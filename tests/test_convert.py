"""Converting a pretrained encoder by attention distillation (convert.distill, convert,
commands.convert, nn.families.bert save/load) on tiny random BERT checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from coulomb_attention.convert import ConvertConfig, convert_encoder, embedding_fidelity
from coulomb_attention.convert.distill import (
    DistillConfig,
    capture_teacher_batches,
    distill_attention,
)
from coulomb_attention.energy import TeacherAttention
from coulomb_attention.features import hedgehog_features
from coulomb_attention.nn.families.bert import (
    load_pretrained_encoder,
    load_pretrained_tokenizer,
    save_pretrained_encoder,
)
from test_pretrained import TINY, write_tiny_bert

SENTENCES = ["the movie was good", "a bad film , not fun", "great", "it is not good",
             "the film was a great fun", "bad , bad movie", "it was fun", "not a film",
             "good good fun", "the bad movie is not great", "a film", "it is the movie"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    # larger q/k weights than the loader tests: attention far from uniform, so it is learnable
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert-convert"), qk_scale=4.0)


@pytest.fixture(scope="module")
def batch(tiny_dir):
    return load_pretrained_tokenizer(tiny_dir).encode_batch(SENTENCES, max_length=16)


def _cfg(**kw):
    base = dict(n_examples=9, holdout=3, batch_size=3, rows_per_sequence=0, steps=30,
                eta=0.1, eta_end=0.02, beta=0)
    return DistillConfig(**{**base, **kw})


def _student(tiny_dir, m=8, feature="favor"):
    return load_pretrained_encoder(tiny_dir, feature, m, share_features=False, generator=0)


def test_distillation_lowers_row_kl_per_head_and_changes_only_omega(tiny_dir, batch):
    ids, mask = batch
    model = _student(tiny_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    records = distill_attention(model, ids, mask, _cfg(), generator=torch.Generator()
                                .manual_seed(0))
    assert [(r["layer"], r["heads"]) for r in records] == [(0, [0, 1]), (0, [1, 2]),
                                                           (1, [0, 1]), (1, [1, 2])]
    for r in records:
        assert r["kl_after"] < 0.7 * r["kl_before"], r
        assert r["holdout_kl_after"] < r["holdout_kl_before"], r
        assert r["mse_after"] is not None and r["time_s"] > 0
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"blocks.0.attn.omega", "blocks.1.attn.omega"}
    om = model.attention_layers[0].omega
    assert not torch.equal(om[0], om[1])  # particles per head
    # the record's KL is the data term evaluated on the converted layer's cached rows
    layer = model.attention_layers[1]
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    cached = capture_teacher_batches(model, 1, ids[perm[9:]], mask[perm[9:]], rows_per_sequence=0)
    kl = TeacherAttention(layer.feature).evaluate(layer.omega[0].double(),
                                                  [b.heads(slice(0, 1)) for b in cached])["kl"]
    assert kl == pytest.approx(records[2]["holdout_kl_after"], rel=0.5)


def test_lam_and_output_mse_and_hedgehog_run(tiny_dir, batch):
    ids, mask = batch
    rec = distill_attention(_student(tiny_dir), ids, mask, _cfg(lam=0.5, output_weight=1.0,
                                                                beta=1e6, steps=10),
                            generator=torch.Generator().manual_seed(0))
    assert all(r["kl_after"] < r["kl_before"] for r in rec)
    model = _student(tiny_dir)
    hh = distill_attention(model, ids, mask, _cfg(method="hedgehog", lr=0.05),
                           generator=torch.Generator().manual_seed(0))
    assert all(r["kl_after"] < r["kl_before"] for r in hh)
    layer = model.attention_layers[0]
    assert layer.feature_map == "hedgehog"
    om = layer.omega[0]
    assert torch.equal(om[:4], -om[4:])  # tied [W; -W]
    u = torch.randn(5, layer.head_dim)
    phi = hedgehog_features(u, om)
    assert torch.allclose(phi.sum(-1), torch.full((5,), 2.0))
    with torch.no_grad():
        assert bool(torch.isfinite(model.sentence_embedding(ids, mask)).all())


def test_resume_after_a_layer_equals_one_run(tiny_dir, batch):
    ids, mask = batch
    full = _student(tiny_dir)
    rec_full = distill_attention(full, ids, mask, _cfg(steps=8, beta=1e4),
                                 generator=torch.Generator().manual_seed(3))
    saved = {}

    class Interrupt(Exception):
        pass

    def hook(next_layer, records, state):
        saved.update(next_layer=next_layer, records=json.loads(json.dumps(records)),
                     generator_state=state.clone(),
                     omega=[la.omega.clone() for la in part.attention_layers])
        raise Interrupt

    part = _student(tiny_dir)
    with pytest.raises(Interrupt):
        distill_attention(part, ids, mask, _cfg(steps=8, beta=1e4),
                          generator=torch.Generator().manual_seed(3), on_layer_done=hook)
    fresh = _student(tiny_dir)  # a new process: reload the converted layer 0
    fresh.attention_layers[0].load_features_(saved.pop("omega")[0])
    rec = distill_attention(fresh, ids, mask, _cfg(steps=8, beta=1e4),
                            generator=torch.Generator().manual_seed(3), resume=saved)
    for a, b in zip(full.attention_layers, fresh.attention_layers, strict=True):
        assert torch.equal(a.omega, b.omega)
    assert [r["kl_after"] for r in rec] == [r["kl_after"] for r in rec_full]


def test_converted_checkpoint_round_trip(tiny_dir, batch, tmp_path):
    ids, mask = batch
    model = _student(tiny_dir, m=6)
    distill_attention(model, ids, mask, _cfg(steps=3), generator=torch.Generator().manual_seed(0))
    save_pretrained_encoder(model, tmp_path / "ckpt", extra={"note": "test"})
    assert {p.name for p in (tmp_path / "ckpt").iterdir()} >= {"config.json", "vocab.txt",
                                                                "model.safetensors"}
    back = load_pretrained_encoder(tmp_path / "ckpt")
    assert back.config.attention == "favor" and back.config.n_features == 6
    assert not back.config.share_features
    own, other = model.state_dict(), back.state_dict()
    assert all(torch.equal(own[k], other[k]) for k in own if not k.startswith("head."))
    with torch.no_grad():
        assert torch.equal(model.sentence_embedding(ids, mask), back.sentence_embedding(ids, mask))
    with pytest.raises(ValueError, match="n_features"):
        load_pretrained_encoder(tmp_path / "ckpt", n_features=8)
    # another kernel on the same weights: fresh particles; softmax: the teacher again
    soft = load_pretrained_encoder(tmp_path / "ckpt", "softmax")
    ref = load_pretrained_encoder(tiny_dir, "softmax")
    with torch.no_grad():
        assert torch.equal(soft.encode(ids, mask), ref.encode(ids, mask))


def test_embedding_fidelity_math():
    gen = torch.Generator().manual_seed(0)
    t = torch.nn.functional.normalize(torch.randn(30, 5, generator=gen), dim=1)
    same = embedding_fidelity(t, t)
    assert same["cos_mean"] == pytest.approx(1.0) and same["spearman"] == pytest.approx(1.0)
    # a rotation keeps every pairwise cosine (Spearman 1) but not the per-sentence cosine
    q, _ = torch.linalg.qr(torch.randn(5, 5, generator=gen))
    rot = embedding_fidelity(t, t @ q)
    assert rot["spearman"] == pytest.approx(1.0) and rot["cos_mean"] < 0.9
    noise = embedding_fidelity(t, torch.randn(30, 5, generator=gen))
    assert abs(noise["spearman"]) < 0.3 and noise["cos_p5"] <= noise["cos_mean"]


def test_config_validation_names_the_field():
    for kw, name in [({"steps": 0}, "steps"), ({"method": "sgd"}, "method"),
                     ({"lam": -1.0}, "lam"), ({"rows_per_sequence": -1}, "rows_per_sequence"),
                     ({"dtype": "half"}, "dtype")]:
        with pytest.raises(ValueError, match=name):
            DistillConfig(**kw)
    with pytest.raises(ValueError, match="feature_map"):
        ConvertConfig(feature_map="softmax")


def test_convert_run_resumes_and_cli_errors(tiny_dir, tmp_path, capsys):
    from coulomb_attention.cli import main

    sent = tmp_path / "sentences.txt"
    sent.write_text("\n".join(SENTENCES) + "\n")
    cfg = ConvertConfig(encoder=str(tiny_dir), n_features=8, sentences_file=str(sent),
                        distill=_cfg(steps=4), max_length=16, eval_sentences=10,
                        probe_tasks=("sst2",), probe_train=40, probe_eval=30)
    out = tmp_path / "run"
    # an interrupted run: layer 0 finished, its state on disk
    import coulomb_attention.convert.pipeline as conv

    calls = []
    orig = conv._save_progress

    def save_then_stop(art, model, next_layer, records, gen_state, config):
        orig(art, model, next_layer, records, gen_state, config)
        calls.append(next_layer)
        raise KeyboardInterrupt

    conv._save_progress = save_then_stop
    try:
        with pytest.raises(KeyboardInterrupt):
            convert_encoder(cfg, out, log=lambda *_: None)
    finally:
        conv._save_progress = orig
    assert calls == [1] and (out / "state" / "progress.json").is_file()
    other = ConvertConfig(**{**cfg.__dict__, "distill": _cfg(steps=5)})
    with pytest.raises(ValueError, match="another configuration"):
        convert_encoder(other, out, log=lambda *_: None)
    res = convert_encoder(cfg, out, log=lambda *_: None)
    ref = convert_encoder(cfg, tmp_path / "ref", log=lambda *_: None)
    assert res["fidelity"] == ref["fidelity"] and not (out / "state").exists()
    # the joint refinement ran after the resumed layers, as in the uninterrupted run
    assert res["refine"]["steps"] == 200 and res["refine"] == {**ref["refine"],
                                                                "time_s": res["refine"]["time_s"]}
    assert res["probe"]["sst2"]["n_eval"] == 30 and 0 <= res["fidelity"]["cos_p5"] <= 1
    back = load_pretrained_encoder(out / "checkpoint")
    assert back.config.n_features == 8
    # the CLI: one run writes the report and plots
    rc = main(["convert", "--encoder", str(tiny_dir), "--n-features", "4", "--sentences",
               str(sent), "--n-sentences", "9", "--holdout", "3", "--steps", "2",
               "--batch-size", "3", "--max-length", "16", "--eval-sentences", "8",
               "--refine-steps", "3", "--probe-tasks", "--out", str(tmp_path / "cli"),
               "--no-progress"])
    assert rc == 0
    assert (tmp_path / "cli" / "report.md").is_file() and (tmp_path / "cli" / "kl.png").is_file()
    report = (tmp_path / "cli" / "report.md").read_text()
    assert "## Joint refinement" in report and "3 steps on 9 sentences" in report, report
    # bad input: one line, exit 2
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    bad_arch = tmp_path / "relu"
    bad_arch.mkdir()
    (bad_arch / "config.json").write_text(json.dumps(dict(TINY, hidden_act="relu")))
    for argv, msg in [(["--encoder", "nosuchmodel"], "neither a known encoder"),
                      (["--encoder", str(tiny_dir), "--sentences", str(empty)], "no sentences"),
                      (["--encoder", str(bad_arch)], "hidden_act")]:
        capsys.readouterr()
        rc = main(["convert", *argv, "--out", str(tmp_path / "bad"), "--no-progress"])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and msg in err and "\n" not in err, err


def test_hf_bert_model_kernelized_in_place_equals_own_loader(tiny_dir, batch, tmp_path):
    transformers = pytest.importorskip("transformers")
    from coulomb_attention.nn.hf import kernelize_bert_

    ids, mask = batch
    model = _student(tiny_dir, m=6)
    distill_attention(model, ids, mask, _cfg(steps=3), generator=torch.Generator().manual_seed(0))
    save_pretrained_encoder(model, tmp_path / "ckpt")
    hf = transformers.BertModel.from_pretrained(str(tmp_path / "ckpt"), local_files_only=True,
                                                add_pooling_layer=False).eval()
    with torch.no_grad():
        soft = hf(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        kernelize_bert_(hf, load_pretrained_encoder(tmp_path / "ckpt"))
        ours = model.encode(ids, mask)
        theirs = hf(input_ids=ids, attention_mask=mask.long()).last_hidden_state
    assert float((theirs - ours)[mask].abs().max()) < 1e-4
    assert float((soft - ours)[mask].abs().max()) > 1e-3  # the kernel did change


def test_grid_reports_every_run_of_the_base_config_and_refuses_another(tiny_dir, tmp_path,
                                                                     capsys):
    """`convert --grid` in two invocations: the report covers both; a finished run is reused
    only with the same configuration."""
    from coulomb_attention.cli import main

    sent = tmp_path / "sentences.txt"
    sent.write_text("\n".join(SENTENCES) + "\n")
    base = ["convert", "--encoder", str(tiny_dir), "--sentences", str(sent), "--n-sentences",
            "9", "--holdout", "3", "--steps", "2", "--batch-size", "3", "--max-length", "16",
            "--eval-sentences", "8", "--probe-tasks", "--out", str(tmp_path / "g"),
            "--variants", "vanilla", "particles", "--no-progress", "--seeds", "0"]
    assert main([*base, "--grid", "4"]) == 0
    assert main([*base, "--grid", "8"]) == 0
    import json

    rows = [json.loads(x) for x in (tmp_path / "g" / "grid.jsonl").read_text().splitlines()]
    got = sorted((r["config"]["variant"], r["config"]["n_features"],
                  r["config"]["distill"]["lam"]) for r in rows if r["config"]["variant"]
                 != "softmax")
    assert got == [("particles", 4, 0.0), ("particles", 4, 0.1), ("particles", 8, 0.0),
                   ("particles", 8, 0.1), ("vanilla", 4, 0.0), ("vanilla", 8, 0.0)]
    assert len(rows) == 7  # and the softmax teacher once
    capsys.readouterr()
    steps = base.index("--steps") + 1
    other = [*base[:steps], "3", *base[steps + 1:]]
    assert main([*other, "--grid", "4"]) == 2
    assert "holds a conversion of another configuration" in capsys.readouterr().err


def test_convert_feature_map_hedgehog_moves_untied_particles(tiny_dir, tmp_path, capsys):
    """`convert --feature-map hedgehog`: the particles (Langevin, the conversion's defaults)
    move every row of Hedgehog's map, started tied; the checkpoint computes that map;
    `--variant hedgehog` stays the tied Adam baseline; odd M is one line and exit 2."""
    from coulomb_attention.cli import main

    sent = tmp_path / "sentences.txt"
    sent.write_text("\n".join(SENTENCES) + "\n")
    base = dict(encoder=str(tiny_dir), n_features=8, sentences_file=str(sent), max_length=16,
                distill=_cfg(steps=6, refine_steps=3, refine_examples=9), eval_sentences=8,
                probe_tasks=())
    start = _student(tiny_dir, feature="hedgehog")
    fresh = _student(tiny_dir)
    for a, b in zip(start.attention_layers, fresh.attention_layers, strict=True):
        w = b.omega[:, :4]  # the tied start: the FAVOR+ draw's first half, [W; -W]
        assert torch.equal(a.omega, torch.cat([w, -w], 1))
    res = convert_encoder(ConvertConfig(**base, feature_map="hedgehog"), tmp_path / "pp",
                          log=lambda *_: None)
    model = load_pretrained_encoder(tmp_path / "pp" / "checkpoint")
    assert res["refine"]["method"] == "langevin"
    for a, b in zip(model.attention_layers, start.attention_layers, strict=True):
        assert a.feature_map == "hedgehog"
        assert not torch.allclose(a.omega[:, 4:], -a.omega[:, :4])  # untied
        assert not torch.allclose(a.omega, b.omega)
    ref = convert_encoder(ConvertConfig(**base, feature_map="hedgehog"), tmp_path / "pp2",
                          log=lambda *_: None)
    assert ref["fidelity"] == res["fidelity"]  # deterministic in the seed
    res_hh = convert_encoder(ConvertConfig(**base, variant="hedgehog"), tmp_path / "hh",
                             log=lambda *_: None)
    assert res_hh["refine"]["method"] == "hedgehog"
    for layer in load_pretrained_encoder(tmp_path / "hh" / "checkpoint").attention_layers:
        assert layer.feature_map == "hedgehog"
        assert torch.equal(layer.omega[:, 4:], -layer.omega[:, :4])  # tied
    with pytest.raises(ValueError, match="even"):
        ConvertConfig(feature_map="hedgehog", n_features=7)
    capsys.readouterr()
    rc = main(["convert", "--encoder", str(tiny_dir), "--feature-map", "hedgehog",
               "--n-features", "7", "--out", str(tmp_path / "bad"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "even" in err and "\n" not in err, err


def test_hybrid_rows_of_the_data_term_are_the_layers_attention(tiny_dir, batch):
    """The layer-wise data term with a window computes the hybrid of the layer's op: its output
    MSE to the teacher equals the one of nn.ops.window_attention (all rows, padded batch)."""
    from coulomb_attention.nn import functional as AF

    ids, mask = batch
    model = _student(tiny_dir, m=6, feature="porf_softplus")
    layer = model.attention_layers[1]
    layer.set_window_(4)
    with torch.no_grad():
        layer.window_logit.copy_(torch.tensor([-1.0, 0.5]))
    (b,) = capture_teacher_batches(model, 1, ids, mask, batch_size=len(ids), rows_per_sequence=0)
    assert b.window == 4  # every row, in a random order, with its position
    assert torch.equal(b.row_index[0].sort().values, torch.arange(b.q.shape[2]))
    term = TeacherAttention(layer.feature)
    om = layer.omega.double()
    from coulomb_attention.energy import per_head

    got = TeacherAttention(per_head(layer.feature)).evaluate(om, [b])
    inv = b.row_index.argsort(1)[:, None, :, None].expand_as(b.q)  # rows back in position order
    q, k, v = torch.gather(b.q, 2, inv).double(), b.k.double(), b.v.double()
    pq = torch.stack([layer.feature(q[:, h], om[h]) for h in range(2)], 1)
    pk = torch.stack([layer.feature(k[:, h], om[h]) for h in range(2)], 1)
    hyb = AF.naive_window_attention(q, k, v, pq, pk, b.gamma.double(), 4, b.key_mask)
    soft = AF.softmax_attention(q, k, v, b.key_mask)
    rows = b.key_mask[:, None, :].expand(-1, 2, -1)  # the real positions are the real rows
    mse = (((hyb - soft) ** 2).mean(-1))[rows].mean()
    assert abs(got["mse"] - float(mse)) < 1e-10 and float(mse) > 1e-6
    assert term.output_weight == 0


def test_convert_window_learns_its_weights_and_round_trips(tiny_dir, tmp_path, capsys):
    """`convert --window W`: the particles and the per-head window weights are learned in the
    layer-wise stage and the refinement; the checkpoint carries the window and its weights
    (load_pretrained_encoder embeds as the converted model); the window alone has nothing to
    learn; bad windows are one line and exit 2."""
    from coulomb_attention.cli import main
    from coulomb_attention.convert import embed

    sent = tmp_path / "sentences.txt"
    sent.write_text("\n".join(SENTENCES) + "\n")
    base = dict(encoder=str(tiny_dir), n_features=6, sentences_file=str(sent), max_length=16,
                distill=_cfg(steps=4, refine_steps=3, refine_examples=9), eval_sentences=8,
                probe_tasks=())
    res = convert_encoder(ConvertConfig(**base, window=4), tmp_path / "w4", log=lambda *_: None)
    recs = [json.loads(line) for line in (tmp_path / "w4" / "records.jsonl").open()]
    assert all(r["window"] == 4 and r["window_kl_last"] <= r["window_kl_first"] for r in recs)
    assert all(w != pytest.approx(0.1, abs=1e-4) for r in recs for w in r["window_weight"])
    assert len(res["refine"]["window_weight"]) == 2  # layers, each a weight per head
    model = load_pretrained_encoder(tmp_path / "w4" / "checkpoint")
    assert all(layer.window == 4 and layer.window_linear for layer in model.attention_layers)
    learned = torch.sigmoid(torch.stack([layer.window_logit for layer in model.attention_layers]))
    want = torch.tensor(res["refine"]["window_weight"], dtype=torch.float64)
    assert torch.allclose(learned.double(), want, atol=1e-6)
    tok = load_pretrained_tokenizer(tiny_dir)
    plain = load_pretrained_encoder(tmp_path / "w4" / "checkpoint", window=None)
    assert plain.attention_layers[0].window == 4  # None: the checkpoint's window
    assert torch.equal(embed(model, tok, SENTENCES), embed(plain, tok, SENTENCES))
    alone = convert_encoder(ConvertConfig(**base, window=4, window_linear=False),
                            tmp_path / "alone", log=lambda *_: None)
    assert alone["refine"] is None and alone["distill_s"] == 0.0
    back = load_pretrained_encoder(tmp_path / "alone" / "checkpoint")
    assert not back.attention_layers[0].window_linear
    assert alone["fidelity"]["cos_mean"] != res["fidelity"]["cos_mean"]
    for argv, msg in [(["--window", "0"], "> 0"), (["--window", "-4"], "> 0"),
                      (["--window", "3"], "even"), (["--window", "1000"], "positions"),
                      (["--window-alone"], "needs --window")]:
        capsys.readouterr()
        rc = main(["convert", "--encoder", str(tiny_dir), *argv, "--sentences", str(sent),
                   "--out", str(tmp_path / "bad"), "--no-progress"])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and msg in err and "\n" not in err, (argv, err)


def test_pseudo_documents_are_full_length_held_out_texts_without_repeats_inside(tiny_dir):
    from coulomb_attention.data.documents import pseudo_documents

    tok = load_pretrained_tokenizer(tiny_dir)
    ids, mask, info = pseudo_documents(tok, SENTENCES, 20, 5, seed=3)
    assert ids.shape == (5, 20) and bool(mask.all())
    assert (ids[:, 0] == tok.token_to_id("[CLS]")).all()
    assert (ids[:, -1] == tok.token_to_id("[SEP]")).all()
    assert info["reused"] and info["texts_used"] == len(SENTENCES)  # 5 x 18 tokens > the pool
    again = pseudo_documents(tok, SENTENCES, 20, 5, seed=3)[0]
    assert torch.equal(ids, again) and not torch.equal(ids, pseudo_documents(
        tok, SENTENCES, 20, 5, seed=4)[0])
    one, _, info1 = pseudo_documents(tok, SENTENCES, 12, 1, seed=0)
    assert not info1["reused"] and 1 < info1["texts_per_document"] <= len(SENTENCES)
    for kw, msg in [(dict(length=2), "length"), (dict(n=0), "n"), (dict(texts=[" "]), "no texts"),
                    (dict(texts=["good"], length=20), "fewer than one document")]:
        args = {"texts": SENTENCES, "length": 16, "n": 2, **kw}
        with pytest.raises(ValueError, match=msg):
            pseudo_documents(tok, args["texts"], args["length"], args["n"])


def test_window_mass_of_uniform_attention_is_the_window_share(tiny_dir):
    """Zero queries: every row of softmax attention is uniform over the L keys, so the mass
    inside the window of row t is |N(t)| / L (closed form); a window covering everything: 1."""
    from coulomb_attention.convert import window_mass

    model = load_pretrained_encoder(tiny_dir, "softmax")
    with torch.no_grad():
        for layer in model.attention_layers:
            layer.q_proj.weight.zero_()
            layer.q_proj.bias.zero_()
    L, W = 10, 4
    ids = torch.randint(5, 17, (3, L), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, L, dtype=torch.bool)
    t = torch.arange(L)
    want = float(((t[:, None] - t[None, :]).abs() <= W // 2).sum(1).double().mean() / L)
    got = window_mass(model, ids, mask, W, batch_size=2)
    assert got == pytest.approx([want] * 2, abs=1e-12)
    assert window_mass(load_pretrained_encoder(tiny_dir, "softmax"), ids, mask, 2 * L) == \
        pytest.approx([1.0, 1.0], abs=1e-12)
    padded = mask.clone()
    padded[:, 6:] = False  # 6 real tokens: uniform over them, padded rows not counted
    t6 = torch.arange(6)
    want6 = float(((t6[:, None] - t6[None, :]).abs() <= W // 2).sum(1).double().mean() / 6)
    assert window_mass(model, ids, padded, W) == pytest.approx([want6] * 2, abs=1e-12)


def test_convert_measures_pseudo_documents_of_the_hybrid(tiny_dir, tmp_path, capsys):
    """`convert --doc-lengths`: fidelity on held-out pseudo-documents (the shipped RT sample's
    test reviews), the teacher's mass inside the window with a window, in result.json, the
    report and the command's output; too long for the model's positions: one line, exit 2."""
    from coulomb_attention.cli import main

    sent = tmp_path / "sentences.txt"
    sent.write_text("\n".join(SENTENCES) + "\n")
    flags = ["--encoder", str(tiny_dir), "--n-features", "6", "--sentences", str(sent),
             "--max-length", "16", "--n-sentences", "9", "--holdout", "3", "--steps", "3",
             "--refine-steps", "0", "--eval-sentences", "8", "--probe-tasks", "--no-hf",
             "--no-progress", "--batch-size", "3"]
    rc = main(["convert", *flags, "--window", "4", "--doc-lengths", "12", "24",
               "--doc-count", "4", "--out", str(tmp_path / "hyb")])
    out = capsys.readouterr().out
    assert rc == 0 and "24-token pseudo-documents: cosine mean" in out
    docs = json.loads((tmp_path / "hyb" / "result.json").read_text())["documents"]
    assert docs["task"] == "rotten_tomatoes" and docs["n"] == 4
    for n in ("12", "24"):
        row = docs["lengths"][n]
        assert row["n"] == 4 and -1 <= row["cos_mean"] <= 1 and row["texts_per_document"] >= 1
        assert all(0 < m <= 1 for m in row["window_mass"]["per_layer"])
    # a longer document leaves less of the attention inside the same window
    assert docs["lengths"]["24"]["window_mass"]["mean"] < docs["lengths"]["12"]["window_mass"][
        "mean"]
    assert "pseudo-documents" in (tmp_path / "hyb" / "report.md").read_text()
    rc = main(["convert", *flags, "--variant", "softmax", "--doc-lengths", "16",
               "--doc-count", "3", "--out", str(tmp_path / "soft")])
    res = json.loads((tmp_path / "soft" / "result.json").read_text())
    assert rc == 0 and res["documents"]["lengths"]["16"]["cos_mean"] == pytest.approx(1, abs=1e-6)
    assert "window_mass" not in res["documents"]["lengths"]["16"]  # no window, no mass
    capsys.readouterr()
    rc = main(["convert", *flags, "--variant", "vanilla", "--doc-lengths", "30",
               "--out", str(tmp_path / "long")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "30" in err and "positions" in err and "\n" not in err
    rc = main(["convert", *flags, "--doc-lengths", "16", "--doc-count", "2",
               "--out", str(tmp_path / "few")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "doc_count" in err and ">= 3" in err


def test_convert_evaluate_measures_a_finished_conversion_again(tiny_dir, tmp_path, capsys):
    """`convert --evaluate`: new evaluation settings on the saved checkpoint, nothing trained;
    the conversion's config (the cache's key) unchanged; other flags and missing runs refused."""
    from coulomb_attention.cli import main
    from coulomb_attention.convert import cached_conversion, config_of_result, evaluate_conversion

    sent = tmp_path / "sentences.txt"
    sent.write_text("\n".join(SENTENCES) + "\n")
    cfg = ConvertConfig(encoder=str(tiny_dir), n_features=6, sentences_file=str(sent),
                        max_length=16, distill=_cfg(steps=3, refine_steps=0), eval_sentences=8,
                        probe_tasks=(), window=4)
    d = cached_conversion(cfg, tmp_path / "cache", log=lambda *_: None).directory
    before = json.loads((d / "result.json").read_text())
    assert "fidelity" not in before and config_of_result(before["config"]) == cfg
    weights = (d / "checkpoint" / "model.safetensors").read_bytes()
    capsys.readouterr()
    rc = main(["convert", "--evaluate", "--out", str(d), "--doc-lengths", "20", "--doc-count",
               "3", "--eval-sentences", "6", "--probe-tasks"])
    out = capsys.readouterr().out
    res = json.loads((d / "result.json").read_text())
    assert rc == 0 and "20-token pseudo-documents" in out and "embedding cosine" in out
    assert res["fidelity"]["n"] == 6 and list(res["documents"]["lengths"]) == ["20"]
    assert res["evaluation"]["doc_lengths"] == [20] and res["config"] == before["config"]
    assert (d / "checkpoint" / "model.safetensors").read_bytes() == weights
    # still its key
    assert cached_conversion(cfg, tmp_path / "cache", log=lambda *_: None).directory == d
    again = evaluate_conversion(d, {"eval_sentences": 6})  # deterministic
    assert again["fidelity"] == res["fidelity"] and "documents" not in again
    for argv, msg in [(["--out", str(tmp_path / "none")], "no finished conversion"),
                      (["--out", str(d), "--n-features", "8"], "--n-features"),
                      (["--out", str(d), "--steps", "3"], "--steps")]:
        rc = main(["convert", "--evaluate", *argv])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and msg in err and "\n" not in err, (argv, err)


def test_pairs_distil_a_pair_task_whole_and_keep_the_cache_keys(tiny_dir, tmp_path):
    """``convert --pairs``: QQP's training pairs stay whole ([CLS] a [SEP] b [SEP]) while
    single-sentence tasks are unchanged; configurations without it keep their cache keys."""
    from coulomb_attention.convert import config_json, conversion_key, load_sentences
    from coulomb_attention.convert.data import encode_texts
    from coulomb_attention.train.run import checkpoint_config

    single = load_sentences(("qqp",), "train", None, 12, 0)
    whole = load_sentences(("sst2", "qqp"), "train", None, 12, 0, pairs=True)
    assert single and all(isinstance(t, str) for t in single)
    tuples = [t for t in whole if isinstance(t, tuple)]
    assert tuples and all(len(t) == 2 and all(s.strip() for s in t) for t in tuples)
    assert any(isinstance(t, str) for t in whole)  # SST-2's sentences stay sentences
    tok = load_pretrained_tokenizer(tiny_dir)
    ids, mask = encode_texts(tok, tuples + ["good fun"], 32)
    seps = (ids == tok.sep_id).sum(1)
    assert seps[:-1].eq(2).all() and seps[-1] == 1, seps
    # the field is absent from the key of every configuration without it (old caches hold)
    plain = ConvertConfig()
    assert "pairs" not in config_json(plain)["distill"]
    paired = ConvertConfig(distill=DistillConfig(pairs=True))
    assert config_json(paired)["distill"]["pairs"] is True
    assert conversion_key(paired) != conversion_key(plain)
    assert "pairs" not in checkpoint_config({"distill": {"method": "adam", "pairs": False}})[
        "distill"]
    with pytest.raises(ValueError, match="pairs"):
        DistillConfig(pairs="yes")
    # a whole conversion on pairs (QQP's shipped sample)
    cfg = ConvertConfig(encoder=str(tiny_dir), n_features=4, tasks=("qqp",), max_length=24,
                        distill=_cfg(steps=2, refine_steps=2, refine_examples=9, pairs=True),
                        eval_sentences=6, probe_tasks=())
    res = convert_encoder(cfg, tmp_path / "pairs", log=lambda *_: None)
    assert res["config"]["distill"]["pairs"] is True and res["n_sentences"] == 12


def test_embed_truncates_at_the_model_positions(tiny_dir):
    """max_length is a truncation cap: a text longer than the model's positions (24 here) is
    read up to them instead of failing in the forward pass, whatever max_length says."""
    from coulomb_attention.convert import embed, position_cap

    model, tok = _student(tiny_dir), load_pretrained_tokenizer(tiny_dir)
    assert position_cap(model, 64) == 24 and position_cap(model, 16) == 16
    long_text = " ".join(SENTENCES)  # about 50 tokens
    assert int(tok.encode_batch([(long_text,)], max_length=64)[1].sum()) > 24
    got = embed(model, tok, [long_text, "great"], max_length=64)
    want = embed(model, tok, [long_text, "great"], max_length=24)
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got[0], embed(model, tok, [long_text], max_length=16)[0])

"""Low-rank finishing of a converted encoder: it raises the embedding cosine, changes only the
adapted projections (and the particles when asked), its merged checkpoint loads back equal to
the unmerged model, a conversion with it resumes after the kernel stage, the CLI checks flags."""

from __future__ import annotations

import pytest
import torch

from coulomb_attention.convert import ConvertConfig, convert_encoder
from coulomb_attention.convert.distill import DistillConfig, embedding_data
from coulomb_attention.convert.finish import (
    OBJECTIVES,
    FinishConfig,
    finish_loss,
    finish_lowrank,
    hidden_state_loss,
    teacher_states,
)
from coulomb_attention.nn.families.bert import (
    load_pretrained_encoder,
    load_pretrained_tokenizer,
    save_pretrained_encoder,
)
from coulomb_attention.nn.lora import lora_modules, merge_lora_
from helpers import rel_err
from test_convert import SENTENCES
from test_pretrained import write_tiny_bert


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert-finish"), qk_scale=4.0)


@pytest.fixture(scope="module")
def batch(tiny_dir):
    return load_pretrained_tokenizer(tiny_dir).encode_batch(SENTENCES, max_length=16)[:2]


def _distill(**kw):
    base = dict(n_examples=9, holdout=3, batch_size=3, rows_per_sequence=0, steps=4,
                refine_steps=3)
    return DistillConfig(**{**base, **kw})


def _models(tiny_dir):
    return (load_pretrained_encoder(tiny_dir, "favor", 4, share_features=False, generator=0),
            load_pretrained_encoder(tiny_dir, "softmax"))


def _fit_cos(model, teacher, ids, mask, dcfg):
    data = embedding_data(teacher, ids, mask, dcfg, torch.Generator().manual_seed(0))
    with torch.no_grad():
        cos = [torch.nn.functional.cosine_similarity(model.sentence_embedding(*inp), t, dim=-1)
               for inp, t in data["fit"]]
    return float(torch.cat(cos).double().mean())


@pytest.mark.parametrize("with_particles", [False, True])
def test_finishing_raises_the_cosine_and_changes_only_what_it_trains(tiny_dir, batch,
                                                                     with_particles):
    ids, mask = batch
    model, teacher = _models(tiny_dir)
    dcfg = _distill()
    before_state = {k: v.clone() for k, v in model.state_dict().items()}
    cos0 = _fit_cos(model, teacher, ids, mask, dcfg)
    cfg = FinishConfig(rank=2, steps=60, lr=2e-2, with_particles=with_particles)
    rec = finish_lowrank(model, teacher, ids, mask, dcfg, cfg,
                         generator=torch.Generator().manual_seed(0))
    assert rec["cos_before"] == pytest.approx(cos0, abs=1e-6)
    assert rec["cos_after"] > rec["cos_before"] + 0.5 * (1 - rec["cos_before"]), rec
    assert rec["cos_after"] == pytest.approx(_fit_cos(model, teacher, ids, mask, dcfg), abs=1e-5)
    assert not lora_modules(model)  # merged
    n_omega = sum(la.omega.numel() for la in model.attention_layers)
    assert rec["adapter_params"] == 2 * 4 * 2 * (16 + 16)  # layers x projections x r (in + out)
    assert rec["trained_params"] == rec["adapter_params"] + (n_omega if with_particles else 0)
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before_state[k])}
    projections = {f"blocks.{i}.attn.{p}.weight" for i in range(2)
                   for p in ("q_proj", "k_proj", "v_proj", "out_proj")}
    omegas = {f"blocks.{i}.attn.omega" for i in range(2)}
    assert changed == projections | (omegas if with_particles else set())


def test_merged_checkpoint_loads_back_equal_to_the_unmerged_model(tiny_dir, batch, tmp_path):
    ids, mask = batch
    model, teacher = _models(tiny_dir)
    finish_lowrank(model, teacher, ids, mask, _distill(), FinishConfig(rank=3, steps=20, lr=2e-2),
                   generator=torch.Generator().manual_seed(1), merge=False)
    assert lora_modules(model)
    with torch.no_grad():
        unmerged = model.sentence_embedding(ids, mask, normalize=False)
    merge_lora_(model)
    save_pretrained_encoder(model, tmp_path / "ckpt")
    back = load_pretrained_encoder(tmp_path / "ckpt")
    assert type(back) is type(model) and back.config == model.config
    with torch.no_grad():
        loaded = back.sentence_embedding(ids, mask, normalize=False)
    assert rel_err(loaded, unmerged) < 1e-5


def test_finish_config_validation():
    for kw, name in [({"rank": 0}, "rank"), ({"steps": -1}, "steps"), ({"lr": 0.0}, "lr"),
                     ({"targets": ("fc3",)}, "targets")]:
        with pytest.raises(ValueError, match=name):
            FinishConfig(**kw)
    with pytest.raises(ValueError, match="particles variant"):
        ConvertConfig(variant="vanilla", finish=FinishConfig())


def test_convert_with_finishing_resumes_after_the_kernel_stage(tiny_dir, tmp_path):
    import coulomb_attention.convert.pipeline as conv

    sent = tmp_path / "sentences.txt"
    sent.write_text("\n".join(SENTENCES) + "\n")
    cfg = ConvertConfig(encoder=str(tiny_dir), n_features=4, sentences_file=str(sent),
                        distill=_distill(), max_length=16,
                        finish=FinishConfig(rank=2, steps=10, lr=1e-2))
    ref = convert_encoder(cfg, tmp_path / "ref", evaluate=False, log=lambda *_: None)
    out = tmp_path / "run"
    orig = conv.finish_lowrank

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    conv.finish_lowrank = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            convert_encoder(cfg, out, evaluate=False, log=lambda *_: None)
    finally:
        conv.finish_lowrank = orig
    assert (out / "state" / "progress.json").is_file()
    logs = []
    orig_distill = conv.distill_attention
    conv.distill_attention = interrupted  # the layers must not run again
    try:
        res = convert_encoder(cfg, out, evaluate=False, log=logs.append)
    finally:
        conv.distill_attention = orig_distill
    assert logs == ["resuming after the kernel stage"]
    assert not (out / "state").exists()
    assert res["refine"] == {**ref["refine"], "time_s": res["refine"]["time_s"]}
    fin, fin_ref = res["lowrank"]["finish"], ref["lowrank"]["finish"]
    assert fin["cos_after"] == pytest.approx(fin_ref["cos_after"], abs=1e-6)
    assert fin["cos_before"] == pytest.approx(ref["refine"]["cos_after"], abs=1e-5)
    ids, mask = load_pretrained_tokenizer(tiny_dir).encode_batch(SENTENCES, max_length=16)[:2]
    a, b = (load_pretrained_encoder(d / "lowrank" / "checkpoint") for d in (out, tmp_path / "ref"))
    plain = load_pretrained_encoder(out / "checkpoint")
    with torch.no_grad():
        ea, eb, ep = (m.sentence_embedding(ids, mask) for m in (a, b, plain))
    assert rel_err(ea, eb) < 1e-5 and rel_err(ea, ep) > 1e-3  # checkpoint/ stays pure linear


def test_cli_lora_flag_errors_exit_2(tiny_dir, tmp_path, capsys):
    from coulomb_attention.cli import main

    sent = tmp_path / "sentences.txt"
    sent.write_text("\n".join(SENTENCES) + "\n")
    base = ["convert", "--encoder", str(tiny_dir), "--n-features", "4", "--sentences", str(sent),
            "--out", str(tmp_path / "bad"), "--no-progress"]
    for argv, msg in [(["--lora-rank", "-1"], "--lora-rank must be"),
                      (["--lora-steps", "5"], "needs --lora-rank > 0"),
                      (["--lora-with-particles"], "needs --lora-rank > 0"),
                      (["--lora-objective", "tokens"], "--lora-objective needs --lora-rank"),
                      (["--lora-rank", "2", "--lora-aux-weight", "0"], "aux_weight"),
                      (["--lora-rank", "17"], "LoRA rank must be at most"),
                      (["--lora-rank", "2", "--lora-lr", "-1"], "lr"),
                      (["--lora-rank", "2", "--variant", "vanilla"], "particles variant"),
                      (["--lora-rank", "2", "--grid", "4"], "not to --grid")]:
        capsys.readouterr()
        rc = main([*base, *argv])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and msg in err and "\n" not in err, (argv, err)


def test_cli_lora_run_reports_both_rows(tiny_dir, tmp_path, capsys):
    import json

    from coulomb_attention.cli import main

    sent = tmp_path / "sentences.txt"
    sent.write_text("\n".join(SENTENCES) + "\n")
    out = tmp_path / "cli"
    rc = main(["convert", "--encoder", str(tiny_dir), "--n-features", "4", "--sentences",
               str(sent), "--n-sentences", "9", "--holdout", "3", "--steps", "2",
               "--batch-size", "3", "--max-length", "16", "--eval-sentences", "8",
               "--refine-steps", "3", "--probe-tasks", "--lora-rank", "2", "--lora-steps", "3",
               "--lora-objective", "tokens", "--out", str(out), "--no-progress"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "(pure-linear row)" in printed and "(low-rank finished row)" in printed
    res = json.loads((out / "result.json").read_text())
    assert res["config"]["finish"]["rank"] == 2 and res["lowrank"]["finish"]["steps"] == 3
    assert res["lowrank"]["finish"]["objective"] == "tokens"
    assert res["lowrank"]["fidelity"] != res["fidelity"]
    report = (out / "report.md").read_text()
    assert "## Low-rank finishing" in report and "| low-rank finished (rank 2) |" in report
    assert "objective tokens (hidden-state weight 1)" in report
    assert "| pure linear (layer-wise + refinement) | particles |" in report, report
    assert (out / "lowrank" / "checkpoint" / "model.safetensors").is_file()
    # each row its own Hugging Face directory, the card naming the row and its numbers
    pure, low = (out / "hf" / "README.md").read_text(), (out / "lowrank" / "hf" / "README.md")
    low = low.read_text()
    assert "**Row:** pure linear" in pure and f"{res['fidelity']['cos_mean']:.4f}" in pure
    assert "**Row:** low-rank finished" in low
    assert f"{res['lowrank']['fidelity']['cos_mean']:.4f}" in low


# ---------------------------------------------------------------------------- objectives


def _padded_batch(tiny_dir):
    ids, mask = load_pretrained_tokenizer(tiny_dir).encode_batch(SENTENCES[:4], max_length=16)[:2]
    t = int(mask.sum(1).max())
    ids, mask = ids[:, :t], mask[:, :t]
    assert (~mask).any()  # some padding to test
    return ids, mask


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_each_objective_is_zero_for_the_teacher_and_positive_for_the_student(tiny_dir,
                                                                              objective):
    ids, mask = _padded_batch(tiny_dir)
    model, teacher = _models(tiny_dir)
    with torch.no_grad():
        target = teacher.sentence_embedding(ids, mask)
    states = teacher_states(teacher, objective, ids, mask)
    assert len(states) == {"embedding": 0, "tokens": 1, "layers": 2}[objective]
    with torch.no_grad():
        own, aux0 = finish_loss(teacher, objective, (ids, mask), target, states)
    loss, aux = finish_loss(model, objective, (ids, mask), target, states, aux_weight=3.0)
    assert abs(float(own)) < 1e-6 and loss > 1e-3
    if objective == "embedding":
        assert aux0 is None and aux is None
    else:
        assert abs(float(aux0)) < 1e-10 and aux > 1e-3
        emb, _ = finish_loss(model, "embedding", (ids, mask), target, [])
        total = float(emb.detach()) + 3.0 * float(aux.detach())
        assert float(loss.detach()) == pytest.approx(total, rel=1e-5)


@pytest.mark.parametrize("objective", ["tokens", "layers"])
def test_hidden_state_objectives_ignore_padding(tiny_dir, objective):
    ids, mask = _padded_batch(tiny_dir)
    model, teacher = _models(tiny_dir)
    other = ids.clone()
    other[~mask] = 7  # another token at every padded position
    losses, pads = [], []
    for x in (ids, other):
        with torch.no_grad():
            target = teacher.sentence_embedding(x, mask)
        states = teacher_states(teacher, objective, x, mask)
        pads.append(states[-1][~mask])
        losses.append(float(finish_loss(model, objective, (x, mask), target, states)[1].detach()))
    assert rel_err(pads[0], pads[1]) > 1e-3  # the padded states do change
    assert losses[0] == pytest.approx(losses[1], rel=1e-6, abs=1e-9)
    # the unmasked error would see them
    full = torch.ones_like(mask)
    s0, s1 = (teacher_states(model, objective, x, mask) for x in (ids, other))
    t0, t1 = (teacher_states(teacher, objective, x, mask) for x in (ids, other))
    assert abs(float(hidden_state_loss(s0, t0, full) - hidden_state_loss(s1, t1, full))) > 1e-6


def test_hidden_state_loss_is_the_normalised_squared_error():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, 4, generator=g)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    want = sum(float((s[b, i] - t[b, i]).square().sum()) for b, i in [(0, 0), (0, 1), (1, 0)])
    want /= sum(float(t[b, i].square().sum()) for b, i in [(0, 0), (0, 1), (1, 0)])
    assert float(hidden_state_loss([s], [t], mask)) == pytest.approx(want, rel=1e-6)
    assert float(hidden_state_loss([s, t], [t, t], mask)) == pytest.approx(want / 2, rel=1e-6)
    with pytest.raises(ValueError, match="as many"):
        hidden_state_loss([s], [t, t], mask)


@pytest.mark.parametrize("objective", ["tokens", "layers"])
def test_finishing_with_hidden_state_objectives_raises_the_cosine(tiny_dir, batch, objective):
    ids, mask = batch
    model, teacher = _models(tiny_dir)
    cfg = FinishConfig(rank=2, steps=40, lr=2e-2, objective=objective, aux_weight=0.5,
                       targets=("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rec = finish_lowrank(model, teacher, ids, mask, _distill(), cfg,
                         generator=torch.Generator().manual_seed(0))
    assert rec["objective"] == objective and rec["aux_weight"] == 0.5
    assert rec["aux_last"] < rec["aux_first"]
    assert rec["cos_after"] > rec["cos_before"] + 0.3 * (1 - rec["cos_before"]), rec
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert {f"blocks.{i}.mlp.fc{j}.weight" for i in range(2) for j in (1, 2)} <= changed
    f, d = model.blocks[0].mlp.fc1.weight.shape
    assert rec["adapter_params"] == 2 * 2 * (4 * (d + d) + 2 * (d + f))


def test_finish_config_objective_validation():
    for kw, name in [({"objective": "logits"}, "objective must be one of embedding"),
                     ({"aux_weight": 0.0}, "aux_weight"), ({"aux_weight": -1.0}, "aux_weight"),
                     ({"targets": ("q_proj", "q_proj")}, "distinct")]:
        with pytest.raises(ValueError, match=name):
            FinishConfig(**kw)
    assert FinishConfig(targets=["fc1", "fc2"]).targets == ("fc1", "fc2")

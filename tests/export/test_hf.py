"""Hugging Face export of converted encoders (export.hf, commands.export_hf, bench.encoder_speed).

A tiny random BERT saved by ``transformers`` itself (3 heads, width 48, 2 layers, 60 tokens) is
converted with a tiny budget through the CLI; its export must load with ``AutoModel`` and
``SentenceTransformer`` (``trust_remote_code=True``) and embed like the project's own encoder,
for every feature map, shared and per-head particles, padded batches included.
"""

from __future__ import annotations

import ast
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from sentence_transformers import SentenceTransformer

from coulomb_attention.cli import main
from coulomb_attention.convert import embed
from coulomb_attention.export import REMOTE_CODE, export_hf_directory
from coulomb_attention.nn.families.bert import (
    OMEGA_KEY,
    load_pretrained_encoder,
    load_pretrained_tokenizer,
)

WORDS = "the movie was good bad a film great not fun it is".split()
TEXTS = ["the movie was good", "a great film it is not", "fun",
         "the film was bad bad bad and not great at all , it is", "unknownword movie"]
SENTENCES = ["the movie was good", "a great film", "it is not fun", "the film was bad",
             "good fun", "not a great movie it is", "bad bad film", "it was a film"] * 2


def write_hf_bert(path: Path, *, hidden=48, heads=3, layers=2, vocab=60, qk_scale=3.0) -> Path:
    """A random BERT written by ``transformers.BertModel.save_pretrained`` plus a vocab.txt;
    query/key weights scaled by ``qk_scale`` (attention far from uniform)."""
    cfg = transformers.BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                  num_attention_heads=heads, intermediate_size=2 * hidden,
                                  max_position_embeddings=40)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg, add_pooling_layer=False)
    with torch.no_grad():
        for layer in model.encoder.layer:
            layer.attention.self.query.weight.mul_(qk_scale)
            layer.attention.self.key.weight.mul_(qk_scale)
    model.save_pretrained(path)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, ","]
    tokens += [f"tok{i}" for i in range(vocab - len(tokens))]
    (path / "vocab.txt").write_text("\n".join(tokens) + "\n")
    return path


@pytest.fixture(scope="module")
def hf_bert(tmp_path_factory):
    return write_hf_bert(tmp_path_factory.mktemp("hf-bert"))


@pytest.fixture(scope="module")
def converted(hf_bert, tmp_path_factory):
    """`convert` of the tiny BERT through the CLI (tiny budget): its output directory."""
    root = tmp_path_factory.mktemp("converted")
    sent = root / "sentences.txt"
    sent.write_text("\n".join(SENTENCES) + "\n")
    out = root / "run"
    rc = main(["convert", "--encoder", str(hf_bert), "--feature-map", "favor", "--n-features",
               "6", "--sentences", str(sent), "--n-sentences", "12", "--holdout", "4",
               "--steps", "3",
               "--batch-size", "4", "--max-length", "16", "--eval-sentences", "8",
               "--refine-steps", "2", "--refine-sentences", "12", "--probe-tasks",
               "--out", str(out), "--no-progress"])
    assert rc == 0
    return out


def _ours(checkpoint, texts=TEXTS) -> torch.Tensor:
    model = load_pretrained_encoder(checkpoint)
    return embed(model, load_pretrained_tokenizer(checkpoint), texts, max_length=40,
                 batch_size=2)


def _automodel(hf_dir, texts=TEXTS) -> torch.Tensor:
    tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir), trust_remote_code=True)
    model = transformers.AutoModel.from_pretrained(str(hf_dir), trust_remote_code=True).eval()
    batch = tok(texts, padding=True, return_tensors="pt")
    assert bool((batch["attention_mask"] == 0).any())  # a padded batch
    with torch.no_grad():
        h = model(**batch).last_hidden_state
    m = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
    return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)


def _st(hf_dir, texts=TEXTS) -> torch.Tensor:
    model = SentenceTransformer(str(hf_dir), trust_remote_code=True, device="cpu")
    return torch.as_tensor(model.encode(texts, batch_size=3))


def test_convert_writes_hf_dir_that_embeds_like_the_project(converted):
    hf = converted / "hf"
    res = json.loads((converted / "result.json").read_text())
    assert res["fidelity"]["n"] == 8 and -1 <= res["fidelity"]["cos_mean"] <= 1
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "modules.json",
                 "sentence_bert_config.json", "1_Pooling/config.json", "README.md", *REMOTE_CODE):
        assert (hf / name).is_file(), name
    assert (hf / "2_Normalize").is_dir()
    cfg = json.loads((hf / "config.json").read_text())
    assert cfg["auto_map"]["AutoModel"] == "modeling_coulomb_bert.CoulombBertModel"
    assert (cfg["feature_map"], cfg["n_features"], cfg["share_features"]) == ("favor", 6, False)
    pooling = json.loads((hf / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] and pooling["word_embedding_dimension"] == 48
    ours = _ours(converted / "checkpoint")
    auto, st = _automodel(hf), _st(hf)
    assert float((auto - ours).abs().max()) < 1e-5
    assert float((st - ours).abs().max()) < 1e-5
    # the kernel matters: the original softmax encoder embeds differently
    soft = embed(load_pretrained_encoder(res["encoder_dir"], "softmax"),
                 load_pretrained_tokenizer(res["encoder_dir"]), TEXTS, max_length=40)
    assert float((soft - ours).abs().max()) > 1e-3
    # the export still loads with the project's own loader, particles as saved
    back = load_pretrained_encoder(hf)
    ref = load_pretrained_encoder(converted / "checkpoint")
    for a, b in zip(back.attention_layers, ref.attention_layers, strict=True):
        assert torch.equal(a.omega, b.omega)
    # the card reads the conversion's result
    card = (hf / "README.md").read_text()
    assert f"{res['fidelity']['cos_mean']:.4f}" in card and "trust_remote_code=True" in card
    assert "M = 6 learned particles per head" in card


@pytest.mark.parametrize("feature_map,share", [
    ("softmax_feat", True), ("porf_softplus", False), ("favor", True), ("hedgehog", False),
    ("hedgehog", True), ("elu", True)])
def test_every_map_exports_exactly(hf_bert, tmp_path, feature_map, share):
    """Every map of the registry that the export writes: fresh particles (untied for
    hedgehog, so both halves matter), saved, exported through the Hugging Face directory and
    loaded back three ways (AutoModel, SentenceTransformer, the project's loader)."""
    from coulomb_attention.export import EXPORTABLE_MAPS
    from coulomb_attention.nn.families.bert import save_pretrained_encoder

    assert feature_map in EXPORTABLE_MAPS
    m = 6 if feature_map == "hedgehog" else 5
    model = load_pretrained_encoder(hf_bert, feature_map, m, share_features=share, generator=1)
    if model.attention_layers[0].has_features:
        g = torch.Generator().manual_seed(3)
        for layer in model.attention_layers:  # untied rows: B is not -A
            layer.load_features_(torch.randn(layer.omega.shape, generator=g))
    ckpt = tmp_path / "ckpt"
    save_pretrained_encoder(model, ckpt)
    out = export_hf_directory(model, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["feature_map"] == feature_map
    ours = _ours(ckpt)
    assert float((_automodel(out) - ours).abs().max()) < 1e-5
    assert float((_st(out) - ours).abs().max()) < 1e-5
    back = load_pretrained_encoder(out)
    for a, b in zip(back.attention_layers, model.attention_layers, strict=True):
        assert a.feature_map == feature_map and torch.equal(a.omega, b.omega)
    # the map matters: the same particles on FAVOR+ embed otherwise
    if feature_map in ("hedgehog", "softmax_feat"):
        other = load_pretrained_encoder(hf_bert, "favor", m, share_features=share)
        for a, b in zip(other.attention_layers, model.attention_layers, strict=True):
            a.load_features_(b.omega)
        fav = embed(other, load_pretrained_tokenizer(ckpt), TEXTS, max_length=40)
        assert float((fav - ours).abs().max()) > 1e-3


def test_a_checkpoint_switched_to_hedgehog_exports_hedgehog(hf_bert, tmp_path):
    """A model loaded on FAVOR+ whose layers were switched to Hedgehog's map (the conversion's
    baseline route, ``use_hedgehog_map_``): its checkpoint and its export compute Hedgehog's
    map (before the registry the export wrote ``favor`` and embedded as FAVOR+). A checkpoint
    in the earlier form (``attention`` favor, ``layer_maps`` hedgehog for every layer) still
    loads and exports as Hedgehog."""
    from coulomb_attention.nn.attention import use_hedgehog_map_
    from coulomb_attention.nn.families.bert import KERNEL_KEY, save_pretrained_encoder

    model = load_pretrained_encoder(hf_bert, "favor", 6, share_features=False, generator=2)
    for layer in model.attention_layers:
        use_hedgehog_map_(layer)
    ckpt = save_pretrained_encoder(model, tmp_path / "ckpt")
    kernel = json.loads((ckpt / "config.json").read_text())[KERNEL_KEY]
    assert kernel["attention"] == "hedgehog" and "layer_maps" not in kernel
    out = export_hf_directory(ckpt, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["feature_map"] == "hedgehog"
    ours = embed(model, load_pretrained_tokenizer(ckpt), TEXTS, max_length=40, batch_size=2)
    assert float((_automodel(out) - ours).abs().max()) < 1e-5
    # the earlier form of the same checkpoint
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg[KERNEL_KEY].update(attention="favor", layer_maps={"0": "hedgehog", "1": "hedgehog"})
    (ckpt / "config.json").write_text(json.dumps(cfg))
    old = load_pretrained_encoder(ckpt)
    assert [layer.feature_map for layer in old.attention_layers] == ["hedgehog"] * 2
    assert float((_ours(ckpt) - ours).abs().max()) < 1e-5
    out2 = export_hf_directory(ckpt, tmp_path / "hf2")
    assert float((_automodel(out2) - ours).abs().max()) < 1e-5
    # one layer on another map: loads, and the export refuses it in one line
    cfg[KERNEL_KEY].update(attention="favor", layer_maps={"1": "hedgehog"})
    (ckpt / "config.json").write_text(json.dumps(cfg))
    mixed = load_pretrained_encoder(ckpt)
    assert [layer.feature_map for layer in mixed.attention_layers] == ["favor", "hedgehog"]
    with pytest.raises(ValueError, match="different feature maps"):
        export_hf_directory(mixed, tmp_path / "hf3")


@pytest.mark.parametrize("attention", ["softmax", "none"])
def test_the_export_refuses_the_kinds_without_a_map(hf_bert, tmp_path, attention):
    model = load_pretrained_encoder(hf_bert, attention, 4)
    with pytest.raises(ValueError, match="cannot be exported") as err:
        export_hf_directory(model, tmp_path / "hf")
    assert "\n" not in str(err.value)


def test_remote_model_trains_and_its_autograd_path_equals_the_in_place_one(converted):
    """With autograd the remote kernel runs out of place: same outputs, finite gradients."""
    model = transformers.AutoModel.from_pretrained(str(converted / "hf"),
                                                   trust_remote_code=True).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(converted / "hf"),
                                                     trust_remote_code=True)
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = model(**batch).last_hidden_state
    out = model(**batch).last_hidden_state
    assert out.requires_grad and float((out.detach() - ref).abs().max()) < 1e-6
    out[batch["attention_mask"].bool()].pow(2).mean().backward()
    grad = model.encoder.layer[0].attention.self.query.weight.grad
    assert grad is not None and bool(torch.isfinite(grad).all()) and float(grad.abs().max()) > 0
    assert all(not b.requires_grad for n, b in model.named_buffers() if n.endswith("omega"))


def test_remote_code_imports_only_torch_and_transformers():
    import coulomb_attention.export as pkg

    allowed = {"torch", "transformers", "math", "__future__", "configuration_coulomb_bert"}
    for name in REMOTE_CODE:
        tree = ast.parse((Path(pkg.__file__).parent / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]} if node.level == 0 else set()
            else:
                continue
            assert roots <= allowed, (name, roots)


def test_remote_kernel_matches_the_project_ops():
    """The remote code's plain formula equals the project's fast FAVOR+ and linear ops."""
    from coulomb_attention.export import modeling_coulomb_bert as remote
    from coulomb_attention.nn import functional as AF
    from coulomb_attention.nn.attention import ATTENTION_FEATURES

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8, generator=g, dtype=torch.float64) for _ in range(3))
    omega = torch.randn(3, 5, 8, generator=g, dtype=torch.float64)  # float64: exact compare
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    def remote_attention(q, k, v, omega, name, mask=None):  # the remote code puts heads first
        def t(x):
            return x.transpose(0, 1)

        return t(remote.kernel_attention(t(q), t(k), t(v), omega, name, mask))

    ref = AF.favor_attention(q, k, v, omega, mask)
    got = remote_attention(q, k, v, omega, "favor", mask)
    assert got.dtype == torch.float64 and float((ref - got).abs().max()) < 1e-12
    for name in ("porf_softplus", "softmax_feat"):
        phi = ATTENTION_FEATURES[name].phi
        pq = torch.stack([phi(q[:, h], omega[h]) for h in range(3)], 1)
        pk = torch.stack([phi(k[:, h], omega[h]) for h in range(3)], 1)
        ref = AF.linear_attention(pq, pk, v, mask)
        got = remote_attention(q, k, v, omega, name, mask)
        assert float((ref - got).abs().max()) < 1e-12, name
    # padded keys do not matter: the short sequence alone gives the same rows
    alone = remote_attention(q[1:, :, :4], k[1:, :, :4], v[1:, :, :4], omega, "favor")
    assert float((alone - remote_attention(q, k, v, omega, "favor", mask)[1:, :, :4])
                 .abs().max()) < 1e-12
    scaled = remote.kernel_attention(q.transpose(0, 1) / 3, k.transpose(0, 1) / 3,
                                     v.transpose(0, 1), omega, "favor", mask, scale=3.0)
    favor_ref = AF.favor_attention(q, k, v, omega, mask)
    assert float((scaled.transpose(0, 1) - favor_ref).abs().max()) < 1e-12  # scale on omega
    shared = remote_attention(q, k, v, omega[:1], "favor", mask)  # one omega for all heads
    assert float((shared - AF.favor_attention(q, k, v, omega[:1], mask)).abs().max()) < 1e-12


@pytest.mark.parametrize("feature_map", ["favor", "porf_softplus", "softmax_feat"])
@pytest.mark.parametrize("groups", [1, 3])
def test_blocked_remote_kernel_equals_the_plain_one(feature_map, groups):
    """The blocked in-place CPU path (token-major views, one head and a few sequences per
    block) gives the plain heads-first kernel's values for every block shape, padded batches
    and a sequence without any real key included."""
    from coulomb_attention.export import modeling_coulomb_bert as remote

    B, L, H, d, M = 5, 9, 3, 4, 6
    g = torch.Generator().manual_seed(2)
    mask = torch.rand(B, L, generator=g) > 0.3
    mask[:, 0] = True
    mask[3] = False  # no real key: output 0
    for dtype, tol in [(torch.float64, 1e-12), (torch.float32, 1e-5)]:
        q, k, v = (2 * torch.randn(B, L, H * d, generator=g, dtype=dtype) for _ in range(3))
        omega = torch.randn(groups, M, d, generator=g, dtype=dtype)

        def split(t):
            return t.view(B, L, H, d).permute(2, 0, 1, 3)

        ref = remote.kernel_attention(split(q), split(k), split(v), omega, feature_map, mask,
                                      0.7).permute(1, 2, 0, 3).reshape(B, L, H * d)
        assert float(ref[3].abs().max()) == 0 and float(ref[0].abs().max()) > 0.1
        for blocks in [(1, 1), (1, 2), (2, 3), (3, 5), (3, 7), None]:
            got = remote.blocked_kernel_attention(q, k, v, omega, feature_map, mask, 0.7,
                                                  blocks)
            assert got.dtype == dtype and got.shape == (B, L, H * d)
            assert float((got - ref).abs().max()) < tol, (dtype, blocks)
    # bf16 projections: computed in float32, returned in bf16
    qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
    got = remote.blocked_kernel_attention(qb, kb, vb, omega.float(), feature_map, mask, 0.7)
    ref = remote.kernel_attention(split(qb), split(kb), split(vb), omega.float(), feature_map,
                                  mask, 0.7).permute(1, 2, 0, 3).reshape(B, L, H * d)
    assert got.dtype == torch.bfloat16 and torch.equal(got, ref)


def test_attention_blocks_fit_the_cache_on_cpu_and_are_whole_elsewhere():
    from coulomb_attention.export import modeling_coulomb_bert as remote

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    hb, bb = remote.attention_blocks(32, 256, 12, 64, cpu)
    assert hb == 1 and bb * 256 * 64 <= remote.BLOCK_ELEMENTS < (bb + 1) * 256 * 64
    assert remote.attention_blocks(32, 1 << 16, 12, 64, cpu) == (1, 1)  # at least a sequence
    assert remote.attention_blocks(3, 1024, 12, 64, cpu) == (1, 3)  # at most the batch
    assert remote.attention_blocks(32, 256, 12, 64, cuda) == (12, 32)
    # a short batch whose features fit one block: one block, not one call per head
    assert remote.attention_blocks(2, 8, 12, 64, cpu) == (12, 2)
    n = remote.BLOCK_ELEMENTS // (12 * 64)
    assert remote.attention_blocks(1, n, 12, 64, cpu) == (12, 1)
    assert remote.attention_blocks(1, n + 1, 12, 64, cpu)[0] == 1


def _run_cli(argv, capsys):
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    return rc, err


def test_export_cli_and_bad_checkpoints(converted, hf_bert, tmp_path, capsys):
    import shutil

    # a clean export through the command equals the one convert wrote
    rc, err = _run_cli(["export-hf", str(converted / "checkpoint"), str(tmp_path / "hf")],
                       capsys)
    assert rc == 0, err
    a = load_file(str(tmp_path / "hf" / "model.safetensors"))
    b = load_file(str(converted / "hf" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # a plain BERT (no particles) is not a converted checkpoint
    rc, err = _run_cli(["export-hf", str(hf_bert), str(tmp_path / "x")], capsys)
    assert rc == 2 and "not a converted checkpoint" in err and "\n" not in err, err
    # tampered particles: wrong shape, NaN
    key = OMEGA_KEY.format(1)
    for what, change, msg in [("shape", lambda t: t[:, :-1], "shape"),
                              ("nan", lambda t: t.index_fill(0, torch.tensor([0]), math.nan),
                               "NaN")]:
        bad = tmp_path / f"bad-{what}"
        shutil.copytree(converted / "checkpoint", bad)
        state = load_file(str(bad / "model.safetensors"))
        state[key] = change(state[key]).contiguous()
        save_file(state, str(bad / "model.safetensors"), metadata={"format": "pt"})
        rc, err = _run_cli(["export-hf", str(bad), str(tmp_path / f"out-{what}")], capsys)
        assert rc == 2 and key in err and msg in err and "\n" not in err, err
        assert not (tmp_path / f"out-{what}").exists()
        with pytest.raises(ValueError, match="particles"):
            export_hf_directory(bad, tmp_path / f"lib-{what}")
    # a tokenizer of another model: vocabulary size != embedding rows
    bad = tmp_path / "bad-vocab"
    shutil.copytree(converted / "checkpoint", bad)
    lines = (bad / "vocab.txt").read_text().splitlines()
    (bad / "vocab.txt").write_text("\n".join(lines[:-3]) + "\n")
    rc, err = _run_cli(["export-hf", str(bad), str(tmp_path / "out-vocab")], capsys)
    assert rc == 2 and "57 tokens but the word embeddings have 60 rows" in err, err
    # a truncated model.safetensors in the checkpoint
    bad = tmp_path / "bad-cut"
    shutil.copytree(converted / "checkpoint", bad)
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    rc, err = _run_cli(["export-hf", str(bad), str(tmp_path / "out-cut")], capsys)
    assert rc == 2 and "not a readable safetensors file" in err and "\n" not in err, err
    # a non-empty directory that is not an export is never overwritten
    other = tmp_path / "precious"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    rc, err = _run_cli(["export-hf", str(converted / "checkpoint"), str(other)], capsys)
    assert rc == 2 and "not an export" in err and (other / "notes.txt").read_text() == "keep"


def test_convert_bad_encoders_one_line(hf_bert, tmp_path, capsys):
    import shutil

    sent = tmp_path / "s.txt"
    sent.write_text("\n".join(SENTENCES) + "\n")
    base = ["--sentences", str(sent), "--n-sentences", "4", "--holdout", "2", "--steps", "1",
            "--probe-tasks", "--out", str(tmp_path / "out"), "--no-progress"]
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 32,
                                                  "n_layer": 2, "n_head": 2, "vocab_size": 60}))
    vocab = tmp_path / "vocab-mismatch"
    shutil.copytree(hf_bert, vocab)
    (vocab / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the"]) + "\n")
    cut = tmp_path / "cut"
    shutil.copytree(hf_bert, cut)
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) - 100])
    for enc, msg in [(gpt2, "model_type 'gpt2' is not a BERT-family encoder"),
                     (vocab, "5 tokens but the word embeddings have 60 rows"),
                     (cut, "not a readable safetensors file")]:
        rc, err = _run_cli(["convert", "--encoder", str(enc), *base], capsys)
        assert rc == 2 and msg in err and "\n" not in err, (enc, err)


def test_convert_no_hf_skips_the_export(hf_bert, tmp_path):
    sent = tmp_path / "s.txt"
    sent.write_text("\n".join(SENTENCES) + "\n")
    out = tmp_path / "run"
    assert main(["convert", "--encoder", str(hf_bert), "--n-features", "4", "--sentences",
                 str(sent), "--n-sentences", "6", "--holdout", "2", "--steps", "1",
                 "--refine-steps", "0", "--no-eval", "--no-hf", "--out", str(out),
                 "--no-progress"]) == 0
    assert (out / "checkpoint" / "model.safetensors").is_file() and not (out / "hf").exists()


def test_export_hf_help_imports_no_torch():
    code = ("import sys\nfrom coulomb_attention.cli import main\n"
            "try:\n    main(['export-hf', '--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "--speed" in proc.stdout, proc.stderr


def test_encoder_speed_rows_and_card(converted, hf_bert, tmp_path):
    from sentence_transformers import models

    from coulomb_attention.bench.encoder_speed import encoder_speed

    original = tmp_path / "original"
    tr = models.Transformer(str(hf_bert))
    SentenceTransformer(modules=[tr, models.Pooling(48, "mean"), models.Normalize()],
                        device="cpu").save(str(original))
    rows = encoder_speed(converted / "hf", original, (8, 16), batch_size=4, repeats=2)
    assert [r["length"] for r in rows] == [8, 16]
    for r in rows:
        assert r["converted_sps"] > 0 and r["original_sps"] > 0
        assert len(r["converted_s"]) == 2 and r["batch_size"] == 4
        assert math.isclose(r["converted_sps"], 4 / statistics.median(r["converted_s"]))
        assert math.isclose(r["original_sps"], 4 / statistics.median(r["original_s"]))
    with pytest.raises(ValueError, match="exceed the position table"):
        encoder_speed(converted / "hf", original, (64,), batch_size=2, repeats=1)
    out = export_hf_directory(converted / "checkpoint", tmp_path / "hf", speed=rows)
    card = (out / "README.md").read_text()
    assert "## Speed" in card and f"| 16 | {rows[1]['converted_sps']:.1f} |" in card
    # the commands: bench encoder writes the rows, export-hf --speed puts them in the card
    small = ["--original", str(original), "--lengths", "8", "--batch-size", "2",
             "--repeats", "1"]
    assert main(["bench", "encoder", str(out), *small, "--out", str(tmp_path / "s.json")]) == 0
    assert [r["length"] for r in json.loads((tmp_path / "s.json").read_text())] == [8]
    assert main(["export-hf", str(converted / "checkpoint"), str(tmp_path / "hf2"), "--speed",
                 *small]) == 0
    rows = json.loads((tmp_path / "hf2" / "speed.json").read_text())
    assert f"| 8 | {rows[0]['converted_sps']:.1f} |" in (tmp_path / "hf2" / "README.md").read_text()


def test_weighted_checkpoints_round_trip_and_the_export_refuses_them(hf_bert, tmp_path, capsys):
    from coulomb_attention.nn.families.bert import MASS_KEY, save_pretrained_encoder

    model = load_pretrained_encoder(hf_bert, attention="favor", n_features=6, generator=0)
    layer = model.attention_layers[1]
    layer.load_masses_(torch.rand(6, generator=torch.Generator().manual_seed(1)) + 0.1)
    ckpt = save_pretrained_encoder(model, tmp_path / "ckpt")
    assert MASS_KEY.format(1) in load_file(str(ckpt / "model.safetensors"))
    assert MASS_KEY.format(0) not in load_file(str(ckpt / "model.safetensors"))
    back = load_pretrained_encoder(ckpt)
    assert back.attention_layers[0].mass is None
    assert torch.equal(back.attention_layers[1].mass, layer.mass)
    assert torch.allclose(_ours(ckpt), _ours_model(model), atol=1e-6)
    # the remote code has no masses: the export refuses rather than drop them
    with pytest.raises(ValueError, match=r"layers \[1\] have weighted particles"):
        export_hf_directory(ckpt, tmp_path / "hf")
    rc, err = _run_cli(["export-hf", str(ckpt), str(tmp_path / "hf2")], capsys)
    assert rc == 2 and "weighted particles" in err and "\n" not in err, err
    assert not (tmp_path / "hf").exists() and not (tmp_path / "hf2").exists()
    # tampered masses: negative
    state = load_file(str(ckpt / "model.safetensors"))
    state[MASS_KEY.format(1)] = -state[MASS_KEY.format(1)]
    save_file(state, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"masses .*self\.mass.*non-negative"):
        load_pretrained_encoder(ckpt)


def _ours_model(model, texts=TEXTS) -> torch.Tensor:
    tok = load_pretrained_tokenizer(model.source)
    return embed(model, tok, texts, max_length=40, batch_size=2)


@pytest.mark.parametrize("feature_map,linear", [("favor", True), ("hedgehog", True),
                                                ("porf_softplus", True), ("favor", False)])
def test_window_hybrid_exports_exactly(hf_bert, tmp_path, feature_map, linear):
    """A sliding-window hybrid checkpoint (learned-looking window weights, per-head particles)
    exports with its window: AutoModel and SentenceTransformer embed as the project, padded
    batches included; the card says which row it is."""
    from coulomb_attention.nn.families.bert import save_pretrained_encoder

    model = load_pretrained_encoder(hf_bert, feature_map, 6, share_features=False,
                                    generator=1, window=4, window_linear=linear)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for layer in model.attention_layers:
            layer.window_logit.copy_(torch.randn(layer.heads, generator=g))
    ckpt = save_pretrained_encoder(model, tmp_path / "ckpt")
    out = export_hf_directory(ckpt, tmp_path / "hf")
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["window"], cfg["window_linear"]) == (4, linear)
    ours = _ours(ckpt)
    assert float((_automodel(out) - ours).abs().max()) < 1e-5
    assert float((_st(out) - ours).abs().max()) < 1e-5
    plain = load_pretrained_encoder(hf_bert, feature_map, 6, share_features=False, generator=1)
    far = embed(plain, load_pretrained_tokenizer(ckpt), TEXTS, max_length=40)
    assert float((far - ours).abs().max()) > 1e-4  # the window matters (10x the tolerance)
    assert "sliding-window hybrid" in (out / "README.md").read_text()

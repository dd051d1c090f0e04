"""TransformerClassifier: shapes, padding invariance, particles as buffers, BERT names."""

from __future__ import annotations

import pytest
import torch

from coulomb_attention.nn.families.bert import bert_key_map
from coulomb_attention.nn.model import ModelConfig, TransformerClassifier

ATTENTIONS = ("favor", "porf_softplus", "softmax_feat", "elu", "softmax")


def tiny(attention="favor", **kw) -> TransformerClassifier:
    cfg = ModelConfig(vocab_size=50, num_labels=3, dim=16, layers=2, heads=2, mlp_dim=32,
                      max_len=20, attention=attention, n_features=8, **kw)
    return TransformerClassifier(cfg, generator=torch.Generator().manual_seed(0)).eval()


def batch(g=None, b=4, t=12):
    g = g or torch.Generator().manual_seed(1)
    ids = torch.randint(5, 50, (b, t), generator=g)
    lengths = torch.tensor([t, t - 3, 4, 1])[:b]
    mask = torch.arange(t)[None] < lengths[:, None]
    ids[~mask] = 0
    return ids, mask


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_forward_shape_and_padding_invariance(attention, pooling):
    model = tiny(attention, pooling=pooling)
    ids, mask = batch()
    logits = model(ids, mask)
    assert logits.shape == (4, 3)
    assert torch.isfinite(logits).all()
    # Each sequence alone, unpadded, gives the same logits as inside the padded batch.
    for i in range(4):
        n = int(mask[i].sum())
        alone = model(ids[i:i + 1, :n], mask[i:i + 1, :n])
        torch.testing.assert_close(alone, logits[i:i + 1], rtol=1e-4, atol=1e-5)
    # Extra padding columns and garbage in padded positions change nothing.
    ids2 = torch.cat([ids, torch.full((4, 5), 7)], 1)
    ids2[:, :12][~mask] = 9
    mask2 = torch.cat([mask, torch.zeros(4, 5, dtype=torch.bool)], 1)
    torch.testing.assert_close(model(ids2, mask2), logits, rtol=1e-4, atol=1e-5)


def test_post_norm_and_token_types():
    model = tiny("favor", post_norm=True, type_vocab_size=2)
    assert model.final_norm is None and model.embeddings.norm is not None
    ids, mask = batch()
    assert model(ids, mask).shape == (4, 3)


def test_particles_are_buffers_and_tied_qk():
    model = tiny("softmax_feat")
    assert model.config.tie_qk is True  # resolved default for softmax_feat
    attn = model.attention_layers[0]
    assert attn.k_proj is attn.q_proj
    names = {n for n, _ in model.named_parameters()}
    assert not any("omega" in n for n in names)
    assert "blocks.0.attn.omega" in model.state_dict()
    assert model.attention_layers[0].omega.shape == (1, 8, 8)
    assert tiny("favor").config.tie_qk is False
    # Forward never changes omega, in train or eval mode.
    before = attn.omega.clone()
    model.train()
    model(*batch())
    assert torch.equal(attn.omega, before)


def test_same_generator_same_model():
    a, b = tiny(), tiny()
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)


def test_bert_key_map_covers_every_encoder_weight():
    model = tiny("favor", post_norm=True, type_vocab_size=2)
    mapping = bert_key_map(2)
    targets = set(mapping.values())
    expected = {k for k in model.state_dict() if not k.startswith("head.") and "omega" not in k}
    assert targets == expected
    key = "bert.encoder.layer.1.attention.self.query.weight"
    assert mapping[key] == "blocks.1.attn.q_proj.weight"


def test_bad_input_raises():
    with pytest.raises(ValueError, match="attention"):
        ModelConfig(attention="nope")
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(dim=10, heads=4)
    with pytest.raises(ValueError, match="pooling"):
        ModelConfig(pooling="max")
    model = tiny()
    with pytest.raises(ValueError, match="max_len"):
        model(torch.ones(1, 21, dtype=torch.long))
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.ones(2, 5, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="integer"):
        model(torch.ones(2, 5))


def test_factorised_token_embeddings():
    """``embedding_dim != dim``: a (vocab, E) table and a learned (E -> D) projection; the
    default (None) keeps the (vocab, D) table and no projection."""
    cfg = ModelConfig(vocab_size=20, dim=8, layers=1, heads=2, mlp_dim=16, max_len=8,
                      n_features=4, embedding_dim=12)
    model = TransformerClassifier(cfg, generator=torch.Generator().manual_seed(0))
    emb = model.embeddings
    assert emb.word_embeddings.weight.shape == (20, 12) and emb.word_proj.weight.shape == (8, 12)
    ids = torch.randint(1, 20, (3, 5), generator=torch.Generator().manual_seed(1))
    x = emb(ids)
    pos = emb.position_embeddings.weight[:5]
    ref = emb.word_embeddings.weight[ids] @ emb.word_proj.weight.T + pos
    emb.eval()
    assert torch.allclose(emb(ids), ref, atol=1e-6) and x.shape == (3, 5, 8)
    plain = TransformerClassifier(ModelConfig(vocab_size=20, dim=8, layers=1, heads=2,
                                              mlp_dim=16, max_len=8, n_features=4))
    assert plain.embeddings.word_proj is None
    assert plain.embeddings.word_embeddings.weight.shape == (20, 8)
    with pytest.raises(ValueError, match="embedding_dim"):
        ModelConfig(embedding_dim=0)

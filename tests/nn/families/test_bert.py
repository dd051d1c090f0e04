"""The bert family module: its interface (nn/families/__init__.py) and the in-memory load of a
converted encoder, which must equal a load of its saved checkpoint (train's phase A relies on
it: the conversion's model is never re-read from disk)."""

import pytest
import torch

from coulomb_attention.nn.families import FAMILIES, get_family
from coulomb_attention.nn.families import bert as family
from test_convert import SENTENCES
from test_pretrained import write_tiny_bert


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert-family"), qk_scale=4.0)


def test_bert_is_a_registered_family_with_the_interface():
    assert FAMILIES["bert"] == "bert" and get_family("bert") is family
    for name in ("NAME", "from_pretrained", "load", "load_tokenizer", "save_pretrained",
                 "attention_sites", "teacher_rows", "fidelity_output"):
        assert hasattr(family, name), name
    assert family.NAME == "bert"


def test_teacher_rows_are_the_softmax_layer_and_fidelity_output_the_embedding(tiny_dir):
    model = family.load(tiny_dir)
    ids, mask = family.load_tokenizer(tiny_dir).encode_batch(SENTENCES[:4], max_length=16)[:2]
    sites = family.attention_sites(model)
    assert sites == list(model.attention_layers) and len(sites) == 2
    h = model.embeddings(ids)  # the input of the first site
    rows = family.teacher_rows(sites[0], h, mask)  # (B, H, T, T)
    assert rows.shape == (4, sites[0].heads, ids.shape[1], ids.shape[1])
    torch.testing.assert_close(rows.sum(-1), torch.ones_like(rows.sum(-1)))
    assert float(rows.masked_select(~mask.bool()[:, None, None, :]).abs().max()) == 0.0
    logits = sites[0].queries(h)[0, 0].double() @ sites[0].keys(h)[0, 0].double().T
    real = mask[0].bool()
    torch.testing.assert_close(rows[0, 0][:, real], torch.softmax(logits[:, real], dim=-1))
    emb = family.fidelity_output(model, ids, mask)
    torch.testing.assert_close(emb, model.sentence_embedding(ids, mask))
    torch.testing.assert_close(emb.norm(dim=-1), torch.ones(4))


@pytest.mark.parametrize("hedgehog", [False, True])
def test_an_encoder_in_memory_loads_as_its_saved_checkpoint(tiny_dir, tmp_path, hedgehog):
    from coulomb_attention.nn.attention import use_hedgehog_map_

    conv = family.from_pretrained(tiny_dir, "favor", 8, share_features=False, generator=3)
    for layer in conv.attention_layers:
        with torch.no_grad():
            layer.omega.add_(0.1)
        if hedgehog:
            use_hedgehog_map_(layer)
    family.save_pretrained(conv, tmp_path / "ckpt", vocab_from=tiny_dir)
    kw = {"num_labels": 3, "share_features": False, "dropout": 0.0}
    attention = "hedgehog" if hedgehog else "favor"
    a = family.from_pretrained(tmp_path / "ckpt", attention, 8, generator=7, **kw)
    b = family.from_pretrained(conv, attention, 8, generator=7, **kw)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    assert [x.feature_map for x in a.attention_layers] == [
        x.feature_map for x in b.attention_layers]

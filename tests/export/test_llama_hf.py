"""A converted llama exported as a Hugging Face directory with remote code: for every row (the
softmax teacher, pure FAVOR+ and Hedgehog, the window + sinks hybrid, StreamingLLM)
``AutoModelForCausalLM`` (``trust_remote_code=True``) gives our logits (1e-4), ``generate()``
our greedy tokens through its own decoding state (and the same tokens without a cache), sampling
with a seed the same tokens with and without the cache, a prompt longer than the window the same
steps as our parallel forward; ``AutoTokenizer`` loads the tokenizer."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from coulomb_attention.export.llama_hf import (  # noqa: E402
    LLAMA_REMOTE_CODE,
    export_llama,
    llama_hf_config,
)
from coulomb_attention.nn.families.llama import (  # noqa: E402
    LlamaForCausalLM,
    convert_attention_,
)
from helpers import tiny_llama  # noqa: E402

V = 64
ROWS = {
    "teacher": None,
    "favor": dict(feature_map="favor"),
    "hedgehog": dict(feature_map="hedgehog"),
    "hybrid_favor": dict(feature_map="favor", window=8, sinks=2),
    "streamingllm": dict(feature_map="favor", window=8, sinks=2, linear=False),
}


def _model(row: str, seed: int = 0, tie: bool = False) -> LlamaForCausalLM:
    """A tiny random llama (GQA: 4 query heads, 2 KV heads) with O(1) logits, converted to
    ``row`` with 16 particles per KV head (window weights drawn away from their start)."""
    return tiny_llama(seed, row=ROWS[row], window_logits=True, vocab_size=V,
                      tie_embeddings=tie, bos_token_id=1, eos_token_id=None)


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, **{f"w{i}": i for i in range(2, V)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def _ids(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", params=sorted(ROWS))
def exported(request, tmp_path_factory):
    """(row, our model, the directory, the model loaded by AutoModelForCausalLM)."""
    row = request.param
    model = _model(row)
    out = export_llama(model, _tokenizer(), tmp_path_factory.mktemp("llama") / row,
                       f"{row}, fixed particles", learned=False, base_model="tiny-llama")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True)
    return row, model, out, hf.eval()


def test_remote_logits_equal_ours(exported):
    row, model, out, hf = exported
    assert type(hf).__name__ == "CoulombLlamaForCausalLM"
    ids = _ids(2, 300, 0)  # past the window, the sinks and a 128-position block
    with torch.no_grad():
        ours = model(ids)
        theirs = hf(ids).logits
        loss = hf(ids, labels=ids).loss
    err = (ours - theirs).abs().max().item()
    assert err < 1e-4, f"{row}: max |logit difference| {err:.2e}"
    assert ours.abs().max() > 1.0  # logits that are not all ~0: the comparison means something
    ref = torch.nn.functional.cross_entropy(ours[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    assert abs(loss.item() - ref.item()) < 1e-4


def test_greedy_generate_equals_ours_with_and_without_the_cache(exported):
    row, model, _, hf = exported
    prompt = _ids(2, 12, 1)
    ours = model.greedy_generate(prompt, 20)
    cached = hf.generate(prompt, max_new_tokens=20, do_sample=False)
    slow = hf.generate(prompt, max_new_tokens=20, do_sample=False, use_cache=False)
    assert cached.shape == (2, 32)
    assert torch.equal(cached, ours), row
    assert torch.equal(slow, ours), row


def test_sampling_with_a_seed_equals_the_slow_path(exported):
    row, _, _, hf = exported
    prompt = _ids(2, 12, 2)
    torch.manual_seed(5)
    cached = hf.generate(prompt, max_new_tokens=20, do_sample=True, top_k=0)
    torch.manual_seed(5)
    slow = hf.generate(prompt, max_new_tokens=20, do_sample=True, top_k=0, use_cache=False)
    greedy = hf.generate(prompt, max_new_tokens=20, do_sample=False)
    assert torch.equal(cached, slow), row
    assert not torch.equal(cached, greedy)  # it sampled
    assert torch.equal(cached[:, :12], prompt) and int(cached.max()) < V


def test_a_prompt_longer_than_the_window_decodes_as_our_parallel_forward(exported):
    """300 prompt tokens (W = 8: the ring buffer wrapped ~37 times), then 40 steps through the
    remote cache: every step's logits equal our parallel forward's over the whole sequence; the
    linear rows' cache does not grow (the bytes of its storages: after 100 prompt tokens as
    after 300 and 340); generate() from the long prompt equals ours."""
    row, model, _, hf = exported
    ids = _ids(1, 340, 3)
    with torch.no_grad():
        full = model(ids)
        out = hf(ids[:, :300], use_cache=True)
        cache, parts = out.cache, [out.logits]
        size = cache.nbytes()
        for t in range(300, 340):
            out = hf(ids[:, t:t + 1], cache=cache, use_cache=True)
            parts.append(out.logits)
    assert cache.get_seq_length() == 340
    err = (torch.cat(parts, 1) - full).abs().max().item()
    assert err < 1e-4, f"{row}: max |logit difference| {err:.2e}"
    if row == "teacher":
        assert cache.nbytes() > size
    else:  # constant, also in the storages held: nothing keeps the prompt's keys alive
        assert cache.nbytes() == size
        with torch.no_grad():
            assert hf(ids[:, :100], use_cache=True).cache.nbytes() == size
    prompt = ids[:, :300]
    assert torch.equal(hf.generate(prompt, max_new_tokens=20, do_sample=False),
                       model.greedy_generate(prompt, 20))


def test_beam_search_reorders_the_cache(exported):
    row, _, _, hf = exported
    prompt = _ids(2, 10, 4)
    cached = hf.generate(prompt, max_new_tokens=8, num_beams=3, do_sample=False)
    slow = hf.generate(prompt, max_new_tokens=8, num_beams=3, do_sample=False, use_cache=False)
    assert torch.equal(cached, slow), row


def test_auto_tokenizer_loads_and_the_directory_is_complete(exported):
    row, model, out, _ = exported
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "README.md", *LLAMA_REMOTE_CODE} <= names
    tok = transformers.AutoTokenizer.from_pretrained(str(out), trust_remote_code=True)
    text = "w3 w17 w63 w5"
    assert tok(text)["input_ids"] == _tokenizer().encode(text).ids == [3, 17, 63, 5]
    assert tok.bos_token == "<s>" and tok.bos_token_id == 1
    assert tok.decode([3, 17]) == "w3 w17"
    plain = transformers.PreTrainedTokenizerFast.from_pretrained(str(out))  # no remote code
    assert plain(text)["input_ids"] == [3, 17, 63, 5]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "coulomb_llama"
    assert cfg["auto_map"]["AutoModelForCausalLM"].startswith("modeling_coulomb_llama.")
    spec = ROWS[row] or {}
    assert cfg["feature_map"] == spec.get("feature_map", "softmax")
    assert (cfg["window"], cfg["sinks"]) == (spec.get("window", 0), spec.get("sinks", 0))
    card = (out / "README.md").read_text()
    assert f"**Row:** {row}, fixed particles" in card and "trust_remote_code=True" in card
    assert f"| {cfg['feature_map']} | {cfg['n_features']} | {cfg['window']} | {cfg['sinks']} |" \
        in card
    if row in ("favor", "hedgehog", "hybrid_favor"):
        assert "fixed (a random draw" in card


def test_remote_code_imports_only_torch_and_transformers():
    import coulomb_attention.export as pkg

    allowed = {"torch", "transformers", "math", "__future__", "configuration_coulomb_llama"}
    for name in LLAMA_REMOTE_CODE:
        tree = ast.parse((Path(pkg.__file__).parent / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]} if node.level == 0 else set()
            else:
                continue
            assert roots <= allowed, (name, roots)


def test_the_remote_codes_attention_names_copy_the_vocabulary():
    from coulomb_attention.export import configuration_coulomb_llama as remote
    from coulomb_attention.export.llama_hf import EXPORTABLE
    from coulomb_attention.names import ATTENTIONS, NO_PARTICLES

    # the remote code names only attentions of the vocabulary; the export offers exactly those
    # (a new registry map is refused by name until the remote code computes it)
    assert set(remote.FEATURE_MAPS) <= set(ATTENTIONS) - {"none"}
    assert EXPORTABLE == tuple(a for a in ATTENTIONS if a in remote.FEATURE_MAPS)
    assert {"favor", "porf_softplus", "softmax_feat", "hedgehog", "elu", "softmax"} <= set(
        EXPORTABLE)
    assert set(remote.PARTICLE_MAPS) == set(remote.FEATURE_MAPS) - set(NO_PARTICLES)


def test_tied_embeddings_and_softmax_feat_export(tmp_path):
    model = _model("favor", seed=3, tie=True)
    convert_attention_(model, "softmax_feat", 16, generator=2)
    out = export_llama(model, _tokenizer(), tmp_path / "tied", "softmax_feat tied")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True)
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    ids = _ids(2, 150, 5)
    with torch.no_grad():
        assert (model(ids) - hf.eval()(ids).logits).abs().max().item() < 1e-4
    assert "not stated" in (out / "README.md").read_text()
    # re-exporting over an earlier export replaces it
    export_llama(model, _tokenizer(), out, "again")
    assert "**Row:** again" in (out / "README.md").read_text()


def test_padding_is_refused_except_on_the_right(tmp_path):
    model = _model("hybrid_favor")
    out = export_llama(model, _tokenizer(), tmp_path / "pad", "hybrid")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True)
    ids = _ids(2, 20, 6)
    right = torch.ones(2, 20, dtype=torch.long)
    right[1, 15:] = 0
    with torch.no_grad():
        a = hf(ids, attention_mask=right).logits
        # causal: a row's tokens never see the padding after them
        assert (a[1, :15] - hf(ids[1:, :15]).logits[0]).abs().max() < 1e-5
        left = right.flip(-1)
        with pytest.raises(ValueError, match="unpadded"):
            hf(ids, attention_mask=left)
        with pytest.raises(ValueError, match="unpadded"):
            hf.generate(ids, attention_mask=left, max_new_tokens=2)


def test_export_refuses_what_the_remote_code_cannot_compute(tmp_path):
    tok = _tokenizer()
    with pytest.raises(TypeError, match="LlamaForCausalLM"):
        export_llama(torch.nn.Linear(2, 2), tok, tmp_path / "a", "x")
    model = _model("favor")
    with pytest.raises(ValueError, match="model_card_row"):
        export_llama(model, tok, tmp_path / "a", " ")
    with pytest.raises(TypeError, match="tokenizer"):
        export_llama(model, object(), tmp_path / "a", "x")
    weighted = _model("favor")
    weighted.attention_layers[1].load_masses_(torch.rand(16) + 0.1)
    with pytest.raises(ValueError, match="masses"):
        llama_hf_config(weighted)
    mixed = _model("favor")
    mixed.attention_layers[0].set_window_(8, sinks=2)
    with pytest.raises(ValueError, match="different attentions"):
        llama_hf_config(mixed)
    from tokenizers import Tokenizer, models

    big = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V + 1)}, unk_token="w0"))
    with pytest.raises(ValueError, match="vocabulary"):
        export_llama(model, big, tmp_path / "a", "x")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not an export"):
        export_llama(model, tok, tmp_path / "busy", "x")
    assert not (tmp_path / "a").exists()

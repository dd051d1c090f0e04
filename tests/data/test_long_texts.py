"""Long texts for causal language models: the shipped sample, a user's file, token windows."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from coulomb_attention.data import long_texts, token_documents


class _Chars:
    """A stand-in tokenizer: one token per character."""

    def encode(self, text):
        return [ord(c) % 1000 for c in text]


def test_sample_is_said_to_be_a_sample_and_splits_are_by_work():
    train, src = long_texts("train")
    test, _ = long_texts("test")
    assert src.startswith("sample:") and len(train) == 2 and len(test) == 1
    assert not set(train) & set(test)


def test_user_texts_and_clear_errors(tmp_path):
    f = tmp_path / "mine.jsonl.gz"
    with gzip.open(f, "wt") as out:
        out.write(json.dumps({"text": "abc " * 10}) + "\n")
    texts, src = long_texts("train", path=f)
    assert texts == ["abc " * 10] and src == str(f)
    plain = tmp_path / "book.txt"
    plain.write_text("once upon a time")
    assert long_texts("test", path=plain)[0] == ["once upon a time"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        long_texts("train", path=tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match="shakespeare/train.jsonl.gz"):
        long_texts("train", data_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown split"):
        long_texts("dev")


def test_token_windows_never_span_two_texts():
    tok = _Chars()
    docs = token_documents(tok, ["a" * 25, "b" * 9, "c" * 10], 10)
    assert docs.shape == (3, 10)  # 2 windows of the first text, none of the second, 1 of the third
    assert (docs[0] == ord("a")).all() and (docs[2] == ord("c")).all()
    with_bos = token_documents(tok, ["a" * 25], 10, n=1, bos=7)
    assert with_bos.tolist() == [[7] + [ord("a")] * 9]
    assert token_documents(tok, ["a" * 100], 10, n=3).shape == (3, 10)
    with pytest.raises(ValueError, match="no text holds 50 tokens"):
        token_documents(tok, ["a" * 20], 50)
    assert docs.dtype == torch.long


def test_spread_windows_go_round_robin_over_the_texts():
    """spread=True: every text's first window, then every text's second, ...; the same
    windows as in order, only reordered, and the first n cover as many texts as possible."""
    tok = _Chars()
    texts = ["a" * 30, "b" * 10, "c" * 25]
    spread = token_documents(tok, texts, 10, spread=True)
    plain = token_documents(tok, texts, 10)
    assert [chr(int(d[0])) for d in spread] == ["a", "b", "c", "a", "c", "a"]
    assert sorted(map(tuple, spread.tolist())) == sorted(map(tuple, plain.tolist()))
    assert [chr(int(d[0])) for d in token_documents(tok, texts, 10, n=3, spread=True)] == \
        ["a", "b", "c"]
    assert [chr(int(d[0])) for d in token_documents(tok, texts, 10, n=3)] == ["a", "a", "a"]
    with pytest.raises(ValueError, match="no text holds 50 tokens"):
        token_documents(tok, texts, 50, spread=True)


"""Deterministic WordPiece training: a hand-worked example, the incremental trainer against the
naive reference, independence from hash and insertion order, and the tokenizer built on it
being byte-identical across processes."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from coulomb_attention.data import SAMPLES_DIR, build_tokenizer, load_task
from coulomb_attention.data.tokenizer import TRAINER
from coulomb_attention.data.wordpiece import train_wordpiece, train_wordpiece_naive

SPECIAL = ("[PAD]", "[UNK]")
# hug 10, pug 5, pun 12, bun 4, hugs 5. Pair counts: (##u,##g) 20 -> ##ug; then (##u,##n) 16
# -> ##un; (h,##ug) 15 -> hug; (p,##un) 12 -> pun; then (hug,##s) 5 ties (p,##ug) 5 and the
# smaller pair in string order wins: hugs, then pug; (b,##un) 4 -> bun.
WORDS = {"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}
ALPHABET = ["##g", "##n", "##s", "##u", "b", "h", "p"]
MERGES = ["##ug", "##un", "hug", "pun", "hugs", "pug", "bun"]


@pytest.mark.parametrize("train", [train_wordpiece, train_wordpiece_naive])
def test_hand_worked_example(train):
    full = train(WORDS, 100, min_frequency=1, special_tokens=SPECIAL)
    assert full == [*SPECIAL, *ALPHABET, *MERGES]
    # min_frequency 5 stops before (b, ##un) with 4 occurrences
    assert train(WORDS, 100, min_frequency=5, special_tokens=SPECIAL) == [
        *SPECIAL, *ALPHABET, *MERGES[:-1]]
    # vocab_size counts the special tokens and the alphabet
    assert train(WORDS, 2 + 7 + 3, min_frequency=1, special_tokens=SPECIAL) == [
        *SPECIAL, *ALPHABET, *MERGES[:3]]


def test_limit_alphabet_keeps_the_most_frequent_characters():
    # characters weighted by word counts: u 36, g 20, h 15, p 17, n 16, s 5, b 4 -> keep u, g
    vocab = train_wordpiece(WORDS, 100, min_frequency=1, limit_alphabet=2)
    # hug, pug, hugs -> "ug" (20), pun, bun -> "u" (16)
    assert vocab == ["##g", "u", "ug"]
    with pytest.raises(ValueError, match="limit_alphabet"):
        train_wordpiece(WORDS, 100, limit_alphabet=0)


@pytest.mark.parametrize("seed", range(40))
def test_incremental_trainer_equals_naive_reference(seed):
    rng = random.Random(seed)
    alphabet = "abcdé"[: rng.randint(2, 5)]
    words = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))): rng.randint(1, 6)
             for _ in range(rng.randint(1, 60))}
    kw = dict(min_frequency=rng.randint(1, 3), limit_alphabet=rng.randint(1, 5),
              special_tokens=SPECIAL)
    size = rng.randint(3, 80)
    assert train_wordpiece(words, size, **kw) == train_wordpiece_naive(words, size, **kw)


def test_independent_of_insertion_order():
    texts = load_task("rotten_tomatoes", "train", SAMPLES_DIR).texts
    counts: dict[str, int] = {}
    for (t,) in texts:
        for w in t.lower().split():
            counts[w] = counts.get(w, 0) + 1
    items = list(counts.items())
    random.Random(1).shuffle(items)
    assert train_wordpiece(counts, 800) == train_wordpiece(dict(items), 800)


@pytest.mark.parametrize("bad, match", [
    ({"": 1}, "non-empty strings"), ({"a": 0}, "positive integer"),
    ({"a": 1.5}, "positive integer"), ([("a", 1)], "mapping"),
])
def test_bad_word_counts(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        train_wordpiece(bad, 10)


def test_tokenizer_is_identical_across_processes(tmp_path):
    """The reason for this trainer: HF's WordPieceTrainer gives different vocabularies in
    different processes (huggingface/tokenizers#1794). Two fresh processes with different
    hash seeds must write byte-identical tokenizer files."""
    script = (
        "import sys\n"
        "from coulomb_attention.data import SAMPLES_DIR, build_tokenizer, load_task\n"
        "texts = load_task('qqp', 'train', SAMPLES_DIR).texts\n"
        "build_tokenizer(texts, vocab_size=1500, cache_path=sys.argv[1])\n"
    )
    for i, hash_seed in enumerate(("1", "2")):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run([sys.executable, "-c", script, str(tmp_path / f"t{i}.json")],
                       check=True, env=env, timeout=120)
    a, b = ((tmp_path / f"t{i}.json").read_bytes() for i in range(2))
    assert a == b
    meta = json.loads(a)["meta"]
    assert meta["trainer"] == TRAINER
    # ... and equal to this process's
    texts = load_task("qqp", "train", SAMPLES_DIR).texts
    here = build_tokenizer(texts, vocab_size=1500, cache_path=tmp_path / "here.json")
    assert (tmp_path / "here.json").read_bytes() == a
    assert len(here) == 1500 and here.trainer == TRAINER

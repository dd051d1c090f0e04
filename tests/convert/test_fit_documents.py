"""``convert --fit-documents L``: the conversion fitted on the training texts concatenated into
documents of L tokens (convert.data.training_documents, convert.config.document_budget)."""

from __future__ import annotations

import json

import pytest

from coulomb_attention.convert import ConvertConfig, config_json, conversion_key
from coulomb_attention.convert.config import document_budget
from coulomb_attention.convert.data import load_sentences, training_documents
from coulomb_attention.convert.distill import DistillConfig
from coulomb_attention.nn.families.bert import load_pretrained_tokenizer
from test_pretrained import write_tiny_bert


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert-docs"), qk_scale=4.0)


def test_document_budget_keeps_the_tokens_and_the_pairs_per_step():
    d = DistillConfig()
    b = document_budget(d, 64, 512)
    # 1024 / 256 / 4096 sentences of 64 tokens and 64 per step -> the same tokens in documents
    assert (b.n_examples, b.holdout, b.refine_examples, b.batch_size) == (128, 32, 512, 8)
    assert b.rows_per_sequence == d.rows_per_sequence and b.steps == d.steps
    assert b.n_examples * 512 == d.n_examples * 64
    assert b.batch_size * b.rows_per_sequence * 512 == d.batch_size * d.rows_per_sequence * 64
    # a field the user set is kept; floors; no scaling when documents are no longer
    kept = document_budget(d, 64, 512, keep=("n_examples", "batch_size"))
    assert (kept.n_examples, kept.batch_size, kept.holdout) == (1024, 64, 32)
    small = document_budget(DistillConfig(n_examples=9, holdout=0, batch_size=3), 16, 2048)
    assert (small.n_examples, small.holdout, small.batch_size) == (8, 0, 1)
    assert document_budget(d, 64, 64) == d


def test_fit_documents_field_keeps_old_keys_and_checks_its_value():
    plain = ConvertConfig()
    assert "fit_documents" not in config_json(plain)  # old caches keep their keys
    docs = ConvertConfig(fit_documents=512)
    assert config_json(docs)["fit_documents"] == 512
    assert conversion_key(docs) != conversion_key(plain)
    for bad in (-1, 4, 1.5, True):
        with pytest.raises(ValueError, match="fit_documents"):
            ConvertConfig(fit_documents=bad)
    with pytest.raises(ValueError, match="pairs"):
        ConvertConfig(fit_documents=64, distill=DistillConfig(pairs=True))


def test_training_documents_are_full_and_never_share_a_text(tiny_dir):
    tok = load_pretrained_tokenizer(tiny_dir)
    texts = [f"text number {i} is good fun" for i in range(60)] + [("a pair side", "other")]
    ids, mask, info = training_documents(tok, texts, 20, 8, seed=3)
    assert ids.shape == (8, 20) and bool(mask.all())
    assert info["length"] == 20 and info["n"] == 8 and info["texts_per_document"] >= 1
    # no text placed twice: the distinct texts used equal the placements over all documents
    assert info["texts_used"] == pytest.approx(info["texts_per_document"] * 8)
    with pytest.raises(ValueError, match="too few for 40 documents"):
        training_documents(tok, texts[:10], 20, 40, seed=0)


def test_convert_fit_documents_end_to_end(tiny_dir, tmp_path, capsys):
    """The CLI on the shipped samples: documents of 20 tokens (the tiny model has 24
    positions), the budget's scaled counts in result.json, the held-out documents apart; too
    long for the positions, or given to a decoder: one line, exit 2."""
    from coulomb_attention.cli import main

    flags = ["--encoder", str(tiny_dir), "--n-features", "6", "--max-length", "16",
             "--steps", "3", "--refine-steps", "2", "--eval-sentences", "8", "--probe-tasks",
             "--no-hf", "--no-progress"]
    rc = main(["convert", *flags, "--fit-documents", "20", "--n-sentences", "6",
               "--holdout", "3", "--refine-sentences", "8", "--out", str(tmp_path / "docs")])
    out = capsys.readouterr().out
    assert rc == 0, out
    res = json.loads((tmp_path / "docs" / "result.json").read_text())
    assert res["config"]["fit_documents"] == 20
    assert res["fit_documents"]["length"] == 20 and res["fit_documents"]["n"] == 8 + 3
    d = res["config"]["distill"]
    # given counts kept; batch_size (not given) scaled from 64 at 16 tokens to 20 tokens
    assert (d["n_examples"], d["holdout"], d["refine_examples"]) == (6, 3, 8)
    assert d["batch_size"] == 52
    records = [json.loads(x) for x in (tmp_path / "docs" / "records.jsonl").read_text()
               .splitlines()]
    assert records and all(r["n_fit"] == 6 and r["n_holdout"] == 3 for r in records)
    assert res["fidelity"]["n"] == 8  # held-out sentences, measured as without documents
    report = (tmp_path / "docs" / "report.md").read_text()
    assert "joined into 11 documents of 20 tokens" in report
    assert "held-out documents of 20 tokens" in report and "on 8 documents of 20 tokens" in report
    capsys.readouterr()
    for argv, msg in [(["--fit-documents", "30"], "30 tokens exceed"),
                      (["--fit-documents", "4"], "fit_documents"),
                      (["--model", "smollm2", "--fit-documents", "64"], "--fit-documents")]:
        rc = main(["convert", *flags, *argv, "--out", str(tmp_path / "bad")])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and msg in err and "\n" not in err, (argv, err)


def test_enough_sentences_are_drawn_for_the_documents(tiny_dir):
    from coulomb_attention.convert.data import sentences_for_documents

    tok = load_pretrained_tokenizer(tiny_dir)
    n = sentences_for_documents(11, 20)
    sentences = load_sentences(("sst2", "rotten_tomatoes"), "train", None, n, 0)
    ids, _, _ = training_documents(tok, sentences, 20, 11, seed=0)
    assert ids.shape == (11, 20)


def test_cli_defaults_at_512_tokens_are_the_budget_of_the_sentence_defaults():
    """`convert --fit-documents 512` at the defaults: 128 documents fitted, 32 held out, 512
    refined on, 8 per step (the help's figures), the rest as for sentences."""
    import argparse

    from coulomb_attention.commands.convert import add_arguments, config_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = config_from_args(p.parse_args(["--fit-documents", "512"]))
    d = cfg.distill
    assert cfg.fit_documents == 512 and cfg.max_length == 64
    assert (d.n_examples, d.holdout, d.refine_examples, d.batch_size) == (128, 32, 512, 8)
    assert d == document_budget(config_from_args(p.parse_args([])).distill, 64, 512)
    mine = config_from_args(p.parse_args(["--fit-documents", "512", "--batch-size", "4"]))
    assert mine.distill.batch_size == 4 and mine.distill.n_examples == 128

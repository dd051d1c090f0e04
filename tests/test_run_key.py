"""results.run_key, the studies' one resume key, gives the committed result files the keys
they were written with (the old ``json.dumps(..., sort_keys=True)`` of each study)."""

import json
from pathlib import Path

from coulomb_attention.reports.ablation import SPEC_KEYS, record_key
from coulomb_attention.results import read_jsonl, run_key
from coulomb_attention.studies.recall import run_key as recall_key

DOCS = Path(__file__).resolve().parents[1] / "docs" / "results"


def test_the_key_is_sorted_json_of_the_fields():
    row = {"b": 1, "a": [1, 2], "c": {"y": 1, "x": 2}}
    assert run_key(row) == '{"a": [1, 2], "b": 1, "c": {"x": 2, "y": 1}}'
    assert run_key(row, ("c", "a")) == '{"a": [1, 2], "c": {"x": 2, "y": 1}}'


def test_committed_records_keep_their_keys():
    ablation = sorted(DOCS.glob("ablation*/**/*.jsonl"))
    rows = [r for p in ablation for r in read_jsonl(p) if all(k in r for k in SPEC_KEYS)]
    assert rows
    for r in rows:
        old = {k: r[k] for k in SPEC_KEYS}
        old["M"], old["seed"] = int(old["M"]), int(old["seed"])
        assert record_key(r) == json.dumps(old, sort_keys=True)
    recall = read_jsonl(DOCS / "recall" / "results.jsonl")
    assert recall
    for r in recall:
        assert recall_key(r["config"]).startswith("{") and \
            json.loads(recall_key(r["config"])).items() <= r["config"].items()

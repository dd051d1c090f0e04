"""The MiniLM comparison (coulomb_attention.studies.minilm): variants and the table."""

from __future__ import annotations

from coulomb_attention.studies.minilm import parse_variant, table


def _row(task, variant, acc):
    return {"task": task, "variant": variant, "accuracy": acc, "ece": 0.05, "log_loss": 0.4,
            "brier": 0.1, "phase_a_s": 3.0, "phase_b_s": 10.0, "ms_per_example": 1.5}


def test_variants_and_the_gap_to_softmax_in_points():
    assert parse_variant("favor", "teacher") == {
        "attention": "favor", "kernel": "learned", "objective": "teacher"}
    assert parse_variant("favor", "softmax_align") == parse_variant("favor", "teacher")
    assert parse_variant("favor", "labels") == {
        "attention": "favor", "kernel": "learned", "objective": "labels"}
    assert parse_variant("hedgehog", "hedgehog")["distill"] == {"method": "hedgehog"}
    assert parse_variant("favor", "vanilla") == {"attention": "favor", "kernel": "vanilla"}
    text = table([_row("sst2", "softmax:vanilla", 0.90), _row("sst2", "favor:learned", 0.875),
                  _row("qqp", "favor:vanilla", 0.7)])
    lines = text.splitlines()
    assert len(lines) == 2 + 3
    assert "| sst2 | favor:learned | 0 | 0.8750 | -2.5 |" in text
    assert "| qqp | favor:vanilla | 0 | 0.7000 |  |" in text  # no softmax row for qqp: no gap


def test_bad_variants_are_refused_by_name():
    import pytest
    with pytest.raises(ValueError, match="unknown kernel 'magic'"):
        parse_variant("favor", "magic")
    with pytest.raises(ValueError, match="softmax:vanilla"):
        parse_variant("softmax", "teacher")
    with pytest.raises(ValueError, match="hedgehog:hedgehog"):
        parse_variant("favor", "hedgehog")

"""config.deep_merge: how config files, presets and flags are laid over each other."""

from __future__ import annotations

from coulomb_attention.config import deep_merge


def test_deep_merge_merges_nested_dicts_and_copies():
    base = {"model": {"dim": 64, "heads": 1}, "train": {"epochs": 4}, "seed": 0}
    over = {"model": {"dim": 32}, "train": 5, "extra": {"a": 1}}
    out = deep_merge(base, over)
    assert out == {"model": {"dim": 32, "heads": 1}, "train": 5, "seed": 0, "extra": {"a": 1}}
    assert base == {"model": {"dim": 64, "heads": 1}, "train": {"epochs": 4}, "seed": 0}
    out["extra"]["a"] = 2
    assert over["extra"] == {"a": 1}  # a new dict, not the caller's
    assert deep_merge({"x": 1}, {"x": {"y": 2}}) == {"x": {"y": 2}}

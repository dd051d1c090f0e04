"""The ablation framework (studies.ablation, commands.ablation) with a fake arena: the plan, the
resume loop (done keys skipped, an interrupted plan resumed), name validation, the command."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from coulomb_attention.cli import main
from coulomb_attention.results import read_jsonl
from coulomb_attention.studies import ablation
from coulomb_attention.studies.ablation import make_plan, run_key, run_plan, run_study


def _fake_module(calls: list, fail_at: int | None = None, extra_kw: bool = False):
    mod = types.ModuleType("fake_ablation_arena")
    mod.ARENA = "fake"

    def plan(quick, seeds, features):
        return [{"arena": "fake", "setting": "easy" if quick else "hard", "variant": v,
                 "params": {"lam": 0.1} if v == "coulomb" else {}, "M": m, "seed": s}
                for m in (features or [4, 8]) for s in seeds
                for v in ("fixed", "gradient", "coulomb")]

    def score(spec):  # deterministic, differs by variant, M and seed
        return {"fixed": 0.5, "gradient": 0.6, "coulomb": 0.65}[spec["variant"]] \
            + 0.01 * spec["M"] + 0.001 * spec["seed"]

    def run(spec, **kw):
        if fail_at is not None and len(calls) == fail_at:
            raise KeyboardInterrupt
        calls.append((run_key(spec), kw))
        return {**spec, "metric": "accuracy", "score": score(spec),
                "diagnostics": {"nn_min": 1.0}, "energy_trace": [], "time_s": 0.0}

    if extra_kw:
        def run_with_dir(spec, *, run_dir=None):
            return run(spec, run_dir=run_dir)
        mod.run = run_with_dir
    else:
        mod.run = run
    mod.plan = plan
    return mod


@pytest.fixture
def fake(monkeypatch):
    """Register the fake arena: returns a function installing a module with given options."""
    def install(**kw):
        calls: list = []
        monkeypatch.setitem(sys.modules, "fake_ablation_arena", _fake_module(calls, **kw))
        monkeypatch.setitem(ablation.ARENAS, "fake", "fake_ablation_arena")
        return calls
    return install


def test_resume_skips_done_keys(fake, tmp_path):
    calls = fake()
    first = run_study(["fake"], tmp_path, seeds=[0, 1], log=lambda s: None)
    assert first == {"planned": 12, "ran": 12, "skipped": 0,
                     "records": str(tmp_path / "records.jsonl")}
    assert len(calls) == 12
    again = run_study(["fake"], tmp_path, seeds=[0, 1], log=lambda s: None)
    assert again["ran"] == 0 and again["skipped"] == 12 and len(calls) == 12
    # a larger plan runs only the new keys
    more = run_study(["fake"], tmp_path, seeds=[0, 1, 2], log=lambda s: None)
    assert more["ran"] == 6 and more["skipped"] == 12
    keys = [run_key(r) for r in read_jsonl(tmp_path / "records.jsonl")]
    assert len(keys) == len(set(keys)) == 18


def test_resume_after_an_interruption_mid_plan(fake, tmp_path):
    calls = fake(fail_at=5)
    assert calls == []
    plan = make_plan(["fake"], seeds=[0, 1])
    with pytest.raises(KeyboardInterrupt):
        run_plan(plan, tmp_path, log=lambda s: None)
    done = [run_key(r) for r in read_jsonl(tmp_path / "records.jsonl")]
    assert done == [run_key(s) for s in plan[:5]]  # each record appended when its run ends
    calls2 = fake()
    res = run_plan(plan, tmp_path, log=lambda s: None)
    assert res["ran"] == 7 and res["skipped"] == 5
    assert [k for k, _ in calls2] == [run_key(s) for s in plan[5:]]
    assert sorted(run_key(r) for r in read_jsonl(tmp_path / "records.jsonl")) == \
        sorted(run_key(s) for s in plan)


def test_truncated_last_line_is_rerun(fake, tmp_path):
    fake()
    plan = make_plan(["fake"], seeds=[0], features=[4])
    run_plan(plan, tmp_path, log=lambda s: None)
    path = tmp_path / "records.jsonl"
    raw = path.read_bytes()
    path.write_bytes(raw[:-10])  # the last record cut mid-line (a crash during a write)
    calls = fake()
    res = run_plan(plan, tmp_path, log=lambda s: None)
    assert res["ran"] == 1 and [k for k, _ in calls] == [run_key(plan[-1])]
    assert len(read_jsonl(path)) == 3


def test_key_ignores_param_order_and_extra_fields():
    a = {"arena": "x", "setting": "s", "variant": "coulomb", "params": {"lam": 0.1, "beta": 1.0},
         "M": 8, "seed": 0}
    b = {**a, "params": {"beta": 1.0, "lam": 0.1}, "score": 0.3, "budget": {"steps": 3}}
    assert run_key(a) == run_key(b)
    assert run_key(a) != run_key({**a, "params": {"lam": 0.2, "beta": 1.0}})
    assert run_key(a) != run_key({**a, "seed": 1})
    with pytest.raises(ValueError, match="lacks M"):
        run_key({k: v for k, v in a.items() if k != "M"})


def test_unknown_names_raise_listing_the_valid_ones(fake):
    fake()
    with pytest.raises(ValueError, match="unknown arena 'nope'; valid: synthetic, mqar, convert"):
        make_plan(["nope"])
    with pytest.raises(ValueError, match="unknown variant 'bogus'; valid: fixed, gradient, "
                                         "langevin, coulomb, weighted, importance, hedgehog"):
        make_plan(["fake"], variants=["bogus"])
    with pytest.raises(ValueError, match="no arena given"):
        make_plan([])


def test_variant_filter_and_run_dir_keyword(fake, tmp_path):
    calls = fake(extra_kw=True)
    plan = make_plan(["fake"], seeds=[3], features=[4], variants=["coulomb", "fixed"])
    assert [s["variant"] for s in plan] == ["fixed", "coulomb"]
    run_plan(plan, tmp_path, log=lambda s: None)
    dirs = [kw["run_dir"] for _, kw in calls]
    assert dirs == [str(tmp_path / "runs/fake/hard/fixed-M4-s3"),
                    str(tmp_path / "runs/fake/hard/coulomb-lam0.1-M4-s3")]


def test_a_record_without_its_fields_is_refused(fake, tmp_path, monkeypatch):
    fake()
    mod = sys.modules["fake_ablation_arena"]
    monkeypatch.setattr(mod, "run", lambda spec: {**spec, "score": 1.0})
    with pytest.raises(ValueError, match="lacks metric"):
        run_plan(make_plan(["fake"], seeds=[0], features=[4]), tmp_path, log=lambda s: None)
    assert not (tmp_path / "records.jsonl").exists()


def test_command_lists_commas_quick_and_report(fake, tmp_path, capsys):
    calls = fake()
    out = tmp_path / "abl"
    assert main(["ablation", "--arena", "fake", "--quick", "--seeds", "0,1", "2",
                 "--features", "4", "--out", str(out)]) == 0
    recs = read_jsonl(out / "records.jsonl")
    # --quick picks the quick setting but never overrides the explicit seeds or features
    assert {r["seed"] for r in recs} == {0, 1, 2} and {r["M"] for r in recs} == {4}
    assert {r["setting"] for r in recs} == {"easy"} and len(calls) == 9
    assert (out / "report.md").is_file() and (out / "ablation_fake_score.png").is_file()
    report = (out / "report.md").read_text()
    assert "fake: Coulomb beats gradient at M=4: yes +0.0500" in report
    # quick without seeds: the quick default seeds
    assert main(["ablation", "--arena", "fake", "--quick", "--features", "8",
                 "--out", str(out)]) == 0
    assert {r["seed"] for r in read_jsonl(out / "records.jsonl") if r["M"] == 8} == {0, 1}
    capsys.readouterr()
    assert main(["ablation", "--arena", "nope", "--out", str(out)]) == 2
    assert "valid: synthetic, mqar, convert" in capsys.readouterr().err
    assert main(["ablation", "--arena", "fake", "--seeds", "x", "--out", str(out)]) == 2


def test_help_does_not_import_torch():
    code = ("import sys\nfrom coulomb_attention.cli import main\n"
            "try:\n    main(['ablation', '--help'])\nexcept SystemExit:\n    pass\n"
            "import json; print(json.dumps('torch' in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert "--arena" in out.stdout
    assert json.loads(out.stdout.strip().splitlines()[-1]) is False


def test_settings_filter_keeps_prefix_matches_and_refuses_an_empty_plan(fake):
    fake()
    plan = make_plan(["fake"], seeds=[0], features=[4], settings=["ha"])
    assert len(plan) == 3 and {s["setting"] for s in plan} == {"hard"}
    assert make_plan(["fake"], seeds=[0], features=[4], settings=["easy", "hard"]) == plan
    with pytest.raises(ValueError, match="no planned run has a setting starting with easy"):
        make_plan(["fake"], seeds=[0], features=[4], settings=["easy"])


def test_waves_put_the_first_run_of_each_cache_group_first(fake, monkeypatch):
    fake()
    mod = sys.modules["fake_ablation_arena"]
    plan = make_plan(["fake"], seeds=[0, 1], features=[4, 8])
    assert ablation._waves(plan) == [plan]  # no cache_group: one wave
    monkeypatch.setattr(mod, "cache_group", lambda spec: f"seed{spec['seed']}", raising=False)
    first, rest = ablation._waves(plan)
    assert [(s["seed"], s["M"], s["variant"]) for s in first] == [(0, 4, "fixed"), (1, 4, "fixed")]
    assert len(rest) == len(plan) - 2 and all(s not in first for s in rest)


def test_jobs_give_the_same_records_as_one_process(tmp_path):
    """Worker processes (spawned: the real synthetic arena, importable in a fresh interpreter)
    write the same records, only in another order."""
    plan = make_plan(["synthetic"], quick=True, seeds=[0], features=[8],
                     variants=["fixed", "gradient"])[:4]
    assert len(plan) == 4
    one = run_plan(plan, tmp_path / "one", log=lambda s: None)
    two = run_plan(plan, tmp_path / "two", jobs=2, log=lambda s: None)
    assert one["ran"] == two["ran"] == 4
    a = {run_key(r): r["score"] for r in read_jsonl(tmp_path / "one" / "records.jsonl")}
    b = {run_key(r): r["score"] for r in read_jsonl(tmp_path / "two" / "records.jsonl")}
    assert a == b
    assert run_plan(plan, tmp_path / "two", jobs=2, log=lambda s: None)["skipped"] == 4
    with pytest.raises(ValueError, match="jobs must be a positive integer"):
        run_plan(plan, tmp_path / "one", jobs=0)

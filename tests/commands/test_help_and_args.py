"""The command line's conventions: --help without torch, one list convention, presets that
never override an explicit flag, progress modes; and the --help copies of library names."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from coulomb_attention.cli import BENCHMARKS, COMMANDS, main
from coulomb_attention.commands._args import fill, list_arg, progress_mode, split_list

HELP = [[name] for name in COMMANDS] + [["bench", name] for name in BENCHMARKS] + \
    [["minilm", action] for action in ("run", "compare", "timing")] + [[]]
PROBE = ("import sys\nfrom coulomb_attention.cli import main\n"
         "try:\n    main(sys.argv[1:] + ['--help'])\nexcept SystemExit as e:\n"
         "    assert e.code == 0, e.code\n"
         "print('TORCH', 'torch' in sys.modules, file=sys.stderr)")


@pytest.fixture(scope="module")
def helps():
    """``COMMAND --help`` of every command, each in a fresh interpreter (run side by side)."""
    procs = {" ".join(argv): subprocess.Popen([sys.executable, "-c", PROBE, *argv],
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True) for argv in HELP}
    return {k: p.communicate(timeout=120) + (p.returncode,) for k, p in procs.items()}


@pytest.mark.parametrize("argv", [pytest.param(" ".join(a), id=" ".join(a) or "(top)")
                                  for a in HELP])
def test_help_prints_without_importing_torch(helps, argv):
    out, err, rc = helps[argv]
    assert rc == 0, err
    assert "usage: coulomb-attention" in out
    assert "TORCH False" in err, f"{argv or '(top)'} --help imported torch"


def test_help_copies_of_library_names_match_the_library():
    from coulomb_attention.bench import langevin as bench_langevin
    from coulomb_attention.commands import bench_langevin as bl_cmd
    from coulomb_attention.commands import synthetic as syn_cmd
    from coulomb_attention.commands import train as train_cmd
    from coulomb_attention.data.synthetic import TASKS
    from coulomb_attention.nn.attention import ATTENTION_FEATURES
    from coulomb_attention.studies.synthetic import METHODS
    from coulomb_attention.train.run import OBJECTIVES, make_run_config

    assert set(syn_cmd.TASK_NAMES) == set(TASKS) and syn_cmd.METHOD_NAMES == METHODS
    assert train_cmd.ATTENTIONS == tuple(sorted(ATTENTION_FEATURES))
    assert train_cmd.OBJECTIVES == OBJECTIVES
    scratch, pretrained = make_run_config({}), make_run_config({"encoder": "minilm"})
    assert set(train_cmd.DEFAULTS) == set(train_cmd.COMMON_FLAGS)
    for name, (path, _, _) in train_cmd.COMMON_FLAGS.items():
        got = []
        for cfg in (scratch, pretrained):
            for part in path:
                cfg = getattr(cfg, part)
            got.append(cfg)
        assert tuple(got) == train_cmd.DEFAULTS[name], name
    from coulomb_attention.commands.suite import VARIANT_NAMES
    from coulomb_attention.studies.suite import VARIANTS

    assert VARIANT_NAMES == tuple(f"{a}-{k}" for a, k in VARIANTS)
    from coulomb_attention.commands import minilm as minilm_cmd
    from coulomb_attention.studies import minilm as minilm_study

    assert minilm_cmd.VARIANT_NAMES == tuple(f"{a}:{k}" for a, k in minilm_study.VARIANTS)
    assert (bl_cmd.DEFAULT_REPEATS, bl_cmd.DEFAULT_ROUNDS, bl_cmd.MIN_ROUND_SECONDS) == (
        bench_langevin.DEFAULT_REPEATS, bench_langevin.DEFAULT_ROUNDS,
        bench_langevin.MIN_ROUND_SECONDS)


def test_lists_are_space_separated_and_accept_commas():
    assert split_list(["0", "1", "2"], int) == [0, 1, 2]
    assert split_list(["0,1", "2", "3,"], int) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="--seeds: invalid int value 'x'"):
        split_list(["0,x"], int, name="--seeds")
    with pytest.raises(ValueError, match="invalid choice 'c'"):
        split_list(["a,c"], choices=("a", "b"))
    with pytest.raises(ValueError, match="at least one value"):
        split_list([","])
    p = argparse.ArgumentParser()
    list_arg(p, "--seeds", type=int)
    list_arg(p, "--tasks", default=["a"])
    assert p.parse_args(["--seeds", "0", "1,2"]).seeds == [0, 1, 2]
    assert p.parse_args([]).tasks == ["a"] and p.parse_args([]).seeds is None


def test_every_seeds_flag_takes_a_list():
    """``--seeds`` takes the seeds themselves, space- or comma-separated, in every command that
    has it (a count is ``--n-seeds``)."""
    from coulomb_attention.cli import build_parser

    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = []
    stack = list(subs.choices.items())
    while stack:
        name, sub = stack.pop()
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack += [(f"{name} {k}", v) for k, v in action.choices.items()]
            elif "--seeds" in action.option_strings:
                found.append(name)
                assert action.nargs in ("+", "*"), f"{name} --seeds takes one value"
    assert {"synthetic", "concentration", "suite", "recall", "convert"} <= set(found)


def test_presets_fill_only_what_was_not_given():
    ns = argparse.Namespace(lengths=[64], features=None)
    fill(ns, {"lengths": [1, 2], "features": [8]})
    assert ns.lengths == [64] and ns.features == [8]


@pytest.mark.parametrize("argv,key,want", [
    (["synthetic", "--quick", "--budgets", "8"], "budgets", (8,)),
    (["synthetic", "--quick", "--seeds", "4", "5"], "seeds", (4, 5)),
    (["synthetic", "--quick"], "budgets", (16, 32, 64, 256)),
])
def test_synthetic_quick_never_overrides_an_explicit_flag(argv, key, want):
    from coulomb_attention.cli import build_parser
    from coulomb_attention.commands.synthetic import resolve_config

    args = build_parser(argv).parse_args(argv)
    assert getattr(resolve_config(args), key) == want


def test_recall_quick_with_an_invalid_explicit_flag_exits_2(tmp_path, capsys):
    assert main(["recall", "--quick", "--n-features", "0", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "n_features must be a positive integer, got 0" in err[0]
    assert not (tmp_path / "results.jsonl").exists()


def test_recall_quick_keeps_explicit_grid_flags(tmp_path):
    from coulomb_attention.cli import build_parser
    from coulomb_attention.commands.recall import grid

    argv = ["recall", "--quick", "--attentions", "favor", "--n-features", "8", "32",
            "--out", str(tmp_path)]
    runs = grid(build_parser(argv).parse_args(argv))
    assert {c.model.attention for _, c in runs} == {"favor"}
    assert sorted({c.model.n_features for _, c in runs}) == [8, 32]
    assert {lvl for lvl, _ in runs} == {"easy"} and {c.seed for _, c in runs} == {0}
    assert all(c.n_train == 4000 for _, c in runs)  # the rest of --quick still applies


class _Stream:
    def __init__(self, tty):
        self.tty = tty

    def isatty(self):
        return self.tty


def test_progress_bars_only_on_a_terminal_by_default():
    from tqdm.auto import tqdm

    try:
        assert progress_mode("auto", _Stream(False)) == "lines"
        assert tqdm(range(2), disable=False).disable  # bars off, whatever the caller asks
        assert progress_mode("none") == "none"
        assert progress_mode("auto", _Stream(True)) == "bar"
        assert not tqdm(range(2), disable=False, file=_Sink()).disable
    finally:
        progress_mode("bar")
    with pytest.raises(ValueError, match="progress must be one of"):
        progress_mode("sometimes")
    p = argparse.ArgumentParser()
    from coulomb_attention.commands._args import add_progress

    add_progress(p)
    assert p.parse_args([]).progress == "auto"
    assert p.parse_args(["--progress"]).progress == "bar"
    assert p.parse_args(["--progress", "lines"]).progress == "lines"
    assert p.parse_args(["--no-progress"]).progress == "none"


class _Sink:
    def write(self, s):
        pass

    def flush(self):
        pass


def test_convert_flag_tables_match_the_configs():
    import dataclasses

    from coulomb_attention import convert as conv
    from coulomb_attention.cli import build_parser
    from coulomb_attention.commands import convert as cmd
    from coulomb_attention.convert.distill import DistillConfig

    assert cmd.VARIANTS == conv.VARIANTS
    conv_fields = {f.name for f in dataclasses.fields(conv.ConvertConfig)}
    dist_fields = {f.name for f in dataclasses.fields(DistillConfig)}
    assert set(cmd.CONVERT_FLAGS.values()) <= conv_fields
    assert set(cmd.DISTILL_FLAGS.values()) <= dist_fields
    from coulomb_attention.convert.finish import OBJECTIVES, FinishConfig
    from coulomb_attention.nn.lora import ALL_TARGETS

    assert cmd.LORA_OBJECTIVES == tuple(OBJECTIVES) and cmd.LORA_TARGETS == ALL_TARGETS
    assert set(cmd.LORA_FLAGS.values()) <= {f.name for f in dataclasses.fields(FinishConfig)}
    # --evaluate accepts exactly the flags whose field the library lets it change
    assert set(cmd.EVALUATION_FLAGS) == {flag for flag, field in cmd.CONVERT_FLAGS.items()
                                         if field in conv.EVAL_FIELDS}
    argv = ["convert", "--out", "x", "--evaluate", "--doc-lengths", "256", "--steps", "3",
            "--feature-map", "favor"]
    with pytest.raises(ValueError, match="--feature-map, --steps"):
        cmd.evaluation_changes(build_parser(argv).parse_args(argv))
    argv = ["convert", "--out", "x", "--evaluate", "--doc-lengths", "256", "--probe-eval", "9"]
    assert cmd.evaluation_changes(build_parser(argv).parse_args(argv)) == {
        "doc_lengths": [256], "probe_eval": 9}
    argv = ["convert", "--out", "x", "--lora-rank", "4", "--lora-objective", "layers",
            "--lora-targets", "q_proj", "fc1"]
    fin = cmd.config_from_args(build_parser(argv).parse_args(argv)).finish
    assert (fin.rank, fin.objective, fin.targets) == (4, "layers", ("q_proj", "fc1"))
    assert (fin.steps, fin.aux_weight) == (FinishConfig().steps, FinishConfig().aux_weight)
    # a flag not given takes the config's default; a given one wins
    argv = ["convert", "--out", "x", "--steps", "7", "--tasks", "sst2"]
    args = build_parser(argv).parse_args(argv)
    cfg = cmd.config_from_args(args)
    default = conv.ConvertConfig()
    assert cfg.distill.steps == 7 and cfg.tasks == ("sst2",)
    assert cfg.n_features == default.n_features and cfg.encoder == default.encoder
    assert cfg.distill.lam == default.distill.lam == DistillConfig().lam
    assert cfg.distill.refine_eta_end == pytest.approx(cfg.distill.refine_eta / 10)


def test_convert_help_prints_the_configs_real_defaults():
    from coulomb_attention import convert as conv
    from coulomb_attention.commands import convert as cmd
    from coulomb_attention.convert.distill import DistillConfig
    from coulomb_attention.convert.finish import FinishConfig

    for name, config, flags in (("convert", conv.ConvertConfig(), cmd.CONVERT_FLAGS),
                                ("distill", DistillConfig(), cmd.DISTILL_FLAGS),
                                ("finish", FinishConfig(rank=1), cmd.LORA_FLAGS)):
        copy = cmd.HELP_DEFAULTS[name]
        assert set(copy) == set(flags.values()), name
        for field, value in copy.items():
            assert getattr(config, field) == value, f"{name}.{field}"
    parser = argparse.ArgumentParser()
    cmd.add_arguments(parser)
    text = parser.format_help()
    assert "Config's" not in text
    assert "(default: 150)" in text and "(default: sst2 rotten_tomatoes qqp)" in text
    assert "(default: runs/convert)" in text

"""The vocabulary (coulomb_attention.names) agrees with every registry that gives its names a
meaning, and the copies that must stay (the export's remote code, modules not yet moved onto
the vocabulary) agree with it."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import coulomb_attention
from coulomb_attention import names

ROOT = Path(coulomb_attention.__file__).parent


def test_the_vocabulary_imports_nothing():
    """Nothing but ``ast`` (the map names are read from the registry's source), and no torch."""
    tree = ast.parse((ROOT / "names.py").read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert [ast.unparse(n) for n in imports] == ["from __future__ import annotations",
                                                 "import ast"]
    code = "import sys, coulomb_attention.names; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_maps_and_attentions_match_the_registries():
    from coulomb_attention.features import MAPS
    from coulomb_attention.nn.attention import ATTENTION_FEATURES

    assert names.MAP_NAMES == tuple(MAPS)
    assert names.ATTENTION_MAPS == tuple(n for n, m in MAPS.items() if m.attention)
    assert names.ATTENTIONS == tuple(ATTENTION_FEATURES)
    no_omega = {n for n, a in ATTENTION_FEATURES.items() if a.sampler is None}
    assert set(names.NO_PARTICLES) == no_omega
    assert set(names.RECALL_ATTENTIONS) == set(names.ATTENTIONS) - {"hedgehog"}


def test_map_names_are_read_from_the_registry_source(tmp_path, monkeypatch):
    """A new map is one entry in features/maps.py: the reader finds it (name, and whether it is
    an attention map) without importing the module, and refuses what it cannot read."""
    pkg = tmp_path / "pkg"
    (pkg / "features").mkdir(parents=True)
    monkeypatch.setattr(names, "__file__", str(pkg / "names.py"))
    (pkg / "features" / "maps.py").write_text(
        "import torch\n"
        "MAPS: dict = {m.name: m for m in (\n"
        "    FeatureMap('rff', rff, 'gaussian', 'x', core='rff', attention=False),\n"
        "    FeatureMap('favor', positive, 'orthogonal', 'y'),\n"
        "    FeatureMap('cosformer', cos_features, 'orthogonal', 'z', attention=True),\n"
        ")}\n")
    assert names._registry_names("features/maps.py", "MAPS", "FeatureMap") == (
        ("rff", False), ("favor", True), ("cosformer", True))
    with pytest.raises(RuntimeError, match="assigns no REGISTRY"):
        names._registry_names("features/maps.py", "REGISTRY", "FeatureMap")
    (pkg / "features" / "maps.py").write_text(
        "NAME = 'x'\nMAPS = {m.name: m for m in (FeatureMap(NAME, None, None, 'd'),)}\n")
    with pytest.raises(RuntimeError, match="line 2.*no string literal"):
        names._registry_names("features/maps.py", "MAPS", "FeatureMap")


def test_methods_and_variants_match_the_registries():
    from coulomb_attention.data.synthetic import TASKS
    from coulomb_attention.dynamics import FIT_METHODS, METHODS, ParticleConfig
    from coulomb_attention.dynamics.variants import VARIANTS
    from coulomb_attention.studies import minilm, suite, synthetic

    assert FIT_METHODS == names.FIT_METHODS == ParticleConfig.methods
    assert METHODS == names.LEARN_METHODS
    assert set(names.RECALL_FIT_METHODS) == set(names.FIT_METHODS)
    assert names.ABLATION_VARIANTS == tuple(VARIANTS)
    assert synthetic.METHODS == names.SYNTHETIC_METHODS
    assert set(names.SYNTHETIC_TASKS) == set(TASKS)
    assert suite.VARIANTS == names.SUITE_VARIANTS and minilm.VARIANTS == names.MINILM_VARIANTS
    for attention, _ in names.SUITE_VARIANTS + names.MINILM_VARIANTS:
        assert attention in names.ATTENTIONS


def test_the_export_copy_agrees():
    """The remote code runs without this package: its list is the one allowed copy. It names
    only maps of the registry, each with its branch in the remote model; the export offers
    exactly those (a new registry map is refused by name until the remote code has it), and
    every map the export offered before the registry was read stays exportable."""
    from coulomb_attention.export import EXPORTABLE_MAPS
    from coulomb_attention.export.hf import remote_names

    copy = remote_names("configuration_coulomb_bert.py", "FEATURE_MAPS")
    assert set(copy) <= set(names.ATTENTION_MAPS)
    assert EXPORTABLE_MAPS == tuple(m for m in names.ATTENTION_MAPS if m in copy)
    assert {"favor", "porf_softplus", "softmax_feat", "hedgehog", "elu"} <= set(EXPORTABLE_MAPS)
    modeling = (ROOT / "export" / "modeling_coulomb_bert.py").read_text()
    for m in copy:
        assert f'feature_map == "{m}"' in modeling, m
    with pytest.raises(RuntimeError, match="assigns no NOPE"):
        remote_names("configuration_coulomb_bert.py", "NOPE")


def _copies(name: str, *places: str) -> list[tuple]:
    """Every module-level ``name = <strings>`` in the files or folders ``places`` (a dict: its
    keys), read from the source (the conversion package moves while this settles)."""
    found = []
    for place in places:
        path = ROOT / place
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path] * path.is_file():
            for node in ast.parse(file.read_text()).body:
                target = node.targets[0] if isinstance(node, ast.Assign) else getattr(
                    node, "target", None)
                if isinstance(target, ast.Name) and target.id == name and node.value:
                    value = node.value
                    keys = value.keys if isinstance(value, ast.Dict) else value.elts \
                        if isinstance(value, ast.Tuple | ast.List) else None
                    if keys is not None:
                        found.append(tuple(ast.literal_eval(k) for k in keys))
    return found


def test_the_library_copies_agree():
    """Copies in modules this change did not touch (train/, convert): each to be replaced by
    an import of the vocabulary."""
    from coulomb_attention.train.recall_teacher import FIT_METHODS
    from coulomb_attention.train.run import OBJECTIVES

    assert OBJECTIVES == names.TRAIN_OBJECTIVES
    assert FIT_METHODS == names.RECALL_FIT_METHODS
    assert names.RECALL_OBJECTIVES == ("token_pair", *_copies("OBJECTIVES",
                                                             "train/recall_teacher.py")[0])
    lora = _copies("OBJECTIVES", "convert", "convert.py", "train/finish.py")
    convert = _copies("VARIANTS", "convert", "convert.py")
    assert lora and set(lora) == {names.LORA_OBJECTIVES}
    assert convert and set(convert) == {names.CONVERT_VARIANTS}

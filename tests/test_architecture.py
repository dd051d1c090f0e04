"""The package's architecture (docs/architecture.md): every import points down the layer
order, and no modules import each other in a circle.

Imports are read from the source with ``ast`` (module level and inside functions alike; only
``if TYPE_CHECKING:`` blocks are left out, they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import coulomb_attention

ROOT = Path(coulomb_attention.__file__).parent
PKG = "coulomb_attention"

# Lowest first. A module may import from its own package (first name under coulomb_attention)
# and from packages of a lower layer, never from its layer or above.
LAYERS: list[set[str]] = [
    {"__init__", "_validation", "config", "names", "results", "stats", "metrics",
     "progress"},  # foundations
    {"features", "energy", "dynamics", "data"},  # the mathematics' pieces, the data
    {"estimators", "meanfield", "nn"},  # models, solvers
    {"convert"},  # pretrained encoder -> particles (a conversion is phase A of a pretrained run)
    # the training pipeline; converted encoder -> HF directory; report renderers (they read a
    # conversion directory through convert.artifact)
    {"train", "export", "reports"},
    {"studies", "bench"},  # experiments: config in, records out
    {"commands"},  # flags -> config -> library -> result files
    {"cli"},  # the entry point: names -> command modules
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path) -> set[str]:
    return _imports_in(name, path.read_text(), path.name == "__init__.py")


def _imports_in(name: str, source: str, is_pkg: bool) -> set[str]:
    """The coulomb_attention modules that module ``name`` (source text ``source``) imports (a
    ``from pkg import x`` names the module ``pkg.x`` when it is one, else ``pkg``)."""
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    found: set[str] = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.split(".")[0] == PKG)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = here[: len(here) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if target.split(".")[0] != PKG:
                    continue
                for alias in child.names:
                    sub = f"{target}.{alias.name}"
                    found.add(sub if sub in MODULES else target)
            visit(child)

    visit(ast.parse(source))
    found.discard(name)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_package_has_a_layer():
    missing = sorted({_top(m) for m in MODULES} - set(LAYER))
    assert not missing, f"add {missing} to LAYERS (and docs/architecture.md)"


def test_no_module_imports_from_its_layer_or_above():
    bad = []
    for module, targets in GRAPH.items():
        src = _top(module)
        for target in targets:
            dst = _top(target)
            if dst != src and LAYER[dst] >= LAYER[src]:
                bad.append(f"{module} -> {target} ({src}: layer {LAYER[src]}, "
                           f"{dst}: layer {LAYER[dst]})")
    assert not bad, "imports against the layer order:\n" + "\n".join(sorted(bad))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    return out


def test_no_import_circles():
    assert _cycles(GRAPH) == [], "modules importing each other in a circle"


def test_the_checks_can_fail():
    """The cycle finder and the layer rule on a made-up graph."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert LAYER["nn"] < LAYER["convert"] < LAYER["train"] < LAYER["commands"]
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
              "    from ..train import run\nfrom ..nn import model\nfrom .families import bert\n"
              "def f():\n    from ..train.run import run\n")
    assert _imports_in("coulomb_attention.nn.probe", source, False) == {
        "coulomb_attention.nn.model", "coulomb_attention.nn.families.bert",
        "coulomb_attention.train.run"}


@pytest.mark.parametrize("path", sorted((ROOT / "commands").glob("*.py")), ids=lambda p: p.name)
def test_command_modules_stay_thin(path):
    n = len(path.read_text().splitlines())
    assert n <= 250, f"{path.name} has {n} lines: move the work into a library module"


def test_every_package_is_a_regular_package():
    """setuptools' find() installs only directories with an ``__init__.py``."""
    dirs = {p.parent for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(str(d.relative_to(ROOT)) for d in dirs if not (d / "__init__.py").is_file())
    assert not missing, f"no __init__.py in {missing}"


# ---------------------------------------------------------------------------- one particle fit
# How particles move is answered in dynamics/ only (issue 34): one Adam loop
# (dynamics/adam.py) and one method dispatch (dynamics/fit.py, dynamics/driver.py).

#: torch optimisers built outside dynamics/, each a whole-model (not a particle) optimiser
ALLOWED_OPTIMISERS = {
    ("train/loop.py", "torch.optim.AdamW"): "the one training loop (warm-up, phase B): every "
    "model parameter, particles frozen as buffers",
    ("convert/finish.py", "torch.optim.Adam"): "the low-rank finishing of a converted encoder: "
    "its adapter and bias parameters, not particles",
    ("convert/decoder.py", "torch.optim.Adam"): "the end-to-end finishing of a converted "
    "decoder (after the particle transfer): the whole model's next-token KL moves particles, "
    "window weights and adapters together, as the end2end ablation (trainable_omega) does",
}

#: comparisons of a method / optimiser name with a method outside dynamics/, each not a choice
#: of how particles move
ALLOWED_METHOD_TESTS = {
    ("convert/distill.py", "config.method == 'hedgehog'"): "map switching: the layer takes "
    "Hedgehog's feature map (use_hedgehog_map_) before its particles are fitted",
    ("train/recall_teacher.py", "config.method == 'hedgehog'"): "map switching "
    "(use_hedgehog_map_), as in distill",
    ("train/recall.py", "self.fit.method in ('hedgehog', 'weighted')"): "config validation: "
    "these methods need a row objective",
    ("convert/config.py", "run_config.distill.method == 'hedgehog'"): "the converted checkpoint's "
    "variant name (Hedgehog's map or particles), not how particles move",
    ("estimators.py", "self.optimizer == 'adam'"): "the estimator's validation (no noise, no "
    "masses) and its public eta turned into Adam's lr = eta / sqrt(d), a unit conversion",
}

METHOD_NAMES = {"langevin", "weighted", "adam", "hedgehog"}
METHOD_FIELDS = {"method", "optimizer"}


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(set(), *(_strings(e) for e in node.elts))
    return set()


def _is_method_field(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id in METHOD_FIELDS) or (
        isinstance(node, ast.Attribute) and node.attr in METHOD_FIELDS)


def _particle_motion_outside_dynamics(sources: dict[str, str]):
    """``(optimisers, method tests)`` found in ``{relative path: source}`` outside dynamics/:
    each a ``(path, source text)`` pair."""
    optimisers, tests = [], []
    for rel, source in sources.items():
        if rel.startswith("dynamics/"):
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("Adam", "AdamW"):
                optimisers.append((rel, ast.unparse(node.func)))
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_is_method_field(s) for s in sides) and \
                        set().union(*(_strings(s) for s in sides)) & METHOD_NAMES:
                    tests.append((rel, ast.unparse(node)))
    return optimisers, tests


def _sources() -> dict[str, str]:
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in ROOT.rglob("*.py")}


def test_particles_move_by_dynamics_only():
    optimisers, tests = _particle_motion_outside_dynamics(_sources())
    bad = [f"{rel}: {src} (an optimiser outside dynamics/: move particles by "
           "dynamics.fit_particles / adam_fit, or list a whole-model optimiser with its reason)"
           for rel, src in optimisers if (rel, src) not in ALLOWED_OPTIMISERS]
    bad += [f"{rel}: {src} (a method dispatch outside dynamics/: let dynamics.fit_particles "
            "answer it, or list it with its reason)"
            for rel, src in tests if (rel, src) not in ALLOWED_METHOD_TESTS]
    assert not bad, "particle motion outside dynamics/:\n" + "\n".join(bad)


def test_the_particle_motion_check_catches_a_second_loop_and_a_dispatch():
    # the check itself: the old code's second Adam loop and its method dispatch fail it
    old = {"train/distill.py": (
        "def adam_fit(term, omega0, stream, steps, lr):\n"
        "    opt = torch.optim.Adam([w], lr=lr)\n"
        "def fit(config):\n"
        "    if config.method == 'weighted':\n        pass\n"
        "    elif config.method in ('hedgehog', 'adam'):\n        pass\n"),
        "dynamics/fit.py": "if config.method == 'adam':\n    torch.optim.Adam([w])\n"}
    optimisers, tests = _particle_motion_outside_dynamics(old)
    assert optimisers == [("train/distill.py", "torch.optim.Adam")]
    assert [src for _, src in tests] == ["config.method == 'weighted'",
                                         "config.method in ('hedgehog', 'adam')"]


def test_every_allowed_exception_still_exists():
    optimisers, tests = _particle_motion_outside_dynamics(_sources())
    stale = (set(ALLOWED_OPTIMISERS) - set(optimisers)) | (set(ALLOWED_METHOD_TESTS) - set(tests))
    assert not stale, f"allow-list entries that no longer occur: {sorted(stale)}"


# ------------------------------------------------------------------------ one home for names
# A list of feature-map, attention, variant or method names lives in coulomb_attention.names
# (issue 46): commands, studies, reports and the export import it. A module-level tuple, list,
# set or dict (its keys) of string literals naming two or more of them anywhere else is a copy
# that a new name would have to update, unless it is listed below with its reason.

from coulomb_attention import names as _names  # noqa: E402

#: the names the check looks for ("a:b" and "a-b" variant strings count by their parts)
VOCABULARY = set().union(_names.MAP_NAMES, _names.ATTENTIONS, _names.ABLATION_VARIANTS,
                         _names.FIT_METHODS, _names.SYNTHETIC_METHODS, _names.CONVERT_VARIANTS)

#: (file or folder, assigned name) -> why this list is not a copy of the vocabulary
ALLOWED_NAME_LISTS = {
    ("export/configuration_coulomb_bert.py", "FEATURE_MAPS"): "the Hugging Face remote code "
    "runs without this package; tests/test_names.py checks the copy against names",
    ("export/configuration_coulomb_llama.py", "FEATURE_MAPS"): "the Hugging Face remote code "
    "runs without this package; tests/export/test_llama_hf.py checks the copy against names",
    ("nn/attention.py", "ATTENTION_FEATURES"): "the registry: each attention's feature map",
    ("nn/ops/triton_linear.py", "FUSED_MAPS"): "the registry of the fused kernel's map ids",
    ("dynamics/variants.py", "VARIANTS"): "the registry: each variant's ParticleConfig "
    "overrides (tests/test_names.py checks it against names.ABLATION_VARIANTS)",
    ("studies/ablation_convert.py", "VARIANTS"): "the conversion arena's plan: the variants "
    "it runs, a selection",
    ("studies/ablation_synthetic.py", "VARIANTS"): "the synthetic arena's plan: each "
    "variant's settings",
    ("studies/ablation_synthetic.py", "_ALLOWED"): "the synthetic arena's estimator params "
    "per variant",
    ("studies/ablation_synthetic.py", "_DEFAULTS"): "the synthetic arena's default params "
    "per variant",
    ("studies/minilm.py", "KERNELS"): "the MiniLM study's registry: a kernel's run config "
    "overrides",
    ("studies/synthetic.py", "FIXED_METHODS"): "the synthetic methods without a fit, a "
    "selection of names.SYNTHETIC_METHODS",
    ("estimators.py", "OPTIMIZERS"): "the estimator's own ``optimizer`` choices (its "
    "scikit-learn parameter), a selection",
    ("dynamics/driver.py", "ADAM_METHODS"): "the driver's dispatch: the methods that take "
    "Adam's lr, a selection of names.LEARN_METHODS",
    ("studies/ablation_mqar.py", "MAPS"): "the MQAR arena's plan: the maps it runs, a selection",
    ("reports/ablation.py", "REFERENCES"): "the report's default references, a selection",
    ("reports/minilm.py", "COMPARISONS"): "the report's paired comparisons, a selection",
    ("reports/synthetic.py", "COLORS"): "a plot style per synthetic method",
    ("convert", "VARIANTS"): "pending: the conversion package is being moved; its "
    "ConvertConfig.variant list is to import names.CONVERT_VARIANTS (checked in "
    "tests/test_names.py meanwhile)",
    ("convert.py", "VARIANTS"): "pending, as convert/ (before the move)",
    ("train/recall_teacher.py", "FIT_METHODS"): "pending: train/ is edited elsewhere; to "
    "import names.RECALL_FIT_METHODS (checked in tests/test_names.py meanwhile)",
}


def _literal_names(node: ast.AST) -> list[str] | None:
    """The strings of a literal tuple / list / set (nested ones too) or of a dict's keys;
    None if ``node`` is no such literal."""
    if isinstance(node, ast.Dict):
        keys = node.keys
    elif isinstance(node, ast.Tuple | ast.List | ast.Set):
        keys = node.elts
    else:
        return None
    out = []
    for k in keys:
        if isinstance(k, ast.Constant) and isinstance(k.value, str):
            out.append(k.value)
        elif isinstance(k, ast.Tuple | ast.List):
            out.extend(_literal_names(k) or [])
    return out


def _name_lists(sources: dict[str, str]) -> list[tuple[str, str]]:
    """``(path, assigned name)`` of every module- or class-level literal list naming two or
    more names of :data:`VOCABULARY`, outside names.py."""
    found = []
    for rel, source in sources.items():
        if rel == "names.py":
            continue
        tree = ast.parse(source)
        bodies = [tree.body] + [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        for node in (n for body in bodies for n in body):
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                target, value = node.targets[0].id, node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                target, value = node.target.id, node.value
            else:
                continue
            strings = _literal_names(value) if value is not None else None
            if target == "__all__" or not strings:
                continue
            parts = {p for s in strings for p in s.replace(":", "-").split("-")} | set(strings)
            if len(parts & VOCABULARY) >= 2:
                found.append((rel, target))
    return found


def _allowed_name_list(rel: str, target: str) -> tuple[str, str] | None:
    for place, name in ALLOWED_NAME_LISTS:
        if name == target and (rel == place or rel.startswith(place + "/")):
            return place, name
    return None


def test_name_lists_live_in_the_vocabulary():
    bad = [f"{rel}: {target} (import it from coulomb_attention.names, or list it with its "
           "reason)" for rel, target in _name_lists(_sources())
           if _allowed_name_list(rel, target) is None]
    assert not bad, "name lists outside coulomb_attention.names:\n" + "\n".join(bad)


def test_every_allowed_name_list_still_exists():
    used = {_allowed_name_list(rel, t) for rel, t in _name_lists(_sources())}
    stale = set(ALLOWED_NAME_LISTS) - used
    # the conversion module or its package, whichever exists now
    stale -= {("convert.py", "VARIANTS")} if ("convert", "VARIANTS") in used else \
        {("convert", "VARIANTS")}
    assert not stale, f"allow-list entries that no longer occur: {sorted(stale)}"


def test_the_name_list_check_catches_the_old_copies():
    """Lines of the code before the vocabulary (commit 73701fd: ``git show
    73701fd:src/coulomb_attention/commands/train.py`` and the others): each copy fails."""
    old = {
        "commands/train.py": 'ATTENTIONS = ("elu", "favor", "hedgehog", "none", '
        '"porf_softplus", "softmax", "softmax_feat")\nOBJECTIVES = ("labels", "teacher")\n',
        "commands/suite.py": 'VARIANT_NAMES = ("softmax-vanilla", "none-vanilla")\n',
        "commands/minilm.py": 'VARIANT_NAMES = ("softmax:vanilla", "favor:vanilla")\n',
        "export/hf.py": 'EXPORTABLE_MAPS = ("favor", "porf_softplus", "softmax_feat")\n',
        "studies/suite.py": 'VARIANTS: tuple[tuple[str, str], ...] = (("softmax", "vanilla"),'
        ' ("none", "vanilla"))\n',
        "dynamics/config.py": 'class C:\n    FIT_METHODS = ("langevin", "weighted")\n',
        "names.py": 'MAP_NAMES = ("rff", "favor")\n',
        "commands/_args.py": '__all__ = ["favor", "elu"]\nKINDS = ("favor", "kernel")\n',
    }
    assert sorted(_name_lists(old)) == [
        ("commands/minilm.py", "VARIANT_NAMES"), ("commands/suite.py", "VARIANT_NAMES"),
        ("commands/train.py", "ATTENTIONS"), ("dynamics/config.py", "FIT_METHODS"),
        ("export/hf.py", "EXPORTABLE_MAPS"), ("studies/suite.py", "VARIANTS")]


# -------------------------------------------------------------------- one transport step
# The move of the particles (drift, noise scaled by the temperature, projection) is written
# once, in dynamics/transport.py (issue 46): a function that both draws Gaussian noise and
# projects is a second transport step.


def _transport_steps(sources: dict[str, str]) -> list[tuple[str, str]]:
    """``(path, function)`` of every function in dynamics/ whose own body (nested functions
    apart) both draws ``randn`` noise and calls a projection."""
    found = []
    for rel, source in sources.items():
        if not rel.startswith("dynamics/"):
            continue
        for fn in ast.walk(ast.parse(source)):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            calls, stack = [], list(fn.body)
            while stack:
                node = stack.pop()
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                    continue
                if isinstance(node, ast.Call):
                    calls.append(ast.unparse(node.func))
                stack.extend(ast.iter_child_nodes(node))
            noise = any(c.split(".")[-1] in ("randn", "randn_like", "normal") for c in calls)
            projects = any("project" in c.split(".")[-1] for c in calls)
            if noise and projects:
                found.append((rel, fn.name))
    return found


def test_one_transport_step():
    assert _transport_steps(_sources()) == [("dynamics/transport.py", "transport_step")]


def test_the_transport_check_catches_the_old_second_step():
    """The step as both drivers wrote it before dynamics/transport.py (``git show
    73701fd:src/coulomb_attention/dynamics/langevin.py``, ``.../weighted.py``)."""
    step = ("def {name}(projection, eta, beta):\n"
            "    def step_fn(state):\n"
            "        proposal = state.omega + drift\n"
            "        if math.isfinite(beta):\n"
            "            noise = torch.randn(omega.shape, generator=state.generator)\n"
            "            proposal = proposal + math.sqrt(2.0 * eta / beta) * noise\n"
            "        new_omega, on_boundary = projection(proposal)\n"
            "    return step_fn\n")
    old = {"dynamics/langevin.py": step.format(name="projected_langevin"),
           "dynamics/weighted.py": step.format(name="weighted_langevin"),
           "meanfield/solver.py": step.format(name="elsewhere")}
    assert sorted(_transport_steps(old)) == [("dynamics/langevin.py", "step_fn"),
                                             ("dynamics/weighted.py", "step_fn")]


# ------------------------------------------------------------------ one conversion directory
# A conversion directory's layout is known in one module, convert/artifact.py (issue 46): every
# other module reaches result.json, checkpoint/, lowrank/, hf/ and the resume state through
# convert.artifact.Artifact.
#
# What counts: a path join, i.e. ``a / b`` with a string operand, or a call of ``join``,
# ``joinpath``, ``glob`` or ``rglob`` with string arguments, whose strings (split on "/", so
# "*/result.json" and "lowrank/checkpoint" count) name an entry of CONVERSION_ENTRIES.
# ``records.jsonl``, ``speed.json`` and ``generator.safetensors`` are left out: other
# directories (the ablation's records, an export's speed table, train/checkpoint.py's phase-A
# state) hold files of those names. On 73701fd, before convert/ was a package, the check finds
# 44 path joins in 8 modules and fails on 42 of them (convert.py 21, commands/convert.py 9,
# train/run.py 4, studies/convert_grid.py 3, export/hf.py 2, reports/convert.py 2,
# studies/ablation_convert.py 1; nn/bert.py's 2 are the allowed entry); shown by running
# _conversion_paths over that commit's src/ (git worktree), and here on excerpts of it.

#: the entries of a conversion directory (convert/artifact.py's names)
CONVERSION_ENTRIES = {"result.json", "checkpoint", "lowrank", "hf", "state", "progress.json",
                      "omega.safetensors"}
_JOIN_CALLS = {"join", "joinpath", "glob", "rglob"}

#: path joins with a conversion entry's name outside convert/artifact.py, each with its reason
ALLOWED_CONVERSION_PATHS = {
    ("nn/families/bert.py", "path / 'checkpoint'"): "resolve_checkpoint_dir accepts convert's OUT "
    "directory where a checkpoint is named (OUT/checkpoint); nn lies below convert, so it "
    "cannot ask the artifact",
}


def _conversion_paths(sources: dict[str, str]) -> list[tuple[str, str]]:
    """``(path, source text)`` of every path join naming a conversion entry, outside
    convert/artifact.py, in ``{relative path: source}``."""
    found = []
    for rel, source in sources.items():
        if rel == "convert/artifact.py":
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                parts = [n.value for n in (node.left, node.right)
                         if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in _JOIN_CALLS:
                parts = [a.value for a in node.args
                         if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            else:
                continue
            if {c for p in parts for c in p.split("/")} & CONVERSION_ENTRIES:
                found.append((rel, ast.unparse(node)))
    return found


def test_only_the_artifact_opens_a_conversion_directory():
    bad = [f"{rel}: {src} (use coulomb_attention.convert.artifact.Artifact)"
           for rel, src in _conversion_paths(_sources())
           if (rel, src) not in ALLOWED_CONVERSION_PATHS]
    assert not bad, "a conversion directory opened outside convert/artifact.py:\n" + \
        "\n".join(sorted(set(bad)))


def test_the_conversion_directory_check_catches_the_old_readers():
    # excerpts of 73701fd: train/run.py's re-parse, studies/convert_grid.py's glob,
    # commands/convert.py's export paths, os.path.join; the artifact itself is exempt
    old = {
        "train/run.py": "if not (d / 'result.json').is_file() or not "
                        "(d / 'checkpoint' / 'config.json').is_file():\n    pass\n",
        "studies/convert_grid.py": "for p in sorted((out / 'grid').glob('*/result.json')):\n"
                                   "    pass\n",
        "commands/convert.py": "low = out / 'lowrank'\nx = os.path.join(out, 'hf')\n",
        "convert/artifact.py": "p = root / 'result.json'\n",
        "reports/ablation.py": "p = out / 'records.jsonl'\n",
    }
    assert sorted(_conversion_paths(old)) == [
        ("commands/convert.py", "os.path.join(out, 'hf')"),
        ("commands/convert.py", "out / 'lowrank'"),
        ("studies/convert_grid.py", "(out / 'grid').glob('*/result.json')"),
        ("train/run.py", "d / 'checkpoint'"),
        ("train/run.py", "d / 'result.json'"),
    ]


def test_every_allowed_conversion_path_still_exists():
    stale = set(ALLOWED_CONVERSION_PATHS) - set(_conversion_paths(_sources()))
    assert not stale, f"allow-list entries that no longer occur: {sorted(stale)}"

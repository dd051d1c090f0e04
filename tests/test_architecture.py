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
    {"__init__", "_validation", "config", "results", "stats", "metrics"},  # foundations
    {"features", "energy", "dynamics", "data"},  # the mathematics' pieces, the data
    {"estimators", "meanfield", "nn", "reports"},  # models, solvers, report renderers
    {"train"},  # the training pipeline
    {"convert", "export"},  # pretrained encoder -> particles; converted encoder -> HF directory
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
    assert LAYER["nn"] < LAYER["train"] < LAYER["commands"]
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
              "    from ..train import run\nfrom ..nn import model\nfrom . import bert\n"
              "def f():\n    from ..train.run import run\n")
    assert _imports_in("coulomb_attention.nn.probe", source, False) == {
        "coulomb_attention.nn.model", "coulomb_attention.nn.bert", "coulomb_attention.train.run"}


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
    ("train/finish.py", "torch.optim.Adam"): "the low-rank finishing of a converted encoder: "
    "its adapter and bias parameters, not particles",
}

#: comparisons of a method / optimiser name with a method outside dynamics/, each not a choice
#: of how particles move
ALLOWED_METHOD_TESTS = {
    ("train/distill.py", "config.method == 'hedgehog'"): "map switching: the layer takes "
    "Hedgehog's feature map (use_hedgehog_map_) before its particles are fitted",
    ("train/recall_teacher.py", "config.method == 'hedgehog'"): "map switching "
    "(use_hedgehog_map_), as in distill",
    ("train/recall.py", "self.fit.method in ('hedgehog', 'weighted')"): "config validation: "
    "these methods need a row objective",
    ("convert.py", "run_config.distill.method == 'hedgehog'"): "the converted checkpoint's "
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

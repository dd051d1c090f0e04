"""One feature-map registry (features/maps.py): a feature map defined anywhere else fails.

A feature map is a function ``phi(u, omega, ...)``: first argument the inputs (``u``, ``x``,
``q`` or ``k``), second the particles ``omega``. Outside ``features/`` only the entries of
:data:`WRAPPERS` may have that signature, each a wrapper around a registry map (or the
self-contained copy the Hugging Face export must carry), each tested against the registry.
"""

from __future__ import annotations

import ast
from pathlib import Path

import coulomb_attention

ROOT = Path(coulomb_attention.__file__).parent
INPUTS = {"u", "x", "q", "k", "inputs"}

#: module (relative to the package) -> function names allowed to take ``(inputs, omega)``
WRAPPERS: dict[str, set[str]] = {
    # the layer's map as forward uses it: dispatches to features.maps.MAPS[self.feature_map]
    "nn/attention.py": {"feature"},
    # the fused FAVOR+ fast path (stabilised, chunked); tests/nn compare it with the registry
    "nn/ops/favor.py": {"favor_features"},
    # per-head-group vmap around a registry map
    "energy/teacher.py": {"phi"},
    # the mean-field potentials' unnormalised rff / positive: call the registry maps
    "meanfield/potentials.py": {"_rff_unnormalised", "_positive_unnormalised"},
    # phase A's feature closure over the layer's registry map
    "train/phases.py": {"features"},
    # remote code of the Hugging Face directory cannot import this package: its copy is
    # checked map by map by tests/export/test_hf.py (round trip of every exportable map)
    "export/modeling_coulomb_bert.py": {"feature_logits", "kernel_features", "hybrid_features"},
    # the same for the causal LM's remote code: tests/export/test_llama_hf.py compares its
    # logits with the package's for every exported row (favor, hedgehog, hybrid, StreamingLLM)
    "export/modeling_coulomb_llama.py": {"favor_logits", "features"},
}


def map_like_functions(source: str) -> set[str]:
    """Names of the functions in ``source`` whose first two arguments (after ``self``) are an
    input and ``omega``."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = [a.arg for a in node.args.posonlyargs + node.args.args]
            if args[:1] == ["self"]:
                args = args[1:]
            if len(args) >= 2 and args[0] in INPUTS and args[1] == "omega":
                out.add(node.name)
    return out


def test_no_feature_map_outside_the_registry():
    found = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("features/"):
            continue
        extra = map_like_functions(path.read_text()) - WRAPPERS.get(rel, set())
        if extra:
            found[rel] = sorted(extra)
    assert not found, (f"feature maps outside features/maps.py: {found}; register the map in "
                       f"features.maps.MAPS (or, for a wrapper of a registered map, list it in "
                       f"WRAPPERS with the reason)")


def test_every_listed_wrapper_still_exists():
    for rel, names in WRAPPERS.items():
        assert names <= map_like_functions((ROOT / rel).read_text()), rel


def test_the_check_can_fail():
    src = "def my_elu(u, omega):\n    return (u @ omega.T).clamp(min=0)\n" \
          "class A:\n    def phi(self, x, omega, b=0):\n        return x\n" \
          "def energy(feature, omega, batches):\n    return 0\n"
    assert map_like_functions(src) == {"my_elu", "phi"}

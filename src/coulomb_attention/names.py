"""The package's one vocabulary of names: feature maps, attentions, variants, methods and
objectives, as plain string tuples (no torch: nothing but the standard library's ``ast``), so
that commands print ``--help`` without the library and studies, reports and the export read one
list instead of a copy.

The registries that give the names their meaning stay where the behaviour is
(:data:`coulomb_attention.features.MAPS`, :data:`coulomb_attention.nn.attention.ATTENTION_FEATURES`,
:data:`coulomb_attention.dynamics.variants.VARIANTS`, ...); ``tests/test_names.py`` checks that
every tuple here agrees with its registry, and ``tests/test_architecture.py`` fails on a list
of these names written anywhere else. The only other copy is the Hugging Face remote code
(``export/configuration_coulomb_bert.py``), which must run without this package.

A new feature map: its entry in :data:`coulomb_attention.features.MAPS`, its kernel if it has
one, its test. :data:`MAP_NAMES` is read from that registry's source (:func:`_registry_names`),
so the name is written once, in the entry, and this module still imports no torch.
"""

from __future__ import annotations

import ast

__all__ = [
    "ABLATION_VARIANTS",
    "ATTENTIONS",
    "ATTENTION_MAPS",
    "CONVERT_VARIANTS",
    "FIT_METHODS",
    "LEARN_METHODS",
    "LORA_OBJECTIVES",
    "MAP_NAMES",
    "MINILM_VARIANTS",
    "NO_PARTICLES",
    "RECALL_ATTENTIONS",
    "RECALL_FIT_METHODS",
    "RECALL_OBJECTIVES",
    "SUITE_VARIANTS",
    "SYNTHETIC_METHODS",
    "SYNTHETIC_TASKS",
    "TRAIN_OBJECTIVES",
]

# ------------------------------------------------------------------------------ feature maps


def _registry_names(module: str, registry: str, entry: str) -> tuple[tuple[str, bool], ...]:
    """``(name, attention)`` of every ``entry("name", ...)`` call in the value assigned to
    ``registry`` in the package module ``module`` (a path relative to this package), read from
    its source, not imported (the registry's module needs torch). ``attention`` is False only
    where the call passes ``attention=False`` literally. An entry this cannot read (a name that
    is not a string literal) is an error here, at import, not a silently missing name."""
    path = __file__[:-len("names.py")] + module
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == registry:
            break
    else:
        raise RuntimeError(f"{module} assigns no {registry}: the vocabulary cannot read it")
    found = []
    for call in ast.walk(node.value):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) \
                and call.func.id == entry:
            first = call.args[0] if call.args else None
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                raise RuntimeError(f"{module}: an {entry}(...) in {registry} (line "
                                   f"{call.lineno}) has no string literal as its name")
            attention = next((k.value for k in call.keywords if k.arg == "attention"), None)
            found.append((first.value, not (isinstance(attention, ast.Constant)
                                            and attention.value is False)))
    return tuple(found)


_MAPS = _registry_names("features/maps.py", "MAPS", "FeatureMap")
#: every feature map, in the order of :data:`coulomb_attention.features.MAPS` (read from it)
MAP_NAMES: tuple[str, ...] = tuple(name for name, _ in _MAPS)
#: the maps an attention layer takes (all but the classifier-only ``rff``); the exportable ones
ATTENTION_MAPS: tuple[str, ...] = tuple(name for name, attention in _MAPS if attention)
#: :data:`coulomb_attention.nn.attention.ATTENTION_FEATURES`: the maps, exact softmax and the
#: no-mixing control
ATTENTIONS: tuple[str, ...] = (*ATTENTION_MAPS, "softmax", "none")
#: attentions without particles (no omega: M does not apply), in the recall report's order
NO_PARTICLES: tuple[str, ...] = ("softmax", "elu", "none")
#: the recall grid's attentions (Hedgehog's map is a fit method there, not an attention)
RECALL_ATTENTIONS: tuple[str, ...] = (
    "softmax", *(m for m in ATTENTION_MAPS if m != "hedgehog"), "none")

# ---------------------------------------------------------------------- methods and variants
#: ``ParticleConfig.method``: how particles move (dynamics.fit_particles)
FIT_METHODS: tuple[str, ...] = ("langevin", "weighted", "adam", "hedgehog")
#: the methods of the unweighted driver (:func:`coulomb_attention.dynamics.learn_particles`)
LEARN_METHODS: tuple[str, ...] = tuple(m for m in FIT_METHODS if m != "weighted")
#: the recall teacher route's ``--fit-method`` choices, in its order
RECALL_FIT_METHODS: tuple[str, ...] = (*LEARN_METHODS, "weighted")
#: the ablation's variants (:data:`coulomb_attention.dynamics.variants.VARIANTS`), in the
#: order the studies plan them and the report shows them
ABLATION_VARIANTS: tuple[str, ...] = ("fixed", "gradient", "langevin", "coulomb", "weighted",
                                      "importance", "hedgehog", "end2end")
#: a converted checkpoint's variant (``ConvertConfig.variant``)
CONVERT_VARIANTS: tuple[str, ...] = ("vanilla", "particles", "hedgehog", "softmax")
#: the synthetic study's methods (estimators and the SVM), in plan order
SYNTHETIC_METHODS: tuple[str, ...] = ("rff", "orf", "importance", "particles_lam0",
                                      "particles", "svm")
#: the synthetic task families (:data:`coulomb_attention.data.synthetic.TASKS`)
SYNTHETIC_TASKS: tuple[str, ...] = ("anisotropic", "xor", "checkerboard", "radial", "spectral")
#: the suite's default (attention, kernel) variants, in table order: the three particle maps
#: with fixed and learned features, the two references without particles, and the no-mixing
#: control (``none``: softmax minus none says whether a task can rank kernels at all)
SUITE_VARIANTS: tuple[tuple[str, str], ...] = (
    ("softmax", "vanilla"),
    ("none", "vanilla"),
    ("elu", "vanilla"),
    ("favor", "vanilla"),
    ("favor", "learned"),
    ("porf_softplus", "vanilla"),
    ("porf_softplus", "learned"),
    ("softmax_feat", "vanilla"),
    ("softmax_feat", "learned"),
)
#: the MiniLM study's default (attention, kernel) comparison, in table order
MINILM_VARIANTS: tuple[tuple[str, str], ...] = (
    ("softmax", "vanilla"),
    ("favor", "vanilla"),
    ("favor", "teacher"),
    ("hedgehog", "hedgehog"),
    ("hedgehog", "teacher"),
    ("favor", "labels"),
    ("porf_softplus", "vanilla"),
    ("porf_softplus", "teacher"),
    ("softmax_feat", "vanilla"),
    ("softmax_feat", "teacher"),
)

# -------------------------------------------------------------------------------- objectives
#: ``RunConfig.objective``: phase A of a learned kernel
TRAIN_OBJECTIVES: tuple[str, ...] = ("labels", "teacher")
#: ``RecallRunConfig.objective``: label-free token pairs or the teacher route's objectives
RECALL_OBJECTIVES: tuple[str, ...] = ("token_pair", "teacher", "teacher_query", "indicator")
#: ``FinishConfig.objective``: the low-rank finishing's auxiliary targets
LORA_OBJECTIVES: tuple[str, ...] = ("embedding", "tokens", "layers")

"""A conversion's configuration: :class:`ConvertConfig`, its variants, its JSON form (stored
in ``result.json`` and compared by the cache and the resume), and the conversion that is phase A
of a pretrained-encoder training run (:func:`conversion_of_run`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._validation import check_choice, check_positive
from ..nn.attention import ATTENTION_FEATURES
from .distill import DistillConfig, WindowFitConfig
from .finish import FinishConfig

__all__ = ["EVAL_FIELDS", "VARIANTS", "ConvertConfig", "config_json", "config_of_result",
           "conversion_key", "conversion_of_run", "document_budget"]

#: Variants of the comparison: how the particles are obtained.
VARIANTS = ("vanilla", "particles", "hedgehog", "softmax")


@dataclass(frozen=True)
class ConvertConfig:
    """One conversion.

    Attributes
    ----------
    encoder : str             ``minilm`` or a BERT checkpoint directory
    feature_map : str         the map the particles move in: ``favor``, ``softmax_feat``,
                              ``porf_softplus`` or ``hedgehog`` (Hedgehog's map
                              ``[softmax(A x), softmax(B x)]``: started tied, ``B = -A``, every
                              row of omega then a particle, untied); the maps with particles
                              of :data:`coulomb_attention.features.MAPS`
    n_features : int          particles per head
    seed : int                particles, sentence draws, Langevin noise
    variant : str             ``particles`` (distilled, the method), ``vanilla`` (fresh fixed
                              features), ``hedgehog`` (baseline), ``softmax`` (the teacher)
    distill : DistillConfig   the distillation (``n_examples`` + ``holdout`` sentences)
    tasks : tuple of str      registry tasks whose *training* text is distilled on (no labels)
    sentences_file : str      optional text file, one sentence per line, instead of ``tasks``
    max_length : int          tokens per sentence (with [CLS]/[SEP])
    eval_sentences : int      held-out sentences for the fidelity (evaluation splits)
    probe_tasks : tuple       tasks of the logistic-regression probe
    probe_train : int         training examples of the probe (0: whole split)
    probe_eval : int          evaluation examples (0: whole evaluation split)
    probe_c : float           inverse L2 strength of the probe
    batch_size : int          sentences per forward pass when embedding
    finish : FinishConfig or None  low-rank finishing after the kernel stage (``particles``
                              only; with ``finish.with_particles`` it replaces the joint
                              refinement: the particles move with the adapters)
    window : int              the sliding-window hybrid (LoLCATs eq. 7, ``KernelAttention.
                              set_window_``): softmax over the ``window/2`` tokens on each side
                              plus the particles' linear term over the rest, the window weight
                              per head learned in both stages (``window_fit``); even, at most
                              the model's positions; 0: pure linear (default)
    window_linear : bool      False: the window alone, no linear term (the ablation of the
                              linear branch; nothing to learn, the stages are skipped)
    window_fit : WindowFitConfig  how the window weights are learned
    doc_lengths : tuple of int  also measure the fidelity on held-out pseudo-documents of these
                              token lengths (:func:`document_fidelity`; at most the model's
                              positions); empty: none (default)
    doc_count : int           pseudo-documents per length (>= 3)
    doc_task : str            the task whose evaluation texts are concatenated
    fit_documents : int       fit on documents of this many tokens instead of sentences: the
                              training texts (``tasks``' training splits or ``sentences_file``)
                              concatenated into documents of exactly ``fit_documents`` tokens
                              (:func:`coulomb_attention.convert.data.training_documents`; every
                              text in one document at most, so the held-out documents share no
                              text with the fitted ones); the distillation's counts
                              (``n_examples``, ``holdout``, ``refine_examples``, ``batch_size``)
                              then count documents (:func:`document_budget` scales the
                              sentence defaults to the same tokens); at most the model's
                              positions; 0: sentences of ``max_length`` (default). The held-out
                              sentence fidelity is measured as without it.
    """

    encoder: str = "minilm"
    feature_map: str = "hedgehog"
    n_features: int = 64
    seed: int = 0
    variant: str = "particles"
    distill: DistillConfig = field(default_factory=DistillConfig)
    tasks: tuple[str, ...] = ("sst2", "rotten_tomatoes", "qqp")
    sentences_file: str | None = None
    max_length: int = 64
    eval_sentences: int = 512
    probe_tasks: tuple[str, ...] = ("sst2", "rotten_tomatoes")
    probe_train: int = 2000
    probe_eval: int = 0
    probe_c: float = 1.0
    batch_size: int = 64
    finish: FinishConfig | None = None
    window: int = 0
    window_linear: bool = True
    window_fit: WindowFitConfig = field(default_factory=WindowFitConfig)
    doc_lengths: tuple[int, ...] = ()
    doc_count: int = 32
    doc_task: str = "rotten_tomatoes"
    fit_documents: int = 0

    def __post_init__(self) -> None:
        maps = [n for n, f in ATTENTION_FEATURES.items() if f.has_features]
        check_choice("feature_map", self.feature_map, maps)
        check_choice("variant", self.variant, VARIANTS)
        for name in ("n_features", "max_length", "eval_sentences", "batch_size"):
            check_positive(name, getattr(self, name), integer=True)
        for name in ("probe_train", "probe_eval"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        check_positive("probe_c", self.probe_c)
        if not isinstance(self.distill, DistillConfig):
            raise TypeError("distill must be a DistillConfig")
        object.__setattr__(self, "tasks", tuple(self.tasks))
        object.__setattr__(self, "probe_tasks", tuple(self.probe_tasks))
        if self.finish is not None:
            if not isinstance(self.finish, FinishConfig):
                raise TypeError("finish must be a FinishConfig or None")
            if self.variant != "particles":
                raise ValueError(f"low-rank finishing applies to the particles variant, not "
                                 f"{self.variant!r}")
        if self.variant == "hedgehog" and self.n_features % 2:
            raise ValueError(f"n_features must be even for the hedgehog baseline, got "
                             f"{self.n_features}")
        w = self.window
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ValueError(f"window must be an integer >= 0 (0: none), got {w!r}")
        if w % 2:
            raise ValueError(f"window must be even for an encoder (window/2 tokens on each "
                             f"side), got {w}")
        if not self.window_linear and not w:
            raise ValueError("window_linear=False (the window alone) needs a window > 0")
        if w and self.variant not in ("particles", "vanilla", "hedgehog"):
            raise ValueError(f"a window applies to a linear variant, not {self.variant!r}")
        if w and self.finish is not None:
            raise ValueError("a window and low-rank finishing are separate rows; pick one")
        if not isinstance(self.window_fit, WindowFitConfig):
            raise TypeError("window_fit must be a WindowFitConfig")
        if self.feature_map == "hedgehog" and self.n_features % 2:
            raise ValueError(f"n_features must be even for feature_map 'hedgehog', got "
                             f"{self.n_features}")
        object.__setattr__(self, "doc_lengths", tuple(self.doc_lengths))
        for n in self.doc_lengths:
            if isinstance(n, bool) or not isinstance(n, int) or n < 3:
                raise ValueError(f"doc_lengths must be integers >= 3, got {n!r}")
        if isinstance(self.doc_count, bool) or not isinstance(self.doc_count, int) or \
                self.doc_count < 3:  # Spearman of pairwise cosines needs 2 pairs or more
            raise ValueError(f"doc_count must be an integer >= 3, got {self.doc_count!r}")
        f = self.fit_documents
        if isinstance(f, bool) or not isinstance(f, int) or f < 0 or 0 < f < 8:
            raise ValueError(f"fit_documents must be 0 (sentences) or an integer >= 8 "
                             f"(tokens per document), got {f!r}")
        if f and self.distill.pairs:
            raise ValueError("fit_documents and pairs are separate inputs; pick one")


#: the fields of ConvertConfig that only the evaluation reads (``convert --evaluate`` may
#: change them without converting again)
EVAL_FIELDS = ("eval_sentences", "probe_tasks", "probe_train", "probe_eval", "probe_c",
               "doc_lengths", "doc_count", "doc_task")


def config_json(config) -> dict[str, Any]:
    d = dataclasses.asdict(config)
    if isinstance(config, ConvertConfig) and config.finish is None:
        d.pop("finish")  # configurations from before the finishing stage compare equal
    if isinstance(config, ConvertConfig) and not config.window:
        for key in ("window", "window_linear", "window_fit"):  # likewise the window's
            d.pop(key)
    if isinstance(config, ConvertConfig) and not config.distill.pairs:
        d["distill"].pop("pairs")  # and the pair sequences'
    if isinstance(config, ConvertConfig) and not config.doc_lengths:
        for key in ("doc_lengths", "doc_count", "doc_task"):  # and the pseudo-documents'
            d.pop(key)
    if isinstance(config, ConvertConfig) and not config.fit_documents:
        d.pop("fit_documents")  # and the documents' (older configurations: the same hash)
    return json.loads(json.dumps(d, default=list))


def document_budget(distill: DistillConfig, max_length: int, length: int,
                    keep: tuple[str, ...] = ()) -> DistillConfig:
    """``distill`` with its sequence counts scaled from sentences of ``max_length`` tokens to
    documents of ``length``: the same tokens fitted, held out and refined on, and the same
    query-key pairs per step (``n_examples``, ``holdout``, ``refine_examples`` and
    ``batch_size`` times ``max_length / length``, rounded up, at least 8 / 4 / 8 / 1;
    ``rows_per_sequence`` and the step counts unchanged). Fields named in ``keep`` (set by the
    user) are left as they are. MiniLM's defaults at 512 tokens: 128 documents fitted, 32
    held out, 512 refined on, 8 per step."""
    import math

    if length <= max_length:
        return distill
    f = max_length / length
    floors = {"n_examples": 8, "holdout": 4, "refine_examples": 8, "batch_size": 1}
    changes = {name: max(low, math.ceil(getattr(distill, name) * f))
               for name, low in floors.items() if name not in keep}
    if "holdout" in changes and distill.holdout == 0:
        changes["holdout"] = 0
    return dataclasses.replace(distill, **changes)


def config_of_result(saved: dict[str, Any]) -> ConvertConfig:
    """The :class:`ConvertConfig` of a ``result.json``'s ``config``."""
    from ..config import from_dict

    data = dict(saved)
    finish = data.pop("finish", None)
    return dataclasses.replace(from_dict(ConvertConfig, data), finish=None if finish is None
                               else from_dict(FinishConfig, finish))


def conversion_of_run(run_config) -> ConvertConfig:
    """The conversion that is phase A of a pretrained-encoder run with the teacher objective.

    ``run_config`` (:class:`~coulomb_attention.train.run.RunConfig`) contributes the encoder,
    the map (``attention``), ``M`` (``model.n_features``), the seed and the distillation
    (``distill``; ``distill.method == "hedgehog"`` gives the Hedgehog baseline); everything
    else is :class:`ConvertConfig`'s default, so ``coulomb-attention convert`` with the same
    four choices makes the same checkpoint, and every task reuses it (the conversion
    distils on the unlabelled training text of ``ConvertConfig.tasks``, not on one task).
    """
    variant = "hedgehog" if run_config.distill.method == "hedgehog" else "particles"
    distill = run_config.distill
    if variant == "hedgehog":
        distill = dataclasses.replace(distill, method=DistillConfig().method)
    return ConvertConfig(encoder=run_config.encoder, feature_map=run_config.attention,
                         n_features=run_config.model.n_features, seed=run_config.seed,
                         variant=variant, distill=distill)


def conversion_key(config: ConvertConfig) -> str:
    """Directory name of ``config`` in a conversion cache: readable fields + a config hash."""
    import hashlib

    digest = hashlib.sha256(json.dumps(config_json(config), sort_keys=True).encode()).hexdigest()
    encoder = Path(str(config.encoder).rstrip("/")).name or "encoder"
    return (f"{encoder}-{config.feature_map}-{config.variant}-M{config.n_features}"
            f"-s{config.seed}-{digest[:10]}")


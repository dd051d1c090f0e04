"""Convert a pretrained encoder to linear attention by distilling its attention into particles.

The package, lowest first:

* :mod:`~.capture` the inputs of an attention layer under the already converted layers;
  :mod:`~.driver` the one layer-wise driver (layers in order, the checkpoint hook, the resume);
* :mod:`~.distill` attention distillation and the joint refinement (``DistillConfig``);
  :mod:`~.finish` the optional low-rank finishing; :mod:`~.fit_features` a one-call fit;
* :mod:`~.config` :class:`ConvertConfig` and its variants; :mod:`~.data` the sentences;
* :mod:`~.evaluate` fidelity, probes, pseudo-documents; :mod:`~.timing` forward timings;
* :mod:`~.artifact` the one reader and writer of a conversion directory (torch-free);
* :mod:`~.pipeline` one conversion end to end (:func:`convert_encoder`), the cache and the
  in-memory :class:`Conversion` a training run's phase A receives (:func:`cached_conversion`);
* :mod:`~.decoder` a causal language model's conversion (:func:`convert_decoder`: the same
  distillation on long documents, every row, the end-to-end finishing); :mod:`~.lm_eval` its
  evaluation (perplexity by position, passkey, repeated text).

Result files: ``records.jsonl`` (per layer and head group: row KL / output MSE before and
after), ``result.json`` (config, fidelity, probes, times); reports and plots are made from them
by :mod:`coulomb_attention.reports.convert`.

The names below are imported on first use (PEP 562), so ``convert.artifact`` and
``convert.config``'s readers (reports, export, ``--help``) load no more than they need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

#: public name -> the submodule that defines it
_EXPORTS = {
    "Artifact": "artifact",
    "EVAL_FIELDS": "config", "VARIANTS": "config", "ConvertConfig": "config",
    "config_json": "config", "config_of_result": "config", "conversion_key": "config",
    "conversion_of_run": "config",
    "load_sentences": "data", "position_cap": "data", "read_sentence_file": "data",
    "document_fidelity": "evaluate", "embed": "evaluate", "embedding_fidelity": "evaluate",
    "evaluate_conversion": "evaluate", "evaluate_encoder": "evaluate", "held_out": "evaluate",
    "probe_features": "evaluate", "probe_metrics": "evaluate", "run_probes": "evaluate",
    "window_mass": "evaluate",
    "Conversion": "pipeline", "cached_conversion": "pipeline", "convert_encoder": "pipeline",
    "load_conversion": "pipeline",
    "speed_table": "timing", "time_forward": "timing",
    "DecoderConfig": "decoder", "convert_decoder": "decoder", "finish_decoder": "decoder",
    "load_converted": "decoder",
}

__all__ = [
    "Artifact",
    "Conversion",
    "ConvertConfig",
    "DecoderConfig",
    "EVAL_FIELDS",
    "VARIANTS",
    "cached_conversion",
    "config_json",
    "config_of_result",
    "conversion_key",
    "conversion_of_run",
    "convert_decoder",
    "convert_encoder",
    "document_fidelity",
    "embed",
    "embedding_fidelity",
    "evaluate_conversion",
    "evaluate_encoder",
    "finish_decoder",
    "held_out",
    "load_conversion",
    "load_converted",
    "load_sentences",
    "position_cap",
    "probe_features",
    "probe_metrics",
    "read_sentence_file",
    "run_probes",
    "speed_table",
    "time_forward",
    "window_mass",
]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:
    from .artifact import Artifact
    from .config import (
        EVAL_FIELDS,
        VARIANTS,
        ConvertConfig,
        config_json,
        config_of_result,
        conversion_key,
        conversion_of_run,
    )
    from .data import load_sentences, position_cap, read_sentence_file
    from .decoder import DecoderConfig, convert_decoder, finish_decoder, load_converted
    from .evaluate import (
        document_fidelity,
        embed,
        embedding_fidelity,
        evaluate_conversion,
        evaluate_encoder,
        held_out,
        probe_features,
        probe_metrics,
        run_probes,
        window_mass,
    )
    from .pipeline import Conversion, cached_conversion, convert_encoder, load_conversion
    from .timing import speed_table, time_forward

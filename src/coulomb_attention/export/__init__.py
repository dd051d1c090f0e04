"""Exports of converted encoders to other ecosystems.

:mod:`.hf`: a Hugging Face model directory (``transformers`` ``AutoModel`` and
``sentence-transformers``, with self-contained remote code
``configuration_coulomb_bert.py`` / ``modeling_coulomb_bert.py`` that import only ``torch``
and ``transformers``).
"""

from .hf import EXPORTABLE_MAPS, REMOTE_CODE, export_hf_directory, model_card

__all__ = ["EXPORTABLE_MAPS", "REMOTE_CODE", "export_hf_directory", "model_card"]

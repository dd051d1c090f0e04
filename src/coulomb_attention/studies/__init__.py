"""Studies: plans of many runs over one library, resumable, with their records as results.

:mod:`coulomb_attention.studies.ablation` is the ablation study (issue 24): one framework and
one module per arena (``ablation_synthetic``, ``ablation_mqar``, ``ablation_convert``).
"""

"""Benchmarks: a frozen config in, timings and result files out (``docs/architecture.md``).

- :mod:`.attention`      time, memory and GFLOP/s of attention versus sequence length
- :mod:`.langevin`       wall time of one projected Langevin step
- :mod:`.minilm_timing`  encoder forward time versus sequence length
- :mod:`.encoder_speed`  sentences/s of a Hugging Face export of a converted encoder against
                         the original loaded by sentence-transformers (needs the ``hf-export``
                         extra)

Submodules are imported by name; this package imports nothing.
"""

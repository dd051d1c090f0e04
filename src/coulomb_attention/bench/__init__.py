"""Benchmarks: a frozen config in, timings and result files out (``docs/architecture.md``).

- :mod:`.attention`      time, memory and GFLOP/s of attention versus sequence length
- :mod:`.langevin`       wall time of one projected Langevin step
- :mod:`.minilm_timing`  encoder forward time versus sequence length

Submodules are imported by name; this package imports nothing.
"""

"""Benchmarks that need more than this package (``transformers``, ``sentence-transformers``).

:mod:`.encoder_speed`: sentences per second of a Hugging Face export of a converted encoder
against the original loaded by sentence-transformers.
"""

"""Benchmarks and the strategy study (run from the repository root: ``python -m benchmarks.study``)."""

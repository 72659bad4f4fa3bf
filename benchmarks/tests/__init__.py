"""Tests of the benchmark scripts (run by default: pyproject's testpaths)."""

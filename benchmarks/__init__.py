"""Maintainers' benchmark scripts, run as files (python benchmarks/NAME.py); a package so that the
tests import them by name."""

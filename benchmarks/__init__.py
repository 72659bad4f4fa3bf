"""The scripts that make the tables the docs cite (benchmarks/README.md). Not part of the
installed package: run them from the repository root as ``python -m benchmarks.NAME``."""

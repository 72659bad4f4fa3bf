"""The benchmarks' results table, kept at this path so recorded commands still run; the
table is :mod:`adni_pu.workflows.results_table` (its docstring says what it reads)."""

import sys

from adni_pu.workflows.results_table import main

if __name__ == "__main__":
    sys.exit(main())

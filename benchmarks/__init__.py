"""Maintainers' benchmark scripts: ``python benchmarks/NAME.py`` or, from the repository root,
``python -m benchmarks.NAME``. They import each other and :mod:`benchmarks.common` (what they
share) through this package, which the editable install maps beside ``adni_pu``."""

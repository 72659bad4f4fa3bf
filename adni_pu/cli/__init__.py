"""The ``adni-pu`` command line: thin wrappers that parse, load settings and call the library."""

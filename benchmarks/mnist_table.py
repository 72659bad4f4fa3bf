"""The benchmarks' results table, kept at this path so recorded commands still run: the same
as ``adni-pu benchmark table`` (:mod:`adni_pu.workflows.results_table` says what it reads)."""

import sys


def main(argv: list[str] | None = None) -> int:
    """``adni-pu benchmark table`` with ``argv`` (default: this process's arguments); returns
    its exit status."""
    from adni_pu.cli.app import app

    try:
        app(["benchmark", "table", *(sys.argv[1:] if argv is None else argv)],
            prog_name="adni-pu")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 0 if done.code is None else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the benchmark scripts share: where things are, the parts every results file has
(command, date, machine, versions), the command-line plumbing, a child process on another
checkout, and the steps of the demo-style cohort benchmarks.

Light on purpose: importing it loads no numerical library, so ``--help`` stays quick.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
#: Colin27 (1 mm, with skull; ch2bet.nii.gz and aal.nii.gz beside it), from the shared data.
COLIN27 = REPO.parent / "shared" / "data" / "mri" / "colin27"


# ----------------------------------------------------------------------------- command line


def script_parser(doc: str | None) -> argparse.ArgumentParser:
    """A script's parser: its docstring's first paragraph describes it, the rest (what it
    measures, example commands) follows the options in ``--help``."""
    head, _, rest = (doc or "").strip().partition("\n\n")
    return argparse.ArgumentParser(description=head, epilog=rest.strip() or None,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_out(parser: argparse.ArgumentParser, filename: str) -> None:
    """``--out``: the results file, ``benchmarks/results/<filename>`` unless given."""
    parser.add_argument("--out", type=Path, default=RESULTS / filename,
                        help=f"results file (default: benchmarks/results/{filename})")


def command_line(script: str, argv: list[str] | None = None, prefix: str = "") -> str:
    """How a script was called, for its results file: ``python -m benchmarks.NAME ARGS``
    (``script`` is the script's ``__file__``; ``argv`` defaults to this call's)."""
    words = ["python", "-m", f"benchmarks.{Path(script).stem}",
             *(sys.argv[1:] if argv is None else argv)]
    return " ".join([prefix, *map(str, words)] if prefix else map(str, words))


def args_command(script: str, args: argparse.Namespace) -> str:
    """The command line that repeats ``args`` (every option spelled out, defaults too)."""
    return command_line(script, _options(vars(args)))


def _options(values: dict[str, Any]) -> list[str]:
    """Parsed options back as command-line words (flags bare, lists spread, paths inside
    the repository relative to it)."""
    words: list[str] = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            words += [flag] if value else []
        elif isinstance(value, (list, tuple)):
            words += [flag, *map(_word, value)]
        else:
            words += [flag, _word(value)]
    return words


def _word(value: Any) -> str:
    if isinstance(value, Path) and value.is_absolute() and value.is_relative_to(REPO):
        return str(value.relative_to(REPO))
    return str(value)


# ----------------------------------------------------------------------------- results files


def today() -> str:
    """The date, as results files record it (ISO, local)."""
    return dt.date.today().isoformat()


def machine(note: str = "") -> str:
    """This machine in words (CPU, cores, GPU), then ``note``."""
    from adni_pu.provenance import machine_description

    return machine_description() + note


def results_record(name: str, command: str, data: str, results: Any, *,
                   settings: dict[str, Any] | None = None, machine_note: str = "",
                   **fields: Any) -> dict[str, Any]:
    """A results file's record: benchmark name, command, the commit it ran on, date, machine
    (this one, plus ``machine_note``), data, settings, any other ``fields``, package
    versions, results."""
    from adni_pu.provenance import git_commit, package_versions

    record = {"benchmark": name, "command": command, "git_commit": git_commit(),
              "date": today(), "machine": machine(machine_note), "data": data}
    if settings is not None:
        record["settings"] = settings
    return {**record, **fields, "versions": package_versions(), "results": results}


def cost_parser(doc: str | None, filename: str) -> argparse.ArgumentParser:
    """The options every MNIST CPU cost benchmark takes: data, results file, threads."""
    parser = script_parser(doc)
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data/mnist"))
    add_out(parser, filename)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    return parser


def mnist_setup(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """MNIST's PU data (seed 0) and the settings every timed run shares (mlp6, CPU)."""
    import torch

    from adni_pu.data.benchmarks import load_benchmark

    torch.set_num_threads(args.threads)
    data = load_benchmark("mnist", args.data_dir, seed=0)
    return data, {"model": "mlp6", "progress": False, "device": "cpu", "threads": args.threads}


def cost_record(name: str, script: str, args: argparse.Namespace, data: str,
                settings: dict[str, Any], results: Any) -> dict[str, Any]:
    """The record of a CPU cost benchmark: its command from ``args`` and the torch threads
    it ran with (``args.threads``) beside the machine."""
    return results_record(name, args_command(script, args), data, results, settings=settings,
                          machine_note=f", {args.threads} torch thread(s)")


def write_json(path: Path, record: Any, **dump: Any) -> Path:
    """Write ``record`` as indented JSON to ``path`` (its folder made if missing), through a
    temporary file so that an interrupted write leaves the old file whole."""
    from adni_pu.fileio import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, json.dumps(record, indent=2, **dump) + "\n")


def dice(a: Any, b: Any) -> float:
    """Dice overlap of two boolean masks (0 when both are empty)."""
    return float(2 * (a & b).sum() / max(a.sum() + b.sum(), 1))


# ----------------------------------------------------------------------------- checkouts


def cli_command(*args: str) -> list[str]:
    """The ``adni-pu`` command line run by this Python, so that ``PYTHONPATH`` picks the
    package it imports (the installed ``adni-pu`` script would import this checkout's)."""
    return [sys.executable, "-c", "from adni_pu.cli.app import main; main()", *args]


def checkout_env(checkout: Path, *extra: Path, links: Path | None = None) -> dict[str, str]:
    """The environment of a child process that imports ``adni_pu`` from ``checkout`` (then
    from the folders ``extra``).

    Without ``links`` the whole checkout goes first on ``PYTHONPATH`` (its ``benchmarks``
    too). With ``links``, an empty folder that outlives the child, only a link to the
    checkout's ``adni_pu`` is put there, so that the child's ``benchmarks`` stays this
    one: how a script of this checkout is run against another checkout's package.
    """
    first = checkout.resolve()
    if links is not None:
        links.mkdir(parents=True, exist_ok=True)
        (links / "adni_pu").symlink_to(first / "adni_pu", target_is_directory=True)
        first = links
    path = os.pathsep.join(str(p) for p in (first, *extra))
    return {**os.environ, "PYTHONPATH": path}


def git_describe(checkout: Path, abbrev: int | None = None) -> str:
    """The checkout's commit (``-dirty`` when it has changes not committed)."""
    cmd = ["git", "-C", str(checkout), "describe", "--always", "--dirty"]
    if abbrev is not None:
        cmd.append(f"--abbrev={abbrev}")
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()


def mean_std_cell(values: list[float]) -> str:
    """Mean (sample std) in percent; the bare mean for one value, "-" for none."""
    from adni_pu.pu.metrics import summarise

    s = summarise(values)
    if s["n"] == 0:
        return "-"
    return f"{100 * s['mean']:.1f}" + (f" ({100 * s['std']:.1f})" if s["n"] > 1 else "")

"""What the benchmark scripts share (benchmarks/common.py): the command line a results file
records, and a child process that takes ``adni_pu`` from another checkout while keeping this
checkout's scripts."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from benchmarks.common import REPO, args_command, checkout_env, script_parser


def test_the_recorded_command_repeats_the_options_with_paths_relative_to_the_repository(
        ) -> None:
    args = argparse.Namespace(data_dir=Path("../shared/data/mnist"),
                              out=REPO / "benchmarks" / "results" / "x.json", sizes=[1, 4],
                              jvp=True, capture=False, threads=1)
    assert args_command("/anywhere/benchmarks/population_cost.py", args) == (
        "python -m benchmarks.population_cost --data-dir ../shared/data/mnist "
        "--out benchmarks/results/x.json --sizes 1 4 --jvp --threads 1")


def test_help_shows_the_docstring_after_the_options() -> None:
    parser = script_parser("What it measures.\n\n    python -m benchmarks.x --fast\n")
    parser.add_argument("--fast", action="store_true")
    text = parser.format_help()
    assert text.index("What it measures.") < text.index("\n  --fast") < text.index(
        "python -m benchmarks.x --fast")


def test_a_child_takes_adni_pu_from_the_checkout_and_benchmarks_from_here(tmp_path) -> None:
    """How ``demo_guard --code`` runs another checkout's reduced demo with this one's scripts."""
    other = tmp_path / "other"
    (other / "adni_pu").mkdir(parents=True)
    (other / "adni_pu" / "__init__.py").write_text("CHECKOUT = 'other'\n")
    (other / "benchmarks").mkdir()
    (other / "benchmarks" / "__init__.py").write_text("raise ImportError('not this one')\n")
    env = checkout_env(other, REPO, links=tmp_path / "path")
    done = subprocess.run([sys.executable, "-c", "import adni_pu, benchmarks.common as c; "
                           "print(adni_pu.CHECKOUT, c.REPO)"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["other", str(REPO)]
    # without links the whole checkout comes first: its benchmarks too
    plain = subprocess.run([sys.executable, "-c", "import benchmarks"], cwd=tmp_path,
                           env=checkout_env(other), capture_output=True, text=True, timeout=60)
    assert "not this one" in plain.stderr

"""What the benchmark scripts share (benchmarks/common.py): the a, b, b, a order of a
two-checkout comparison, the command line a results file records, and a child process that
takes ``adni_pu`` from another checkout while keeping this checkout's scripts."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from benchmarks.common import REPO, args_command, checkout_env, interleaved, script_parser


def test_interleaved_runs_every_round_a_b_b_a_and_keeps_each_sides_runs() -> None:
    calls: list[tuple[str, str]] = []

    def run(side: str, tag: str) -> dict:
        calls.append((side, tag))
        return {"n": len(calls)}

    runs = interleaved(2, run)
    assert [side for side, _ in calls] == ["a", "b", "b", "a"] * 2
    assert len({tag for _, tag in calls}) == 8  # a fresh tag (output name) per run
    assert [r["n"] for r in runs["a"]] == [1, 4, 5, 8]
    assert [r["n"] for r in runs["b"]] == [2, 3, 6, 7]


def test_the_recorded_command_repeats_the_options_with_paths_relative_to_the_repository(
        ) -> None:
    args = argparse.Namespace(data_dir=Path("../shared/data/mnist"),
                              out=REPO / "benchmarks" / "results" / "x.json", sizes=[1, 4],
                              jvp=True, capture=False, threads=1)
    assert args_command("/anywhere/benchmarks/population_cost.py", args) == (
        "python benchmarks/population_cost.py --data-dir ../shared/data/mnist "
        "--out benchmarks/results/x.json --sizes 1 4 --jvp --threads 1")


def test_help_shows_the_docstring_after_the_options() -> None:
    parser = script_parser("What it measures.\n\n    python benchmarks/x.py --fast\n")
    parser.add_argument("--fast", action="store_true")
    text = parser.format_help()
    assert text.index("What it measures.") < text.index("\n  --fast") < text.index(
        "python benchmarks/x.py --fast")


def test_a_child_takes_adni_pu_from_the_checkout_and_benchmarks_from_here(tmp_path) -> None:
    """How compare_checkouts.py runs this checkout's selfpu_cost.py on another checkout."""
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

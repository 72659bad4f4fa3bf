"""The demo's numbers are the code's numbers: a recorded reduced demo that the tests rerun.

The full demo (100 subjects, 4 methods, about 10 minutes) is too long for the test suite, so
its committed tables (``benchmarks/results/demo-seeds.*``, and the README and
docs/results.md built from them) are tied to the code through a reduced demo that runs the
same stages (generator, real preprocessing, cohort builder, the comparison of naive, nnPU
and Self-PU, pooled evaluation, reference lines) on 12 subjects for 2 epochs, and through
the folds the default demo (100 subjects) draws, which need no image:

    # after regenerating the demo tables (docs/results.md, "The demo"), record the guard
    .venv/bin/python -m benchmarks.demo_guard --record

writes ``benchmarks/results/demo-guard.json``: every held-out subject's logit per method,
the pooled metrics, and the commit of the demo tables it vouches for. The integration test
(tests/test_demo.py) runs the same reduced demo (the record's ``demo_args``) and fails when a
logit moved by more than ``LOGIT_ATOL`` (:mod:`adni_pu.workflows.demo_fingerprint`), or when
the demo tables were regenerated without recording the guard again. The tolerance is far
above float noise across CPUs (the 2-epoch logits agree to about 1e-6 between runs) and far
below what a change to preprocessing, the cohort or training gives.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from adni_pu.workflows.demo_fingerprint import LOGIT_ATOL, differences, fingerprint
from benchmarks.common import (
    REPO,
    RESULTS,
    checkout_env,
    cli_command,
    git_describe,
    script_parser,
    write_json,
)

GUARD = RESULTS / "demo-guard.json"
SEEDS = RESULTS / "demo-seeds.json"


def guard_args(out: Path) -> list[str]:
    """The reduced demo: 12 subjects of a CN/AD-heavy mix (so every fold's training and
    validation splits hold labelled positives), 2 folds, 2 epochs, three methods."""
    return ["demo", "--subjects", "12", "--out", str(out), "--epochs", "2", "--folds", "2",
            "--set", "synth.dx_proportions=[0.4, 0.05, 0.05, 0.1, 0.4]",
            "--methods", "naive,nnpu,selfpu", "--threads", "1", "--workers", "2"]


def stale_message(lines: list[str]) -> str:
    """Why the committed demo numbers no longer hold, and how to regenerate them."""
    return ("the demo's numbers moved: the committed tables (README, docs/results.md, "
            "benchmarks/results/demo-seeds.*) no longer match what the code gives:\n  "
            + "\n  ".join(lines) + "\nRegenerate them with the commands in docs/results.md, "
            "\"The demo\", then run `python -m benchmarks.demo_guard --record`.")


def seeds_commit(path: Path = SEEDS) -> str | None:
    """The commit the committed demo tables were made on."""
    return json.loads(path.read_text())["provenance"].get("git_commit")


def run_reduced_demo(out: Path, code: Path = REPO) -> dict:
    """Run the reduced demo of the checkout ``code`` through its CLI in a fresh process;
    its ``demo.json``."""
    subprocess.run(cli_command(*guard_args(out)), check=True, cwd=code,
                   stdout=subprocess.DEVNULL, env=checkout_env(code))
    return json.loads((out / "demo.json").read_text())


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--record", action="store_true",
                        help=f"run the reduced demo twice and write {GUARD.relative_to(REPO)}")
    parser.add_argument("--check", action="store_true",
                        help="run the reduced demo once and compare it with the record")
    parser.add_argument("--code", type=Path, default=REPO,
                        help="the checkout whose demo runs (default: this one)")
    parser.add_argument("--json", type=Path, help="also write this run's fingerprint here")
    args = parser.parse_args()
    from adni_pu.provenance import provenance
    from adni_pu.workflows.demo import DemoSettings, planned_folds

    with tempfile.TemporaryDirectory() as tmp:
        first = fingerprint(run_reduced_demo(Path(tmp) / "a", args.code.resolve()))
        if args.json:
            write_json(args.json, first)
        if args.check:
            lines = differences(json.loads(GUARD.read_text())["fingerprint"], first)
            print(stale_message(lines) if lines else "the demo's numbers are the code's")
            raise SystemExit(1 if lines else 0)
        if not args.record:
            if args.json:
                return
            parser.error("give --record, --check or --json")
        second = fingerprint(run_reduced_demo(Path(tmp) / "b", args.code.resolve()))
    repeat = max(abs(first[m]["logits"][s] - second[m]["logits"][s])
                 for m in first for s in first[m]["logits"])
    if differences(first, second, atol=LOGIT_ATOL / 10):
        raise SystemExit(f"the reduced demo is not repeatable on this machine (largest logit "
                         f"difference {repeat:.2e}): fix that before recording a guard")
    record = {"command": "python -m benchmarks.demo_guard --record",
              "demo_args": guard_args(Path("<tmp>")), "logit_atol": LOGIT_ATOL,
              "demo_seeds_commit": seeds_commit(),
              "code_commit": git_describe(args.code, abbrev=40),
              "repeat_max_logit_difference": repeat,
              "fingerprint": first, "default_folds": planned_folds(DemoSettings()),
              "provenance": provenance()}
    write_json(GUARD, record)
    print(f"wrote {GUARD} (two runs agree to {repeat:.1e})")


if __name__ == "__main__":
    main()

"""Run benchmarks/selfpu_cost.py against two checkouts, interleaved, in one session.

    nice python benchmarks/compare_checkouts.py --a /path/to/main --b . --rounds 2 \
        --out benchmarks/results/selfpu-cost-main-vs-branch.json -- --nnpu-epochs 3

Each round runs A then B then B then A (so drift in the machine's load affects both sides
alike), each in its own process that imports ``adni_pu`` from that checkout and runs the
same copy of selfpu_cost.py (this one, with this checkout's ``benchmarks``). The result
keeps every run, so the spread between repeats of one side says how noisy the machine was.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import (
    ABBA,
    REPO,
    add_checkouts,
    checkout_env,
    command_line,
    interleaved,
    machine,
    script_parser,
    today,
    write_json,
)

SCRIPT = Path(__file__).with_name("selfpu_cost.py")
KEYS = ("nnpu_seconds_per_epoch", "selfpu_phase2_seconds_per_epoch",
        "selfpu_phase3_seconds_per_epoch", "phase2_ratio", "phase3_ratio")


def _run(checkout: Path, extra: list[str], tmp: Path, tag: str) -> dict:
    """One run of selfpu_cost.py on ``checkout``'s package: the numbers compared."""
    out = tmp / f"{tag}.json"
    env = checkout_env(checkout, REPO, links=tmp / f"{tag}-path")
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *extra], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    result = json.loads(out.read_text())["results"]
    result["nnpu_seconds_per_epoch"] = result["nnpu_seconds_per_epoch"]["mean"]
    return {k: result[k] for k in KEYS}


def main() -> None:
    parser = script_parser(__doc__)
    add_checkouts(parser, rounds=2)
    parser.add_argument("rest", nargs="*", help="arguments for selfpu_cost.py (after --)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = interleaved(args.rounds, lambda side, tag: _run(
            getattr(args, side), args.rest, Path(tmp), tag))

    def summary(side: str) -> dict:
        return {k: {"mean": statistics.mean(r[k] for r in runs[side]),
                    "min": min(r[k] for r in runs[side]),
                    "max": max(r[k] for r in runs[side])} for k in KEYS}

    result = {
        "benchmark": "selfpu-cost-compare",
        "command": command_line(__file__),
        "date": today(),
        "machine": machine(", shared with other jobs (run under nice)"),
        "data": "MNIST (original IDX)",
        "order": "per round: " + ", ".join(ABBA),
        "a": {"checkout": str(args.a), "runs": runs["a"], "summary": summary("a")},
        "b": {"checkout": str(args.b), "runs": runs["b"], "summary": summary("b")},
    }
    write_json(args.out, result)
    print(json.dumps({s: result[s]["summary"] for s in ("a", "b")}, indent=2))


if __name__ == "__main__":
    main()

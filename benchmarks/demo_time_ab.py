"""Time `adni-pu demo` stage by stage on two checkouts, interleaved, in one session.

    nice .venv/bin/python benchmarks/demo_time_ab.py --a /path/to/old --b . --reduced \
        --out benchmarks/results/demo-time-ab.json

Each round runs A, B, B, A (drift in the machine's load hits both sides alike), each demo
in its own process that imports that checkout's ``adni_pu``, with a fresh output folder, and
keeps the demo's own per-stage seconds (``demo.json``, ``times_s``). The ratio B/A per
stage says whether a slower demo comes from the code or from the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from benchmarks import demo_guard
from benchmarks.common import (
    ABBA,
    add_checkouts,
    checkout_env,
    cli_command,
    command_line,
    git_describe,
    interleaved,
    machine,
    script_parser,
    utc_stamp,
    write_json,
)


def _demo(checkout: Path, out: Path, args: argparse.Namespace) -> dict[str, float]:
    """One demo on ``checkout``'s package: its seconds per stage."""
    demo = (demo_guard.guard_args(out) if args.reduced else
            ["demo", "--out", str(out), "--subjects", str(args.subjects)])
    cmd = cli_command(*demo, "--seed", str(args.seed))
    # run from the checkout: ``python -c`` puts the working folder before PYTHONPATH
    log = out.with_suffix(".log")
    with log.open("w") as sink:
        done = subprocess.run(cmd, env=checkout_env(checkout), cwd=checkout, stdout=sink,
                              stderr=sink)
    if done.returncode:
        raise SystemExit(f"{checkout}: the demo failed (exit {done.returncode}): "
                         + log.read_text().strip().splitlines()[-1])
    return json.loads((out / "demo.json").read_text())["times_s"]


def main() -> None:
    parser = script_parser(__doc__)
    add_checkouts(parser, rounds=1)
    parser.add_argument("--subjects", type=int, default=100)
    parser.add_argument("--reduced", action="store_true",
                        help="the reduced demo of the test suite (benchmarks/demo_guard.py)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--load", default="", help="what else ran on the machine")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = interleaved(args.rounds, lambda side, tag: _demo(
            getattr(args, side), Path(tmp) / tag, args))
    stages = list(runs["a"][0])
    mean = {s: {k: statistics.mean(run[k] for run in runs[s]) for k in stages} for s in runs}
    result = {
        "benchmark": "demo-time-ab",
        "command": command_line(__file__),
        "date": utc_stamp(),
        "machine": machine(),
        "load": args.load,
        "order": "per round: " + ", ".join(ABBA),
        "a": {"checkout": str(args.a), "commit": git_describe(args.a), "runs": runs["a"]},
        "b": {"checkout": str(args.b), "commit": git_describe(args.b), "runs": runs["b"]},
        "mean_seconds": mean,
        "ratio_b_over_a": {k: round(mean["b"][k] / mean["a"][k], 3) for k in stages
                           if mean["a"][k] > 0},
    }
    write_json(args.out, result)
    print(json.dumps(result["ratio_b_over_a"], indent=2))


if __name__ == "__main__":
    main()

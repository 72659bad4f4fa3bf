"""Run benchmarks/selfpu_cost.py against two checkouts, interleaved, in one session.

    nice python benchmarks/compare_checkouts.py --a /path/to/main --b . --rounds 2 \
        --out benchmarks/results/selfpu-cost-main-vs-branch.json -- --nnpu-epochs 3

Each round runs A then B then B then A (so drift in the machine's load affects both sides
alike), each in its own process with ``PYTHONPATH`` set to that checkout and the same copy
of selfpu_cost.py (this one). The result keeps every run, so the spread between repeats of
one side says how noisy the machine was.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from adni_pu import fileio
from adni_pu.provenance import machine_description

SCRIPT = Path(__file__).with_name("selfpu_cost.py")
KEYS = ("nnpu_seconds_per_epoch", "selfpu_phase2_seconds_per_epoch",
        "selfpu_phase3_seconds_per_epoch", "phase2_ratio", "phase3_ratio")


def _run(checkout: Path, extra: list[str], tmp: Path, tag: str) -> dict:
    out = tmp / f"{tag}.json"
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve())}
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *extra], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    result = json.loads(out.read_text())["results"]
    result["nnpu_seconds_per_epoch"] = result["nnpu_seconds_per_epoch"]["mean"]
    return {k: result[k] for k in KEYS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--a", type=Path, required=True, help="first checkout (baseline)")
    parser.add_argument("--b", type=Path, required=True, help="second checkout")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("rest", nargs="*", help="arguments for selfpu_cost.py (after --)")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for side in ("a", "b", "b", "a"):
                tag = f"{side}{r}{len(runs[side])}"
                runs[side].append(_run(getattr(args, side), args.rest, Path(tmp), tag))
                print(side, runs[side][-1], file=sys.stderr, flush=True)

    def summary(side: str) -> dict:
        return {k: {"mean": statistics.mean(r[k] for r in runs[side]),
                    "min": min(r[k] for r in runs[side]),
                    "max": max(r[k] for r in runs[side])} for k in KEYS}

    result = {
        "benchmark": "selfpu-cost-compare",
        "command": "python benchmarks/compare_checkouts.py " + " ".join(sys.argv[1:]),
        "date": dt.date.today().isoformat(),
        "machine": machine_description() + ", shared with other jobs (run under nice)",
        "data": "MNIST (original IDX)",
        "order": "per round: a, b, b, a",
        "a": {"checkout": str(args.a), "runs": runs["a"], "summary": summary("a")},
        "b": {"checkout": str(args.b), "runs": runs["b"], "summary": summary("b")},
    }
    fileio.atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(json.dumps({s: result[s]["summary"] for s in ("a", "b")}, indent=2))


if __name__ == "__main__":
    main()

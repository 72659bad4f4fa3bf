"""Time `adni-pu demo` stage by stage on two checkouts, interleaved, in one session.

    nice .venv/bin/python benchmarks/demo_time_ab.py --a /path/to/old --b . --reduced \
        --out benchmarks/results/demo-time-ab.json

Each round runs A, B, B, A (drift in the machine's load hits both sides alike), each demo
in its own process with ``PYTHONPATH`` set to that checkout and a fresh output folder, and
keeps the demo's own per-stage seconds (``demo.json``, ``times_s``). The ratio B/A per
stage says whether a slower demo comes from the code or from the machine.
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

try:
    from benchmarks import demo_guard
except ImportError:   # run as a script
    import demo_guard  # type: ignore[no-redef]


def _demo(checkout: Path, out: Path, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve())}
    demo = (demo_guard.guard_args(out) if args.reduced else
            ["demo", "--out", str(out), "--subjects", str(args.subjects)])
    cmd = [sys.executable, "-c", "from adni_pu.cli.app import main; main()", *demo,
           "--seed", str(args.seed)]
    # run from the checkout: ``python -c`` puts the working folder before PYTHONPATH
    log = out.with_suffix(".log")
    with log.open("w") as sink:
        done = subprocess.run(cmd, env=env, cwd=checkout, stdout=sink, stderr=sink)
    if done.returncode:
        raise SystemExit(f"{checkout}: the demo failed (exit {done.returncode}): "
                         + log.read_text().strip().splitlines()[-1])
    return json.loads((out / "demo.json").read_text())["times_s"]


def _commit(checkout: Path) -> str:
    return subprocess.run(["git", "-C", str(checkout), "describe", "--always", "--dirty"],
                          capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--a", type=Path, required=True, help="first checkout (baseline)")
    parser.add_argument("--b", type=Path, required=True, help="second checkout")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--subjects", type=int, default=100)
    parser.add_argument("--reduced", action="store_true",
                        help="the reduced demo of the test suite (benchmarks/demo_guard.py)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--load", default="", help="what else ran on the machine")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for side in ("a", "b", "b", "a"):
                out = Path(tmp) / f"{side}{r}{len(runs[side])}"
                runs[side].append(_demo(getattr(args, side), out, args))
                print(side, json.dumps(runs[side][-1]), file=sys.stderr, flush=True)
    stages = list(runs["a"][0])
    mean = {s: {k: statistics.mean(run[k] for run in runs[s]) for k in stages} for s in runs}
    result = {
        "benchmark": "demo-time-ab",
        "command": "python benchmarks/demo_time_ab.py " + " ".join(sys.argv[1:]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_description(),
        "load": args.load,
        "order": "per round: a, b, b, a",
        "a": {"checkout": str(args.a), "commit": _commit(args.a), "runs": runs["a"]},
        "b": {"checkout": str(args.b), "commit": _commit(args.b), "runs": runs["b"]},
        "mean_seconds": mean,
        "ratio_b_over_a": {k: round(mean["b"][k] / mean["a"][k], 3) for k in stages
                           if mean["a"][k] > 0},
    }
    fileio.atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["ratio_b_over_a"], indent=2))


if __name__ == "__main__":
    main()

"""The hostile-user probe table: every finding as a reproducible check on one checkout.

Runs each probe of ``benchmarks/hostile/`` against the ``adni_pu`` of ``--checkout`` (a clone
or worktree of this repository at any commit), each in its own fresh temporary folder, through
the command line or the library as a user would, and prints one line per probe. Run it on the
commit before the fixes and on the fixes; the two runs are the table's "before" and "after"::

    git worktree add /tmp/before b8e6988
    python -m benchmarks.hostile_probes --checkout /tmp/before --label before
    python -m benchmarks.hostile_probes --label after \\
        --merge benchmarks/results/hostile-probes-before.json \\
        --out benchmarks/results/hostile-probes.md
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks.integrity_probes import REPO, Probe, table_rows

GROUPS = ("inputs", "preprocessing", "sharing", "training")


def probes(groups: tuple[str, ...] = GROUPS) -> list[tuple[str, Callable[[Probe], str]]]:
    """The probes of ``groups``, in finding order (the number that starts each name)."""
    found = []
    for group in groups:
        found += importlib.import_module(f"benchmarks.hostile.{group}").PROBES
    return sorted(found, key=lambda item: _order(item[0]))


def _order(name: str) -> tuple[int, str]:
    head = name.split(" ", 1)[0].rstrip("abc")
    return (int(head) if head.isdigit() else 999, name)


def run(checkout: Path, only: str | None = None,
        groups: tuple[str, ...] = GROUPS) -> dict[str, str]:
    """Each probe's one-line result, keyed by finding; a probe that breaks says so."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="adni-pu-hostile-") as tmp:
        for i, (name, fn) in enumerate(probes(groups)):
            if only and only not in name:
                continue
            work = Path(tmp) / f"p{i:02d}"
            work.mkdir()
            try:
                results[name] = " ".join(fn(Probe(checkout, work)).split())
            except Exception as exc:  # noqa: BLE001 - a probe's failure is its result
                results[name] = f"probe failed: {type(exc).__name__}: {exc}"[:200]
            print(f"{name}: {results[name]}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, default=REPO)
    parser.add_argument("--label", default="after")
    parser.add_argument("--only", default=None,
                        help="run only the probes whose name contains this (their results "
                             "replace those in this label's JSON, as with --groups)")
    parser.add_argument("--groups", nargs="+", choices=GROUPS, default=list(GROUPS),
                        help="run these groups only; their results replace the same probes' "
                             "results in this label's JSON of the same commit, the others "
                             "are kept")
    parser.add_argument("--merge", type=Path, default=None,
                        help="JSON of an earlier run (another checkout) to show beside")
    parser.add_argument("--out", type=Path, default=None, help="Markdown table to write")
    args = parser.parse_args()
    # "-dirty" when the checkout has changes not committed yet
    commit = subprocess.run(["git", "-C", str(args.checkout), "describe", "--always", "--dirty",
                             "--abbrev=7"], capture_output=True, text=True).stdout.strip()
    results = run(args.checkout, args.only, tuple(args.groups))
    json_path = REPO / "benchmarks" / "results" / f"hostile-probes-{args.label}.json"
    if json_path.is_file():  # keep the other groups' results of the same commit
        earlier = json.loads(json_path.read_text())
        if earlier.get("commit") == commit:
            results = {**earlier["results"], **results}
    record = {"label": args.label, "commit": commit, "results": results}
    json_path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    if args.out is not None and args.merge is not None:
        before = json.loads(args.merge.read_text())
        lines = ["# Hostile-user probes: before and after", "",
                 f"`python -m benchmarks.hostile_probes` on {before['commit']} (before) and "
                 f"{commit} (after), 2-core CPU; each probe runs in a fresh temporary folder.",
                 "", "| finding | before | after |", "|---|---|---|"]
        lines += table_rows([name for name, _ in probes()], before["results"], results)
        args.out.write_text("\n".join(lines) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

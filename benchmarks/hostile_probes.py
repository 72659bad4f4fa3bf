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

import importlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import RESULTS, git_describe, script_parser
from benchmarks.integrity_probes import Probe, add_probe_options, outcome, write_table

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
            results[name] = outcome(fn, Probe(checkout, work), 200)
            print(f"{name}: {results[name]}", flush=True)
    return results


def main() -> None:
    parser = script_parser(__doc__)
    add_probe_options(parser)
    parser.add_argument("--only", default=None,
                        help="run only the probes whose name contains this (their results "
                             "replace those in this label's JSON, as with --groups)")
    parser.add_argument("--groups", nargs="+", choices=GROUPS, default=list(GROUPS),
                        help="run these groups only; their results replace the same probes' "
                             "results in this label's JSON of the same commit, the others "
                             "are kept")
    args = parser.parse_args()
    commit = git_describe(args.checkout, abbrev=7)
    results = run(args.checkout, args.only, tuple(args.groups))
    json_path = RESULTS / f"hostile-probes-{args.label}.json"
    if json_path.is_file():  # keep the other groups' results of the same commit
        earlier = json.loads(json_path.read_text())
        if earlier.get("commit") == commit:
            results = {**earlier["results"], **results}
    record = {"label": args.label, "commit": commit, "results": results}
    json_path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    write_table(args, commit, results, [name for name, _ in probes()],
                ("Hostile-user probes", "python -m benchmarks.hostile_probes", "finding"))


if __name__ == "__main__":
    main()

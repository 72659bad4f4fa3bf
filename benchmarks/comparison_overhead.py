"""The comparison's own time over the pieces it schedules (``adni-pu benchmark cohort``).

A comparison folder whose pieces are finished is copied, its report and the reference
line's measured volumes are removed, and the command's own work is timed on the copy:
the checks and fold manifests with every finished piece skipped (``run_comparison``), then
the report (pooled scores with their bootstrap, paired differences, the reference line's
volumes measured again, calibration, plots, records). Against it: the time the pieces
themselves took (training and scoring, each ``piece.json``'s ``train_seconds`` and
``score_seconds``, measured when they ran)::

    python -m benchmarks.comparison_overhead runs/final/demo-seed0/comparison \\
        runs/final/demo-seed1/comparison runs/final/demo-seed2/comparison

writes ``benchmarks/results/comparison-overhead.json``. Each folder is timed ``--repeats``
times; the smallest time is kept (the machine's noise only adds).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.common import RESULTS, command_line, script_parser, write_json


def own_time(folder: Path) -> dict[str, float]:
    """Seconds of the comparison's own work on a copy of ``folder``: scheduling (checks,
    fold manifests, finished pieces skipped) and the report."""
    from adni_pu.workflows.compare.pieces import run_comparison
    from adni_pu.workflows.compare.report import read_spec, write_report

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "comparison"
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns(
            "report.*", "roc.png", "calibration.png", "records", "volume_features.csv"))
        spec = read_spec(copy)
        tic = time.perf_counter()
        counts = run_comparison(spec)
        scheduling = time.perf_counter() - tic
        assert counts["trained"] == 0, f"{folder}: unfinished pieces"
        tic = time.perf_counter()
        write_report(copy, None, 1000, "benchmark")
        return {"scheduling_s": scheduling, "report_s": time.perf_counter() - tic}


def pieces_time(folder: Path) -> tuple[float, int]:
    """The pieces' own seconds (training and scoring) and their number."""
    import json

    records = [json.loads(p.read_text()) for p in sorted(folder.glob("pieces/*/*/*/piece.json"))]
    return sum(r["train_seconds"] + r["score_seconds"] for r in records), len(records)


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("folders", type=Path, nargs="+", help="finished comparison folders")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "comparison-overhead.json")
    args = parser.parse_args()
    from adni_pu.provenance import provenance

    rows = []
    for folder in args.folders:
        runs = [own_time(folder) for _ in range(args.repeats)]
        best = min(runs, key=lambda r: r["scheduling_s"] + r["report_s"])
        pieces, n = pieces_time(folder)
        own = best["scheduling_s"] + best["report_s"]
        rows.append({"folder": str(folder), "pieces": n, "pieces_s": round(pieces, 1),
                     "scheduling_s": round(best["scheduling_s"], 2),
                     "report_s": round(best["report_s"], 2), "own_s": round(own, 2),
                     "own_share": round(own / pieces, 4),
                     "all_repeats": [{k: round(v, 2) for k, v in r.items()} for r in runs]})
        print(f"{folder}: {n} pieces, {pieces:.1f} s; own {own:.2f} s "
              f"({100 * own / pieces:.1f} %: scheduling {best['scheduling_s']:.2f} s, "
              f"report {best['report_s']:.2f} s)")
    write_json(args.out, {"command": command_line(__file__), "folders": rows,
                          "provenance": provenance()})


if __name__ == "__main__":
    main()

"""``adni-pu demo`` over several seeds: wall time and every method's pooled AUC with its CI.

Each seed is a fresh cohort (the generator's seed), fresh folds and fresh training::

    # one demo per seed, timed (each writes runs/demo-seed<N>/, as the README's command)
    for s in 0 1 2; do /usr/bin/time -v adni-pu demo --out runs/demo-seed$s --seed $s \\
        2> runs/demo-seed$s.time; done
    # the table: benchmarks/results/demo-seeds.md and .json
    python benchmarks/demo_seeds.py --runs runs/demo-seed0 runs/demo-seed1 runs/demo-seed2

The table gives, per seed, each method's and each reference line's AUC [95 % CI] on the
pooled held-out subjects, the wall time (``/usr/bin/time``'s elapsed time when the
``.time`` file beside the run folder has it, else the demo's own total), the mean (std)
over seeds, and the paired difference of AUC (Self-PU minus nnPU, nnPU minus naive, nnPU
minus uPU, Self-PU minus naive, and the CNN methods minus the logistic-regression
reference) with a paired bootstrap CI over the seeds and the subjects within each seed.
Over more seeds (``--name demo-benchmark``) the same table is the synthetic benchmark.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Paired differences reported: the two, then the rest of the method ladder and the
# CNN against the logistic-regression reference (same subjects, same folds).
LOGISTIC = "logistic regression on 2 volumes"
PAIRS: tuple[tuple[str, str], ...] = (("selfpu", "nnpu"), ("nnpu", "naive"), ("nnpu", "upu"),
                                      ("selfpu", "naive"), ("selfpu", LOGISTIC),
                                      ("nnpu", LOGISTIC))


def _ci(entry: dict) -> str:
    return f"{entry['value']:.3f} [{entry['ci_low']:.3f}, {entry['ci_high']:.3f}]"


def _wall(run: Path, record: dict) -> tuple[float, str]:
    """Seconds of the whole command (``/usr/bin/time -v``) or the demo's own total."""
    timing = run.parent / f"{run.name}.time"
    if timing.is_file():
        match = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)",
                          timing.read_text())
        if match:
            h, m, s = match.groups()
            return int(h or 0) * 3600 + int(m) * 60 + float(s), "/usr/bin/time"
    return float(record["times_s"]["total"]), "demo total"


def _predictions(record: dict, name: str) -> list[dict]:
    """Per-subject held-out predictions of a method or a reference line of one seed."""
    source = record["results"] if name in record["results"] else record["references"]
    return source[name]["predictions"]


def _mean_row(summary: list[dict], methods: list[str], refs: list[str]) -> str:
    """The table's last row: mean (std) over seeds of each AUC, and of the wall time."""
    from adni_pu.pu.metrics import summarise

    def cell(values: list[float]) -> str:
        d = summarise(values)
        return f"{d['mean']:.3f} ({d['std']:.3f})"

    wall = summarise([s["wall_s"] / 60 for s in summary])["mean"]
    cells = [cell([s["auc"][m]["value"] for s in summary]) for m in methods]
    cells += [cell([s["references"][r]["value"] for s in summary]) for r in refs]
    return (f"| mean (std) | {wall:.1f} min | {sum(s['n_scored'] for s in summary)} "
            "in all | " + " | ".join(cells) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, nargs="+", required=True)
    p.add_argument("--name", default="demo-seeds")
    p.add_argument("--load", default="", help="load average while measuring (for the record)")
    p.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results")
    args = p.parse_args()

    import pandas as pd

    from adni_pu.fileio import atomic_write_text
    from adni_pu.provenance import provenance
    from adni_pu.workflows.crossval import paired_difference

    records = {run: json.loads((run / "demo.json").read_text()) for run in args.runs}
    methods = list(next(iter(records.values()))["results"])
    refs = list(next(iter(records.values()))["references"])
    rows = ["| seed | wall time | scored (positive) | " + " | ".join(methods)
            + " | " + " | ".join(f"*{r}*" for r in refs) + " |",
            "|---|---|---|" + "---|" * (len(methods) + len(refs))]
    summary = []
    for run, rec in records.items():
        seed = rec["settings"]["seed"]
        wall, source = _wall(run, rec)
        first = rec["results"][methods[0]]["pooled"]
        cells = [_ci(rec["results"][m]["pooled"]["metrics"]["auc"]) for m in methods]
        cells += [_ci(rec["references"][r]["pooled"]["metrics"]["auc"]) for r in refs]
        rows.append(f"| {seed} | {wall / 60:.1f} min | {first['n_scored']} "
                    f"({first['n_positive']}) | " + " | ".join(cells) + " |")
        summary.append({"run": str(run), "seed": seed, "wall_s": round(wall, 1),
                        "n_scored": first["n_scored"],
                        "wall_source": source, "times_s": rec["times_s"],
                        "auc": {m: rec["results"][m]["pooled"]["metrics"]["auc"]
                                for m in methods},
                        "references": {r: rec["references"][r]["pooled"]["metrics"]["auc"]
                                       for r in refs},
                        "nn_correction": {m: rec["results"][m]["nn_correction"]
                                          for m in methods}})
    above = {m: sum(s["auc"][m]["ci_low"] > 0.5 for s in summary) for m in methods}
    rows.append(_mean_row(summary, methods, refs))
    paired = []
    for a, b in PAIRS:
        if not {a, b} <= set(methods) | set(refs):
            continue
        frames = {m: pd.concat([pd.DataFrame(_predictions(rec, m)).assign(
            seed=rec["settings"]["seed"]) for rec in records.values()]) for m in (a, b)}
        d = paired_difference(frames[a], frames[b])
        paired.append({"pair": f"{a} - {b}", **d})
    lines = [f"# adni-pu demo over {len(summary)} seed(s)", "",
             "Every method's AUC [95 % CI, percentile bootstrap over subjects] on the pooled "
             "held-out subjects of the seed's cross-validation; reference lines in italics. "
             "Command per seed: `adni-pu demo --out runs/demo-seed<N> --seed <N>` (the README's "
             "command with a seed)." + (f" Load average while measuring: {args.load}."
                                        if args.load else ""), "", *rows, "",
             "Seeds whose AUC CI lies above 0.5: "
             + ", ".join(f"{m} {above[m]} of {len(summary)}" for m in methods) + ".", "",
             "Paired difference of AUC, 95 % CI from a paired bootstrap over the seeds and "
             "the subjects within each seed (1000 resamples):", "",
             "| difference | AUC difference [95 % CI] | share of resamples > 0 | subject-seeds |",
             "|---|---|---|---|"]
    for d in paired:
        lines.append(f"| {d['pair']} | {d['value']:+.3f} [{d['ci_low']:+.3f}, "
                     f"{d['ci_high']:+.3f}] | {d['share_a_better']:.2f} | {d['n_subjects']} |")
    lines += ["", "From `python benchmarks/demo_seeds.py --runs "
              + " ".join(str(r) for r in args.runs) + "`.", ""]
    out = args.out_dir
    atomic_write_text(out / f"{args.name}.md", "\n".join(lines))
    atomic_write_text(out / f"{args.name}.json", json.dumps(
        {"command": "python benchmarks/demo_seeds.py " + " ".join(sys.argv[1:]),
         "seeds": summary, "paired": paired, "load": args.load,
         "provenance": provenance()}, indent=2, default=str) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

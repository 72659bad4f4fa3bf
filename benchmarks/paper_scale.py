"""The paper's ADNI testbed at its scale, on a synthetic cohort: naive, uPU, nnPU, Self-PU.

935 synthetic subjects with ADNI's composition (the generator's defaults, docs/volumes.md
"Composition") and the demo's disease effects, labelled by the ``paper`` preset (labelled:
diagnosed patients; truth: that diagnosis or SUVR >= 1.08, so amyloid-positive MCI and CN
are hidden in the unlabelled set). Per seed a subject-level split holds out 113 subjects
(the paper's test count) and trains and validates on the other 822 (15 % of all subjects
validate), stratified by label and truth. The 3-branch CNN and every training setting are
the demo's (chosen on the demo's tuning cohorts, ``benchmarks/results/demo-tuning-log.md``);
nothing here was tuned, and the test split is scored once, after training.

In pieces that each write their own results file, so a run cut short keeps what finished
and every piece can run on another machine::

    # 1. generate the cohort once (and preprocess it: ``--preprocessing real``, about an
    #    hour on 2 cores; the default uses the generator's ideal model-grid volumes)
    python benchmarks/paper_scale.py prepare --work runs/paper-scale
    # 2. one method and one seed per call (seed = split seed = training seed); resumable
    python benchmarks/paper_scale.py run --work runs/paper-scale --method nnpu --seed 0
    # 3. the table over the results files found
    python benchmarks/paper_scale.py table

Results: ``benchmarks/results/paper-scale/<method>-seed<S>.json`` (metrics with CIs over
subjects, per-subject test predictions, wall time, machine, settings, versions) and
``benchmarks/results/paper-scale-table.md`` / ``.json``: accuracy (the paper's number),
AUC and hidden-positive recall per method as mean (std) over seeds, paired differences of
accuracy with a bootstrap CI over seeds and subjects, the all-negative and all-positive
reference lines, and the paper's ADNI table beside.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from adni_pu.fileio import atomic_write_text
from adni_pu.pu.metrics import TABLE_METRICS, metric_label
from benchmarks.common import (
    REPO,
    add_prepare_options,
    add_run_options,
    command_line,
    mean_std_cell,
    prepare_cohort,
    script_parser,
    train_on_split,
    write_json,
)

RESULTS = REPO / "benchmarks" / "results" / "paper-scale"
METHODS = ("naive", "upu", "nnpu", "selfpu")
#: The paper's ADNI testbed (Chen et al., ICML 2020): 822 train, 113 test subjects.
SUBJECTS, TEST_SUBJECTS = 935, 113
VAL_FRACTION = 0.15
#: The paper's ADNI accuracies (%), test-selected on its private split.
PAPER = {"naive": 73.27, "upu": 73.45, "nnpu": 75.96, "selfpu": 79.50}
PAIRS: tuple[tuple[str, str], ...] = (("nnpu", "naive"), ("selfpu", "nnpu"), ("nnpu", "upu"),
                                      ("selfpu", "naive"))


def _settings(work: Path, subjects: int, cohort_seed: int, preprocessing: str, workers: int):
    from adni_pu.workflows.demo import DemoSettings

    return DemoSettings(subjects=subjects, out=work, preprocessing=preprocessing,
                        workers=workers, seed=cohort_seed)


def prepare(args: argparse.Namespace) -> None:
    """Generate (and with ``--preprocessing real`` preprocess) the cohort once."""
    settings = _settings(args.work, args.subjects, args.cohort_seed, args.preprocessing,
                         args.workers)
    prepare_cohort(settings, {"subjects": args.subjects, "cohort_seed": args.cohort_seed,
                              "synth": settings.synth, "workers": args.workers})


def run(args: argparse.Namespace) -> None:
    """Train one method on one seed's split and score its held-out subjects once."""
    from adni_pu.cohort import pu_summary
    from adni_pu.provenance import provenance

    subjects = json.loads((args.work / "prepared.json").read_text())["subjects"]
    tic = time.perf_counter()
    done = train_on_split(args, print, test_fraction=TEST_SUBJECTS / subjects,
                          val_fraction=VAL_FRACTION)
    info, pooled, manifest = done["info"], done["pooled"], done["cohort"].manifest
    splits = {s: pu_summary(manifest[manifest["split"] == s]) for s in ("train", "val", "test")}
    out = {
        "benchmark": "paper-scale synthetic ADNI: naive vs uPU vs nnPU vs Self-PU",
        "command": command_line(__file__),
        "date": time.strftime("%Y-%m-%d"), "machine": f"{args.machine}; torch threads "
        f"{args.threads}", "data": f"synthetic ADNI-like cohort ({info['preprocessing']})",
        "method": args.method, "seed": args.seed, "epochs": args.epochs,
        "cohort": {"subjects": info["subjects"], "cohort_seed": info["cohort_seed"],
                   "synth": info["synth"], "prior": done["prior"],
                   "prior_note": done["prior_note"], "splits": splits},
        "settings": done["settings"], "overrides": args.set,
        "wall_s": round(time.perf_counter() - tic, 1),
        "metrics": pooled["metrics"], "n_scored": pooled["n_scored"],
        "n_positive": pooled["n_positive"], "n_hidden": pooled.get("n_hidden"),
        "result": done["record"], "provenance": provenance(),
    }
    path = write_json(args.results / f"{args.method}-seed{args.seed}.json", out, default=str)
    m = pooled["metrics"]
    print(f"{args.method} seed {args.seed}: accuracy {m['accuracy']['value']:.3f}, AUC "
          f"{m['auc']['value']:.3f}, hidden-positive recall "
          f"{m['hidden_positive_recall']['value']:.3f} ({out['wall_s']:.0f} s) -> {path}")


def load_results(directory: Path) -> dict[str, list[dict]]:
    """Every results file of ``directory``, by method, sorted by seed."""
    out: dict[str, list[dict]] = {}
    for method in METHODS:
        recs = [json.loads(f.read_text()) for f in directory.glob(f"{method}-seed*.json")]
        if recs:
            out[method] = sorted(recs, key=lambda r: r["seed"])
    return out


def paired_rows(results: dict[str, list[dict]], n_boot: int = 1000) -> list[dict]:
    """Paired differences (accuracy and AUC) on the seeds both methods have."""
    import pandas as pd

    from adni_pu.workflows.crossval import paired_difference

    rows = []
    for a, b in PAIRS:
        if a not in results or b not in results:
            continue
        seeds = sorted({r["seed"] for r in results[a]} & {r["seed"] for r in results[b]})
        if not seeds:
            continue
        frames = {m: pd.concat([pd.DataFrame(r["result"]["predictions"]).assign(seed=r["seed"])
                                for r in results[m] if r["seed"] in seeds]) for m in (a, b)}
        for metric in ("accuracy", "auc", "hidden_positive_recall"):
            d = paired_difference(frames[a], frames[b], n_boot=n_boot, metric=metric)
            rows.append({"pair": f"{a} - {b}", "metric": metric, "seeds": seeds, **d})
    return rows


def table(args: argparse.Namespace) -> None:
    """Aggregate the results files into the table beside the paper's."""
    from adni_pu.provenance import provenance
    from adni_pu.pu.metrics import summarise

    results = load_results(args.results)
    if not results:
        raise SystemExit(f"no results files in {args.results}")
    head = ["method", "seeds", *(metric_label(m) for m in TABLE_METRICS),
            "paper accuracy", "minutes per run", "machine"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    summary = {}
    for method, recs in results.items():
        cells = [mean_std_cell([r["metrics"][m]["value"] for r in recs]) for m in TABLE_METRICS]
        minutes = summarise([r["wall_s"] / 60 for r in recs])["mean"]
        machines = sorted({r["machine"] for r in recs})
        rows.append(f"| {method} | {', '.join(str(r['seed']) for r in recs)} | "
                    + " | ".join(cells) + f" | {PAPER[method]:.2f} | {minutes:.0f} | "
                    + "; ".join(machines) + " |")
        summary[method] = {m: summarise([r["metrics"][m]["value"] for r in recs])
                           for m in TABLE_METRICS}
        summary[method]["seeds"] = [r["seed"] for r in recs]
        summary[method]["wall_s"] = [r["wall_s"] for r in recs]
    any_recs = next(iter(results.values()))
    for name, key in (("call everyone negative", "all_negative_accuracy"),
                      ("call everyone positive", "all_positive_accuracy")):
        rows.append(f"| *reference: {name}* | {', '.join(str(r['seed']) for r in any_recs)} | "
                    + mean_std_cell([r["metrics"][key]["value"] for r in any_recs])
                    + " |" + " - |" * (len(head) - 3))
    paired = paired_rows(results, args.boot)
    first = any_recs[0]
    test = first["cohort"]["splits"]["test"]
    train = first["cohort"]["splits"]["train"]
    lines = [
        "# The paper's ADNI testbed at its scale (synthetic cohort)", "",
        f"{first['cohort']['subjects']} subjects, cohort seed "
        f"{first['cohort']['cohort_seed']}: {first['data']}; labels by the `paper` preset; per "
        f"seed {test['subjects']} held out, {train['subjects']} trained on and the rest "
        f"({first['cohort']['subjects'] - test['subjects'] - train['subjects']}) validated "
        "on, by subject. The first seed's training split: "
        f"n_p = {train['n_p']}, class prior {train['class_prior']:.3f}, "
        f"{train['hidden_positive']} hidden positives ({train['hidden_share']:.0%} of the "
        f"positives); its test split: {test['hidden_positive']} hidden positives of "
        f"{test['truth_positive']} positives. Test split, mean (std) over seeds, percent; "
        "each seed's metrics are on its own held-out subjects.", "",
        *rows, "",
        "Paired differences (percentage points), 95 % CI from a paired bootstrap over the "
        f"seeds and the held-out subjects within each seed ({args.boot} resamples):", "",
        "| difference | metric | value [95 % CI] | share of resamples > 0 | seeds |",
        "|---|---|---|---|---|"]
    for d in paired:
        lines.append(f"| {d['pair']} | {d['metric'].replace('_', ' ')} | "
                     f"{100 * d['value']:+.1f} [{100 * d['ci_low']:+.1f}, "
                     f"{100 * d['ci_high']:+.1f}] | {d['share_a_better']:.2f} | "
                     f"{', '.join(map(str, d['seeds']))} |")
    lines += ["", "The paper's column is its ADNI table (Chen et al., ICML 2020): accuracy on "
              "its private 113-subject test split, with the model chosen on that split's "
              "curve; ours are chosen on validation. Different data: read the columns for "
              "the ordering and the size of the PU effect, not for equal numbers.", "",
              "From `python benchmarks/paper_scale.py table` over "
              f"`{args.results.relative_to(REPO) if args.results.is_relative_to(REPO) else args.results}"
              "/*.json` (each file has its command, settings, machine and versions).", ""]
    text = "\n".join(lines)
    atomic_write_text(args.out.with_suffix(".md"), text)
    write_json(args.out.with_suffix(".json"), {
        "command": command_line(__file__), "paper": PAPER, "methods": summary,
        "paired": paired, "provenance": provenance()}, default=str)
    print(text)


def main() -> None:
    parser = script_parser(__doc__)
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare", help="generate (and preprocess) the cohort")
    add_prepare_options(p, "runs/paper-scale", subjects=SUBJECTS)
    p.add_argument("--preprocessing", choices=("ideal", "real"), default="ideal")
    r = sub.add_parser("run", help="train and test one method with one seed")
    add_run_options(r, METHODS, "runs/paper-scale", epochs=8, threads=2)
    r.add_argument("--results", type=Path, default=RESULTS,
                   help="folder for the results file (another machine's pieces)")
    t = sub.add_parser("table", help="aggregate the results files")
    t.add_argument("--results", type=Path, default=RESULTS)
    t.add_argument("--out", type=Path, default=RESULTS.parent / "paper-scale-table.md")
    t.add_argument("--boot", type=int, default=1000)
    args = parser.parse_args()
    {"prepare": prepare, "run": run, "table": table}[args.step](args)


if __name__ == "__main__":
    main()

"""naive vs uPU vs nnPU vs Self-PU on the demo's synthetic cohort at a larger size.

In pieces that each write their own results file, so a run cut short keeps what finished::

    # 1. generate and preprocess the cohort once (resumable; about 10 CPU-s per scan)
    python benchmarks/demo_cohort.py prepare --subjects 240 --work runs/cohort240
    # 2. one method and one seed per call (seed = split seed = training seed)
    python benchmarks/demo_cohort.py run --work runs/cohort240 --method nnpu --seed 0
    # 3. the table, mean (std) over the seeds found in the results files
    python benchmarks/demo_cohort.py table --name cohort240

Each seed draws its own subject-level split of the same cohort (test 25 %, validation 20 %
of the rest, stratified), so the spread covers both the split and the training. Selection
uses the validation split only; the test split is scored once, at the end. Metrics are
per scan against the cohort's truth (amyloid status from SUVR; subjects without PET have
unknown truth and are left out of the metrics), plus, because the data are synthetic, the
AUC against the generator's latent truth for every test subject (``auc_latent``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import (
    RESULTS,
    add_prepare_options,
    add_run_options,
    command_line,
    mean_std_cell,
    prepare_cohort,
    script_parser,
    train_on_split,
    write_json,
)

METHODS = ("naive", "upu", "nnpu", "selfpu")
#: The generator settings of this benchmark's cohort: the demo's layout (3 mm, one scan per
#: subject), hippocampal atrophy 0.6 (stronger than published ADNI effects, docs/volumes.md
#: "Effect sizes"), 25 % preclinical.
BENCH_SYNTH = {"voxel_size": 3.0, "visit_probabilities": [1.0, 0.0, 0.0],
               "write_brain_masks": False, "hippocampal_atrophy": 0.6,
               "preclinical_fraction": 0.25}


def _settings(args: argparse.Namespace):
    from adni_pu.workflows.demo import DemoSettings

    return DemoSettings(subjects=args.subjects, out=args.work, workers=args.workers,
                        threads=getattr(args, "threads", 1), seed=args.cohort_seed,
                        synth=dict(BENCH_SYNTH))


def prepare(args: argparse.Namespace) -> None:
    """Generate and preprocess the cohort once."""
    prepare_cohort(_settings(args), {"subjects": args.subjects, "cohort_seed": args.cohort_seed,
                                     "workers": args.workers, "synth": BENCH_SYNTH})


def _latent_auc(run_dir: Path, synth_dir: Path) -> float:
    """Test AUC against the generator's truth (every test subject, PET or not)."""
    import pandas as pd
    from sklearn.metrics import roc_auc_score

    preds = pd.read_csv(run_dir / "evaluation" / "test" / "predictions_scans.csv")
    truth = pd.read_csv(synth_dir / "truth.csv")
    key = dict(zip(truth["subject_id"].astype(str), truth["amyloid_positive"].astype(int)))
    y = [key[s] for s in preds["subject_id"]]
    return float(roc_auc_score(y, preds["logit"]))


def run(args: argparse.Namespace) -> None:
    """Train and test one method on one seed's split; write its results file."""
    from adni_pu.provenance import provenance

    done = train_on_split(args)
    info, record, pooled = done["info"], done["record"], done["pooled"]
    record.update(metrics=pooled["metrics"], n_scored=pooled["n_scored"])
    record["auc_latent"] = _latent_auc(done["run_dir"], args.work / "synth")
    out = {
        "benchmark": "demo cohort: naive vs uPU vs nnPU vs Self-PU",
        "command": command_line(__file__),
        "method": args.method, "seed": args.seed, "epochs": args.epochs,
        "cohort": {"subjects": info["subjects"], "cohort_seed": info["cohort_seed"],
                   "synth": info.get("synth", BENCH_SYNTH),
                   "preprocessing": info["preprocessing"], "prior": done["prior"],
                   "prior_note": done["prior_note"]},
        "settings": done["settings"], "overrides": args.set, "result": record,
        "provenance": provenance(), "machine": f"{args.machine}; torch threads {args.threads}",
    }
    path = write_json(RESULTS / f"{args.name}-{args.method}-seed{args.seed}.json", out,
                      default=str)
    m = record["metrics"]
    print(f"{args.method} seed {args.seed}: acc {m['accuracy']['value']:.3f} "
          f"bacc {m['balanced_accuracy']['value']:.3f} auc {m['auc']['value']:.3f} "
          f"auc_latent {record['auc_latent']:.3f} ({record['seconds']:.0f} s) -> {path}")


def _oracle_line(synth_dir: Path) -> str:
    """The ceiling the generator sets: AUC of each subject's true atrophy for amyloid status."""
    if not (synth_dir / "truth_scans.csv").is_file():
        return ""
    import pandas as pd
    from sklearn.metrics import roc_auc_score

    scans = pd.read_csv(synth_dir / "truth_scans.csv")
    y = scans["amyloid_positive"].astype(int)
    parts = [f"{name} {roc_auc_score(y, scans[name]):.3f}"
             for name in ("hippocampal_loss", "severity")]
    return (f"\n\nGenerator truth as a score for amyloid status, all {len(scans)} scans of "
            f"{synth_dir} (AUC): " + ", ".join(parts) + ".")


PAIRS: tuple[tuple[str, str], ...] = (("selfpu", "nnpu"), ("nnpu", "naive"))


def _paired_lines(name: str) -> str:
    """Paired differences of test AUC (Self-PU minus nnPU, nnPU minus naive) with a
    bootstrap CI over subjects and seeds, from the per-subject predictions in the results
    files (files written before they were saved have none and are left out)."""
    import pandas as pd

    from adni_pu.workflows.crossval import paired_difference

    def predictions(method: str) -> pd.DataFrame | None:
        frames = []
        for f in sorted(RESULTS.glob(f"{name}-{method}-seed*.json")):
            rec = json.loads(f.read_text())
            if "predictions" in rec["result"]:
                frames.append(pd.DataFrame(rec["result"]["predictions"]).assign(
                    seed=rec["seed"]))
        return pd.concat(frames, ignore_index=True) if frames else None

    lines = []
    for a, b in PAIRS:
        pa, pb = predictions(a), predictions(b)
        if pa is None or pb is None:
            lines.append(f"| {a} - {b} | no per-subject predictions saved (rerun "
                         "`demo_cohort.py run` for both) | | |")
            continue
        seeds = sorted(set(pa["seed"]) & set(pb["seed"]))
        d = paired_difference(pa[pa["seed"].isin(seeds)], pb[pb["seed"].isin(seeds)])
        lines.append(f"| {a} - {b} | {100 * d['value']:+.1f} [{100 * d['ci_low']:+.1f}, "
                     f"{100 * d['ci_high']:+.1f}] | {d['n_seeds']} | {d['n_subjects']} |")
    return ("\n\nPaired difference of test AUC (percentage points), 95 % CI from a paired "
            "bootstrap over seeds and the test subjects within each seed:\n\n"
            "| difference | AUC [95 % CI] | seeds | subject-seeds |\n|---|---|---|---|\n"
            + "\n".join(lines))


def table(args: argparse.Namespace) -> None:
    from adni_pu.pu.metrics import summarise

    rows = ["| method | seeds | accuracy | balanced accuracy | AUC | sensitivity | specificity "
            "| AUC vs latent truth | s/run |", "|---|---|---|---|---|---|---|---|---|"]
    for method in METHODS:
        files = sorted(RESULTS.glob(f"{args.name}-{method}-seed*.json"))
        if not files:
            continue
        recs = [json.loads(f.read_text())["result"] for f in files]
        metric = [mean_std_cell([r["metrics"][k]["value"] for r in recs]) for k in (
            "accuracy", "balanced_accuracy", "auc", "sensitivity", "specificity")]
        rows.append(f"| {method} | {len(recs)} | " + " | ".join(metric)
                    + f" | {mean_std_cell([r['auc_latent'] for r in recs])} | "
                    f"{summarise([r['seconds'] for r in recs])['mean']:.0f} |")
    text = (f"# {args.name}: test split, mean (std) over seeds, %\n\n" + "\n".join(rows)
            + _paired_lines(args.name) + _oracle_line(args.work / "synth")
            + "\n\nFrom `python benchmarks/demo_cohort.py table --name " + args.name
            + "` over benchmarks/results/" + args.name + "-*.json (each file has its command, "
            "settings and machine).\n")
    from adni_pu.fileio import atomic_write_text

    atomic_write_text(RESULTS / f"{args.name}-table.md", text)
    print(text)


def main() -> None:
    parser = script_parser(__doc__)
    sub = parser.add_subparsers(dest="step", required=True)
    add_prepare_options(sub.add_parser("prepare", help="generate and preprocess the cohort"),
                        "runs/cohort240", subjects=240)
    r = sub.add_parser("run", help="train and test one method with one seed")
    add_run_options(r, METHODS, "runs/cohort240", epochs=30, threads=1)
    r.add_argument("--name", default="cohort240")
    t = sub.add_parser("table", help="aggregate the results files")
    t.add_argument("--name", default="cohort240")
    t.add_argument("--work", type=Path, default=Path("runs/cohort240"),
                   help="the prepared cohort, for the generator-truth line (optional)")
    args = parser.parse_args()
    {"prepare": prepare, "run": run, "table": table}[args.step](args)


if __name__ == "__main__":
    main()

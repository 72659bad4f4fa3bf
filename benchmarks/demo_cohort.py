"""naive vs uPU vs nnPU vs Self-PU on the demo's synthetic cohort at a larger size.

The long benchmark of issue 6, in pieces that each write their own results file, so a run
cut short keeps what finished::

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
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from adni_pu.fileio import atomic_write_text  # noqa: E402 - light; after the path above

RESULTS = REPO / "benchmarks" / "results"
METHODS = ("naive", "upu", "nnpu", "selfpu")
# The generator settings of this benchmark's cohort (results in benchmarks/results/cohort240-*
# were made with them): the demo's layout (3 mm, one scan per subject), hippocampal atrophy
# 0.6 (stronger than published ADNI effects, see docs/volumes.md "Effect sizes"; the demo
# now uses 0.3), 25 % preclinical.
BENCH_SYNTH = {"voxel_size": 3.0, "visit_probabilities": [1.0, 0.0, 0.0],
               "write_brain_masks": False, "hippocampal_atrophy": 0.6,
               "preclinical_fraction": 0.25}


def _settings(args: argparse.Namespace):
    from adni_pu.workflows.demo import DemoSettings

    return DemoSettings(subjects=args.subjects, out=args.work, workers=args.workers,
                        threads=getattr(args, "threads", 1), seed=args.cohort_seed,
                        synth=dict(BENCH_SYNTH))


def prepare(args: argparse.Namespace) -> None:
    from adni_pu.workflows.demo import generate_stage, preprocess_stage

    settings = _settings(args)
    settings.out.mkdir(parents=True, exist_ok=True)
    tic = time.perf_counter()
    synth = generate_stage(settings.out, settings, print)
    summary, note = preprocess_stage(settings.out, synth, settings, print)
    info = {"subjects": args.subjects, "cohort_seed": args.cohort_seed, "summary": str(summary),
            "preprocessing": note, "seconds": round(time.perf_counter() - tic, 1),
            "workers": args.workers, "synth": BENCH_SYNTH}
    atomic_write_text(settings.out / "prepared.json", json.dumps(info, indent=2) + "\n")
    print(json.dumps(info, indent=2))


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
    import pandas as pd
    import torch

    from adni_pu.provenance import provenance
    from adni_pu.workflows.crossval import pooled_metrics
    from adni_pu.workflows.demo import cohort_stage, demo_prior, method_settings, train_method

    torch.set_num_threads(args.threads)
    work = args.work
    info = json.loads((work / "prepared.json").read_text())
    cohort, manifest = cohort_stage(work / f"cohort-seed{args.seed}", work / "synth",
                                    Path(info["summary"]), args.seed, print)
    extra, prior_note, prior = demo_prior(cohort.manifest)
    settings = method_settings(args.epochs, args.seed, args.threads, work / "cache", extra)
    run_dir = work / "runs" / f"{args.method}-seed{args.seed}"
    record = train_method(manifest, args.method, run_dir, settings, overrides=args.set)
    # per-subject test predictions stay in the record ("predictions"), so that the table
    # can give paired differences between methods over subjects and seeds
    pooled = pooled_metrics(pd.DataFrame(record["predictions"]), n_boot=1000)
    record.update(metrics=pooled["metrics"], n_scored=pooled["n_scored"])
    record["auc_latent"] = _latent_auc(run_dir, work / "synth")
    out = {
        "benchmark": "demo cohort: naive vs uPU vs nnPU vs Self-PU",
        "command": " ".join(["python", "benchmarks/demo_cohort.py", *sys.argv[1:]]),
        "method": args.method, "seed": args.seed, "epochs": args.epochs,
        "cohort": {"subjects": info["subjects"], "cohort_seed": info["cohort_seed"],
                   "synth": info.get("synth", BENCH_SYNTH),
                   "preprocessing": info["preprocessing"], "prior": prior,
                   "prior_note": prior_note},
        "settings": settings, "overrides": args.set, "result": record, "provenance": provenance(),
        "machine": f"{args.machine}; torch threads {args.threads}",
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{args.name}-{args.method}-seed{args.seed}.json"
    atomic_write_text(path, json.dumps(out, indent=2, default=str) + "\n")
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


def cell(values: list[float]) -> str:
    """Mean (sample std) in percent; the bare value for a single seed."""
    from adni_pu.pu.metrics import summarise

    s = summarise(values)
    if s["n"] < 2:
        return f"{100 * s['mean']:.1f}"
    return f"{100 * s['mean']:.1f} ({100 * s['std']:.1f})"


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
        metric = [cell([r["metrics"][k]["value"] for r in recs]) for k in (
            "accuracy", "balanced_accuracy", "auc", "sensitivity", "specificity")]
        rows.append(f"| {method} | {len(recs)} | " + " | ".join(metric)
                    + f" | {cell([r['auc_latent'] for r in recs])} | "
                    f"{summarise([r['seconds'] for r in recs])['mean']:.0f} |")
    text = (f"# {args.name}: test split, mean (std) over seeds, %\n\n" + "\n".join(rows)
            + _paired_lines(args.name) + _oracle_line(args.work / "synth")
            + "\n\nFrom `python benchmarks/demo_cohort.py table --name " + args.name
            + "` over benchmarks/results/" + args.name + "-*.json (each file has its command, "
            "settings and machine).\n")
    path = RESULTS / f"{args.name}-table.md"
    atomic_write_text(path, text)
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare", help="generate and preprocess the cohort")
    p.add_argument("--subjects", type=int, default=240)
    p.add_argument("--work", type=Path, default=Path("runs/cohort240"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cohort-seed", type=int, default=0)
    r = sub.add_parser("run", help="train and test one method with one seed")
    r.add_argument("--work", type=Path, default=Path("runs/cohort240"))
    r.add_argument("--method", choices=METHODS, required=True)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--epochs", type=int, default=30)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--name", default="cohort240")
    r.add_argument("--set", action="append", default=[], help="extra setting override")
    r.add_argument("--machine", default="2-core CPU VM, no GPU")
    t = sub.add_parser("table", help="aggregate the results files")
    t.add_argument("--name", default="cohort240")
    t.add_argument("--work", type=Path, default=Path("runs/cohort240"),
                   help="the prepared cohort, for the generator-truth line (optional)")
    args = parser.parse_args()
    {"prepare": prepare, "run": run, "table": table}[args.step](args)


if __name__ == "__main__":
    main()

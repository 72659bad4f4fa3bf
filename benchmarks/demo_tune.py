"""Tune ``adni-pu demo``'s training settings on VALIDATION predictions only.

Builds (or reuses) a demo folder's synthetic cohort, preprocessed scans and fold manifests
(the demo's own stages 1-3), then trains the chosen methods on every fold with the demo's
settings (``DEMO_TRAINING`` as it is now, recorded with each result) plus ``--set``
overrides and scores each fold's validation split, never its test split (no test
prediction is made)::

    # stages 1-3 only (a tuning cohort; seed 100 is never one of the measured seeds)
    python benchmarks/demo_tune.py --data runs/tune-s100 --seed 100 --prepare-only
    # one candidate: naive and nnPU, 12 epochs, learning rate 3e-3
    python benchmarks/demo_tune.py --data runs/tune-s100 --seed 100 --name lr3 \\
        --methods naive nnpu --epochs 12 --set train.lr=0.003

Per method it prints and appends to ``benchmarks/results/demo-tuning.jsonl``: the
validation AUC for amyloid status (truth) pooled over the folds' validation rows (a
subject can sit in the validation split of two folds; each fold's row counts), the mean of
the per-fold validation AUCs, the validation AUC of the PU label (labelled vs unlabelled,
subjects without PET included), the selected epochs and the seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def prepare(data: Path, seed: int, subjects: int) -> list[Path]:
    """The demo's stages 1-3 in ``data`` (each resumes); returns the fold manifests."""
    from adni_pu.cohort import read_manifest
    from adni_pu.workflows.crossval import fold_manifests
    from adni_pu.workflows.demo import (
        DemoSettings,
        cohort_stage,
        generate_stage,
        preprocess_stage,
    )

    settings = DemoSettings(out=data, seed=seed, subjects=subjects)
    synth = generate_stage(data, settings, print)
    summary, note = preprocess_stage(data, synth, settings, print)
    print("     ", note)
    _, manifest = cohort_stage(data / "cohort", synth, summary, seed, print)
    return fold_manifests(read_manifest(manifest), settings.folds, seed, data / "cohort" / "folds")


def validation_rows(run: Path, fold: int) -> object:
    """One row per validation subject of a run: mean logit, truth, PU label, fold."""
    import pandas as pd

    val = pd.read_csv(run / "val_predictions.csv", dtype={"subject_id": str})
    rows = val.groupby("subject_id").agg(logit=("logit", "mean"), truth=("truth", "first"),
                                         pu_label=("pu_label", "max")).reset_index()
    return rows.assign(fold=fold)


def reference_on_validation(folds: list[Path]) -> dict:
    """The demo's logistic-regression reference (2 volumes, fitted on each fold's training
    subjects' PU labels) scored on the folds' validation splits: the same pooled AUC."""
    import pandas as pd

    from adni_pu.cohort import read_manifest
    from adni_pu.pu.metrics import binary_metrics
    from adni_pu.workflows.crossval import logistic_reference, volume_features

    frames = [read_manifest(p) for p in folds]
    for frame in frames:
        frame["scan_path"] = frame["scan_path"].astype(str)
        # the validation split plays the scored part; the test split is dropped
        frame["split"] = frame["split"].map({"train": "train", "val": "test", "test": "-"})
    features = volume_features(sorted(set(frames[0]["scan_path"])))
    rows = pd.concat([logistic_reference(f, features) for f in frames], ignore_index=True)
    rows = rows[rows["truth"].notna()]
    return {"reference": "logistic regression on 2 volumes", "split": "val",
            "val_auc_pooled": round(float(binary_metrics(
                rows["logit"].to_numpy(float), rows["truth"].to_numpy(float))["auc"]), 4),
            "val_rows_with_truth": int(len(rows))}


def train_fit(runs: Path, folds: list[Path]) -> dict:
    """AUC of each fold's selected model on its own training split, for the PU label
    (what naive learns) and for the truth: tells under-fitting from over-fitting."""
    import pandas as pd

    from adni_pu.data.volumes import build_volume_dataset
    from adni_pu.pu.metrics import binary_metrics
    from adni_pu.workflows.train import load_run, score_dataset

    out: dict = {"runs": str(runs), "split": "train", "pu_label_auc": [], "truth_auc": []}
    for k, path in enumerate(folds):
        cfg, model, _ = load_run(runs / f"fold{k}", "cpu")
        frame = pd.read_csv(path, dtype={"subject_id": str})
        rows = frame[frame["split"] == "train"]
        dataset = build_volume_dataset(frame, "train", cfg.data, train=False,
                                       base_dir=path.parent)
        logits = score_dataset(model, dataset, max(cfg.train.batch_size, 2))
        for key, column in (("pu_label_auc", "pu_label"), ("truth_auc", "truth")):
            known = rows[column].notna().to_numpy()
            out[key].append(round(float(binary_metrics(
                logits[known], rows[column].to_numpy(float)[known])["auc"]), 3))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="a demo folder (made if absent)")
    p.add_argument("--seed", type=int, required=True, help="the cohort's (and training) seed")
    p.add_argument("--subjects", type=int, default=48)
    p.add_argument("--prepare-only", action="store_true")
    p.add_argument("--train-fit", action="store_true",
                   help="score the selected models of candidate --name on their own training "
                   "split (does the model fit what it was trained on?)")
    p.add_argument("--reference", action="store_true",
                   help="score the logistic-regression reference on the validation splits")
    p.add_argument("--name", default="default", help="the candidate's name (its run folders)")
    p.add_argument("--methods", nargs="+", default=["naive"])
    p.add_argument("--epochs", type=int, default=None, help="default: the demo's")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE")
    args = p.parse_args()

    folds = prepare(args.data, args.seed, args.subjects)
    if args.prepare_only:
        return
    if args.train_fit:
        for method in args.methods:
            print(json.dumps(train_fit(args.data / "tune" / args.name / method, folds)))
        return
    if args.reference:
        print(json.dumps(reference_on_validation(folds)))
        return
    if args.epochs is None:
        from adni_pu.workflows.demo import DemoSettings

        args.epochs = DemoSettings().epochs

    import numpy as np
    import pandas as pd

    from adni_pu.cohort import read_manifest
    from adni_pu.pu.metrics import binary_metrics
    from adni_pu.workflows.demo import DEMO_TRAINING, demo_prior, method_settings
    from adni_pu.workflows.train import load_volume_config, train_volumes

    def auc(frame: pd.DataFrame, column: str) -> float:
        known = frame[frame[column].notna()]
        return float(binary_metrics(known["logit"].to_numpy(float),
                                    known[column].to_numpy(float))["auc"])

    log_path = REPO / "benchmarks" / "results" / "demo-tuning.jsonl"
    for method in args.methods:
        tic = time.perf_counter()
        parts, best = [], []
        for k, path in enumerate(folds):
            extra, _, _ = demo_prior(read_manifest(path))
            values = method_settings(args.epochs, args.seed, args.threads,
                                     args.data / "cache", extra)
            cfg = load_volume_config(None, args.overrides, preset=method, values=values)
            run = args.data / "tune" / args.name / method / f"fold{k}"
            fit = train_volumes(path, cfg, run)
            best.append(fit.best_epoch + 1)
            parts.append(validation_rows(run, k))
        rows = pd.concat(parts, ignore_index=True)
        per_fold = [auc(g, "truth") for _, g in rows.groupby("fold")]
        record = {
            "name": args.name, "method": method, "cohort_seed": args.seed,
            "epochs": args.epochs, "overrides": args.overrides,
            "demo_training": DEMO_TRAINING,
            "val_auc_pooled": round(auc(rows, "truth"), 4),
            "val_auc_fold_mean": round(float(np.nanmean(per_fold)), 4),
            "val_auc_folds": [round(a, 3) for a in per_fold],
            "val_pu_label_auc_pooled": round(auc(rows, "pu_label"), 4),
            "val_rows_with_truth": int(rows["truth"].notna().sum()),
            "best_epochs": best, "seconds": round(time.perf_counter() - tic, 1),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        print(json.dumps(record))
        # one appended line (candidates run side by side: a read-and-rewrite could drop one)
        with log_path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()

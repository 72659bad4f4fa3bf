"""Tune ``adni-pu demo``'s training settings on TUNING cohorts, never the measured ones.

Builds (or reuses) a demo folder's synthetic cohort, preprocessed scans and fold manifests
(the demo's own stages 1-3), then trains the chosen methods on every fold with the demo's
settings (``DEMO_TRAINING`` as it is now, recorded with each result) plus ``--set``
overrides and scores each fold's validation split. With ``--heldout`` it also scores each
fold's held-out split, pooled as the demo pools it: on a tuning cohort (seeds 100 and up,
never a measured seed) these subjects chose nothing, so their AUC is an unbiased score of
the candidate, unlike the validation AUC (the validation split also chose the epoch)::

    # stages 1-3 only (a tuning cohort; seed 100 is never one of the measured seeds)
    python benchmarks/demo_tune.py --data runs/tune-s100 --seed 100 --prepare-only
    # one candidate: naive and nnPU, 12 epochs, learning rate 3e-3
    python benchmarks/demo_tune.py --data runs/tune-s100 --seed 100 --name lr3 \\
        --methods naive nnpu --epochs 12 --set train.lr=0.003
    # nnPU with the same change, also scored on the tuning cohort's held-out folds
    python benchmarks/demo_tune.py --data runs/tune-s100 --seed 100 --name lr3 --heldout \\
        --methods nnpu --set train.lr=0.003
    # two candidates' held-out AUC, paired over (cohort, training seed) runs and subjects
    python benchmarks/demo_tune.py --compare lr3,lr3t1 default,defaultt1
    # a cohort of another size and fold count (the folds go to cohort/folds-k<K>/)
    python benchmarks/demo_tune.py --data runs/tune96-s100 --seed 100 --subjects 96 \
        --folds 2 --name h2 --heldout --methods nnpu --set data.hipp_mask=true

Per method it prints and appends to ``benchmarks/results/demo-tuning.jsonl``: the
validation AUC for amyloid status (truth) pooled over the folds' validation rows (a
subject can sit in the validation split of two folds; each fold's row counts), the mean of
the per-fold validation AUCs, the validation AUC of the PU label (labelled vs unlabelled,
subjects without PET included), the selected epochs and the seconds; with ``--heldout``
also the pooled held-out AUC and the held-out predictions (``heldout_predictions``:
subject, logit, truth), so that candidates can be compared paired over subjects and
cohorts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, script_parser, utc_stamp


def prepare(data: Path, seed: int, subjects: int, folds: int) -> list[Path]:
    """The demo's stages 1-3 in ``data`` (each resumes); returns the fold manifests
    (``cohort/folds-k<folds>/``, so one cohort serves candidates with other fold counts)."""
    from adni_pu.cohort import read_manifest
    from adni_pu.workflows.crossval import fold_manifests
    from adni_pu.workflows.demo import (
        DemoSettings,
        cohort_stage,
        generate_stage,
        preprocess_stage,
    )

    settings = DemoSettings(out=data, seed=seed, subjects=subjects, folds=folds)
    synth = generate_stage(data, settings, print)
    summary, note = preprocess_stage(data, synth, settings, print)
    print("     ", note)
    _, manifest = cohort_stage(data / "cohort", synth, summary, seed, print)
    return fold_manifests(read_manifest(manifest), folds, seed,
                          data / "cohort" / f"folds-k{folds}")


def validation_rows(run: Path, fold: int) -> object:
    """One row per validation subject of a run: mean logit, truth, PU label, fold."""
    import pandas as pd

    val = pd.read_csv(run / "val_predictions.csv", dtype={"subject_id": str})
    rows = val.groupby("subject_id").agg(logit=("logit", "mean"), truth=("truth", "first"),
                                         pu_label=("pu_label", "max")).reset_index()
    return rows.assign(fold=fold)


def heldout_rows(run: Path) -> Any:
    """One row per held-out (test) subject of a run, scored as the demo scores it."""
    import pandas as pd

    from adni_pu.workflows.evaluate import evaluate_run

    evaluate_run(run, "test", n_boot=0)
    return pd.read_csv(run / "evaluation" / "test" / "predictions_subjects.csv",
                       dtype={"subject_id": str})[["subject_id", "logit", "truth"]]


def reference_on_validation(folds: list[Path], heldout: bool = False) -> dict:
    """The demo's logistic-regression reference (2 volumes, fitted on each fold's training
    subjects' PU labels) scored on the folds' validation splits (the same pooled AUC), or
    with ``heldout`` on their held-out splits."""
    import pandas as pd

    from adni_pu.cohort import read_manifest
    from adni_pu.pu.metrics import binary_metrics
    from adni_pu.workflows.crossval import logistic_reference, volume_features

    frames = [read_manifest(p) for p in folds]
    for frame in frames:
        frame["scan_path"] = frame["scan_path"].astype(str)
        if not heldout:  # the validation split plays the scored part; the test split is dropped
            frame["split"] = frame["split"].map({"train": "train", "val": "test", "test": "-"})
    features = volume_features(sorted(set(frames[0]["scan_path"])))
    rows = pd.concat([logistic_reference(f, features) for f in frames], ignore_index=True)
    rows = rows[rows["truth"].notna()]
    return {"reference": "logistic regression on 2 volumes",
            "split": "test" if heldout else "val",
            ("heldout_auc_pooled" if heldout else "val_auc_pooled"): round(float(binary_metrics(
                rows["logit"].to_numpy(float), rows["truth"].to_numpy(float))["auc"]), 4),
            "rows_with_truth": int(len(rows))}


def train_fit(runs: Path, folds: list[Path]) -> dict:
    """AUC of each fold's selected model on its own training split, for the PU label
    (what naive learns) and for the truth: tells under-fitting from over-fitting."""
    import pandas as pd

    from adni_pu.data.volumes import build_volume_dataset
    from adni_pu.pu.metrics import binary_metrics
    from adni_pu.workflows.run_folder import load_run, score_dataset

    out: dict = {"runs": str(runs), "split": "train", "pu_label_auc": [], "truth_auc": []}
    for k, path in enumerate(folds):
        cfg, model, _ = load_run(runs / f"k{len(folds)}-fold{k}", "cpu")
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


def heldout_record(rows: Any, auc: Callable[[Any, str], float]) -> dict:
    """The held-out part of a candidate's record: pooled AUC and per-subject predictions."""
    known = rows[rows["truth"].notna()]
    return {"heldout_auc_pooled": round(auc(known, "truth"), 4),
            "heldout_rows_with_truth": int(len(known)),
            "heldout_predictions": [[r.subject_id, round(float(r.logit), 5), int(r.truth)]
                                    for r in known.itertuples()]}


def _run_key(record: dict) -> tuple[str, int, int, int]:
    """(method, cohort seed, training seed, cohort size) of a tuning record: what two
    candidates pair on (records made before the size was recorded are of 48-subject
    cohorts). A later record with the same name and key replaces an earlier one."""
    seed = record["cohort_seed"]
    for item in record.get("overrides", []):
        if item.replace(" ", "").startswith("train.seed="):
            seed = int(item.split("=", 1)[1])
    return record["method"], record["cohort_seed"], seed, int(record.get("subjects", 48))


def compare(log_path: Path, first: list[str], second: list[str], n_boot: int = 2000,
            seed: int = 0) -> dict:
    """Held-out AUC of two candidates (each a list of record names, e.g. a name and its
    training-seed-1 twin), paired over runs (method, cohort, training seed, cohort size)
    and subjects.

    The score is the mean over the common runs of each run's pooled held-out AUC; the CI
    of the difference (first minus second) resamples subjects within every run, the same
    subjects for both candidates (a paired percentile bootstrap).
    """
    import numpy as np

    from adni_pu.pu.metrics import binary_metrics

    runs: dict[str, dict] = {"first": {}, "second": {}}
    for line in log_path.read_text().splitlines():
        record = json.loads(line)
        for side, names in (("first", first), ("second", second)):
            if record.get("name") in names and record.get("heldout_predictions"):
                runs[side][_run_key(record)] = {
                    r[0]: (r[1], r[2]) for r in record["heldout_predictions"]}  # last wins
    keys = sorted(set(runs["first"]) & set(runs["second"]))
    if not keys:
        raise SystemExit(f"no run (cohort, training seed) scored held out by both {first} "
                         f"and {second} in {log_path}")

    def auc(logits: np.ndarray, truth: np.ndarray) -> float:
        return float(binary_metrics(logits, truth)["auc"])

    rng = np.random.default_rng(seed)
    per_run, boot = [], np.zeros(n_boot)
    for key in keys:
        subjects = sorted(set(runs["first"][key]) & set(runs["second"][key]))
        a = np.array([runs["first"][key][s][0] for s in subjects], float)
        b = np.array([runs["second"][key][s][0] for s in subjects], float)
        truth = np.array([runs["first"][key][s][1] for s in subjects], float)
        per_run.append((auc(a, truth), auc(b, truth), len(subjects)))
        for i in range(n_boot):
            idx = rng.integers(0, len(subjects), len(subjects))
            boot[i] += (auc(a[idx], truth[idx]) - auc(b[idx], truth[idx])) / len(keys)
    boot = boot[~np.isnan(boot)]
    first_mean = float(np.mean([r[0] for r in per_run]))
    second_mean = float(np.mean([r[1] for r in per_run]))
    return {"first": first, "second": second, "runs": [list(k) for k in keys],
            "heldout_auc_first": round(first_mean, 4),
            "heldout_auc_second": round(second_mean, 4),
            "per_run": [[round(x, 3), round(y, 3), n] for x, y, n in per_run],
            "difference": round(first_mean - second_mean, 4),
            "difference_ci95": [round(float(np.percentile(boot, q)), 4) for q in (2.5, 97.5)],
            "share_above_0": round(float((boot > 0).mean()), 3)}


def main() -> None:
    p = script_parser(__doc__)
    p.add_argument("--compare", nargs=2, metavar=("A", "B"),
                   help="compare two candidates' held-out AUC from the log, paired (each a "
                   "comma-separated list of names, e.g. c8,c8t1 c0,c0t1); nothing is trained")
    p.add_argument("--data", type=Path, help="a demo folder (made if absent)")
    p.add_argument("--seed", type=int, help="the cohort's (and training) seed")
    p.add_argument("--subjects", type=int, default=None, help="default: the demo's")
    p.add_argument("--folds", type=int, default=None, help="default: the demo's")
    p.add_argument("--prepare-only", action="store_true")
    p.add_argument("--train-fit", action="store_true",
                   help="score the selected models of candidate --name on their own training "
                   "split (does the model fit what it was trained on?)")
    p.add_argument("--reference", action="store_true",
                   help="score the logistic-regression reference on the validation splits")
    p.add_argument("--heldout", action="store_true",
                   help="also score each fold's held-out split (tuning cohorts only: it must "
                   "never be a seed the demo's results are measured on)")
    p.add_argument("--name", default="default", help="the candidate's name (its run folders)")
    p.add_argument("--methods", nargs="+", default=["naive"])
    p.add_argument("--epochs", type=int, default=None, help="default: the demo's")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE")
    args = p.parse_args()
    log_path = RESULTS / "demo-tuning.jsonl"
    if args.compare:
        print(json.dumps(compare(log_path, *(c.split(",") for c in args.compare))))
        return
    if args.data is None or args.seed is None:
        p.error("--data and --seed are needed (except with --compare)")

    from adni_pu.workflows.demo import DemoSettings

    defaults = DemoSettings()
    args.subjects = args.subjects or defaults.subjects
    args.folds = args.folds or defaults.folds
    folds = prepare(args.data, args.seed, args.subjects, args.folds)
    if args.prepare_only:
        return
    if args.train_fit:
        for method in args.methods:
            print(json.dumps(train_fit(args.data / "tune" / args.name / method, folds)))
        return
    if args.reference:
        print(json.dumps(reference_on_validation(folds, args.heldout)))
        return
    if args.epochs is None:
        args.epochs = defaults.epochs

    import numpy as np
    import pandas as pd

    from adni_pu.cohort import read_manifest
    from adni_pu.pu.metrics import binary_metrics
    from adni_pu.workflows.demo_policy import DEMO_TRAINING, demo_prior, method_settings
    from adni_pu.workflows.train import train_volumes
    from adni_pu.workflows.volume_settings import load_volume_config

    def auc(frame: pd.DataFrame, column: str) -> float:
        known = frame[frame[column].notna()]
        return float(binary_metrics(known["logit"].to_numpy(float),
                                    known[column].to_numpy(float))["auc"])

    for method in args.methods:
        tic = time.perf_counter()
        parts, best, held = [], [], []
        for k, path in enumerate(folds):
            extra, _, _ = demo_prior(read_manifest(path))
            values = method_settings(args.epochs, args.seed, args.threads,
                                     args.data / "cache", extra)
            cfg = load_volume_config(None, args.overrides, preset=method, values=values)
            run = args.data / "tune" / args.name / method / f"k{args.folds}-fold{k}"
            fit = train_volumes(path, cfg, run)
            best.append(fit.best_epoch + 1)
            parts.append(validation_rows(run, k))
            if args.heldout:
                held.append(heldout_rows(run))
        rows = pd.concat(parts, ignore_index=True)
        per_fold = [auc(g, "truth") for _, g in rows.groupby("fold")]
        record = {
            "name": args.name, "method": method, "cohort_seed": args.seed,
            "subjects": args.subjects, "folds": args.folds, "epochs": args.epochs,
            "overrides": args.overrides,
            "demo_training": DEMO_TRAINING,
            "val_auc_pooled": round(auc(rows, "truth"), 4),
            "val_auc_fold_mean": round(float(np.nanmean(per_fold)), 4),
            "val_auc_folds": [round(a, 3) for a in per_fold],
            "val_pu_label_auc_pooled": round(auc(rows, "pu_label"), 4),
            "val_rows_with_truth": int(rows["truth"].notna().sum()),
            "best_epochs": best, "seconds": round(time.perf_counter() - tic, 1),
            **(heldout_record(pd.concat(held, ignore_index=True), auc) if held else {}),
            "date": utc_stamp()}
        print(json.dumps(record))
        # one appended line (candidates run side by side: a read-and-rewrite could drop one)
        with log_path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()

"""Cross-validation over all subjects of a cohort, pooled scoring and reference scores.

Used by ``adni-pu demo``: on a small cohort one test split scores a dozen subjects, so the
demo trains every method once per fold and scores each subject exactly once, by the models
of the fold that held it out (its validation split, a stratified share of the rest, picks
the epoch). The held-out predictions of all folds are pooled and their metrics get
percentile-bootstrap CIs over subjects.

Reference scores on the same folds give the CNN's numbers meaning:

- :func:`volume_features` measures two volumes on each preprocessed (model-grid) scan: the
  hippocampal tissue (voxels of the AAL hippocampi brighter than CSF) and the central CSF
  (dark voxels in a box around the lateral ventricles); :func:`logistic_reference` fits a
  logistic regression on them per fold, on the training subjects only;
- the generator's true signal (a synthetic cohort's ``truth_scans.csv``) is the score a
  perfect hippocampal measurement would give.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from adni_pu import fileio
from adni_pu.atlas import VENTRICLE_BOX_MM
from adni_pu.errors import ConfigError

# Intensity (relative to the scan's brain median) below which a voxel counts as CSF.
CSF_LEVEL = 0.55
# Share of the non-test subjects of a fold that form its validation split.
VAL_SHARE_FOLDS = 5


def subject_frame(manifest: Any) -> Any:
    """One row per subject: ``subject_id, pu_label, truth`` (the manifest's first scan)."""
    return manifest.groupby("subject_id", sort=True).agg(
        pu_label=("pu_label", "max"), truth=("truth", "first")).reset_index()


def fold_frames(manifest: Any, folds: int, seed: int) -> list[Any]:
    """The manifests of the ``folds`` folds (:func:`fold_manifests`), in memory."""
    from adni_pu.cohort import kfold

    if folds < 2:
        raise ConfigError(f"folds={folds}: expected at least 2")
    subjects = subject_frame(manifest)
    if len(subjects) < 2 * folds:
        raise ConfigError(f"folds={folds}: {len(subjects)} subjects are too few "
                         f"(need at least {2 * folds})")
    fold_of = kfold(subjects, folds, seed)
    frames = []
    for k in range(folds):
        test = set(fold_of.index[fold_of == k])
        rest = subjects[~subjects["subject_id"].isin(test)]
        inner = kfold(rest, VAL_SHARE_FOLDS, seed + 1 + k)
        val = set(inner.index[inner == 0])
        frame = manifest.copy()
        frame["split"] = ["test" if s in test else "val" if s in val else "train"
                          for s in frame["subject_id"]]
        frame["fold"] = k
        frames.append(frame)
    return frames


def fold_problem(frame: Any) -> str | None:
    """Why PU training cannot run on a fold's manifest, or None: its training and
    validation splits each need a labelled positive and an unlabelled subject, and the
    training split a subject with known truth (the class prior comes from those)."""
    for split in ("train", "val"):
        rows = frame[frame["split"].astype(str) == split]
        labels = rows.groupby("subject_id")["pu_label"].max()
        if not (labels == 1).any():
            return f"{split} split has no labelled positive"
        if not (labels == 0).any():
            return f"{split} split has no unlabelled subject"
    train = frame[frame["split"].astype(str) == "train"]
    if not train.groupby("subject_id")["truth"].first().notna().any():
        return "train split has no subject with a known truth (for the class prior)"
    return None


def fold_manifests(manifest: Any, folds: int, seed: int, out: Path) -> list[Path]:
    """Write ``out/fold<k>/manifest.csv`` for k < ``folds``; returns their paths.

    Fold k: test = the subjects of fold k (stratified by PU label and truth,
    :func:`adni_pu.cohort.kfold`), val = a stratified fifth of the others, train = the
    rest. Every subject is in the test split of exactly one fold. A file that already holds
    the same content is left untouched (so a resumed run sees the same manifest).
    """
    paths = []
    for k, frame in enumerate(fold_frames(manifest, folds, seed)):
        path = out / f"fold{k}" / "manifest.csv"
        text = frame.to_csv(index=False)
        if not (path.is_file() and path.read_text() == text):
            path.parent.mkdir(parents=True, exist_ok=True)
            fileio.atomic_write_text(path, text)
        paths.append(path)
    return paths


def pooled_metrics(predictions: Any, n_boot: int = 1000, seed: int = 0,
                   metrics: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Metrics of pooled per-subject predictions (``subject_id, logit, truth`` and, for the
    PU task's metrics, ``pu_label``) with percentile-bootstrap 95 % CIs over subjects;
    subjects with unknown truth are left out.

    Refuses a subject scored twice (each must come from the one fold that held it out).
    """
    from adni_pu.pu.metrics import bootstrap_ci
    from adni_pu.workflows.evaluate import METRICS, REPORT_METRICS

    twice = predictions["subject_id"][predictions["subject_id"].duplicated()]
    if len(twice):
        raise ValueError(f"subject(s) scored more than once: {sorted(set(twice))[:5]}")
    truth = predictions["truth"].astype(float).to_numpy()
    known = ~np.isnan(truth)
    pu = predictions["pu_label"].to_numpy(float) if "pu_label" in predictions else None
    out = {"n_subjects": int(len(predictions)), "n_scored": int(known.sum()),
           "n_positive": int(np.nansum(truth)),
           "metrics": bootstrap_ci(predictions["logit"].to_numpy(float), truth,
                                   metrics or (METRICS if pu is None else REPORT_METRICS),
                                   n_boot=n_boot, seed=seed, pu_label=pu)}
    if pu is not None:
        out["n_hidden"] = int(((pu == 0) & (truth == 1)).sum())
    return out


def volume_features(paths: Iterable[str | Path]) -> Any:
    """Per scan: ``hippocampus_ml`` (hippocampal tissue) and ``central_csf_ml`` (CSF around
    the lateral ventricles), measured on model-grid volumes (``adni-pu preprocess`` output).

    Tissue and CSF are told apart by intensity relative to the scan's brain median
    (``CSF_LEVEL``), so no segmentation is needed; the numbers are proxies, good for
    ranking subjects, not calibrated volumes.
    """
    import pandas as pd

    from adni_pu import atlas
    from adni_pu.data.grid_check import read_model_grid

    affine = atlas.model_grid_affine()
    shape = atlas.MODEL_GRID_SHAPE
    hippocampus = atlas.region_mask(atlas.HIPPOCAMPUS_LEFT + atlas.HIPPOCAMPUS_RIGHT)
    box = atlas.mm_box_mask(VENTRICLE_BOX_MM, affine, shape)
    voxel_ml = abs(float(np.linalg.det(affine[:3, :3]))) / 1000.0
    rows = []
    for path in paths:
        vol = read_model_grid(path, shape)  # the model-grid input check (ManifestError)
        brain = vol > 0
        level = CSF_LEVEL * float(np.median(vol[brain])) if brain.any() else 0.0
        rows.append({"scan_path": str(path),
                     "hippocampus_ml": float((hippocampus & (vol > level)).sum()) * voxel_ml,
                     "central_csf_ml": float((box & brain & (vol <= level)).sum()) * voxel_ml})
    return pd.DataFrame(rows, columns=["scan_path", "hippocampus_ml", "central_csf_ml"])


FEATURES: tuple[str, ...] = ("hippocampus_ml", "central_csf_ml")


def logistic_reference(frame: Any, features: Any) -> Any:
    """Held-out logits of a logistic regression on :data:`FEATURES`, one fold.

    ``frame``: the fold's manifest (``subject_id, scan_path, pu_label, truth, split``);
    ``features``: :func:`volume_features` rows keyed by ``scan_path``. Fitted on the
    training subjects' PU labels (labelled vs unlabelled, what the naive method learns
    from; no truth), standardised on them; returns ``subject_id, logit, truth`` of the
    test subjects (scan logits averaged per subject).
    """
    import pandas as pd
    from sklearn.linear_model import LogisticRegression

    rows = frame.merge(features, on="scan_path", how="left")
    if rows[list(FEATURES)].isna().any().any():
        missing = rows.loc[rows[list(FEATURES)].isna().any(axis=1), "scan_path"].iloc[0]
        raise ValueError(f"{missing}: no volume features")
    train = rows[rows["split"] == "train"]
    test = rows[rows["split"] == "test"]
    mean = train[list(FEATURES)].mean()
    std = train[list(FEATURES)].std(ddof=0).replace(0.0, 1.0)
    model = LogisticRegression(class_weight="balanced")
    model.fit(((train[list(FEATURES)] - mean) / std).to_numpy(),
              train["pu_label"].astype(int).to_numpy())
    logits = model.decision_function(((test[list(FEATURES)] - mean) / std).to_numpy())
    scans = pd.DataFrame({"subject_id": test["subject_id"].to_numpy(), "logit": logits,
                          "truth": test["truth"].astype(float).to_numpy()})
    return scans.groupby("subject_id", sort=True).agg(
        logit=("logit", "mean"), truth=("truth", "first")).reset_index()


def paired_difference(a: Any, b: Any, n_boot: int = 1000, seed: int = 0,
                      level: float = 0.95, metric: str = "auc") -> dict[str, Any]:
    """``metric`` (AUC by default; ``accuracy``, or a PU metric when both frames carry
    ``pu_label``) of ``a`` minus that of ``b`` on the same subjects, with a paired
    bootstrap CI.

    ``a`` and ``b``: per-subject predictions (``subject_id, logit, truth`` and optionally
    ``seed``, one row per subject and seed). Subjects with unknown truth are left out and
    both must score the same subjects. The bootstrap resamples seeds, then subjects within
    each drawn seed, and takes the same draw for both methods (paired); the difference is
    the mean over seeds of the per-seed AUC difference. Returns ``value, ci_low, ci_high``,
    the share of resamples where ``a`` is better, and the counts.
    """
    from adni_pu.pu.metrics import binary_metrics, paired_bootstrap

    keys = ["seed", "subject_id"]
    a = a.assign(seed=a.get("seed", 0))
    b = b.assign(seed=b.get("seed", 0))
    extra = ["pu_label"] if "pu_label" in a else []
    both = a[keys + ["logit", "truth"] + extra].merge(
        b[keys + ["logit"]], on=keys, how="outer", suffixes=("_a", "_b"), indicator=True)
    if (both["_merge"] != "both").any():
        odd = both.loc[both["_merge"] != "both", "subject_id"].iloc[0]
        raise ValueError(f"paired difference: subject {odd} is scored by one method only")
    both = both[both["truth"].notna()]
    if not extra:
        both = both.assign(pu_label=np.nan)
    groups = [(g["logit_a"].to_numpy(float), g["logit_b"].to_numpy(float),
               g["truth"].to_numpy(float), g["pu_label"].to_numpy(float))
              for _, g in both.groupby("seed", sort=True)]

    def diff(picks: list[tuple[int, np.ndarray]]) -> float:
        values = []
        for g, idx in picks:
            la, lb, truth, pu = (arr[idx] for arr in groups[g])
            pu = pu if extra else None
            values.append(binary_metrics(la, truth, pu)[metric]
                          - binary_metrics(lb, truth, pu)[metric])
        values = [v for v in values if not np.isnan(v)]  # a resample with one class only
        return float(np.mean(values)) if values else float("nan")

    out = paired_bootstrap([len(g[2]) for g in groups], diff, n_boot, seed, level)
    return {**out, "metric": metric,
            "n_subjects": int(len(both)), "n_seeds": len(groups), "resamples": n_boot}

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

from pathlib import Path
from typing import Any

import numpy as np

from adni_pu import fileio
from adni_pu.errors import ConfigError

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



"""Subject-level splits (train/validation/test and k folds); the leakage guard is
:mod:`adni_pu.cohort.leakage`.

Every visit of a subject stays in the subject's split. Subjects are ordered stratum by
stratum (pu_label x truth) and, inside a stratum, by sex and age when balancing is on;
a largest-deficit allocation then walks that order so every stratum (and every stretch
of similar age and sex) gets each split in proportion, to within two subjects. Shuffling
the allocation inside short windows makes it random; the seed fixes it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from adni_pu.cohort.config import SplitSettings

# The leakage guard lives in adni_pu.cohort.leakage; its names stay importable from here.
from adni_pu.cohort.leakage import (  # noqa: F401
    assert_manifest_no_leakage,
    assert_no_leakage,
    check_manifest_splits,
)
from adni_pu.errors import LeakageError  # noqa: F401

SPLITS = ("train", "val", "test")


def strata(subjects: pd.DataFrame) -> pd.Series:
    """Stratum of each subject: ``pu<label>|truth<0/1/unknown>``."""
    truth = subjects["truth"].astype("Int64").astype("string").fillna("unknown")
    return "pu" + subjects["pu_label"].astype(int).astype(str) + "|truth" + truth.astype(str)


def _deficit_pattern(n: int, proportions: np.ndarray) -> np.ndarray:
    """Group of each of ``n`` positions so that every prefix is proportional within 1."""
    counts = np.zeros(len(proportions))
    out = np.empty(n, dtype=int)
    for i in range(n):
        j = int(np.argmax(proportions * (i + 1) - counts))
        out[i] = j
        counts[j] += 1
    return out


def _ordered(subjects: pd.DataFrame, settings: SplitSettings, rng: np.random.Generator
             ) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the subjects in allocation order, and each one's stratum number."""
    frame = subjects.reset_index(drop=True).copy()
    frame["_shuffle"] = rng.permutation(len(frame))
    frame["_stratum"] = strata(frame) if settings.stratify else "all"
    keys = ["_stratum"]
    if "sex" in settings.balance_covariates:
        frame["_sex"] = frame["sex"].astype("string").fillna("~")
        keys.append("_sex")
    if "age" in settings.balance_covariates:
        keys.append("age")
    keys.append("_shuffle")
    frame = frame.sort_values(keys, na_position="last", kind="stable")
    codes = pd.factorize(frame["_stratum"])[0]
    return frame.index.to_numpy(), codes


def _allocate(order_strata: np.ndarray, proportions: list[float], rng: np.random.Generator,
              window: int) -> np.ndarray:
    pattern = _deficit_pattern(len(order_strata), np.asarray(proportions, dtype=float))
    start = 0
    while start < len(pattern):
        stop = start + 1
        while (stop < len(pattern) and stop - start < window
               and order_strata[stop] == order_strata[start]):
            stop += 1
        rng.shuffle(pattern[start:stop])
        start = stop
    return pattern


def assign_splits(subjects: pd.DataFrame, settings: SplitSettings) -> pd.DataFrame:
    """Add ``split`` (train/val/test) and ``fold`` (0..k-1, -1 for test or no folds).

    ``subjects`` needs ``subject_id, pu_label, truth`` and, for balancing, ``sex, age``;
    one row per subject.
    """
    if subjects["subject_id"].duplicated().any():
        raise ValueError("assign_splits: one row per subject expected")
    # The split depends on the subjects and the seed only, not on the row order.
    subjects = subjects.sort_values("subject_id", kind="stable").reset_index(drop=True)
    rng = np.random.default_rng(settings.seed)
    order, codes = _ordered(subjects, settings, rng)
    split = np.empty(len(subjects), dtype=object)
    fold = np.full(len(subjects), -1, dtype=int)
    if settings.k_folds >= 2:
        window = max(settings.k_folds, int(np.ceil(1.0 / max(settings.test_fraction, 1e-9)))
                     if settings.test_fraction > 0 else settings.k_folds)
        first = _allocate(codes, [1 - settings.test_fraction, settings.test_fraction], rng,
                          min(window, 20))
        test = first == 1
        split[order[test]] = "test"
        rest = order[~test]
        folds = _allocate(codes[~test], [1.0 / settings.k_folds] * settings.k_folds, rng,
                          settings.k_folds)
        fold[rest] = folds
        split[rest] = np.where(folds == settings.fold, "val", "train")
    else:
        props = [1 - settings.val_fraction - settings.test_fraction, settings.val_fraction,
                 settings.test_fraction]
        smallest = min([p for p in props if p > 0])
        window = min(int(np.ceil(1.0 / smallest)), 20)
        groups = _allocate(codes, props, rng, window)
        split[order] = np.asarray(SPLITS, dtype=object)[groups]
    out = subjects.reset_index(drop=True).copy()
    out["split"] = split
    out["fold"] = fold
    return out


def kfold(subjects: pd.DataFrame, k: int, seed: int = 0, stratify: bool = True,
          balance_covariates: list[str] | None = None) -> pd.Series:
    """Fold number 0..k-1 of each subject (stratified, seeded), indexed by subject_id.

    A notebook-level helper for cross-validation over all given subjects (no test hold-out).
    """
    settings = SplitSettings(seed=seed, test_fraction=0.0, k_folds=k, stratify=stratify,
                             balance_covariates=list(balance_covariates or []))
    out = assign_splits(subjects, settings)
    return pd.Series(out["fold"].to_numpy(), index=out["subject_id"], name="fold")

"""The folds of a comparison: by subject (canonical PTID), stratified on the PU label.

Fold k's manifest: ``test`` = the subjects of fold k (held out: they decide nothing),
``val`` = a stratified fifth of the other subjects (the first of the five parts, by PU
labels alone, that leaves a labelled positive and an unlabelled subject in both train and
val; it picks the epoch and the model),
``train`` = the rest. A subject's visits stay together, and every subject is held out by
exactly one fold. With a fixed test set (``test_size`` subjects drawn stratified, or the
manifest's own ``split == "test"`` rows kept) the folds cross-validate the other subjects
only, and the test set is scored by every fold model but chooses nothing (Wen et al. 2020).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adni_pu.errors import ConfigError

#: The validation split is one of this many stratified parts of a fold's training part.
VAL_PARTS = 5
#: The largest number of folds the refusal's search for a workable K tries.
MAX_FOLDS = 20


def subject_table(frame: Any) -> Any:
    """One row per canonical subject: ``subject_id, pu_label, truth, split`` (the manifest's
    split of the subject's first scan)."""
    from adni_pu.cohort.ids import scans_by_subject

    return scans_by_subject(frame).groupby("subject_id", sort=True).agg(
        pu_label=("pu_label", "max"), truth=("truth", "first"),
        split=("split", "first")).reset_index()


def _kfold(subjects: Any, k: int, seed: int) -> Any:
    from adni_pu.cohort import kfold

    return kfold(subjects[["subject_id", "pu_label", "truth"]], k, seed)


def test_subjects(subjects: Any, test_size: int | None, keep_test: bool, seed: int) -> set[str]:
    """The fixed test set's subjects: the manifest's ``test`` subjects (``keep_test``), or
    ``test_size`` subjects drawn stratified on the PU label and truth; empty without one."""
    if keep_test:
        return set(subjects.loc[subjects["split"].astype(str) == "test", "subject_id"])
    if not test_size:
        return set()
    if not 0 < test_size < len(subjects):
        raise ConfigError(f"--test-size {test_size}: expected 1 to {len(subjects) - 1} "
                          f"(the cohort has {len(subjects)} subjects)")
    parts = max(2, round(len(subjects) / test_size))
    fold = _kfold(subjects, parts, seed + 1000)
    order = fold.sort_values(kind="stable")  # fold 0 first, then fold 1, ...
    return set(order.index[:test_size])


def fold_assignment(subjects: Any, folds: int, seed: int) -> list[dict[str, str]]:
    """Per fold: subject id -> ``train``, ``val`` or ``test`` (the held-out fold)."""
    held = _kfold(subjects, folds, seed)
    out = []
    for k in range(folds):
        test = set(held.index[held == k])
        rest = subjects[~subjects["subject_id"].isin(test)]
        inner = _kfold(rest, VAL_PARTS, seed + 1 + k)
        options = []
        for part in range(VAL_PARTS):  # the first inner part that leaves both trainable
            val = set(inner.index[inner == part])
            options.append({s: "test" if s in test else "val" if s in val else "train"
                            for s in subjects["subject_id"]})
            if assignment_problem(subjects, options[-1]) is None:
                break
        out.append(options[-1] if assignment_problem(subjects, options[-1]) is None
                   else options[0])
    return out


def assignment_problem(subjects: Any, assignment: dict[str, str]) -> str | None:
    """Why PU training cannot run on a fold: its training and validation splits each need a
    labelled positive and an unlabelled subject. None when it can."""
    labels = subjects.set_index("subject_id")["pu_label"]
    for split in ("train", "val"):
        ids = [s for s, where in assignment.items() if where == split]
        values = labels.loc[ids]
        if not (values == 1).any():
            return f"its {split} split has no labelled positive"
        if not (values == 0).any():
            return f"its {split} split has no unlabelled subject"
    return None


def workable_folds(subjects: Any, folds: int, seed: int) -> str | None:
    """Why ``folds`` folds of ``subjects`` cannot all be trained, or None."""
    if len(subjects) < 3 * folds:
        return f"{len(subjects)} subjects are too few (each fold needs train, val and test)"
    for k, assignment in enumerate(fold_assignment(subjects, folds, seed)):
        problem = assignment_problem(subjects, assignment)
        if problem is not None:
            return f"fold {k}: {problem}"
    return None


def check_folds(subjects: Any, folds: int, seed: int, where: str) -> None:
    """Refuse ``folds`` folds that cannot all train, naming the largest K that works."""
    if folds < 2:
        raise ConfigError(f"--folds {folds}: expected at least 2 (every subject is held out "
                          "by one fold)")
    problem = workable_folds(subjects, folds, seed)
    if problem is None:
        return
    good = [k for k in range(2, MAX_FOLDS + 1) if workable_folds(subjects, k, seed) is None]
    hint = (f"the largest number of folds that works is {max(good)}" if good else
            "no number of folds works: the cohort needs more labelled positive subjects")
    raise ConfigError(f"{where}: {folds} folds of {len(subjects)} subjects cannot all train "
                      f"({problem}: every fold's train and validation split needs a labelled "
                      f"positive and an unlabelled subject); {hint}")


def fold_frames(frame: Any, folds: int, seed: int, test: set[str]) -> tuple[list[Any], Any]:
    """The fold manifests and the fixed test set's manifest (None without one).

    ``frame``: the manifest with absolute scan paths. Rows keep every column; ``split`` is
    rewritten and ``fold`` added. The test set's rows get ``split = "test"`` in a manifest
    of their own, so no fold's training ever sees them."""
    from adni_pu.cohort.ids import normalise_subject_id

    canonical = [normalise_subject_id(s) or str(s) for s in frame["subject_id"]]
    subjects = subject_table(frame)
    rest = subjects[~subjects["subject_id"].isin(test)].reset_index(drop=True)
    keep = [c not in test for c in canonical]
    frames = []
    for k, assignment in enumerate(fold_assignment(rest, folds, seed)):
        part = frame[keep].copy()
        part["split"] = [assignment[c] for c, kept in zip(canonical, keep) if kept]
        part["fold"] = k
        frames.append(part.reset_index(drop=True))
    test_frame = None
    if test:
        test_frame = frame[[not k for k in keep]].copy().reset_index(drop=True)
        test_frame["split"] = "test"
    return frames, test_frame


def absolute_scan_paths(frame: Any, base: Path) -> Any:
    """The manifest with each relative ``scan_path`` made absolute (from ``base``), so a
    fold manifest written elsewhere finds the same files."""
    paths = [str(p if Path(p).is_absolute() else (base / p).resolve())
             for p in frame["scan_path"].astype(str)]
    return frame.assign(scan_path=paths)


def holdout_subjects(frame: Any) -> Any:
    """One row per canonical subject with what the cohort builder's split balances on:
    ``subject_id, pu_label, truth, sex, age`` (the first scan's sex, the youngest scan's
    age: the baseline age ``adni-pu cohort build`` splits on)."""
    from adni_pu.cohort.ids import scans_by_subject

    scans = scans_by_subject(frame)
    for column in ("sex", "age"):
        if column not in scans:
            scans[column] = None
    return scans.groupby("subject_id", sort=True).agg(
        pu_label=("pu_label", "max"), truth=("truth", "first"), sex=("sex", "first"),
        age=("age", "min")).reset_index()


def holdout_assignment(subjects: Any, holdout: int, val_fraction: float, seed: int
                       ) -> dict[str, str]:
    """Seed ``seed``'s repeated hold-out: subject id -> ``test`` (about ``holdout``
    subjects, to within one), ``val`` (``val_fraction`` of all subjects) or ``train``.

    The split of ``adni-pu cohort build`` (:func:`adni_pu.cohort.assign_splits`, stratified
    on the PU label and truth, balanced on sex and age) with split seed ``seed`` and
    ``test_fraction = holdout / subjects``: a cohort built with those settings holds out the
    same subjects."""
    from adni_pu.cohort import assign_splits
    from adni_pu.cohort.config import SplitSettings

    table = subjects[["subject_id", "pu_label", "truth", "sex", "age"]].copy()
    table["truth"] = table["truth"].astype(float).astype("Int64")
    settings = SplitSettings(seed=seed, test_fraction=holdout / len(table),
                             val_fraction=val_fraction)
    split = assign_splits(table, settings)
    return dict(zip(split["subject_id"], split["split"].astype(str)))


def check_holdout(subjects: Any, holdout: int, val_fraction: float, seeds: tuple[int, ...],
                  where: str) -> None:
    """Refuse a hold-out that cannot train: too many held out, or a seed whose training or
    validation split lacks a labelled positive or an unlabelled subject."""
    n = len(subjects)
    if not 0 < holdout < n:
        raise ConfigError(f"--holdout {holdout}: expected 1 to {n - 1} (the cohort has {n} "
                          "subjects)")
    if not 0 < val_fraction < 1 - holdout / n:
        raise ConfigError(f"--val-fraction {val_fraction}: expected above 0 and below "
                          f"{1 - holdout / n:.3f} (what --holdout {holdout} of {n} leaves)")
    for seed in seeds:
        problem = assignment_problem(subjects, holdout_assignment(subjects, holdout,
                                                                  val_fraction, seed))
        if problem is not None:
            raise ConfigError(f"{where}: --holdout {holdout} with seed {seed} cannot train "
                              f"({problem}; every training and validation split needs a "
                              "labelled positive and an unlabelled subject); hold out fewer "
                              "subjects or raise --val-fraction")


def holdout_frame(frame: Any, assignment: dict[str, str]) -> Any:
    """The manifest with ``split`` from a hold-out ``assignment`` (every row kept; ``fold``
    -1: no folds)."""
    from adni_pu.cohort.ids import normalise_subject_id

    part = frame.copy()
    part["split"] = [assignment[normalise_subject_id(s) or str(s)] for s in frame["subject_id"]]
    part["fold"] = -1
    return part.reset_index(drop=True)

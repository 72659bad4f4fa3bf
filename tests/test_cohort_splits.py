"""Subject-level splits: disjoint, stratified, seeded, k-fold; the leakage guard."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from adni_pu.cohort.config import SplitSettings
from adni_pu.cohort.splits import (
    LeakageError,
    assert_manifest_no_leakage,
    assert_no_leakage,
    assign_splits,
    check_manifest_splits,
    kfold,
    strata,
)


def subjects(n: int = 400, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    pu = (rng.random(n) < 0.3).astype(int)
    truth = pd.array(np.where(rng.random(n) < 0.5, 1, 0), dtype="Int64")
    truth[rng.random(n) < 0.25] = pd.NA
    return pd.DataFrame({
        "subject_id": [f"{i:03d}_S_{i:04d}" for i in range(n)], "pu_label": pu, "truth": truth,
        "sex": rng.choice(["M", "F"], n), "age": rng.normal(74, 7, n).round(1),
    })


def test_each_subject_in_exactly_one_split_with_stratification():
    subs = subjects()
    settings = SplitSettings(seed=1, val_fraction=0.15, test_fraction=0.2)
    out = assign_splits(subs, settings)
    assert out["subject_id"].is_unique and len(out) == len(subs)
    assert set(out["split"]) == {"train", "val", "test"}
    out["stratum"] = strata(out).to_numpy()
    for _, group in out.groupby("stratum"):
        n = len(group)
        for split, frac in (("train", 0.65), ("val", 0.15), ("test", 0.2)):
            assert abs((group["split"] == split).sum() - frac * n) <= 2.0, (split, n)
    # Sex is balanced too (the allocation walks subjects sorted by sex and age).
    for split in ("train", "test"):
        share = (out.loc[out["split"] == split, "sex"] == "F").mean()
        assert abs(share - (out["sex"] == "F").mean()) < 0.05


def test_same_seed_same_split_different_seed_differs():
    subs = subjects()
    a = assign_splits(subs, SplitSettings(seed=7))
    b = assign_splits(subs.sample(frac=1.0, random_state=3), SplitSettings(seed=7))
    merged = a.merge(b, on="subject_id")
    assert (merged["split_x"] == merged["split_y"]).all()  # row order does not matter
    c = assign_splits(subs, SplitSettings(seed=7))
    assert a["split"].tolist() == c["split"].tolist()
    d = assign_splits(subs, SplitSettings(seed=8))
    assert (a["split"] != d["split"]).sum() > 20


def test_kfold_assigns_every_non_test_subject_one_fold():
    subs = subjects(300)
    out = assign_splits(subs, SplitSettings(seed=0, k_folds=5, fold=2, test_fraction=0.2))
    test = out["split"] == "test"
    assert (out.loc[test, "fold"] == -1).all()
    folds = out.loc[~test, "fold"]
    assert set(folds) == {0, 1, 2, 3, 4}
    sizes = folds.value_counts()
    assert sizes.max() - sizes.min() <= 2
    assert (out.loc[out["fold"] == 2, "split"] == "val").all()
    assert (out.loc[~test & (out["fold"] != 2), "split"] == "train").all()
    assert abs(test.sum() - 60) <= 2
    cv = kfold(subs, k=4, seed=1)
    assert cv.index.is_unique and set(cv) == {0, 1, 2, 3}


def test_split_settings_are_validated():
    with pytest.raises(ValueError, match="together below 1"):
        SplitSettings(val_fraction=0.6, test_fraction=0.5)
    with pytest.raises(ValueError, match="k_folds"):
        SplitSettings(k_folds=1)
    with pytest.raises(ValueError, match="fold"):
        SplitSettings(k_folds=3, fold=3)


def test_leakage_guard_lists_shared_subjects():
    assert_no_leakage(["011_S_0001", "011_S_0002"], ["011_S_0003"])
    with pytest.raises(LeakageError) as info:
        assert_no_leakage(["011_S_0001", "sub-ADNI011S0002"], ["011_S_0002", "011_S_0003",
                                                              "ADNI011S0001"])
    text = str(info.value)
    assert "2 evaluation subject(s)" in text
    assert "011_S_0001" in text and "011_S_0002" in text and "011_S_0003" not in text


def test_manifest_guard_catches_a_subject_in_two_splits():
    manifest = pd.DataFrame({"subject_id": ["a", "a", "b", "c"],
                             "split": ["train", "train", "test", "val"]})
    check_manifest_splits(manifest)
    assert_manifest_no_leakage(manifest)
    manifest.loc[1, "split"] = "test"
    with pytest.raises(LeakageError, match="a: \\['test', 'train'\\]"):
        check_manifest_splits(manifest)
    with pytest.raises(LeakageError):
        assert_manifest_no_leakage(manifest)

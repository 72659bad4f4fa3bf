"""``adni-pu benchmark cohort``: folds, the fixed test set, bad inputs, pooled and paired
scores, resume, the fold ensemble (tiny cohorts)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.workflows.compare.folds import check_folds, fold_frames, subject_table

RUNNER = CliRunner()


def _manifest(n: int = 30, positives: int = 10, seed: int = 0) -> pd.DataFrame:
    """``n`` subjects (every third with two visits), the first ``positives`` labelled."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        truth = 1 if i < positives or rng.random() < 0.3 else 0
        for visit in (("bl", "m12") if i % 3 == 0 else ("bl",)):
            rows.append({"subject_id": f"{100 + i:03d}_S_{i:04d}", "session_id": visit,
                         "scan_path": f"vol/{i}_{visit}.nii", "pu_label": int(i < positives),
                         "truth": float(truth), "split": "train"})
    return pd.DataFrame(rows)


def test_folds_are_disjoint_and_hold_out_every_subject_once():
    frame = _manifest()
    frames, test = fold_frames(frame, 3, 0, set())
    assert test is None
    held = [set(f.loc[f["split"] == "test", "subject_id"]) for f in frames]
    assert set().union(*held) == set(frame["subject_id"])
    assert sum(len(h) for h in held) == frame["subject_id"].nunique()  # no subject twice
    for f, h in zip(frames, held):
        used = set(f.loc[f["split"].isin(["train", "val"]), "subject_id"])
        assert not used & h  # a held-out subject is in neither train nor val
        assert (f.groupby("subject_id")["split"].nunique() == 1).all()  # visits together
        for split in ("train", "val"):
            labels = f[f["split"] == split].groupby("subject_id")["pu_label"].max()
            assert (labels == 1).any() and (labels == 0).any()


def test_fixed_test_set_chooses_nothing():
    frame = _manifest(40, 12)
    subjects = subject_table(frame)
    test = set(subjects["subject_id"][::8])
    frames, test_frame = fold_frames(frame, 3, 0, test)
    assert set(test_frame["subject_id"]) == test and (test_frame["split"] == "test").all()
    for f in frames:
        assert not set(f["subject_id"]) & test  # in no fold's train, val or held-out part
    # the test subjects' labels and truth change nothing about the folds
    flipped = frame.copy()
    mask = flipped["subject_id"].isin(test)
    flipped.loc[mask, "truth"] = 1 - flipped.loc[mask, "truth"]
    flipped.loc[mask, "pu_label"] = 1 - flipped.loc[mask, "pu_label"]
    again, _ = fold_frames(flipped, 3, 0, test)
    for a, b in zip(frames, again):
        pd.testing.assert_frame_equal(a, b)


def test_too_few_positives_names_the_largest_k():
    from adni_pu.errors import ConfigError
    from adni_pu.workflows.compare.folds import MAX_FOLDS, workable_folds

    subjects = subject_table(_manifest(30, 3))  # 2 folds: one holds out 2 of the 3 positives
    with pytest.raises(ConfigError, match=r"2 folds of 30 subjects cannot all train") as err:
        check_folds(subjects, 2, 0, "m.csv")
    k = int(str(err.value).rsplit("is ", 1)[1])
    check_folds(subjects, k, 0, "m.csv")  # the K it names works, and no larger one does
    assert all(workable_folds(subjects, j, 0) for j in range(k + 1, MAX_FOLDS + 1))


@pytest.mark.parametrize(("change", "args", "expected"), [
    ("nolabels", [], "pu_label"),
    ("", ["--methods", "naive,magic"], "unknown method 'magic'"),
    ("", ["--folds", "1"], "--folds 1: expected at least 2"),
    ("", ["--seeds", "0"], "--seeds 0: expected at least 1"),
    ("", ["--piece", "99"], "--piece '99'"),
    ("", ["--piece", "3/2"], "shard '3/2'"),
])
def test_bad_input_is_one_line_before_any_work(tmp_path, change, args, expected):
    frame = _manifest()
    if change == "nolabels":
        frame["pu_label"] = 0
    path = tmp_path / "manifest.csv"
    frame.to_csv(path, index=False)
    out = tmp_path / "out"
    result = RUNNER.invoke(app, ["benchmark", "cohort", str(path), str(out), *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], result.output
    assert not (out / "pieces").exists()


def _frame(logits: list[float], truth: list[int], seed: int = 0) -> pd.DataFrame:
    n = len(logits)
    return pd.DataFrame({"seed": seed, "subject_id": [f"s{i}" for i in range(n)],
                         "logit": logits, "probability": 1 / (1 + np.exp(-np.array(logits))),
                         "truth": np.array(truth, float), "pu_label": [1, 0] * (n // 2)})


def test_pooled_metrics_and_paired_ci_against_a_hand_computation():
    from adni_pu.workflows.compare.scores import method_scores, paired_scores

    truth = [1, 1, 0, 0, 1, 0]
    a = pd.concat([_frame([2, -1, -3, 1, 4, -2], truth, 0), _frame([1, 1, -1, -1, 1, -1],
                                                                   truth, 1)])
    scored = method_scores(a, n_boot=200)
    acc = scored["metrics"]["accuracy"]
    assert acc["value"] == pytest.approx((4 / 6 + 6 / 6) / 2)  # mean over seeds
    assert acc["over_seeds"]["mean"] == pytest.approx(5 / 6)
    assert acc["over_seeds"]["std"] == pytest.approx(np.std([4 / 6, 1.0], ddof=1))
    # the CI by hand: the same draws (seeds, then subjects within each drawn seed)
    rng = np.random.default_rng(0)
    right = [np.array([1, 0, 1, 0, 1, 1.0]), np.ones(6)]
    draws = []
    for _ in range(200):
        seeds = rng.integers(0, 2, 2)
        draws.append(np.mean([right[g][rng.integers(0, 6, 6)].mean() for g in seeds]))
    assert acc["ci_low"] == pytest.approx(np.percentile(draws, 2.5))
    assert acc["ci_high"] == pytest.approx(np.percentile(draws, 97.5))
    # a method right everywhere against one wrong everywhere: +1 in every resample
    good = _frame([1, 1, -1, -1, 1, -1], truth)
    bad = _frame([-1, -1, 1, 1, -1, 1], truth)
    pair = paired_scores({"good": good, "bad": bad}, [("good", "bad")], 100)[0]
    acc = pair["metrics"]["accuracy"]
    assert (acc["value"], acc["ci_low"], acc["ci_high"]) == (1.0, 1.0, 1.0)
    assert acc["share_a_better"] == 1.0


def test_calibration_error_by_hand():
    from adni_pu.workflows.compare.scores import calibration

    cal = calibration(np.array([0.05, 0.05, 0.95, 0.95, 0.55]), np.array([0, 1, 1, 1, np.nan]))
    # bins: 0 holds 0.05 twice (positive fraction 1/2), 9 holds 0.95 twice (fraction 1)
    assert cal["n"] == 4
    assert cal["ece"] == pytest.approx(0.5 * 0.45 + 0.5 * 0.05)

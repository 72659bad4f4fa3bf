"""The demo's cross-validation, pooled scoring, reference lines, report text and progress,
on tiny generated inputs (no training)."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from adni_pu import atlas
from adni_pu.cli.app import app
from adni_pu.workflows.compare.references import logistic_reference, volume_features
from adni_pu.workflows.compare.scores import method_scores
from adni_pu.workflows.demo import DemoSettings, StageProgress
from adni_pu.workflows.demo_report import coinciding, explanation, render_report, scope

runner = CliRunner()


def _manifest(n: int = 30, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 2, n).astype(float)
    truth[rng.random(n) < 0.2] = np.nan
    pu = ((truth == 1) & (rng.random(n) < 0.7)).astype(int)
    return pd.DataFrame({"subject_id": [f"S{i:03d}" for i in range(n)],
                         "session_id": "bl", "scan_path": [f"/x/S{i:03d}.nii.gz" for i in range(n)],
                         "pu_label": pu, "truth": truth, "split": "train", "fold": -1})


def test_pooled_scores_leave_out_unknown_truth_and_refuse_a_subject_twice():
    preds = pd.DataFrame({"seed": 0, "subject_id": ["a", "b", "c", "d"],
                          "logit": [2.0, 1.0, -1.0, 0.5], "truth": [1.0, 0.0, 0.0, np.nan],
                          "pu_label": [1, 0, 0, 0]})
    out = method_scores(preds, n_boot=50)
    assert out["n_subjects"] == 4 and out["n_scored"] == 3
    assert out["metrics"]["auc"]["value"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="scored twice"):
        method_scores(pd.concat([preds, preds.head(1)]), n_boot=0)


def _volume(path, hippocampus_level: float, csf_voxels: int) -> str:
    """A model-grid scan: brain at 100, the hippocampi at ``hippocampus_level``, and a dark
    slab of ``csf_voxels`` voxels along x at the ventricles' centre."""
    shape = atlas.MODEL_GRID_SHAPE
    vol = np.zeros(shape, np.float32)
    vol[20:-20, 20:-20, 20:-20] = 100.0
    vol[atlas.region_mask(atlas.HIPPOCAMPUS_LEFT + atlas.HIPPOCAMPUS_RIGHT)] = hippocampus_level
    centre = np.round(np.linalg.solve(atlas.model_grid_affine(), [0, -10, 12, 1])[:3]).astype(int)
    x, y, z = centre
    vol[x - csf_voxels // 2: x - csf_voxels // 2 + csf_voxels, y, z] = 10.0
    nib.save(nib.Nifti1Image(vol, atlas.model_grid_affine()), str(path))
    return str(path)


def test_volume_features_see_hippocampal_loss_and_ventricle_growth(tmp_path):
    healthy = _volume(tmp_path / "a.nii.gz", 90.0, 4)
    atrophic = _volume(tmp_path / "b.nii.gz", 20.0, 4)  # dark hippocampi: CSF, not tissue
    wide = _volume(tmp_path / "c.nii.gz", 90.0, 20)  # 16 more CSF voxels at the ventricles
    feats = volume_features([healthy, atrophic, wide]).set_index("scan_path")
    assert feats.loc[healthy, "hippocampus_ml"] > 5.0
    assert feats.loc[atrophic, "hippocampus_ml"] == 0.0
    voxel_ml = 1.5 ** 3 / 1000
    assert feats.loc[healthy, "central_csf_ml"] == pytest.approx(4 * voxel_ml)
    assert feats.loc[wide, "central_csf_ml"] == pytest.approx(20 * voxel_ml)


def test_logistic_reference_is_fitted_on_the_training_subjects_only():
    frame = _manifest(40, seed=3)
    frame["split"] = ["test" if i % 4 == 0 else "train" for i in range(len(frame))]
    rng = np.random.default_rng(0)
    features = pd.DataFrame({"scan_path": frame["scan_path"],
                             "hippocampus_ml": 6.0 - frame["pu_label"] + rng.normal(0, 0.3, 40),
                             "central_csf_ml": 20.0 + rng.normal(0, 1.0, 40)})
    out = logistic_reference(frame, features)
    assert sorted(out["subject_id"]) == sorted(frame.loc[frame["split"] == "test", "subject_id"])
    # smaller hippocampi were labelled more often, so they get higher logits
    merged = out.merge(features.assign(subject_id=frame["subject_id"]), on="subject_id")
    assert np.corrcoef(merged["logit"], merged["hippocampus_ml"])[0, 1] < -0.9
    # the test subjects' labels play no part
    flipped = frame.copy()
    test = flipped["split"] == "test"
    flipped.loc[test, "pu_label"] = 1 - flipped.loc[test, "pu_label"]
    assert np.allclose(logistic_reference(flipped, features)["logit"], out["logit"])


#: A comparison without paired differences or a truth to calibrate against.
NO_COMPARISON = {"paired": [], "calibration": None}


def _result(logits, truth, share=None, column=None, pu_label=None):
    preds = pd.DataFrame({"subject_id": [f"s{i}" for i in range(len(logits))],
                          "logit": logits, "truth": truth})
    preds["pu_label"] = (pu_label if pu_label is not None
                         else (preds["truth"] == 1).astype(int))
    scores = method_scores(preds.assign(seed=0), n_boot=100)
    scores["n_positive"] = int(np.nansum(preds["truth"]))
    return {"pooled": scores, "val_auc": 0.7, "seconds": 1.0,
            "folds": [{"prior": {"prior": 0.5, "source": "given"}, "prior_estimate": None}],
            "nn_correction": share, "nn_correction_column": column,
            "predictions": preds.to_dict("records")}


def test_report_explains_coinciding_methods_and_a_correction_that_never_fired():
    truth = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, np.nan]
    same = [2.0, -1.0, 1.0, -2.0, 0.5, 0.2, 0.0]
    results = {"naive": _result([1.0, 0.0, 0.5, -0.5, 0.2, 0.3, 0.0], truth),
               "upu": _result(same, truth),
               "nnpu": _result(same, truth, 0.0, "train/model/nn_correction"),
               "selfpu": _result([3.0, -1.0, -1.5, -2.0, 0.5, 0.2, 0.0], truth, 0.25,
                                 "train/student1/nn_correction")}
    results["selfpu"]["nn_correction_by_phase"] = {"phase1": 0.1, "phase2": 0.4}
    assert coinciding(results) == [(["upu", "nnpu"], "predictions")]
    refs = {"logistic regression on 2 volumes": _result(same, truth)}
    settings = DemoSettings(subjects=24, folds=2)
    text = "\n".join(explanation(settings, results, refs))
    assert "upu and nnpu gave bit-identical held-out predictions" in text
    assert "nnpu's non-negative correction never fired" in text
    assert "`train/model/nn_correction`" in text
    assert "selfpu's non-negative correction (of its nnPU risk) fired in 25.0 %" in text
    assert "metrics.csv; by phase: phase1 10.0 %, phase2 40.0 %)" in text
    assert "6 subjects with a known truth (3 positive), 1 without one" in text
    assert "**Threshold.**" not in text
    everyone = {"naive": _result([1.0, 1.0, 2.0, 0.5, 3.0, 0.2, 0.0], truth)}
    assert "naive called every scored subject with a negative truth positive" in "\n".join(
        explanation(settings, everyone, refs))
    report = render_report(settings, results, refs, {"total": 3.0}, "7 of 7 scans", "counts",
                           NO_COMPARISON)
    assert "| upu | 0.833 [" in report   # accuracy first (5 of 6), then AUC
    assert "| *reference: logistic regression on 2 volumes* | - | 1.000 [" in report
    assert "Self-PU per fold: fold 1: 0.500 (given)." in report


def test_report_shows_the_pu_effect_on_hidden_positives():
    """Accuracy first, hidden-positive recall and AUC, and the all-negative / all-positive
    reference lines, with naive against the PU methods in words."""
    truth = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, np.nan]
    pu = [1, 0, 0, 0, 0, 0, 0, 0, 0]          # one labelled, three hidden positives
    naive = [2.0, -1.0, -1.0, -0.5, -2.0, -2.0, -1.5, -1.0, 0.0]   # hidden called negative
    nnpu = [2.0, 1.0, 0.5, -0.5, -2.0, -2.0, 0.5, -1.0, 0.0]
    results = {"naive": _result(naive, truth, pu_label=pu),
               "nnpu": _result(nnpu, truth, 0.3, "train/model/nn_correction", pu_label=pu)}
    m = results["nnpu"]["pooled"]["metrics"]
    assert m["hidden_positive_recall"]["value"] == 2 / 3
    assert results["naive"]["pooled"]["metrics"]["hidden_positive_recall"]["value"] == 0.0
    # hidden AUC: hidden positives (1.0, 0.5, -0.5) against the unlabelled negatives
    # (-2, -2, 0.5, -1): 4 + 3.5 (a tie counts half) + 3 wins of 12 pairs
    assert m["hidden_auc"]["value"] == pytest.approx(10.5 / 12)
    assert results["nnpu"]["pooled"]["all_negative_accuracy"] == 0.5
    assert results["nnpu"]["pooled"]["n_hidden"] == 3
    refs = {"logistic regression on 2 volumes": _result(nnpu, truth, pu_label=pu)}
    settings = DemoSettings(subjects=24, folds=2)
    text = "\n".join(explanation(settings, results, refs))
    assert "3 of the 4 scored positives are unlabelled" in text
    assert "Hidden-positive recall: naive 0.000 [" in text and "; nnpu 0.667 [" in text
    assert "calling everyone negative scores 0.500, everyone positive 0.500" in text
    report = render_report(settings, results, refs, {"total": 3.0}, "9 of 9 scans",
                           "counts", NO_COMPARISON)
    assert ("| method | accuracy | AUC | balanced accuracy | hidden-positive recall | hidden AUC "
            "| sensitivity | specificity | validation AUC | seconds |") in report
    assert "| *reference: call everyone negative* | 0.500 | - |" in report
    assert "| *reference: logistic regression on 2 volumes* | - | " in report


def test_report_opens_with_what_a_cohort_this_size_can_show():
    """The first lines after the title give the CI widths measured on this run and point
    to the paper-scale results for effect sizes."""
    truth = [1.0, 0.0] * 10
    results = {"naive": _result([0.5, -0.5] * 10, truth),
               "nnpu": _result([0.5, 0.4, -0.3, -0.6] * 5, truth)}
    acc = [r["pooled"]["metrics"]["accuracy"] for r in results.values()]
    half = sum(a["ci_high"] - a["ci_low"] for a in acc) / len(acc) / 2
    text = scope(results)
    assert text.startswith("**What a cohort this size can show.** 20 subjects are scored "
                           "(10 positive, 0 of them hidden")
    assert f"span about +-{half:.2f} in accuracy" in text and half > 0
    assert "paper-scale results" in text and "docs/results.md" in text
    report = render_report(DemoSettings(subjects=24, folds=2), results, {}, {"total": 3.0},
                           "20 of 20 scans", "counts", NO_COMPARISON)
    head = report.split("## Results")[0]
    assert text in head   # before any table


def test_stage_progress_says_what_is_left():
    lines: list[str] = []
    now = iter([0.0, 10.0, 20.0, 40.0])
    progress = StageProgress(4, lines.append, "scan", clock=lambda: next(now))
    progress.step("sub-1: done")
    progress.step()
    progress.step()
    assert lines[0].strip() == "scan 1/4 sub-1: done | 10 s, ~30 s left"
    assert lines[1].strip() == "scan 2/4 | 20 s, ~20 s left"
    assert lines[2].strip() == "scan 3/4 | 40 s, ~13 s left"


def test_paired_difference_is_paired_over_subjects_and_seeds():
    from adni_pu.workflows.compare.scores import paired_difference

    rng = np.random.default_rng(0)
    rows = []
    for seed in (0, 1, 2):
        truth = rng.integers(0, 2, 40).astype(float)
        shared = rng.normal(0, 1, 40)  # what both methods see: a paired design removes it
        rows.append(pd.DataFrame({"seed": seed, "subject_id": [f"s{i}" for i in range(40)],
                                  "truth": truth, "good": shared + 1.5 * truth,
                                  "weak": shared + 1.0 * truth}))
    frame = pd.concat(rows)
    a = frame.rename(columns={"good": "logit"})[["seed", "subject_id", "logit", "truth"]]
    b = frame.rename(columns={"weak": "logit"})[["seed", "subject_id", "logit", "truth"]]
    out = paired_difference(a, b, n_boot=300)
    assert out["n_seeds"] == 3 and out["n_subjects"] == 120
    assert 0.0 < out["ci_low"] < out["value"] < out["ci_high"]
    assert out["share_a_better"] > 0.975
    same = paired_difference(a, a, n_boot=50)
    assert same["value"] == same["ci_low"] == same["ci_high"] == 0.0
    with pytest.raises(ValueError, match="one method only"):
        paired_difference(a, b.iloc[1:], n_boot=10)


# ------------------------------------------------------------ a cohort too small for its folds


def test_demo_refuses_a_cohort_too_small_for_its_folds_before_any_scan(tmp_path):
    out = tmp_path / "demo"
    result = runner.invoke(app, ["demo", "--subjects", "18", "--out", str(out)])
    assert result.exit_code == 2
    text = result.output.strip()
    assert text.startswith("error: --subjects 18: fold ") and "has no labelled positive" in text
    assert "the smallest --subjects that works with --folds 2 and --seed 0 is 26" in text
    assert not out.exists()  # nothing generated, nothing preprocessed


def test_the_composition_check_agrees_with_the_folds_the_demo_builds():
    from adni_pu.workflows.demo import (
        DemoSettings,
        check_composition,
        fold_problem,
        synthetic_manifest,
    )

    settings = DemoSettings(subjects=26)
    check_composition(settings)  # the smallest that works: accepted
    for n in (18, 26):  # one large build, cut to n subjects, gives the n-subject cohort
        alone, _ = synthetic_manifest(settings, n)
        big, ids = synthetic_manifest(settings, 40)
        cut = big[big["subject_id"].isin(ids[:n])].reset_index(drop=True)
        assert sorted(alone["subject_id"]) == sorted(cut["subject_id"])
        assert (fold_problem(settings, alone) is None) == (n == 26)

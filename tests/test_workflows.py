"""Training, evaluation and prediction on volumes (adni_pu.workflows), on a tiny cohort."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd
import pytest
from volume_helpers import NO_AUGMENTATION, make_volume_cohort, tiny_overrides

from adni_pu.cohort import LeakageError
from adni_pu.config import ConfigError
from adni_pu.errors import OutputError, ResumeError, VolumeRunError
from adni_pu.fileio import sha256_file
from adni_pu.workflows.evaluate import METRICS, evaluate_run
from adni_pu.workflows.predict import predict_scans, preprocess_folder
from adni_pu.workflows.train import train_volumes
from adni_pu.workflows.volume_settings import load_volume_config


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The cohort, a naive run (no augmentation, 4 epochs) and a 3-phase Self-PU run."""
    root = tmp_path_factory.mktemp("volrun")
    manifest = make_volume_cohort(root / "cohort")
    cache = root / "cache"
    naive_cfg = load_volume_config(None, tiny_overrides(4, cache) + NO_AUGMENTATION,
                                   preset="naive")
    naive = train_volumes(manifest, naive_cfg, root / "naive", log=lambda m: None)
    sp = ["train.selfpu.warmup_epochs=1", "train.selfpu.self_paced_end=2",
          "train.selfpu.select_every=1", "train.selfpu.teacher_rampup_epochs=1",
          "train.selfpu.rates=[0.6, 0.6]", 'train.selfpu.schedule="fixed"']
    selfpu_cfg = load_volume_config(None, tiny_overrides(3, cache) + sp, preset="selfpu")
    selfpu = train_volumes(manifest, selfpu_cfg, root / "selfpu", log=lambda m: None)
    return {"root": root, "manifest": manifest, "naive": naive, "selfpu": selfpu,
            "naive_cfg": naive_cfg}


def test_training_lowers_the_loss_and_writes_the_run_folder(runs):
    losses = [row["train/model/loss"] for row in runs["naive"].history]
    assert losses[-1] < losses[0]
    run = runs["root"] / "naive"
    for name in ("volume_config.toml", "config.toml", "splits.csv", "run.json",
                 "hippocampus_boxes.json", "val_predictions.csv", "metrics.csv",
                 "best_model.pt", "checkpoints/last.pt", "selection.json", "provenance.json"):
        assert (run / name).is_file(), name
    info = json.loads((run / "run.json").read_text())
    assert info["manifest_sha256"] == sha256_file(runs["manifest"])
    # prior from the cohort: 5 of the 9 training subjects with known truth are positive
    assert info["prior"]["prior"] == pytest.approx(5 / 9)
    assert info["prior"]["subjects_without_truth"] == 1
    splits = pd.read_csv(run / "splits.csv")
    assert set(splits["split"]) == {"train", "val", "test"} and len(splits) == 19
    val = pd.read_csv(run / "val_predictions.csv")
    assert len(val) == 4 and val["probability"].between(0, 1).all()
    # the resolved settings rebuild the same configuration
    again = load_volume_config(run / "volume_config.toml")
    assert again == runs["naive_cfg"]


def test_selfpu_runs_all_phases_on_volumes(runs):
    history = runs["selfpu"].history
    assert [row["phase"] for row in history] == [1, 2, 3]
    assert history[1]["trusted/student1/size"] > 0
    assert "train/student1/ce_weight_mean" in history[1]  # the meta (reweighting) step ran
    assert runs["selfpu"].best_candidate


def test_evaluate_reports_bootstrap_cis_and_counts(runs):
    result = evaluate_run(runs["root"] / "naive", "test", n_boot=200)
    assert result["n_subjects"] == 5 and result["n_scans"] == 6
    assert result["n_subjects_unknown_truth"] == 1 and result["n_scans_unknown_truth"] == 1
    for level in ("scan_level", "subject_level"):
        for metric in METRICS:
            entry = result[level][metric]
            if not math.isnan(entry["value"]):
                assert entry["ci_low"] <= entry["value"] + 1e-9
                assert entry["value"] <= entry["ci_high"] + 1e-9
    out = runs["root"] / "naive" / "evaluation" / "test"
    for name in ("metrics.json", "predictions_scans.csv", "predictions_subjects.csv",
                 "roc.png", "report.md"):
        assert (out / name).is_file(), name
    subjects = pd.read_csv(out / "predictions_subjects.csv")
    assert len(subjects) == 5
    # the PU task's numbers, recomputed by hand from the per-subject predictions
    known = subjects[subjects["truth"].notna()]
    hidden = known[(known["pu_label"] == 0) & (known["truth"] == 1)]
    assert result["n_hidden_positive_subjects"] == len(hidden)
    recall = result["subject_level"]["hidden_positive_recall"]["value"]
    if len(hidden):
        assert recall == pytest.approx((hidden["logit"] > 0).mean())
    assert result["subject_level"]["all_negative_accuracy"]["value"] == pytest.approx(
        (known["truth"] == 0).mean())
    report = (out / "report.md").read_text()
    assert "balanced accuracy" in report and "hidden-positive recall" in report
    assert "reference: all-negative accuracy" in report
    assert "## nnPU correction\n\nNot applicable: this run's loss has no non-negative" in report
    assert result["nn_correction"] is None


def test_evaluate_warns_when_the_training_manifest_changed_since(runs, tmp_path):
    cohort, run = tmp_path / "cohort", tmp_path / "naive"
    shutil.copytree(runs["manifest"].parent, cohort)
    shutil.copytree(runs["root"] / "naive", run)
    info = json.loads((run / "run.json").read_text())
    info["manifest"] = str(cohort / runs["manifest"].name)
    (run / "run.json").write_text(json.dumps(info))
    assert evaluate_run(run, "test", n_boot=0)["warnings"] == []
    frame = pd.read_csv(info["manifest"], dtype=str)
    frame.iloc[::-1].to_csv(info["manifest"], index=False)  # rows reordered by hand
    result = evaluate_run(run, "test", n_boot=0)
    assert len(result["warnings"]) == 1
    assert "changed since the run was trained on it" in result["warnings"][0]
    assert "**Warning:**" in (run / "evaluation" / "test" / "report.md").read_text()


def test_evaluate_report_says_how_often_the_nnpu_correction_fired(runs):
    result = evaluate_run(runs["root"] / "selfpu", "test", n_boot=10)
    summary = result["nn_correction"]
    assert summary["epochs"] == 3 and set(summary["by_phase"]) == {"phase1", "phase2", "phase3"}
    shares = [row["train/student1/nn_correction"] for row in runs["selfpu"].history]
    assert summary["first_epoch"] == pytest.approx(
        (shares[0] + runs["selfpu"].history[0]["train/student2/nn_correction"]) / 2)
    report = (runs["root"] / "selfpu" / "evaluation" / "test" / "report.md").read_text()
    assert "## nnPU correction" in report and "by phase: phase1" in report


def test_evaluate_report_without_metrics_csv_says_not_recorded(runs, tmp_path):
    run = tmp_path / "selfpu"
    shutil.copytree(runs["root"] / "selfpu", run)
    (run / "metrics.csv").unlink()
    assert evaluate_run(run, "test", n_boot=0)["nn_correction"] == {"recorded": False}
    report = (run / "evaluation" / "test" / "report.md").read_text()
    assert "## nnPU correction\n\nNot recorded: the run folder has no metrics.csv." in report


def test_leakage_guard_refuses_training_and_validation_subjects(runs, tmp_path):
    with pytest.raises(LeakageError, match="110_S_0010") as info:  # a validation subject
        evaluate_run(runs["root"] / "naive", "val", n_boot=10)
    assert "were also in the run's validation split, which chose the model" in str(info.value)
    assert "training" not in str(info.value) and "val_predictions.csv" in str(info.value)
    assert not (runs["root"] / "naive" / "evaluation" / "val").exists()
    frame = pd.read_csv(runs["manifest"])
    frame.loc[frame["subject_id"] == "101_S_0001", "split"] = "test"  # a training subject
    frame["scan_path"] = [str(runs["manifest"].parent / p) for p in frame["scan_path"]]
    other = tmp_path / "manifest.csv"
    frame.to_csv(other, index=False)
    with pytest.raises(LeakageError, match="101_S_0001.*never saw") as info:
        evaluate_run(runs["root"] / "naive", "test", manifest=other, n_boot=10)
    assert "1 'test' subject(s) were also in the run's training split" in str(info.value)


def test_prior_must_exceed_the_labelled_fraction(runs, tmp_path):
    cfg = load_volume_config(None, ["prior=0.05", *tiny_overrides(1)], preset="nnpu")
    with pytest.raises(VolumeRunError, match="labelled fraction"):
        train_volumes(runs["manifest"], cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # a refused run leaves no (empty) run folder


def test_train_prior_is_another_name_for_prior():
    cfg = load_volume_config(None, ["train.prior=0.6"])
    assert cfg.prior == 0.6 and cfg.train.prior is None
    assert load_volume_config(None, ["prior=0.6", "train.prior=0.6"]).prior == 0.6
    for both in (["prior=0.45", "train.prior=0.6"], ['prior="cohort"', "train.prior=0.6"]):
        with pytest.raises(ConfigError, match="disagree"):
            load_volume_config(None, both)


def test_the_recorded_prior_is_the_one_trained_with(runs, tmp_path):
    cfg = load_volume_config(None, ["train.prior=0.7", *tiny_overrides(1)], preset="nnpu")
    train_volumes(runs["manifest"], cfg, tmp_path / "run", log=lambda m: None)
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["prior"]
    used = json.loads((tmp_path / "run" / "data.json").read_text())["prior_used"]
    saved = load_volume_config(tmp_path / "run" / "volume_config.toml")
    assert recorded == {"prior": 0.7, "source": "setting"}
    assert used == 0.7 and saved.prior == 0.7 and saved.train.prior is None


def test_rerun_with_other_settings_is_refused(runs):
    cfg = load_volume_config(None, tiny_overrides(4) + ["data.normalization=\"minmax\""],
                             preset="naive")
    with pytest.raises(ResumeError, match="other settings"):
        train_volumes(runs["manifest"], cfg, runs["root"] / "naive")



def test_refused_rerun_with_other_training_settings_rewrites_nothing(runs, tmp_path):
    run = tmp_path / "naive"
    shutil.copytree(runs["root"] / "naive", run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    cfg = load_volume_config(None, [*tiny_overrides(4, runs["root"] / "cache"),
                                    *NO_AUGMENTATION, "train.lr=0.5"], preset="naive")
    with pytest.raises(ResumeError, match="other settings"):
        train_volumes(runs["manifest"], cfg, run, log=lambda m: None)
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert after == before


def test_settings_precedence_and_validation(tmp_path):
    cfg = load_volume_config(None, [], preset="nnpu")
    assert cfg.train.method == "nnpu" and cfg.train.model == "cnn3d" and cfg.prior == "cohort"
    path = tmp_path / "c.toml"
    path.write_text('preset = "upu"\nprior = 0.4\n[train]\nlr = 0.005\n')
    cfg = load_volume_config(path, ["train.epochs=3"])
    assert (cfg.train.method, cfg.prior, cfg.train.lr, cfg.train.epochs) == ("upu", 0.4, 0.005, 3)
    assert load_volume_config(path, [], preset="naive").train.method == "naive"
    with pytest.raises(ConfigError, match="prior"):
        load_volume_config(None, ['prior="often"'])
    with pytest.raises(ConfigError, match="preset"):
        load_volume_config(None, [], preset="nope")


def test_predict_model_grid_files_and_refuse_raw_without_settings(runs, tmp_path):
    run = runs["root"] / "naive"
    scan = runs["manifest"].parent / "vol" / "sub-15_ses-bl_desc-preproc_T1w.nii"
    table = predict_scans(run, [scan], out=tmp_path / "p.csv")
    assert table.loc[0, "status"] == "model-grid" and 0 < table.loc[0, "probability"] < 1
    assert (tmp_path / "p.csv").is_file()
    raw = tmp_path / "raw.nii.gz"
    nib.save(nib.Nifti1Image(np.ones((40, 48, 40), np.float32), np.diag([3, 3, 3, 1.0])), raw)
    with pytest.raises(VolumeRunError, match="preprocess"):
        predict_scans(run, [raw])
    # a missing scan fails its own row, like an unreadable one; with none usable: refused
    missing = tmp_path / "missing.nii.gz"
    table = predict_scans(run, [scan, missing])
    assert list(table.status) == ["model-grid", "failed"]
    assert table.loc[1, "error"] == f"{missing}: not found"
    assert math.isnan(table.loc[1, "probability"]) and 0 < table.loc[0, "probability"] < 1
    # the table never overwrites an input scan or a file that is not a CSV
    for bad in (scan, run / "best_model.pt"):
        with pytest.raises(OutputError, match="--out"):
            predict_scans(run, [scan], out=bad)
    assert scan.is_file() and (run / "best_model.pt").stat().st_size > 1000
    with pytest.raises(VolumeRunError, match="no usable scan.*not found"):
        predict_scans(run, [missing], out=tmp_path / "refused" / "p.csv",
                      work_dir=tmp_path / "work")
    assert not (tmp_path / "refused").exists() and not (tmp_path / "work").exists()


# fast preprocessing of a small synthetic head (about 5-10 s a scan on one thread)
RAW_FAST = ['skullstrip.method="template"', "registration.resolution_mm=4.0",
            "registration.iterations=[30, 10]", "registration.shrink_factors=[2, 1]",
            "registration.smoothing_sigmas=[1.0, 0.0]", "qc.min_brain_ml=100",
            "n4.enabled=false"]


def test_each_raw_scan_gets_its_own_preprocessing_folder(tmp_path, monkeypatch):
    work = tmp_path / "work"
    a, b = tmp_path / "a" / "T1.nii.gz", tmp_path / "b" / "T1.nii.gz"
    assert preprocess_folder(work, a) != preprocess_folder(work, b)
    assert preprocess_folder(work, a).parent == work
    assert preprocess_folder(work, a).name.startswith("T1-")
    monkeypatch.chdir(tmp_path)  # another spelling of the same file: the same folder
    assert preprocess_folder(work, Path("a/../a/T1.nii.gz")) == preprocess_folder(work, a)


def test_predict_raw_scans_wiring_in_one_process(runs, tmp_path, monkeypatch):
    """Predict on raw scans, fast (the slow test below runs the real preprocessing): the
    pipeline's steps are replaced by one that writes a model-grid volume of the cohort,
    chosen by the raw scan's first voxel, and the worker runs in this process. Each raw
    scan gets its own folder and its own probability, the model input is the preprocessed
    volume (scored as that volume alone), preprocessing uses the run's recorded settings,
    one single-threaded worker, and a file replaced by another scan is preprocessed again."""
    import gzip

    import adni_pu.preprocessing as prep
    import adni_pu.preprocessing.pipeline as pipe
    import adni_pu.preprocessing.runner as prep_runner
    from adni_pu.config import save

    run = tmp_path / "run"
    shutil.copytree(runs["root"] / "naive", run)
    save(prep.load_config(None, RAW_FAST), run / "preprocess_config.toml")
    vol = runs["manifest"].parent / "vol"
    calls: list[tuple[Path, str]] = []

    def in_process(jobs, config, workers, threads, collect, progress=False):
        assert (workers, threads) == (1, 1)  # one single-threaded worker: reproducible
        for scan, out in jobs:
            collect(prep_runner._process_one(scan, str(out), config))

    def grid_steps(scan, paths, config, timings):
        index = int(np.asarray(nib.load(str(scan.path)).dataobj).flat[0])
        calls.append((scan.path, config.skullstrip.method))
        grid = nib.load(str(vol / f"sub-{index}_ses-bl_desc-preproc_T1w.nii"))
        volume = nib.Nifti1Image(np.asarray(grid.dataobj), grid.affine)
        timings["read"] = 0.0
        files = {paths["preproc"]: gzip.compress(volume.to_bytes()),
                 paths["brainmask_native"]: b"mask", paths["qc"]: b"png"}
        return files, "done", [], {"qc": {"brain_volume_ml": 1200.0}}

    monkeypatch.setattr(prep_runner, "run_in_workers", in_process)
    monkeypatch.setattr(pipe, "_run_steps", grid_steps)
    scans = []
    for folder, index in (("a", 15), ("b", 16)):
        raw = np.full((40, 48, 40), float(index), np.float32)
        (tmp_path / folder).mkdir()
        scans.append(tmp_path / folder / "T1.nii.gz")
        nib.save(nib.Nifti1Image(raw, np.diag([3.0, 3.0, 3.0, 1.0])), scans[-1])
    first = predict_scans(run, scans, work_dir=tmp_path / "w1")
    assert list(first.status) == ["preprocessed", "preprocessed"], first.error.tolist()
    assert [p for p, _ in calls] == [s.resolve() for s in scans]
    assert {method for _, method in calls} == {"template"}  # the run's recorded settings
    assert first.model_input[0] != first.model_input[1]
    assert first.model_input[0].endswith("_desc-preproc_T1w.nii.gz")
    assert Path(first.model_input[0]).parent != Path(first.model_input[1]).parent
    sidecar = Path(first.model_input[0].replace("_T1w.nii.gz", "_T1w.json"))
    assert json.loads(sidecar.read_text())["settings"]["skullstrip"]["method"] == "template"
    direct = predict_scans(run, [vol / "sub-15_ses-bl_desc-preproc_T1w.nii",
                                 vol / "sub-16_ses-bl_desc-preproc_T1w.nii"])
    assert first.probability.tolist() == direct.probability.tolist()
    assert first.probability[0] != first.probability[1]
    again = predict_scans(run, [scans[0]], work_dir=tmp_path / "w2")
    assert again.probability[0] == first.probability[0]
    # another scan copied over a file predict has seen: preprocessed again, its own result
    shutil.copy(scans[1], scans[0])
    before = len(calls)
    replaced = predict_scans(run, [scans[0]], work_dir=tmp_path / "w1")
    assert len(calls) == before + 1
    assert replaced.probability[0] == first.probability[1]


@pytest.mark.slow  # three real preprocessing runs: about 60 s on the shared 2-core machine
def test_predict_raw_scans_one_folder_each_and_reproducible(runs, tmp_path):
    """Two different raw scans with the same file name are preprocessed into their own
    folders (each row gets its own scan's probability), with the run's recorded settings,
    single-threaded with the recorded seed: a second run on the same scan gives the same
    probability to the last bit."""
    import adni_pu.preprocessing as prep
    from adni_pu.config import save
    from adni_pu.preprocessing.phantom import synthetic_head

    run = tmp_path / "run"
    shutil.copytree(runs["root"] / "naive", run)
    save(prep.load_config(None, RAW_FAST), run / "preprocess_config.toml")
    scans = []
    for folder, seed, rotation in (("a", 3, (0.0, 0.0, 0.0)), ("b", 4, (6.0, -4.0, 3.0))):
        head = synthetic_head(spacing=4.0, shape=(48, 57, 48), rotation_deg=rotation,
                              seed=seed)
        (tmp_path / folder).mkdir()
        scans.append(tmp_path / folder / "T1.nii.gz")
        nib.save(nib.Nifti1Image(head.data, head.affine), scans[-1])
    first = predict_scans(run, scans, work_dir=tmp_path / "w1")
    assert list(first.status) == ["preprocessed", "preprocessed"], first.error.tolist()
    assert first.model_input[0] != first.model_input[1]
    assert first.probability[0] != first.probability[1]
    sidecar = Path(first.model_input[0].replace("_T1w.nii.gz", "_T1w.json"))
    assert first.model_input[0].endswith("_desc-preproc_T1w.nii.gz")
    assert json.loads(sidecar.read_text())["settings"]["skullstrip"]["method"] == "template"
    again = predict_scans(run, [scans[0]], work_dir=tmp_path / "w2")
    assert again.probability[0] == first.probability[0]
    # another scan copied over a file predict has seen: preprocessed again, its own result
    shutil.copy(scans[1], scans[0])
    replaced = predict_scans(run, [scans[0]], work_dir=tmp_path / "w1")
    assert replaced.probability[0] == first.probability[1]


# --------------------------------------------------------------------------- a failed train


def _cfg():
    return load_volume_config(None, tiny_overrides(1), preset="naive")


class _FailingTrainer:
    """A trainer whose first epoch fails (after the run folder's files are written)."""

    def __init__(self, *args, **kwargs):
        pass

    def check_resume(self):
        return None

    def fit(self):
        raise RuntimeError("failed in the first epoch")


def _fail_in_fit(monkeypatch):
    import adni_pu.pu.trainer
    import adni_pu.workflows.train as train_module

    monkeypatch.setattr(adni_pu.pu.trainer, "Trainer", _FailingTrainer)
    monkeypatch.setattr(train_module, "build_pu_data",  # no volumes read: seconds, not minutes
                        lambda frame, base, cfg, prior: None)


def test_a_train_failing_before_its_first_epoch_leaves_no_run_folder(runs, tmp_path,
                                                                      monkeypatch):
    _fail_in_fit(monkeypatch)
    run = tmp_path / "runs" / "r1"
    with pytest.raises(RuntimeError, match="failed in the first epoch"):
        train_volumes(runs["manifest"], _cfg(), run)
    assert not run.exists()
    mine = tmp_path / "mine"  # a folder that existed before is never removed
    mine.mkdir()
    (mine / "notes.txt").write_text("kept")
    with pytest.raises(RuntimeError, match="failed in the first epoch"):
        train_volumes(runs["manifest"], _cfg(), mine)
    assert (mine / "notes.txt").read_text() == "kept" and (mine / "run.json").is_file()


def test_a_run_folder_without_a_finished_epoch_is_reused_by_a_rerun(runs, tmp_path,
                                                                     monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"manifest_sha256": "another manifest",
                                              "settings": {}}))
    (run / "metrics.csv").write_text("epoch,phase\n")  # a header, no epoch row
    _fail_in_fit(monkeypatch)  # got past the run folder check: fit was reached
    with pytest.raises(RuntimeError, match="failed in the first epoch"):
        train_volumes(runs["manifest"], _cfg(), run)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.pt").write_bytes(b"a finished epoch")
    (run / "run.json").write_text(json.dumps({"manifest_sha256": "another manifest",
                                              "settings": {}}))
    with pytest.raises(ResumeError, match=r"another manifest or other settings "
                                          r"\(checkpoints/last.pt\).*reused by any rerun"):
        train_volumes(runs["manifest"], _cfg(), run)

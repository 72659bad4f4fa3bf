"""The leakage guard by content and canonical subject id (adni_pu.cohort.ids, the train
and evaluate pre-flight): a test scan listed in train under another id, one subject
spelled two ways across splits, and a run without its scan record."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner
from volume_helpers import make_volume_cohort, tiny_overrides

from adni_pu.cohort.ids import normalise_subject_id
from adni_pu.errors import LeakageError
from adni_pu.workflows.evaluate import evaluate_run
from adni_pu.workflows.train import train_volumes
from adni_pu.workflows.volume_settings import load_volume_config

runner = CliRunner()


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    """The tiny model-grid cohort (19 subjects, 21 scans) and its manifest as text rows."""
    root = tmp_path_factory.mktemp("hostile") / "cohort"
    path = make_volume_cohort(root)
    return {"root": root, "manifest": path,
            "frame": pd.read_csv(path, dtype=str, keep_default_na=False)}


@pytest.fixture(scope="module")
def trained(cohort, tmp_path_factory):
    """A naive run of one epoch on the tiny cohort (with its RUN/scans.csv record)."""
    run = tmp_path_factory.mktemp("hostile-run") / "run"
    cfg = load_volume_config(None, tiny_overrides(1), preset="naive")
    train_volumes(cohort["manifest"], cfg, run, log=lambda m: None)
    return run


def _manifest(cohort, frame: pd.DataFrame, name: str) -> Path:
    path = cohort["root"] / name
    frame.to_csv(path, index=False)
    return path


def _cfg():
    return load_volume_config(None, tiny_overrides(1), preset="naive")


def test_canonical_id_covers_both_adni_spellings():
    assert normalise_subject_id("002_S_0004") == normalise_subject_id("sub-ADNI002S0004") \
        == "002_S_0004"


def test_train_refuses_a_test_scan_listed_in_train_under_another_id(cohort, tmp_path):
    frame = cohort["frame"]
    test = frame[frame["split"] == "test"].iloc[0]
    shutil.copy(cohort["root"] / test["scan_path"], cohort["root"] / "vol" / "copy.nii")
    extra = test.copy()
    extra[["subject_id", "scan_path", "split"]] = ["999_S_9999", "vol/copy.nii", "train"]
    path = _manifest(cohort, pd.concat([frame, extra.to_frame().T]), "leak_content.csv")
    with pytest.raises(LeakageError) as info:
        train_volumes(path, _cfg(), tmp_path / "run")
    text = str(info.value)
    for part in ("999_S_9999", test["subject_id"], "vol/copy.nii", test["scan_path"],
                 "['test', 'train']", f"line {len(frame) + 2}"):
        assert part in text, part
    assert not (tmp_path / "run").exists()  # refused before the run folder


def test_train_refuses_one_subject_spelled_two_ways_in_train_and_val(cohort, tmp_path):
    frame = cohort["frame"].copy()
    val = frame.index[frame["split"] == "val"][0]
    train = frame.index[frame["split"] == "train"][3]
    frame.loc[train, "subject_id"] = "002_S_0004"
    frame.loc[val, "subject_id"] = "sub-ADNI002S0004"
    path = _manifest(cohort, frame, "leak_id.csv")
    with pytest.raises(LeakageError, match=r"subject 002_S_0004: \['train', 'val'\]") as info:
        train_volumes(path, _cfg(), tmp_path / "run")
    assert "as 'sub-ADNI002S0004'" in str(info.value)
    assert not (tmp_path / "run").exists()


def test_evaluate_refuses_a_training_scan_under_another_id(cohort, trained, tmp_path):
    record = pd.read_csv(trained / "scans.csv", dtype=str)
    assert set(record["split"]) == {"train", "val"} and record["sha256"].str.startswith(
        "sha256:").all()
    frame = cohort["frame"]
    seen = frame[frame["split"] == "train"].iloc[2]
    shutil.copy(cohort["root"] / seen["scan_path"], tmp_path / "copy.nii")
    extra = seen.copy()
    extra[["subject_id", "scan_path", "split"]] = ["999_S_9999", str(tmp_path / "copy.nii"),
                                                   "test"]
    rows = frame.assign(scan_path=[str(cohort["root"] / p) for p in frame["scan_path"]])
    other = tmp_path / "other.csv"
    pd.concat([rows, extra.to_frame().T]).to_csv(other, index=False)
    with pytest.raises(LeakageError, match="same image") as info:
        evaluate_run(trained, "test", manifest=other, n_boot=0)
    assert "999_S_9999" in str(info.value) and seen["scan_path"] in str(info.value)
    assert "run's training split" in str(info.value)


def test_evaluate_of_a_run_without_its_scan_record_still_compares_canonical_ids(
        cohort, trained, tmp_path):
    run = tmp_path / "old-run"
    shutil.copytree(trained, run)
    (run / "scans.csv").unlink()  # a run made before the record existed
    frame = cohort["frame"]
    rows = frame.assign(scan_path=[str(cohort["root"] / p) for p in frame["scan_path"]])
    val = rows.index[rows["split"] == "val"][0]
    number = rows.loc[val, "subject_id"].replace("_S_", "S")
    rows.loc[val, ["subject_id", "split"]] = [f"sub-ADNI{number}", "test"]
    other = tmp_path / "other.csv"
    rows.to_csv(other, index=False)
    with pytest.raises(LeakageError, match="validation split, which chose the model"):
        evaluate_run(run, "test", manifest=other, n_boot=0)

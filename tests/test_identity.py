"""Identity by what things are (adni_pu.cohort.ids, adni_pu.data.image_identity, the leakage
guard of adni_pu.cohort.leakage).

An image is the same image whatever file holds it (a gunzipped or re-gzipped copy of a
test scan in train; one scan twice in train through a symlink), and a subject is the
same subject whatever the spelling of its PTID (``ADNI_002_S_0004``, ``002-S-0004``).
Tiny synthetic inputs.
"""

from __future__ import annotations

import gzip
import os
import shutil
import warnings
from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd
import pytest
from volume_helpers import make_volume_cohort, tiny_overrides

from adni_pu.cohort.ids import SubjectIdWarning, normalise_subject_id
from adni_pu.cohort.leakage import RECORD_COLUMNS, check_manifest_leakage
from adni_pu.data.image_identity import image_key
from adni_pu.errors import LeakageError, ManifestError
from adni_pu.fileio import sha256_file
from adni_pu.workflows.evaluate import evaluate_run
from adni_pu.workflows.train import train_volumes
from adni_pu.workflows.volume_settings import load_volume_config

# --------------------------------------------------------------------------- image keys


def _small_image(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    data = np.random.default_rng(0).integers(-50, 900, (7, 8, 9)).astype(np.int16)
    affine = np.diag([1.5, 1.5, 1.5, 1.0])
    affine[:3, 3] = [-5.0, -6.0, -7.0]
    path = tmp_path / "a.nii.gz"
    nib.save(nib.Nifti1Image(data, affine), path)
    return path, data, affine


def test_an_image_resaved_any_way_has_one_key_and_a_changed_image_another(tmp_path):
    path, data, affine = _small_image(tmp_path)
    gunzipped = tmp_path / "gunzipped.nii"
    gunzipped.write_bytes(gzip.decompress(path.read_bytes()))
    rezipped = tmp_path / "rezipped.nii.gz"
    rezipped.write_bytes(gzip.compress(gunzipped.read_bytes(), compresslevel=9))
    as_float = tmp_path / "float.nii.gz"
    nib.save(nib.Nifti1Image(data.astype(np.float32), affine), as_float)
    flip = np.array([[-1, 0, 0, data.shape[0] - 1], [0, 1, 0, 0], [0, 0, 1, 0],
                     [0, 0, 0, 1]], float)
    las = tmp_path / "las.nii.gz"  # the same voxels stored right-to-left
    nib.save(nib.Nifti1Image(data[::-1].copy(), affine @ flip), las)
    same = [path, gunzipped, rezipped, as_float, las]
    assert len({sha256_file(p) for p in same}) == len(same)  # every file's bytes differ
    assert len({image_key(p) for p in same}) == 1
    plain = tmp_path / "plain.nii"  # 2 * raw + 100, stored as is
    raw = (data // 4).astype(np.int16)
    nib.save(nib.Nifti1Image((2 * raw + 100).astype(np.int16), affine), plain)
    scaled = tmp_path / "scaled.nii"  # raw, with scl_slope 2 and scl_inter 100 in the header
    nib.save(nib.Nifti1Image(raw, affine), scaled)
    header = bytearray(scaled.read_bytes())
    header[112:120] = np.array([2.0, 100.0], "<f4").tobytes()
    scaled.write_bytes(bytes(header))
    assert image_key(scaled) == image_key(plain)  # compared after nibabel's scaling
    changed = data.copy()
    changed[3, 4, 5] += 1
    other = tmp_path / "changed.nii.gz"
    nib.save(nib.Nifti1Image(changed, affine), other)
    shifted = affine.copy()
    shifted[0, 3] += 1.0
    moved = tmp_path / "moved.nii.gz"
    nib.save(nib.Nifti1Image(data, shifted), moved)
    assert image_key(other) != image_key(path) and image_key(moved) != image_key(path)
    (tmp_path / "not.nii").write_text("not an image")
    assert image_key(tmp_path / "not.nii") is None  # the guard keeps its file hash then


# --------------------------------------------------------------------------- subject ids


@pytest.mark.parametrize("spelling", [
    "002_S_0004", "002-S-0004", "ADNI_002_S_0004", "ADNI002S0004", "sub-ADNI002S0004",
    "002s0004", "adni_002_s_0004", "ADNI-002-S-0004", " 002_s_0004 ", "sub-ADNI_002_S_0004"])
def test_every_adni_spelling_of_a_ptid_is_one_subject(spelling):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert normalise_subject_id(spelling) == "002_S_0004"


def test_adni4_five_digit_roster_numbers_parse():
    assert normalise_subject_id("ADNI_941_S_10013") == "941_S_10013"


@pytest.mark.parametrize("spelling", ["02_S_4", "002_S_04x", "ADNI_2_S_4", "002_S_004"])
def test_an_id_that_looks_like_a_ptid_but_is_not_one_is_named_in_a_warning(spelling):
    with pytest.warns(SubjectIdWarning, match=f"subject id '{spelling}' looks like an ADNI "
                                              "PTID but is not one"):
        assert normalise_subject_id(spelling) == spelling


@pytest.mark.parametrize("other, kept", [("OAS30001", "OAS30001"), ("sub-01", "01"),
                                         ("ctrl-7", "ctrl-7"), ("MR_1234", "MR_1234")])
def test_other_cohorts_ids_are_kept_without_a_warning(other, kept):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert normalise_subject_id(other) == kept


# --------------------------------------------------------------------------- the cohort


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    """The tiny model-grid cohort (19 subjects, 21 scans) and its manifest as text rows."""
    root = tmp_path_factory.mktemp("identity") / "cohort"
    path = make_volume_cohort(root)
    return {"root": root, "manifest": path,
            "frame": pd.read_csv(path, dtype=str, keep_default_na=False)}


@pytest.fixture(scope="module")
def trained(cohort, tmp_path_factory):
    run = tmp_path_factory.mktemp("identity-run") / "run"
    train_volumes(cohort["manifest"], _cfg(), run, log=lambda m: None)
    return run


def _cfg():
    return load_volume_config(None, tiny_overrides(1), preset="naive")


def _manifest(cohort, frame: pd.DataFrame, name: str) -> Path:
    path = cohort["root"] / name
    frame.to_csv(path, index=False)
    return path


def _with(cohort, extra: list[pd.Series], name: str, frame: pd.DataFrame | None = None
          ) -> Path:
    rows = cohort["frame"] if frame is None else frame
    path = cohort["root"] / name
    pd.concat([rows, *(e.to_frame().T for e in extra)]).to_csv(path, index=False)
    return path


def _resaved(source: Path, target: Path, how: str) -> Path:
    raw = source.read_bytes()
    raw = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    if how == "gunzip":
        target.write_bytes(raw)
    else:
        target.write_bytes(gzip.compress(raw, compresslevel=1))
    return target


@pytest.mark.parametrize("how", ["gunzip", "rezip"])
def test_train_refuses_a_resaved_copy_of_a_test_scan_in_train(cohort, tmp_path, how):
    """Finding 3: the test subject's image, saved differently, under another id in train."""
    frame = cohort["frame"].copy()
    first = frame.index[frame["split"] == "test"][0]
    raw = (cohort["root"] / frame.loc[first, "scan_path"]).read_bytes()
    (cohort["root"] / "vol" / "test0.nii.gz").write_bytes(gzip.compress(raw))
    frame.loc[first, "scan_path"] = "vol/test0.nii.gz"  # the test scan, as ADNI gives it
    test = frame.loc[first]
    name = "retest.nii" if how == "gunzip" else "retest.nii.gz"
    copy = _resaved(cohort["root"] / test["scan_path"], cohort["root"] / "vol" / name, how)
    assert sha256_file(copy) != sha256_file(cohort["root"] / test["scan_path"])
    extra = test.copy()
    extra[["subject_id", "scan_path", "split"]] = ["999_S_9999", f"vol/{name}", "train"]
    path = _with(cohort, [extra], f"leak_{how}.csv", frame)
    with pytest.raises(LeakageError, match=r"one image \(decoded content") as info:
        train_volumes(path, _cfg(), tmp_path / "run")
    assert f"vol/{name}" in str(info.value) and test["scan_path"] in str(info.value)
    assert "['test', 'train']" in str(info.value)
    assert not (tmp_path / "run").exists()


def test_the_run_record_keeps_image_keys(trained):
    record = pd.read_csv(trained / "scans.csv", dtype=str)
    assert tuple(record.columns) == RECORD_COLUMNS
    assert record["image_key"].str.startswith("image:").all()


def test_evaluate_refuses_a_gunzipped_copy_of_a_training_scan(cohort, trained, tmp_path):
    frame = cohort["frame"]
    seen = frame[frame["split"] == "train"].iloc[2]
    copy = _resaved(cohort["root"] / seen["scan_path"], tmp_path / "copy.nii.gz", "rezip")
    extra = seen.copy()
    extra[["subject_id", "scan_path", "split"]] = ["999_S_9999", str(copy), "test"]
    rows = frame.assign(scan_path=[str(cohort["root"] / p) for p in frame["scan_path"]])
    other = tmp_path / "other.csv"
    pd.concat([rows, extra.to_frame().T]).to_csv(other, index=False)
    with pytest.raises(LeakageError, match=r"same image \(decoded content\)") as info:
        evaluate_run(trained, "test", manifest=other, n_boot=0)
    assert "999_S_9999" in str(info.value) and seen["scan_path"] in str(info.value)


def test_evaluate_of_an_older_record_compares_file_hashes_and_says_so_once(
        cohort, trained, tmp_path):
    run = tmp_path / "old-run"
    shutil.copytree(trained, run)
    record = pd.read_csv(run / "scans.csv", dtype=str, keep_default_na=False)
    record.drop(columns="image_key").to_csv(run / "scans.csv", index=False)
    result = evaluate_run(run, "test", n_boot=0)
    said = [w for w in result["warnings"] if "before image keys were recorded" in w]
    assert len(said) == 1 and "by file hash" in said[0]
    frame = cohort["frame"]
    seen = frame[frame["split"] == "train"].iloc[1]
    extra = seen.copy()  # a byte-identical copy is still caught by its file hash
    shutil.copy(cohort["root"] / seen["scan_path"], tmp_path / "same.nii")
    extra[["subject_id", "scan_path", "split"]] = ["999_S_9999", str(tmp_path / "same.nii"),
                                                   "test"]
    rows = frame.assign(scan_path=[str(cohort["root"] / p) for p in frame["scan_path"]])
    other = tmp_path / "other.csv"
    pd.concat([rows, extra.to_frame().T]).to_csv(other, index=False)
    with pytest.raises(LeakageError, match=r"same image \(sha256\)"):
        evaluate_run(run, "test", manifest=other, n_boot=0)


@pytest.mark.parametrize("spelling", ["ADNI_{}", "{dash}"])
def test_train_refuses_a_training_subject_spelled_another_way_in_test(cohort, tmp_path,
                                                                       spelling):
    """Finding 4: train subject X gets a second scan (another file) in test as ADNI_X."""
    frame = cohort["frame"]
    train = frame[frame["split"] == "train"].iloc[3]
    other = frame[frame["split"] == "test"].iloc[1]
    sid = train["subject_id"]
    spelled = spelling.format(sid, dash=sid.replace("_", "-"))
    extra = other.copy()
    shutil.copy(cohort["root"] / other["scan_path"], cohort["root"] / "vol" / "x.nii")
    data = nib.load(cohort["root"] / "vol" / "x.nii")
    nib.save(nib.Nifti1Image(np.asanyarray(data.dataobj) + np.int16(1), data.affine),
             cohort["root"] / "vol" / "x.nii")  # another image: only the id leaks
    extra[["subject_id", "session_id", "scan_path"]] = [spelled, "m24", "vol/x.nii"]
    extra["pu_label"], extra["truth"] = train["pu_label"], train["truth"]
    path = _with(cohort, [extra], "leak_spelling.csv")
    with pytest.raises(LeakageError, match=rf"subject {sid}: \['test', 'train'\]") as info:
        train_volumes(path, _cfg(), tmp_path / "run")
    assert f"as {spelled!r}" in str(info.value)


def test_evaluate_counts_a_test_subject_spelled_two_ways_once(cohort, trained, tmp_path):
    frame = cohort["frame"]
    rows = frame.assign(scan_path=[str(cohort["root"] / p) for p in frame["scan_path"]])
    test = rows.index[rows["split"] == "test"]
    two = rows.loc[test, "subject_id"].value_counts()
    sid = two.index[two == 2][0]  # the test subject with two scans
    second = rows.index[(rows["subject_id"] == sid)][1]
    rows.loc[second, "subject_id"] = "ADNI_" + sid
    other = tmp_path / "spelled.csv"
    rows.to_csv(other, index=False)
    result = evaluate_run(trained, "test", manifest=other, n_boot=0, out=tmp_path / "eval")
    assert result["n_subjects"] == frame.loc[frame["split"] == "test", "subject_id"].nunique()
    subjects = pd.read_csv(tmp_path / "eval" / "predictions_subjects.csv",
                           dtype={"subject_id": str})
    assert (subjects["subject_id"] == sid).sum() == 1


def test_a_ptid_like_id_that_does_not_parse_is_named_when_training(cohort, tmp_path):
    frame = cohort["frame"].copy()
    frame.loc[frame["split"] == "val", "subject_id"] = [
        "02_S_4", *frame.loc[frame["split"] == "val", "subject_id"][1:]]
    path = cohort["root"] / "odd_id.csv"
    frame.to_csv(path, index=False)
    from adni_pu.workflows.volume_data import checked_manifest

    with pytest.warns(SubjectIdWarning, match="'02_S_4'"):
        checked_manifest(path, _cfg())


# --------------------------------------------------------------------------- one image once


def test_one_scan_twice_in_train_through_a_symlink_is_refused(cohort, tmp_path):
    """Finding 7: a symlink to a train scan as another session of the same subject."""
    frame = cohort["frame"]
    seen = frame[frame["split"] == "train"].iloc[4]
    link = cohort["root"] / "vol" / "link_train.nii"
    if not link.is_symlink():
        os.symlink(cohort["root"] / seen["scan_path"], link)
    extra = seen.copy()
    extra[["session_id", "scan_path"]] = ["m99", "vol/link_train.nii"]
    path = _with(cohort, [extra], "dup_session.csv")
    with pytest.raises(ManifestError, match="expected each image once") as info:
        train_volumes(path, _cfg(), tmp_path / "run")
    assert "vol/link_train.nii" in str(info.value) and seen["scan_path"] in str(info.value)
    assert not (tmp_path / "run").exists()


def test_one_image_twice_in_a_split_under_two_subjects_is_refused(cohort):
    frame = cohort["frame"]
    seen = frame[frame["split"] == "val"].iloc[0]
    copy = _resaved(cohort["root"] / seen["scan_path"], cohort["root"] / "vol" / "dup.nii.gz",
                    "rezip")
    extra = seen.copy()
    extra[["subject_id", "scan_path"]] = ["888_S_8888", f"vol/{copy.name}"]
    table = pd.concat([frame, extra.to_frame().T], ignore_index=True)
    with pytest.raises(ManifestError, match=r"val: line \d+ .*888_S_8888"):
        check_manifest_leakage(table, cohort["root"], cohort["root"] / "m.csv")


def test_preprocessing_refuses_one_subject_and_session_under_two_spellings(tmp_path):
    from adni_pu.errors import ScanError
    from adni_pu.preprocessing.io import discover_scans

    for name in ("a.nii", "b.nii", "c.nii"):
        (tmp_path / name).write_bytes(b"")
    listing = tmp_path / "scans.csv"
    listing.write_text("subject,session,path\n002_S_0004,bl,a.nii\n003_S_0005,bl,c.nii\n"
                       "ADNI_002_S_0004,bl,b.nii\n")
    with pytest.raises(ScanError, match="are both subject 002_S_0004, session bl"):
        discover_scans(listing)
    listing.write_text("subject,session,path\n002_S_0004,bl,a.nii\n"
                       "ADNI_002_S_0004,m12,b.nii\n")
    assert len(discover_scans(listing)) == 2  # another session of the subject is fine


# --------------------------------------------------------------------------- leakage by canonical id


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

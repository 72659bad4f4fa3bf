"""The synthetic ADNI download (``adni-pu synth``): IDA's layout, the tables' real column
names, dates the cohort builder pairs, determinism, whole-or-nothing writing."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import re
from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.errors import OutputError
from adni_pu.preprocessing.adni_layout import DATE_TIME, PTID, discover_adni
from adni_pu.preprocessing.config import DiscoverySettings
from adni_pu.synth import adni_download as dl

ONE_VISIT = dl.download_config({"visit_probabilities": [1.0, 0.0, 0.0]})


@pytest.fixture(scope="module")
def download(tmp_path_factory) -> dl.AdniDownload:
    return dl.write_adni_download(tmp_path_factory.mktemp("d") / "download", subjects=3, seed=5,
                                  config=ONE_VISIT)


def test_images_lie_in_idas_layout_and_preprocessing_reads_them_as_planned(download):
    images = pd.read_csv(download.images_path, dtype=str)
    assert set(images["expected_status"]) == {"done", "extra-t1", "not-t1"}
    assert (images["expected_status"] == "done").sum() == 3  # one T1 per subject and visit
    for row in images.itertuples():
        path = download.root / row.path
        ptid, series, when, image, _ = path.relative_to(download.adni_dir).parts
        assert PTID.match(ptid) and DATE_TIME.match(when) and re.fullmatch(r"I\d+", image)
        assert (series, image) == (row.series_description, row.image_id)
        assert path.name == (f"ADNI_{ptid}_MR_{series}_br_raw_{when[:10].replace('-', '')}"
                               f"{when[11:19].replace('_', '')}_1_S{int(image[1:]) - 60_000}_"
                               f"{image}.nii")
    scans, left = discover_adni(download.root, DiscoverySettings())
    found = {s.image_id: "done" for s in scans} | {e.scan.image_id: e.status for e in left}
    assert found == dict(zip(images["image_id"], images["expected_status"]))
    assert {s.series_description for s in scans} <= set(dl.T1_SERIES)


def test_tables_have_the_column_names_the_cohort_builder_reads(download):
    clinical = pd.read_csv(download.clinical_path)
    assert {"RID", "PTID", "VISCODE", "EXAMDATE", "DX_bl", "DX", "AGE", "PTGENDER", "AV45",
            "FBB", "PIB"} <= set(clinical.columns)
    amyloid = pd.read_csv(download.amyloid_path)
    assert list(amyloid.columns) == list(dl.AMYLOID_COLUMNS)
    assert re.fullmatch(r"UCBERKELEY_AMY_6MM_\d{2}[A-Z][a-z]{2}\d{4}\.csv",
                        download.amyloid_path.name)
    assert set(amyloid["TRACER"]) <= {"FBP", "FBB"} and (amyloid["qc_flag"] == 2).all()
    # Berkeley's Centiloid conversion and cut-offs, per tracer
    fbp = amyloid["TRACER"] == "FBP"
    cl = np.where(fbp, 188.22 * amyloid["SUMMARY_SUVR"] - 189.16,
                  157.15 * amyloid["SUMMARY_SUVR"] - 151.87)
    np.testing.assert_allclose(amyloid["CENTILOIDS"], cl, atol=0.01)
    cut = np.where(fbp, 1.11, 1.08)
    assert (amyloid["AMYLOID_STATUS"] == (amyloid["SUMMARY_SUVR"] >= cut)).all()
    truth = pd.read_csv(download.truth_path)
    assert set(truth["PTID"]) == set(clinical["PTID"]) and set(truth["amyloid_positive"]) <= {0, 1}


def test_scan_and_pet_dates_lie_near_their_own_visit(download):
    clinical = pd.read_csv(download.clinical_path, dtype=str)
    visits = {(r.PTID, r.VISCODE): dt.date.fromisoformat(r.EXAMDATE) for r in clinical.itertuples()}
    images = pd.read_csv(download.images_path, dtype=str)
    for row in images.itertuples():
        acquired = dt.date.fromisoformat(row.acquisition_date)
        gaps = {code: abs((d - acquired).days) for (p, code), d in visits.items() if p == row.PTID}
        assert min(gaps, key=gaps.get) == row.VISCODE and gaps[row.VISCODE] <= 14
        assert Path(row.path).parts[3].startswith(row.acquisition_date)
    amyloid = pd.read_csv(download.amyloid_path, dtype=str)
    for row in amyloid.itertuples():
        gap = dt.date.fromisoformat(row.SCANDATE) - visits[(row.PTID, row.VISCODE)]
        assert abs(gap.days) <= 30


def test_the_cohort_builder_pairs_every_scan_with_its_visit_and_pet(download):
    from adni_pu.cohort import build_cohort, load_cohort_config

    images = pd.read_csv(download.images_path, dtype=str)
    scans = pd.DataFrame({"subject_id": images["PTID"],
                          "session_id": images["acquisition_date"].str.replace("-", ""),
                          "acquisition_date": images["acquisition_date"],
                          "status": images["expected_status"], "preprocessed_path": images["path"]})
    cfg = load_cohort_config(values={"check_scan_files": False})
    with contextlib.redirect_stdout(io.StringIO()):
        manifest = build_cohort(download.clinical_path, scans, cfg,
                                amyloid=[download.amyloid_path]).manifest
    done = images[images["expected_status"] == "done"]
    assert len(manifest) == len(done)
    merged = manifest.merge(done, left_on="subject_id", right_on="PTID")
    assert (merged["visit_match"] == "date").all()
    assert (merged["visit"] == merged["VISCODE"]).all()
    amyloid = pd.read_csv(download.amyloid_path)
    with_pet = merged[merged["PTID"].isin(amyloid["PTID"])]
    assert with_pet["suvr"].notna().all() and (with_pet["suvr_gap_days"].abs() <= 44).all()


def test_same_seed_same_files_and_another_seed_other_files(tmp_path):
    a = dl.write_adni_download(tmp_path / "a", subjects=2, seed=3, config=ONE_VISIT)
    b = dl.write_adni_download(tmp_path / "b", subjects=2, seed=3, config=ONE_VISIT)

    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
                if p.is_file()}

    assert files(a.root) == files(b.root)
    other = dl.plan_download(2, 4, ONE_VISIT).images_table()
    assert not other.equals(dl.plan_download(2, 3, ONE_VISIT).images_table())


def test_a_small_download_has_adnis_diagnosis_mix_exactly():
    assert dl.diagnosis_quota(18, (0.36, 0.06, 0.28, 0.16, 0.14)) == {
        "CN": 6, "SMC": 1, "EMCI": 5, "LMCI": 3, "AD": 3}  # 6.48 1.08 5.04 2.88 2.52
    subjects = dl.pick_subjects(18, 0, ONE_VISIT)
    assert len({s.rid for s in subjects}) == 18
    assert pd.Series([s.dx_bl for s in subjects]).value_counts().to_dict() == {
        "CN": 6, "EMCI": 5, "LMCI": 3, "AD": 3, "SMC": 1}


@pytest.mark.parametrize(("subjects", "config"), [(18, ONE_VISIT), (32, dl.download_config())])
def test_the_readme_cohort_defaults_give_trainable_splits(subjects, config):
    """18 one-visit subjects (the README test's download) and the command's default (32
    subjects with ADNI's visit mix): the default cohort build gives train and val a labelled
    positive and an unlabelled subject, and test both truths. Planned only: no image."""
    from adni_pu.cohort import build_cohort, load_cohort_config
    from adni_pu.workflows.compare.folds import assignment_problem, subject_table

    plan = dl.plan_download(subjects, 0, config)
    images = plan.images_table()
    scans = pd.DataFrame({"subject_id": images["PTID"],
                          "session_id": images["acquisition_date"].str.replace("-", ""),
                          "acquisition_date": images["acquisition_date"],
                          "status": images["expected_status"],
                          "preprocessed_path": [f"scan{i}.nii.gz" for i in range(len(images))]})
    cfg = load_cohort_config(values={"check_scan_files": False})
    with contextlib.redirect_stdout(io.StringIO()):
        manifest = build_cohort(dl.clinical_table(plan.subjects), scans, cfg).manifest
    subjects = subject_table(manifest)
    assert assignment_problem(subjects, dict(zip(subjects["subject_id"],
                                                 subjects["split"].astype(str)))) is None
    test = manifest[manifest["split"].astype(str) == "test"].groupby("subject_id")["truth"].first()
    assert set(test.dropna()) == {0, 1}


def test_dicom_series_read_back_as_the_nifti_scan(tmp_path):
    from adni_pu.preprocessing.io import read_volume

    nii = dl.write_adni_download(tmp_path / "nii", subjects=1, seed=2, config=ONE_VISIT)
    dcm = dl.write_adni_download(tmp_path / "dcm", subjects=1, seed=2, fmt="dicom",
                                 config=ONE_VISIT)
    a, b = (pd.read_csv(d.images_path) for d in (nii, dcm))
    assert list(a["image_id"]) == list(b["image_id"])
    for x, y in zip(a["path"], b["path"]):
        folder = dcm.root / y
        assert folder.is_dir() and all(p.suffix == ".dcm" for p in folder.iterdir())
        volumes = [nib.as_closest_canonical(nib.Nifti1Image(*read_volume(p)))
                   for p in (nii.root / x, folder)]
        assert np.array_equal(*(np.asarray(v.dataobj) for v in volumes))
        np.testing.assert_allclose(volumes[0].affine, volumes[1].affine, atol=1e-4)
    scans, _ = discover_adni(dcm.root, DiscoverySettings())
    assert [s.path for s in scans] == [dcm.root / p for p in b.loc[b["expected_status"] == "done",
                                                                    "path"]]


def test_a_failed_write_leaves_nothing_and_a_full_folder_is_refused(tmp_path, monkeypatch):
    def broken(root, *args):
        (root / "ADNI").mkdir()
        raise RuntimeError("disk gone")

    monkeypatch.setattr(dl, "_write", broken)
    with pytest.raises(RuntimeError, match="disk gone"):
        dl.write_adni_download(tmp_path / "out", subjects=1, config=ONE_VISIT)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match=r"full: not empty \(holds notes.txt\)"):
        dl.write_adni_download(tmp_path / "full", subjects=1, config=ONE_VISIT)
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["notes.txt"]


def test_cli_writes_into_an_empty_folder_and_prints_the_next_command(tmp_path):
    runner = CliRunner()
    out = tmp_path / "trial"
    out.mkdir()
    result = runner.invoke(app, ["synth", str(out), "--subjects", "1", "--seed", "1",
                                 "--set", "visit_probabilities=[1,0,0]"])
    assert result.exit_code == 0, result.output
    assert (out / "ADNIMERGE.csv").is_file() and (out / dl.amyloid_file_name()).is_file()
    assert f"next: cd {out} && adni-pu preprocess ADNI prep --workers 2" in result.output
    again = runner.invoke(app, ["synth", str(out)])
    assert again.exit_code == 2 and "not empty" in again.output
    bad = runner.invoke(app, ["synth", str(tmp_path / "x"), "--set", "nope=1"])
    assert bad.exit_code == 2 and "unknown setting" in bad.output
    assert not (tmp_path / "x").exists()


def test_the_adni_layout_holds_the_bids_layouts_scans(tmp_path):
    """Subject RID r of a seed has the same T1 scans in both layouts (the demo's scans)."""
    runner = CliRunner()
    args = ["--subjects", "2", "--seed", "3", "--set", "visit_probabilities=[1,0,0]"]
    for layout in ("adni", "bids"):
        result = runner.invoke(app, ["synth", str(tmp_path / layout), "--layout", layout, *args])
        assert result.exit_code == 0, result.output
    images = pd.read_csv(tmp_path / "adni" / "synth" / "images.csv", dtype=str)
    done = images[images["expected_status"] == "done"]
    assert sorted(done["RID"]) == ["2", "3"]  # seed 3's first two subjects fill the quota
    for row in done.itertuples():
        label = "ADNI" + row.PTID.replace("_", "")
        bids = tmp_path / "bids" / "bids" / f"sub-{label}" / "ses-M000" / "anat"
        a, b = nib.load(tmp_path / "adni" / row.path), nib.load(next(bids.glob("*_T1w.nii.gz")))
        assert np.array_equal(np.asarray(a.dataobj), np.asarray(b.dataobj))
        np.testing.assert_allclose(a.affine, b.affine)
    for layout in ("adni", "bids"):  # the same Berkeley table beside both
        assert (tmp_path / layout / dl.amyloid_file_name()).is_file()
    assert (pd.read_csv(tmp_path / "adni" / dl.amyloid_file_name()).equals(
        pd.read_csv(tmp_path / "bids" / dl.amyloid_file_name())))

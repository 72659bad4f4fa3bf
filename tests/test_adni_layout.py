"""ADNI's download layout: discovery, T1 series filter, one T1 per visit, summary, cohort."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd
import pytest
from adni_tree import TREE, head_volume, make_adni_tree

from adni_pu.config import ConfigError
from adni_pu.preprocessing import load_config, run_preprocessing, settings_hash
from adni_pu.preprocessing import pipeline as pipe
from adni_pu.preprocessing.adni_layout import series_skip_reason
from adni_pu.preprocessing.config import DiscoverySettings
from adni_pu.preprocessing.io import ScanError, discover, discover_scans, load_scan, to_canonical

DEFAULTS = DiscoverySettings()


@pytest.fixture(scope="module")
def download(tmp_path_factory) -> Path:
    """The example tree of docs/preprocessing.md, written once (read-only for the tests)."""
    root = tmp_path_factory.mktemp("download")
    make_adni_tree(root)
    return root


def _status(found) -> dict[str, tuple[str, str]]:
    """image ID -> (status, session) for every input found, processed or left out."""
    out = {s.image_id: ("done", s.session_id) for s in found.scans}
    out.update({e.scan.image_id: (e.status, e.scan.session_id) for e in found.excluded})
    return out


def test_adni_download_is_read_with_dates_image_ids_and_series(download: Path) -> None:
    found = discover(download)
    assert _status(found) == {image: (status, ses) for _p, _s, _d, image, _f, status, ses in TREE}
    by_id = {s.image_id: s for s in found.scans}
    nii = by_id["I240001"]
    assert (nii.subject_id, nii.session_id, nii.acquisition_date) == ("011_S_0002", "20110502",
                                                                      "2011-05-02")
    assert nii.series_description == "MT1__GradWarp__N3m" and nii.path.name.endswith(".nii")
    assert nii.label == "sub-011S0002_ses-20110502"
    dcm = by_id["I300001"]  # a DICOM series: the folder holding the slices is the scan
    assert dcm.path.is_dir() and dcm.path.name == "I300001"
    assert (dcm.session_id, dcm.acquisition_date) == ("20120510", "2012-05-10")
    data, affine = to_canonical(*load_scan(dcm.path))  # DICOM is read in LPS voxel order
    written, written_affine = head_volume(5)  # TREE's sixth entry
    assert np.array_equal(data, written) and np.allclose(affine, written_affine)
    # the same scans from the ADNI folder itself and from one subject's folder
    assert discover_scans(download / "ADNI") == found.scans
    assert discover_scans(download / "ADNI" / "002_S_0295") == [by_id["I45108"]]


def test_left_out_series_say_why(download: Path) -> None:
    reasons = {e.scan.image_id: e.reason for e in discover(download).excluded}
    assert "skip_series" in reasons["I238620"] and "locali" in reasons["I238620"]
    assert "flair" in reasons["I238625"] and "calibration" in reasons["I300000"]
    assert "processed instead: MT1__GradWarp__N3m I240001" in reasons["I238623"]
    assert "prefer_series" in reasons["I238623"]
    assert "fallback_series" in reasons["I45117"]  # MPR-R: the repeat's corrected copy


@pytest.mark.parametrize("description", [
    "MPRAGE", "MP-RAGE", "MP RAGE SAGITTAL REPEAT", "MPRAGE_Repeat", "ADNI-R11   MPRAGE-REPEA",
    "ASO-MPRAGE", "MPRAGE SENSE2", "MPRAGE_GRAPPA2", "IR-SPGR", "IR-FSPGR", "Sag IR-SPGR",
    "Accelerated_Sag_IR-FSPGR", "IR-SPGR w/acceleration", "Accelerated Sagittal MPRAGE",
    "Accelerated_Sagittal_MPRAGE_ND", "Accelerated Sagittal MPRAGE (MSV21)",
    "Sagittal 3D Accelerated MPRAGE", "ADNI3_t1_mprag_sag_p2_iso", "T1 Repeat",
    "MPR; GradWarp; B1 Correction; N3; Scaled", "MPR__GradWarp__B1_Correction__N3__Scaled",
    "MPR-R__GradWarp__B1_Correction__N3__Scaled_2", "MPR; ; N3; Scaled", "MT1; GradWarp; N3m",
    "MT1__N3m",
])
def test_t1_series_are_kept(description: str) -> None:
    assert series_skip_reason(description, DEFAULTS) is None


@pytest.mark.parametrize("description", [
    "3_Plane_Localizer", "Localizer", "AAHScout_MPR_sag", "Calibration Scan", "ASSET Cal",
    "B1-Calibration Body", "B1-Calibration_PA", "Field_Mapping", "Axial_T2-FLAIR",
    "Sagittal 3D FLAIR", "Sagittal_3D_FLAIR_MPR_Cor", "Axial PD-T2 TSE", "Axial_T2_Star",
    "Axial 3TE T2 STAR", "Axial DTI", "Axial_MB_DTI", "Axial rsfMRI (Eyes Open)",
    "Resting State fMRI", "Axial 3D PASL (Eyes Open)", "ASL PERFUSION", "HighResHippocampus",
    "Hippocampus T2", "SWI", "ADNI Phantom", "Extended Resting State fMRI",
])
def test_other_series_are_skipped(description: str) -> None:
    assert series_skip_reason(description, DEFAULTS) is not None


def _visit(root: Path, series_times: list[tuple[str, str, str]], fmt: str = "nii") -> None:
    for n, (series, when, image) in enumerate(series_times):
        folder = root / "ADNI/011_S_0002" / series / when / image
        folder.mkdir(parents=True)
        data, affine = head_volume(n)
        nib.save(nib.Nifti1Image(data, affine), str(folder / f"{image}.{fmt}"))


def test_one_t1_per_visit_rule_is_deterministic_and_configurable(tmp_path: Path) -> None:
    _visit(tmp_path, [("MPRAGE", "2011-05-02_13_52_00.0", "I9"),
                      ("MPRAGE", "2011-05-02_13_45_10.0", "I20"),
                      ("MPRAGE_Repeat", "2011-05-02_13_40_00.0", "I5"),
                      ("Accelerated_Sagittal_MPRAGE_ND", "2011-05-02_13_30_00.0", "I3")])

    def kept(settings: DiscoverySettings) -> list[str]:
        return [s.image_id for s in discover_scans(tmp_path, settings)]

    # not repeats/_ND first, then the earliest acquisition of the day
    assert kept(DEFAULTS) == ["I20"]
    found = discover(tmp_path)
    assert sorted(e.scan.image_id for e in found.excluded) == ["I3", "I5", "I9"]
    assert {e.status for e in found.excluded} == {"extra-t1"}
    why = {e.scan.image_id: e.reason for e in found.excluded}
    assert "acquired earlier" in why["I9"] and "fallback_series" in why["I5"]
    # no fallback patterns: the earliest scan of the day wins
    assert kept(DiscoverySettings(fallback_series=())) == ["I3"]
    # a preference for the repeat, and keeping all four with distinct sessions
    assert kept(DiscoverySettings(prefer_series=("repeat",))) == ["I5"]
    every = discover_scans(tmp_path, DiscoverySettings(per_visit="all"))
    assert sorted(s.session_id for s in every) == ["20110502I20", "20110502I3", "20110502I5",
                                                   "20110502I9"]


def test_raw_scan_preferred_over_corrected_copy_by_setting(tmp_path: Path) -> None:
    _visit(tmp_path, [("MPRAGE", "2011-05-02_13_45_10.0", "I238623"),
                      ("MT1__GradWarp__N3m", "2011-05-02_13_45_10.0", "I240001")])
    assert [s.image_id for s in discover_scans(tmp_path)] == ["I240001"]
    raw_first = load_config(None, ['discovery.prefer_series=["mp-?rage|spgr"]']).discovery
    assert [s.image_id for s in discover_scans(tmp_path, raw_first)] == ["I238623"]


def test_nested_and_several_files_and_broken_folders(tmp_path: Path) -> None:
    _visit(tmp_path, [("MPRAGE", "2011-05-02_13_45_10.0", "I1")])
    subject = tmp_path / "ADNI/011_S_0002"
    nested = subject / "MPRAGE/2012-05-02_10_00_00.0/I2/converted/deeper"
    nested.mkdir(parents=True)
    data, affine = head_volume()
    for name in ("b.nii.gz", "a.nii.gz"):
        nib.save(nib.Nifti1Image(data, affine), str(nested / name))
    (subject / "MPRAGE/2013-05-02_10_00_00.0/I3").mkdir(parents=True)  # empty image folder
    (subject / "MPRAGE/not-a-date/I4").mkdir(parents=True)
    nib.save(nib.Nifti1Image(data, affine), str(subject / "MPRAGE/not-a-date/I4/x.nii"))
    nib.save(nib.Nifti1Image(data, affine), str(subject / "MPRAGE/loose.nii"))
    found = discover(tmp_path)
    assert [(s.session_id, s.path.name) for s in found.scans] == [
        ("20110502", "I1.nii"), ("20120502", "a.nii.gz")]
    status = {e.scan.path.name: (e.status, e.reason) for e in found.excluded}
    assert status["b.nii.gz"][0] == "extra-t1" and "file name comes first" in status["b.nii.gz"][1]
    assert status["I3"][0] == "failed" and "found none" in status["I3"][1]
    assert status["I4"][0] == "failed" and "'not-a-date'" in status["I4"][1]
    assert status["MPRAGE"][0] == "failed" and "outside ADNI's layout" in status["MPRAGE"][1]
    every = discover_scans(tmp_path, DiscoverySettings(per_visit="all"))
    assert [s.session_id for s in every] == ["20110502I1", "20120502I2", "20120502I2run2"]


def test_download_with_no_t1_names_what_was_left_out(tmp_path: Path) -> None:
    _visit(tmp_path, [("Axial_T2-FLAIR", "2011-05-02_13_45_10.0", "I1")])
    with pytest.raises(ScanError, match="found no scans.*not-t1: series 'Axial_T2-FLAIR'"):
        discover(tmp_path)


def test_discovery_settings_are_checked_and_not_hashed() -> None:
    with pytest.raises(ConfigError, match=r"discovery.t1_series.*\[unclosed"):
        load_config(None, ['discovery.t1_series=["[unclosed"]'])
    with pytest.raises(ConfigError, match="per_visit"):
        load_config(None, ['discovery.per_visit="first"'])
    changed = load_config(None, ['discovery.per_visit="all"', 'discovery.prefer_series=[]'])
    assert settings_hash(changed) == settings_hash(load_config())


def test_discovery_settings_survive_the_saved_config(tmp_path: Path) -> None:
    """preprocess_config.toml holds the patterns (backslashes, look-behinds) unchanged."""
    from adni_pu import config as cfgmod

    cfg = load_config(None, [r'discovery.skip_series=["\\bscout\\b", "(?<![a-z])t2"]'])
    assert cfg.discovery.skip_series == (r"\bscout\b", "(?<![a-z])t2")
    path = cfgmod.save(cfg, tmp_path / "preprocess_config.toml")
    assert load_config(path) == cfg


def _fake_steps(scan, paths, config, timings):
    # each scan's own output: one image twice in a split is refused by the cohort builder
    return {paths["preproc"]: b"volume " + scan.label.encode(), paths["qc"]: b"png"}, "done", [], {}


CLINICAL = """RID,PTID,VISCODE,EXAMDATE,DX_bl,DX,AGE,PTGENDER,AV45,FBB,PIB
2,011_S_0002,bl,2011-04-20,CN,CN,74,Male,1.02,,
2,011_S_0002,m12,2012-05-01,CN,MCI,75,Male,1.20,,
295,002_S_0295,bl,2006-06-30,CN,CN,84,Female,,,
295,002_S_0295,m36,2009-05-02,CN,CN,87,Female,1.3,,
"""


def test_download_to_summary_to_cohort_matches_visits_by_date(download: Path,
                                                              tmp_path: Path, monkeypatch) -> None:
    from adni_pu.cohort import build_cohort

    monkeypatch.setattr(pipe, "_run_steps", _fake_steps)
    out = tmp_path / "out"
    summary = run_preprocessing(download, out, progress=False)
    table = pd.read_csv(out / "summary.csv", dtype=str, keep_default_na=False)
    assert list(table.columns[:6]) == ["subject_id", "session_id", "acquisition_date",
                                       "image_id", "series_description", "input_path"]
    assert len(table) == len(TREE) == len(summary)
    rows = table.set_index("image_id")
    for _p, series, _d, image, _f, status, ses in TREE:
        assert (rows.loc[image, "status"], rows.loc[image, "session_id"],
                rows.loc[image, "series_description"]) == (status, ses, series)
    assert rows.loc["I45117", "acquisition_date"] == "2006-04-18"
    assert "fallback_series" in rows.loc["I45117", "error"]
    assert (out / "sub-011S0002/ses-20120510").is_dir()

    clinical = tmp_path / "ADNIMERGE.csv"
    clinical.write_text(CLINICAL)
    cohort = build_cohort(clinical, out / "summary.csv")
    assert cohort.summary["columns"]["scans"]["date"] == "acquisition_date"
    m = cohort.manifest.set_index("session_id")
    # scan date -> nearest EXAMDATE within matching.visit_window_days (90), gap recorded
    assert m.loc["20110502", ["visit", "visit_match", "visit_gap_days"]].tolist() == [
        "bl", "date", -12.0]
    assert m.loc["20120510", ["visit", "visit_match", "visit_gap_days"]].tolist() == [
        "m12", "date", -9.0]
    assert m.loc["20120510", "suvr"] == pytest.approx(1.20)
    assert m.loc["20120510", "scan_date"] == pd.Timestamp("2012-05-10")
    # 002_S_0295 was scanned 73 days before its baseline exam: matched, gap kept
    assert m.loc["20060418", ["visit", "visit_match", "visit_gap_days"]].tolist() == [
        "bl", "date", 73.0]
    left_out = cohort.quality.to_frame().set_index("kind").loc["scan_not_usable"]
    assert sorted(left_out["message"]) == [
        "scans with status 'extra-t1' (usable: ['done', 'skipped'])",
        "scans with status 'not-t1' (usable: ['done', 'skipped'])"]
    assert sorted(left_out["count"]) == [3, 4]
    assert sorted(cohort.excluded["reason"]) == ["status extra-t1"] * 3 + ["status not-t1"] * 4

    narrow = tmp_path / "narrow.toml"
    narrow.write_text("[matching]\nvisit_window_days = 30\n")
    from adni_pu.cohort import load_cohort_config

    far = build_cohort(clinical, out / "summary.csv", load_cohort_config(narrow))
    row = far.manifest.set_index("session_id").loc["20060418"]
    assert row["visit_match"] == "none" and pd.isna(row["visit"])


def test_shards_share_the_left_out_inputs(download: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(pipe, "_run_steps", _fake_steps)
    parts = [run_preprocessing(download, tmp_path / "o", shard=f"{i}/2", progress=False)
             for i in (1, 2)]
    images = sorted(i for p in parts for i in p["image_id"])
    assert images == sorted(t[3] for t in TREE)



def test_cli_reads_a_download_and_counts_what_it_left_out(download: Path, tmp_path: Path,
                                                          monkeypatch) -> None:
    from typer.testing import CliRunner

    from adni_pu.cli.app import app

    monkeypatch.setattr(pipe, "_run_steps", _fake_steps)
    result = CliRunner().invoke(app, ["preprocess", str(download), str(tmp_path / "o"),
                                      "--no-progress"])
    assert result.exit_code == 0, result.output  # series left out are not failures
    assert "3 done" in result.output and "4 not-t1" in result.output
    assert "3 extra-t1" in result.output


def test_real_preprocessing_of_an_adni_dicom_series(tmp_path: Path) -> None:
    """A synthetic head stored as ADNI stores a DICOM T1 goes through the whole pipeline."""
    import json

    from adni_tree import write_dicom_series

    from adni_pu.preprocessing import output_paths
    from adni_pu.preprocessing.phantom import synthetic_head

    head = synthetic_head(rotation_deg=(3.0, 0.0, -4.0), translation_mm=(2.0, -3.0, 1.0), seed=3)
    scale = 1000.0 / float(head.data.max())
    folder = tmp_path / "ADNI/011_S_0002/Accelerated_Sagittal_MPRAGE/2012-05-10_09_12_00.0/I300001"
    write_dicom_series(folder, np.round(head.data * scale).astype(np.int16), head.affine,
                       "1.2.826.0.1.3680043.9.8")
    fast = ['skullstrip.method="template"', "registration.resolution_mm=4.0",
            "registration.iterations=[50, 20]", "registration.shrink_factors=[2, 1]",
            "registration.smoothing_sigmas=[1.0, 0.0]", "grid.spacing_mm=3.0",
            "grid.shape=[61, 73, 61]"]
    summary = run_preprocessing(tmp_path, tmp_path / "out", load_config(None, fast),
                                progress=False)
    row = summary.iloc[0]
    assert (row["status"], row["session_id"], row["image_id"]) == ("done", "20120510", "I300001"),\
        row["error"]
    scan = discover_scans(tmp_path)[0]
    side = json.loads(output_paths(scan, tmp_path / "out")["sidecar"].read_text())
    assert (side["acquisition_date"], side["series_description"]) == (
        "2012-05-10", "Accelerated_Sagittal_MPRAGE")
    assert side["input"]["orientation"] == "LPS"

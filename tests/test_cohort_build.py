"""End to end: messy tables -> manifest, quality record, report; CLI; nothing written on bad input."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.cohort import (
    CohortInputError,
    build_cohort,
    load_cohort_config,
    read_manifest,
    write_cohort,
)
from adni_pu.cohort.splits import check_manifest_splits

runner = CliRunner()
HEADER = "RID,PTID,VISCODE,EXAMDATE,DX_bl,DX,AGE,PTGENDER,AV45,FBB,PIB"
INTERFACE_COLUMNS = ["subject_id", "session_id", "scan_path", "pu_label", "truth", "split",
                     "dx", "suvr", "tracer", "suvr_gap_days", "age", "sex", "examdate"]


def clinical_rows(n: int = 30) -> list[str]:
    rows = [HEADER]
    for i in range(1, n + 1):
        ptid = f"011_S_{i:04d}"
        dx_bl, dx = [("CN", "CN"), ("LMCI", "MCI"), ("AD", "Dementia")][i % 3]
        av45 = f"{0.95 + 0.01 * i:.2f}" if i % 4 else ""
        rows.append(f"{i},{ptid},bl,2010-01-{(i % 27) + 1:02d},{dx_bl},{dx},{60 + i},"
                    f"{'Male' if i % 2 else 'Female'},{av45},,")
        rows.append(f"{i},{ptid},m12,2011-01-{(i % 27) + 1:02d},{dx_bl},{dx},{60 + i},"
                    f"{'Male' if i % 2 else 'Female'},,,")
    return rows


def summary_rows(n: int = 30) -> list[str]:
    rows = ["subject_id,session_id,input_path,status,preprocessed_path,error,seconds"]
    for i in range(1, n + 1):
        for ses in ("M000", "M012"):
            rows.append(f"ADNI011S{i:04d},{ses},/raw/{i}_{ses}.nii,done,"
                        f"sub-ADNI011S{i:04d}/ses-{ses}/t1.nii.gz,,3.1")
    return rows


def messy_inputs(tmp_path):
    clinical = clinical_rows()
    clinical += [
        clinical[3],                                                   # duplicate row
        "4,011_S_0004,m12,2011-01-05,LMCI,Dementia,64,Male,,,",        # conflicting DX
        "40,011_S_0040,bl,2010-13-01,CN,CN,seventy,Male,1.2x,,",       # bad date/numbers
        "41,011_S_0041,bl,2010-02-01,CN,CN,70,Male,1.0,,",             # subject with no scan
    ]
    scans = summary_rows()
    scans += [
        "ADNI099S0999,M000,/raw/x.nii,done,x.nii.gz,,1",                # subject not on file
        ",M000,/raw/y.nii,done,y.nii.gz,,1",                            # scan with no subject
        "ADNI011S0040,M000,/raw/z.nii,failed,,read error,1",            # failed scan
        "ADNI011S0040,M024,/raw/w.nii,done,w.nii.gz,,1",                # visit not on file
    ]
    (tmp_path / "ADNIMERGE_2024-10-14.csv").write_text("\n".join(clinical) + "\n")
    (tmp_path / "summary.csv").write_text("\n".join(scans) + "\n")
    # the listed volumes are there, but one (scan_file_missing)
    write_listed_volumes(tmp_path, scans, skip="sub-ADNI011S0001/ses-M012/t1.nii.gz")
    return tmp_path / "ADNIMERGE_2024-10-14.csv", tmp_path / "summary.csv"


def write_listed_volumes(folder, rows: list[str], skip: str = "") -> None:
    """Write each preprocessed_path of summary ``rows`` (relative to ``folder``; distinct
    bytes, so the leakage guard sees distinct scans): cohort build leaves out a scan whose
    file is missing."""
    for row in rows[1:]:
        volume = row.split(",")[4]
        if volume and volume != skip:
            (folder / volume).parent.mkdir(parents=True, exist_ok=True)
            (folder / volume).write_text(volume)


def test_messy_inputs_every_issue_reported(tmp_path):
    clinical, scans = messy_inputs(tmp_path)
    cohort = build_cohort(clinical, scans, load_cohort_config())
    q = cohort.quality
    for kind in ("duplicate_rows", "conflicting_diagnosis", "unparseable_date",
                 "unparseable_number", "scan_without_subject", "subject_without_scan",
                 "scan_not_usable", "scan_without_visit", "scan_file_missing"):
        assert q.count(kind) > 0, kind
    assert q.count("scan_without_subject") == 2     # unknown subject and empty subject
    assert "011_S_0041" in next(i for i in q if i.kind == "subject_without_scan").examples
    reasons = set(cohort.excluded["reason"])
    assert {"status failed", "subject not in clinical table", "no subject id",
            "scan file missing"} <= reasons
    # 59 good scans (one file missing) + the kept scan of 011_S_0040 whose visit is unknown
    assert len(cohort.manifest) == 60
    assert "sub-ADNI011S0001/ses-M012/t1.nii.gz" in set(
        cohort.excluded.loc[cohort.excluded["reason"] == "scan file missing", "scan_path"])
    assert len(cohort.manifest) + len(cohort.excluded) == len(summary_rows()) - 1 + 4
    check_manifest_splits(cohort.manifest)
    assert list(cohort.manifest.columns[:4]) == ["subject_id", "session_id", "scan_id",
                                                 "scan_path"]
    assert set(INTERFACE_COLUMNS) <= set(cohort.manifest.columns)
    # The conflicting visit lost its diagnosis.
    row = cohort.manifest.loc[(cohort.manifest["subject_id"] == "011_S_0004")
                              & (cohort.manifest["session_id"] == "m12")]
    assert row["dx"].isna().all()


def test_write_and_report(tmp_path):
    clinical, scans = messy_inputs(tmp_path)
    cohort = build_cohort(clinical, scans, load_cohort_config(overrides=["split.seed=4"]))
    out = tmp_path / "cohort"
    paths = write_cohort(cohort, out)
    png = paths["histogram"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    text = paths["report"].read_text()
    for heading in ("Counts per split and label", "Class prior", "Data quality",
                    "conflicting_diagnosis", "suvr_histogram.png"):
        assert heading in text
    manifest = read_manifest(out)
    assert len(manifest) == len(cohort.manifest)
    assert manifest["scan_path"].map(lambda p: p.startswith("/")).all()
    assert manifest["examdate"].dtype.kind == "M"
    assert not list(out.glob(".*.tmp"))
    # The saved settings rebuild the same cohort.
    again = build_cohort(clinical, scans, load_cohort_config(out / "cohort_config.toml"))
    pd.testing.assert_frame_equal(again.manifest, cohort.manifest)


def test_nothing_written_when_input_is_unusable(tmp_path):
    bad = tmp_path / "ADNIMERGE.csv"
    bad.write_text("ID,VISIT\n1,bl\n")
    scans = tmp_path / "summary.csv"
    scans.write_text("\n".join(summary_rows(2)) + "\n")
    out = tmp_path / "out"
    result = runner.invoke(app, ["cohort", "build", str(bad), str(scans), str(out)])
    assert result.exit_code == 2
    assert "missing required column(s)" in result.output and "['ID', 'VISIT']" in result.output
    assert not out.exists()
    # Every scan unusable: also refused.
    clinical = tmp_path / "clinical.csv"
    clinical.write_text("\n".join(clinical_rows(2)) + "\n")
    failed = tmp_path / "failed.csv"
    failed.write_text("subject_id,session_id,status,preprocessed_path\n"
                      "ADNI011S0001,M000,failed,\n")
    with pytest.raises(CohortInputError, match="no usable scans"):
        build_cohort(clinical, failed)
    result = runner.invoke(app, ["cohort", "build", str(clinical), str(failed), str(out)])
    assert result.exit_code == 2 and not out.exists()


def test_cli_build_and_report(tmp_path):
    clinical, scans = messy_inputs(tmp_path)
    out = tmp_path / "cohort"
    result = runner.invoke(app, ["cohort", "build", str(clinical), str(scans), str(out),
                                 "--preset", "tracer-cutoffs",
                                 "--set", "output.format=\"parquet\"",
                                 "--set", "split.k_folds=3"])
    assert result.exit_code == 0, result.output
    assert (out / "manifest.parquet").is_file()
    assert 'preset = "tracer-cutoffs"' in (out / "cohort_config.toml").read_text()
    (out / "cohort_report.md").unlink()
    (out / "suvr_histogram.png").unlink()
    result = runner.invoke(app, ["cohort", "report", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "suvr_histogram.png").stat().st_size > 0
    assert "AV45" in (out / "cohort_report.md").read_text()
    manifest = read_manifest(out)
    assert set(manifest.loc[manifest["split"] != "test", "fold"]) == {0, 1, 2}
    result = runner.invoke(app, ["cohort", "report", str(tmp_path / "nope.csv")])
    assert result.exit_code == 2 and "manifest not found" in result.output


def test_rid_and_generic_scan_table_with_dates(tmp_path):
    clinical = tmp_path / "c.csv"
    clinical.write_text("\n".join(clinical_rows(6)) + "\n")
    scans = tmp_path / "scans.csv"
    scans.write_text("subject,session,path,date\n"
                     "1,,a.nii.gz,2010-01-20\n"            # RID only, dated: nearest visit
                     "sub-ADNI011S0002,m12,b.nii.gz,\n")
    cohort = build_cohort(clinical, scans, load_cohort_config(
        overrides=["check_scan_files=false", 'output.scan_paths="as-given"']))
    m = cohort.manifest.set_index("scan_path")
    assert m.at["a.nii.gz", "subject_id"] == "011_S_0001"
    assert m.at["a.nii.gz", "visit"] == "bl" and m.at["a.nii.gz", "visit_match"] == "date"
    assert m.at["b.nii.gz", "subject_id"] == "011_S_0002"
    assert cohort.quality.count("scan_file_missing") == 0


# --------------------------------------------------------------------------- ids that are paths


def cohort_inputs(tmp_path: Path, extra_clinical=(), extra_scans=()):
    """ADNIMERGE and scan summary tables of 12 subjects (plus extra rows) with their
    volumes, as ``adni-pu cohort build`` reads them."""
    clinical = tmp_path / "ADNIMERGE.csv"
    clinical.write_text("\n".join([*clinical_rows(12), *extra_clinical]) + "\n")
    scans = tmp_path / "summary.csv"
    rows = [*summary_rows(12), *extra_scans]
    scans.write_text("\n".join(rows) + "\n")
    write_listed_volumes(tmp_path, rows)
    return clinical, scans


def test_cohort_build_leaves_out_ids_that_are_paths(tmp_path):
    clinical, scans = cohort_inputs(
        tmp_path, ["50,../../x,bl,2010-01-03,AD,Dementia,70,Male,1.3,,",
                   "51,/etc/x,bl,2010-01-03,CN,CN,70,Male,1.0,,"],
        ["../../x,M000,/raw/a.nii,done,a.nii.gz,,1", "/etc/x,M000,/raw/b.nii,done,b.nii.gz,,1"])
    out = tmp_path / "out"
    result = runner.invoke(app, ["cohort", "build", str(clinical), str(scans), str(out)])
    assert result.exit_code == 0, result.output
    assert "scan_unusable_id: 2 scans whose subject id is not an id" in result.output
    manifest = pd.read_csv(out / "manifest.csv", dtype=str)
    assert not manifest["scan_id"].str.contains("/|\\.\\.", regex=True).any()
    excluded = pd.read_csv(out / "excluded.csv", dtype=str)
    assert set(excluded["subject"]) >= {"../../x", "/etc/x"}
    assert set(excluded.loc[excluded["subject"].isin(["../../x", "/etc/x"]), "reason"]) == {
        "subject id is not an id (a path or odd characters)"}

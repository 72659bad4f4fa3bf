"""Reading and normalising clinical and scan tables: ids, visits, dates, diagnoses, bad input."""

from __future__ import annotations

import pandas as pd
import pytest

from adni_pu.cohort.config import ClinicalColumns, ScanColumns
from adni_pu.cohort.ids import normalise_subject_id
from adni_pu.cohort.quality import CohortInputError, QualityReport
from adni_pu.cohort.tables import load_clinical, load_scans
from adni_pu.cohort.values import normalise_diagnosis, normalise_visit, parse_dates

HEADER = "RID,PTID,VISCODE,EXAMDATE,DX_bl,DX,AGE,PTGENDER,AV45,FBB,PIB"


def write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("raw, expected", [
    ("011_S_0002", "011_S_0002"),
    ("sub-ADNI011S0002", "011_S_0002"),
    ("ADNI011S0002", "011_S_0002"),
    ("011s0002", "011_S_0002"),
    (" 022_S_0004 ", "022_S_0004"),
    ("2", "2"),
    ("0002", "2"),
    (2.0, "2"),
    ("sub-P01", "P01"),
    ("", None),
    (None, None),
])
def test_subject_ids(raw, expected):
    assert normalise_subject_id(raw) == expected


@pytest.mark.parametrize("raw, expected", [
    ("bl", "bl"), ("BL", "bl"), ("sc", "sc"), ("scmri", "scmri"), ("nv", "nv"),
    ("m06", "m06"), ("m6", "m06"), ("M12", "m12"), ("m108", "m108"),
    ("ses-M000", "bl"), ("ses-M006", "m06"), ("ses-M012", "m12"), ("ses-M108", "m108"),
    ("M000", "bl"), ("y1", "m12"), ("", None),
])
def test_visit_codes(raw, expected):
    assert normalise_visit(raw) == expected


@pytest.mark.parametrize("raw, expected", [
    ("CN", "CN"), ("SMC", "CN"), ("EMCI", "MCI"), ("LMCI", "MCI"), ("AD", "AD"),
    ("MCI", "MCI"), ("Dementia", "AD"), ("NL", "CN"), ("MCI to Dementia", "AD"),
    ("NL to MCI", "MCI"), ("", None),
])
def test_diagnoses(raw, expected):
    assert normalise_diagnosis(raw) == expected


def test_unknown_diagnosis_raises():
    with pytest.raises(ValueError, match="unknown diagnosis"):
        normalise_diagnosis("banana")


def test_dates_iso_and_us_forms_and_bad_values():
    dates, bad = parse_dates(pd.Series(["2005-09-08", "9/8/2005", "not a date", None, ""]))
    assert dates[0] == pd.Timestamp("2005-09-08")
    assert dates[1] == pd.Timestamp("2005-09-08")
    assert bad.tolist() == [False, False, True, False, False]


def test_missing_columns_error_lists_expected_and_found(tmp_path):
    path = write(tmp_path / "ADNIMERGE.csv", ["ID,VISIT_NO,SCORE", "1,1,3"])
    with pytest.raises(CohortInputError) as info:
        load_clinical(path, ClinicalColumns(), QualityReport())
    text = str(info.value)
    assert "PTID" in text and "RID" in text and "VISCODE" in text  # what was expected
    assert "['ID', 'VISIT_NO', 'SCORE']" in text  # what was found


def test_configured_column_that_does_not_exist_is_named(tmp_path):
    path = write(tmp_path / "t.csv", [HEADER, "2,011_S_0002,bl,2005-09-08,CN,CN,74,Male,1.0,,"])
    with pytest.raises(CohortInputError, match="clinical_columns.dx = 'Diagnosis'"):
        load_clinical(path, ClinicalColumns(dx="Diagnosis"), QualityReport())


def test_messy_clinical_rows_are_reported_not_dropped_silently(tmp_path):
    path = write(tmp_path / "ADNIMERGE_14Oct2024.csv", [
        HEADER,
        "2,011_S_0002,bl,2005-09-08,CN,CN,74.3,Male,1.01,,",
        "2,011_S_0002,bl,2005-09-08,CN,CN,74.3,Male,1.01,,",        # exact duplicate
        "3,011_S_0003,bl,2005-13-45,AD,Dementia,81.3,Male,1.30,,",  # bad date
        "4,022_S_0004,bl,2005-11-08,LMCI,MCI,sixty,Female,x1.2,,",  # bad numbers
        "6,100_S_0006,m06,2006-05-29,LMCI,MCI,80.4,Female,,,",
        "6,100_S_0006,m06,2006-05-29,LMCI,Dementia,80.4,Female,,,",  # conflicting DX
        "7,,bl,2005-10-06,AD,Dementia,75.4,Male,,,",                 # PTID from RID? no
        "9,,,,CN,CN,70,Male,,,",                                     # no visit, no date
        "4,,m06,2006-05-08,LMCI,Zombie,67.5,F,-4,,",                 # RID only; unknown DX
    ])
    quality = QualityReport()
    visits, used, name = load_clinical(path, ClinicalColumns(), quality)
    assert name == "ADNIMERGE_14Oct2024.csv"
    assert used["subject"] == "PTID" and used["av45"] == "AV45"
    assert quality.count("duplicate_rows") == 1
    assert quality.count("unparseable_date") == 1
    assert quality.count("unparseable_number") == 2  # AGE "sixty" and AV45 "x1.2"
    assert quality.count("conflicting_diagnosis") == 1
    assert quality.count("unknown_diagnosis") == 1
    assert quality.count("implausible_suvr") == 1
    assert quality.count("row_without_visit") == 1
    conflict = visits.loc[(visits["subject_id"] == "100_S_0006") & (visits["visit"] == "m06")]
    assert len(conflict) == 1 and conflict["dx"].isna().all()
    # A row with only a RID takes the PTID that other rows give the RID.
    rid_only = visits.loc[(visits["subject_id"] == "022_S_0004") & (visits["visit"] == "m06")]
    assert len(rid_only) == 1 and rid_only["sex"].iloc[0] == "F"
    # RID 7 has no PTID anywhere: its id stays the RID.
    assert "7" in set(visits["subject_id"])
    bad = visits.loc[visits["subject_id"] == "022_S_0004"]
    assert bad["AV45"].isna().all() and bad["age"].isna().iloc[0]
    examples = [i for i in quality if i.kind == "unparseable_number"][0].examples
    assert any("line 5" in e for e in examples)


def test_generic_table_with_column_mapping(tmp_path):
    path = write(tmp_path / "clinic.csv", [
        "participant,when,session,diagnosis,amyloid_av45",
        "sub-ADNI011S0002,2010-01-05,ses-M000,CN,1.2",
    ])
    cols = ClinicalColumns(subject="participant", date="when", visit="session",
                           dx="diagnosis", av45="amyloid_av45")
    visits, used, _ = load_clinical(path, cols, QualityReport())
    row = visits.iloc[0]
    assert row["subject_id"] == "011_S_0002" and row["visit"] == "bl"
    assert row["dx"] == "CN" and row["AV45"] == pytest.approx(1.2)
    assert row["examdate"] == pd.Timestamp("2010-01-05")


def test_scan_table_generic_and_summary(tmp_path):
    generic = write(tmp_path / "scans.csv", ["subject,session,path,date",
                                             "011_S_0002,m06,a.nii.gz,03/01/2006"])
    scans, used, _ = load_scans(generic, ScanColumns(), QualityReport())
    assert used["path"] == "path" and used["status"] is None
    assert scans["scan_date"].iloc[0] == pd.Timestamp("2006-03-01")
    summary = write(tmp_path / "summary.csv", [
        "subject_id,session_id,input_path,status,preprocessed_path,error,seconds",
        "ADNI011S0002,M006,/in/a.nii,done,out/a.nii.gz,,1.0"])
    scans, used, _ = load_scans(summary, ScanColumns(), QualityReport())
    assert used["path"] == "preprocessed_path"
    assert scans["subject_id"].iloc[0] == "011_S_0002" and scans["session_id"].iloc[0] == "m06"


def test_scan_table_missing_path_column(tmp_path):
    path = write(tmp_path / "scans.csv", ["subject,session", "011_S_0002,bl"])
    with pytest.raises(CohortInputError, match="path"):
        load_scans(path, ScanColumns(), QualityReport())

"""Cohort tables and manifests (adni_pu.cohort): row order decides nothing, an unreadable
value erases nothing, tables without QC are flagged, manifests are validated when read
(contradictory rows refused), inputs are never overwritten, and unreadable dates are
named as such."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.cohort import CohortInputError, build_cohort, load_cohort_config, read_manifest
from adni_pu.cohort.manifest_check import ManifestWarning
from adni_pu.errors import ManifestError

runner = CliRunner()
N = 30
BERKELEY = "RID,SCANDATE,TRACER,SUMMARY_SUVR,CENTILOIDS,qc_flag"


def config(*overrides: str, preset: str | None = None):
    return load_cohort_config(overrides=["check_scan_files=false", *overrides], preset=preset)


@pytest.fixture
def tables(tmp_path):
    """N subjects at bl on 2010-01-10 (every third AD); 011_S_0001 has ADNIMERGE AV45 1.20,
    011_S_0004 has 1.00."""
    rows = ["RID,PTID,VISCODE,EXAMDATE,DX_bl,DX,AGE,PTGENDER,AV45"]
    for i in range(1, N + 1):
        dx_bl, dx = ("AD", "Dementia") if i % 3 == 0 else ("CN", "CN")
        av45 = {1: "1.20", 4: "1.00"}.get(i, "")
        rows.append(f"{i},011_S_{i:04d},bl,2010-01-10,{dx_bl},{dx},{60 + i},"
                    f"{'Male' if i % 2 else 'Female'},{av45}")
    clinical = tmp_path / "ADNIMERGE.csv"
    clinical.write_text("\n".join(rows) + "\n")
    scans = tmp_path / "scans.csv"
    scans.write_text("subject,session,path,date\n" + "".join(
        f"011_S_{i:04d},bl,s{i}.nii.gz,2010-01-10\n" for i in range(1, N + 1)))
    return clinical, scans


def berkeley_rows() -> list[str]:
    """One passing FBP scan per subject 5..N, SUVR 0.90 + 0.02 x RID."""
    return [f"{i},2010-01-12,FBP,{0.90 + 0.02 * i:.2f},,2" for i in range(5, N + 1)]


def write(path, header: str, rows: list[str]):
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def per_subject(cohort, column: str) -> dict[str, object]:
    return {k[-2:].lstrip("0"): v for k, v in
            cohort.subjects.set_index("subject_id")[column].items()}


# --------------------------------------------------------------------------- row order


def test_conflicting_rows_on_one_scan_date_do_not_depend_on_row_order(tmp_path, tables):
    # Subject 2: two rows for one PET scan that disagree (1.30 vs 0.95, which straddle 1.08);
    # subject 7: two rows that agree (one without its Centiloid).
    rows = [*berkeley_rows(), "2,2010-01-12,FBP,1.30,,2", "2,2010-01-12,FBP,0.95,,2",
            "7,2010-01-12,FBP,1.04,-1.4,2"]
    forward = write(tmp_path / "UCBERKELEY_AMY_6MM_a.csv", BERKELEY, rows)
    reverse = write(tmp_path / "UCBERKELEY_AMY_6MM_b.csv", BERKELEY, rows[::-1])
    a = build_cohort(*tables, config(), amyloid=forward)
    b = build_cohort(*tables, config(), amyloid=reverse)
    columns = ["subject_id", "pu_label", "truth", "split", "amyloid_suvr"]
    pd.testing.assert_frame_equal(a.subjects[columns], b.subjects[columns])
    pd.testing.assert_frame_equal(a.manifest, b.manifest)
    # Neither row of the conflict is used; the lines are named; no "more than one table".
    assert pd.isna(per_subject(a, "truth")["2"])
    conflict = next(i for i in a.quality if i.kind == "conflicting_amyloid_measure")
    assert conflict.count == 1 and "RID 2 2010-01-12 AV45 (lines" in conflict.examples[0]
    assert "SUVR 1.3" in conflict.examples[0] and "SUVR 0.95" in conflict.examples[0]
    assert conflict.table == "amyloid (UCBERKELEY_AMY_6MM_a.csv)"
    # The agreeing rows are one measure, Centiloid taken from the row that has it.
    assert a.manifest.set_index("subject_id").at["011_S_0007", "centiloid"] == -1.4
    duplicate = next(i for i in a.quality if i.kind == "duplicate_amyloid_measure")
    assert duplicate.count == 1 and "more than one" not in duplicate.message
    assert "in more than one amyloid table" not in " ".join(i.message for i in a.quality)


def test_conflicting_clinical_suvrs_of_one_visit_do_not_depend_on_row_order(tmp_path, tables):
    lines = tables[0].read_text().splitlines()
    extra = ["2,011_S_0002,bl,2010-01-10,CN,CN,62,Female,1.30",
             "2,011_S_0002,bl,2010-01-10,CN,CN,62,Female,0.95"]
    truths = []
    for order in (extra, extra[::-1]):
        clinical = tmp_path / "ADNIMERGE.csv"
        clinical.write_text("\n".join([*lines, *order]) + "\n")
        cohort = build_cohort(clinical, tables[1], config())
        truths.append(per_subject(cohort, "truth")["2"])
        issue = next(i for i in cohort.quality if i.kind == "conflicting_amyloid_measure")
        assert issue.table == "clinical (ADNIMERGE.csv)" and "AV45" in issue.examples[0]
    assert all(pd.isna(t) for t in truths)


def test_same_scan_in_two_tables_keeps_the_first_table_given(tmp_path, tables):
    rows = berkeley_rows()
    one = write(tmp_path / "one.csv", BERKELEY, rows)
    two = write(tmp_path / "two.csv", "PTID,SCANDATE,TRACER,SUMMARY_SUVR,CENTILOIDS,qc_flag",
                ["011_S_0005,2010-01-12,FBP,1.50,,2"])
    cohort = build_cohort(*tables, config(), amyloid=[one, two])
    # The RID of table one and the PTID of table two are the same subject.
    assert cohort.manifest.set_index("subject_id").at["011_S_0005", "suvr"] == 1.00
    issue = next(i for i in cohort.quality if i.kind == "duplicate_amyloid_measure")
    assert "more than one amyloid table" in issue.message and "two.csv" in issue.examples[0]


# --------------------------------------------------------------------------- unreadable values


def test_unreadable_table_row_keeps_the_clinical_value(tmp_path, tables):
    # 011_S_0001: ADNIMERGE AV45 1.20; its Berkeley row's SUVR is text (a Centiloid only).
    # 011_S_0004: ADNIMERGE AV45 1.00; its Berkeley row is NAV (no SUVR cut-off in paper).
    rows = [*berkeley_rows(), "1,2010-01-12,FBP,pending,30,2", "4,2010-01-12,NAV,1.50,,2"]
    path = write(tmp_path / "amy.csv", BERKELEY, rows)
    cohort = build_cohort(*tables, config(), amyloid=path)
    truth, suvr = per_subject(cohort, "truth"), per_subject(cohort, "amyloid_suvr")
    assert truth["1"] == 1 and suvr["1"] == 1.20
    assert truth["4"] == 0 and suvr["4"] == 1.00
    kept = next(i for i in cohort.quality if i.kind == "clinical_amyloid_kept")
    assert kept.examples == ["011_S_0001", "011_S_0004"]
    # A readable table measure still takes precedence (tables-first) ...
    assert cohort.quality.count("clinical_amyloid_superseded") == 0
    # ... and under the Centiloid rule the row is readable: CL 30 supersedes the AV45.
    centiloid = build_cohort(*tables, config(preset="centiloid"), amyloid=path)
    assert per_subject(centiloid, "amyloid_centiloid")["1"] == 30


def test_table_with_no_readable_suvr_stops_the_build(tmp_path, tables):
    rows = [f"{i},2010-01-12,FBP,NA,{10 * i},2" for i in range(5, N + 1)]
    path = write(tmp_path / "UCBERKELEY_AMY_6MM_x.csv", BERKELEY, rows)
    with pytest.raises(CohortInputError) as info:
        build_cohort(*tables, config(), amyloid=path)
    text = str(info.value)
    assert text.startswith("amyloid (UCBERKELEY_AMY_6MM_x.csv): no measure preset paper can use")
    assert "no readable SUVR (column SUMMARY_SUVR: found empty/NA" in text
    assert "--preset centiloid" in text
    out = tmp_path / "out"
    result = runner.invoke(app, ["cohort", "build", str(tables[0]), str(tables[1]), str(out),
                                 "--amyloid", str(path), "--set", "check_scan_files=false"])
    assert result.exit_code == 2 and result.output.startswith("error: amyloid (")
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()
    # The Centiloids are what the Centiloid rule reads: the same table builds.
    cohort = build_cohort(*tables, config(preset="centiloid"), amyloid=path)
    assert per_subject(cohort, "truth")["5"] == 1


def test_table_of_untracked_tracers_stops_the_build(tmp_path, tables):
    path = write(tmp_path / "nav.csv", BERKELEY, ["5,2010-01-12,NAV,1.3,,2"])
    with pytest.raises(CohortInputError, match=r"1 are of tracers with no SUVR cut-off \(NAV\)"):
        build_cohort(*tables, config(), amyloid=path)


def test_table_without_qc_flag_is_warned_about(tmp_path, tables):
    path = write(tmp_path / "UCBERKELEYAV45_01_14_21.csv", "RID,EXAMDATE,SUMMARYSUVR_WHOLECEREBNORM",
                 [f"{i},2010-01-12,{0.90 + 0.02 * i:.2f}" for i in range(5, N + 1)])
    out = tmp_path / "out"
    result = runner.invoke(app, ["cohort", "build", str(tables[0]), str(tables[1]), str(out),
                                 "--amyloid", str(path), "--set", "check_scan_files=false"])
    assert result.exit_code == 0, result.output
    assert ("warning: amyloid (UCBERKELEYAV45_01_14_21.csv): 26 measures used without PET "
            "quality control: the table has no qc_flag column") in result.stderr
    quality = pd.read_csv(out / "quality.csv")
    assert "amyloid_without_qc" in set(quality["kind"])
    assert "amyloid_without_qc" in (out / "cohort_report.md").read_text()


# --------------------------------------------------------------------------- manifests


@pytest.fixture
def manifest(tmp_path, tables):
    out = tmp_path / "cohort"
    result = runner.invoke(app, ["cohort", "build", str(tables[0]), str(tables[1]), str(out),
                                 "--set", "check_scan_files=false"])
    assert result.exit_code == 0, result.output
    return out / "manifest.csv"


def edit(path, column: str, row: int, value: str):
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    frame.loc[row, column] = value
    frame.to_csv(path, index=False)
    return path


@pytest.mark.parametrize(("column", "value", "expected"), [
    ("pu_label", "2", r"column pu_label: expected 0 or 1 on every row .*; found '2' on line 4"),
    ("pu_label", "", r"column pu_label: expected 0 or 1 .*; found empty on line 4"),
    ("truth", "0.5", r"column truth: expected 0, 1 or empty; found '0.5' on line 4"),
    ("split", "validation", r"column split: expected one of train, val, test on every row; "
                            r"found 'validation' on line 4"),
    ("fold", "1.5", r"column fold: expected a whole number"),
    ("subject_id", "", r"column subject_id: expected a subject id on every row"),
])
def test_invalid_manifest_values_are_refused(manifest, column, value, expected):
    edit(manifest, column, 2, value)
    with pytest.raises(ManifestError, match=expected) as info:
        read_manifest(manifest)
    assert f"manifest {manifest}: " in str(info.value)
    result = runner.invoke(app, ["cohort", "report", str(manifest)])
    assert result.exit_code == 2 and result.output.startswith("error: manifest ")
    assert len(result.output.strip().splitlines()) == 1


def test_manifest_split_spelling_is_repaired_with_a_warning(manifest):
    before = read_manifest(manifest)
    split = before.at[2, "split"]
    edit(manifest, "split", 2, f" {split.title()} ")
    with pytest.warns(ManifestWarning, match=rf"column split: read ' {split.title()} ' -> "
                                             rf"'{split}' on line 4"):
        after = read_manifest(manifest)
    pd.testing.assert_frame_equal(after, before)


def test_manifest_missing_column_is_refused(manifest):
    frame = pd.read_csv(manifest, dtype=str).drop(columns="truth")
    frame.to_csv(manifest, index=False)
    with pytest.raises(ManifestError, match=r"missing column\(s\) \['truth'\]"):
        read_manifest(manifest)


# --------------------------------------------------------------------------- inputs in OUT


@pytest.mark.parametrize("names", [("subjects.csv", "manifest.csv"),
                                   ("quality.csv", "excluded.csv")])
def test_inputs_inside_out_are_never_overwritten(tmp_path, tables, names):
    out = tmp_path / "out"
    out.mkdir()
    clinical, scans = out / names[0], out / names[1]
    clinical.write_bytes(tables[0].read_bytes())
    scans.write_bytes(tables[1].read_bytes())
    before = {p: p.read_bytes() for p in (clinical, scans)}
    result = runner.invoke(app, ["cohort", "build", str(clinical), str(scans), str(out),
                                 "--set", "check_scan_files=false"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: output folder {out}: writing ")
    assert "would overwrite the" in result.output and "an input of this build" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in before} == before
    assert sorted(p.name for p in out.iterdir()) == sorted(names)    # nothing else written


def test_settings_file_inside_out_is_never_overwritten(tmp_path, tables):
    out = tmp_path / "out"
    out.mkdir()
    settings = out / "cohort_config.toml"
    settings.write_text('preset = "paper"\n')
    result = runner.invoke(app, ["cohort", "build", str(tables[0]), str(tables[1]), str(out),
                                 "--config", str(settings), "--set", "check_scan_files=false"])
    assert result.exit_code == 2 and "would overwrite the settings file" in result.output
    assert settings.read_text() == 'preset = "paper"\n'


# --------------------------------------------------------------------------- dates


def test_two_digit_year_dates_are_named_as_the_cause(tmp_path, tables):
    clinical = tmp_path / "ADNIMERGE_yy.csv"
    clinical.write_text(tables[0].read_text().replace("2010-01-10", "01/10/10"))
    scans = tmp_path / "scans_nodate.csv"
    scans.write_text("subject,session,path\n" + "".join(
        f"011_S_{i:04d},bl,s{i}.nii.gz\n" for i in range(1, N + 1)))
    result = runner.invoke(app, ["cohort", "build", str(clinical), str(scans),
                                 str(tmp_path / "out"), "--set", "check_scan_files=false"])
    assert result.exit_code == 2
    line = result.output.strip()
    assert "no usable amyloid measure" not in line and len(line.splitlines()) == 1
    assert line.startswith("error: clinical (ADNIMERGE_yy.csv): column EXAMDATE: expected "
                           "dates as YYYY-MM-DD (2016-05-24) or M/D/YYYY (5/24/2016); found "
                           "MM/DD/YY dates with two-digit years, e.g. ['01/10/10']")


def test_some_two_digit_years_are_reported_per_row(tmp_path, tables):
    text = tables[0].read_text().replace("011_S_0002,bl,2010-01-10", "011_S_0002,bl,01/10/10")
    clinical = tmp_path / "ADNIMERGE.csv"
    clinical.write_text(text)
    cohort = build_cohort(clinical, tables[1], config())
    issue = next(i for i in cohort.quality if i.kind == "unparseable_date")
    assert "1 have two-digit years" in issue.message and "01/10/10" in issue.examples[0]


# --------------------------------------------------------------------------- contradictory manifests


def _tiny(tmp_path: Path, rows: list[tuple[str, str, int, object, str]]) -> Path:
    path = tmp_path / "m.csv"
    pd.DataFrame(rows, columns=["subject_id", "scan_path", "pu_label", "truth", "split"]
                 ).to_csv(path, index=False)
    return path


def test_a_subject_with_two_pu_labels_is_refused_naming_its_lines(tmp_path):
    path = _tiny(tmp_path, [("002_S_0004", "a.nii", 1, 1, "train"),
                            ("003_S_0005", "b.nii", 0, 0, "train"),
                            ("sub-ADNI002S0004", "c.nii", 0, 1, "train")])
    with pytest.raises(ManifestError, match="column pu_label: expected one value per subject"
                       ) as info:
        read_manifest(path)
    text = str(info.value)
    assert "subject 002_S_0004: 1 on line 2, 0 on line 4 (as 'sub-ADNI002S0004')" in text


def test_a_subject_with_two_truths_is_refused_but_an_empty_truth_is_not(tmp_path):
    ok = _tiny(tmp_path, [("a", "a.nii", 0, 1, "train"), ("a", "b.nii", 0, "", "train")])
    assert len(read_manifest(ok)) == 2
    bad = _tiny(tmp_path, [("a", "a.nii", 0, 1, "train"), ("a", "b.nii", 0, 0, "train")])
    with pytest.raises(ManifestError, match="column truth: .*subject a: 1 on line 2, 0 on "
                                            "line 3"):
        read_manifest(bad)


def test_an_exact_duplicate_row_is_refused(tmp_path):
    path = _tiny(tmp_path, [("a", "a.nii", 1, 1, "train"), ("b", "b.nii", 0, 0, "val"),
                            ("a", "a.nii", 1, 1, "train")])
    with pytest.raises(ManifestError, match=r"the same row is given more than once \(lines "
                                            r"2, 4\).*count its scan twice"):
        read_manifest(path)


def test_one_scan_on_two_rows_is_refused(tmp_path):
    path = _tiny(tmp_path, [("a", "x/a.nii", 1, 1, "train"), ("b", "x/../x/a.nii", 0, 0,
                                                              "train")])
    with pytest.raises(ManifestError, match=r"expected each scan once; found the same scan "
                                            r"on several rows \(x/a.nii on lines 2, 3\)"):
        read_manifest(path)

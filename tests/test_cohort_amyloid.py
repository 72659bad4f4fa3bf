"""UC Berkeley amyloid tables (--amyloid), the Centiloid rule, and the no-amyloid refusal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.cohort import CohortInputError, build_cohort, load_cohort_config, write_cohort
from adni_pu.cohort.amyloid import add_centiloids, normalise_tracer
from adni_pu.cohort.config import BERKELEY_CENTILOID
from adni_pu.cohort.quality import QualityReport
from adni_pu.config import ConfigError

runner = CliRunner()
#: The synthetic UC Berkeley AMY_6MM table shown in docs/cohort.md.
EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "UCBERKELEY_AMY_6MM_example.csv"
HEADER = "RID,PTID,VISCODE,EXAMDATE,DX_bl,DX,AGE,PTGENDER,AV45,FBB,PIB"


def clinical_rows(amyloid: bool = True) -> list[str]:
    """Nine subjects at bl on 2010-01-10; 011_S_0005 has an ADNIMERGE AV45 of 1.20."""
    rows = [HEADER if amyloid else HEADER.rsplit(",AV45", 1)[0]]
    for i in range(1, 10):
        dx_bl, dx = ("AD", "Dementia") if i == 9 else ("CN", "CN")
        av45 = "1.20" if i == 5 else ""
        row = f"{i},011_S_{i:04d},bl,2010-01-10,{dx_bl},{dx},{70 + i},{'Male' if i % 2 else 'Female'}"
        rows.append(row + (f",{av45},," if amyloid else ""))
    return rows


@pytest.fixture
def tables(tmp_path):
    clinical = tmp_path / "ADNIMERGE.csv"
    clinical.write_text("\n".join(clinical_rows()) + "\n")
    scans = tmp_path / "scans.csv"
    scans.write_text("subject,session,path,date\n" + "".join(
        f"011_S_{i:04d},bl,s{i}.nii.gz,2010-01-10\n" for i in range(1, 10)))
    return clinical, scans


def config(*overrides: str, preset: str | None = None):
    return load_cohort_config(overrides=["check_scan_files=false", *overrides], preset=preset)


def per_subject(cohort, column):
    return {k[-1]: v for k, v in cohort.subjects.set_index("subject_id")[column].items()}


def test_berkeley_6mm_table_by_date_with_qc_and_precedence(tables):
    cohort = build_cohort(*tables, config(), amyloid=EXAMPLE)
    truth, pu = per_subject(cohort, "truth"), per_subject(cohort, "pu_label")
    # RIDs in the table are resolved to PTIDs; FBP is florbetapir (AV45).
    m = cohort.manifest.set_index("subject_id")
    assert m.at["011_S_0001", "tracer"] == "AV45" and m.at["011_S_0001", "suvr"] == 1.00
    assert m.at["011_S_0001", "suvr_gap_days"] == 22                  # PET dated by SCANDATE
    assert m.at["011_S_0002", "tracer"] == "FBB" and m.at["011_S_0002", "centiloid"] == 36.7
    assert truth["1"] == 0 and truth["2"] == 1 and pu["2"] == 0     # a hidden positive
    assert per_subject(cohort, "hidden_positive")["2"] == 1
    # qc_flag 1 (partial pass) and -1 (not assessed) are left out and reported.
    assert pd.isna(truth["3"])
    qc = [i for i in cohort.quality if i.kind == "amyloid_qc_excluded"]
    assert sorted(i.count for i in qc) == [1, 1]
    assert any("partial pass" in i.message for i in qc)
    assert any("not assessed" in i.message for i in qc)
    # NAV has no SUVR cut-off under the paper preset: reported, not paired, not used.
    assert pd.isna(truth["4"]) and cohort.quality.count("tracer_without_cutoff") == 1
    assert pd.isna(m.at["011_S_0004", "tracer"])
    # ADNIMERGE's AV45 1.20 for 011_S_0005 gives way to the Berkeley table's 1.00.
    assert truth["5"] == 0 and pu["5"] == 0
    assert cohort.quality.count("clinical_amyloid_superseded") == 1
    # A PET scan 507 days from the MRI is outside the 365-day window.
    assert pd.isna(truth["6"]) and cohort.quality.count("amyloid_outside_window") == 1
    assert truth["7"] == 1 and truth["8"] == 1                       # 1.12, 1.10 >= 1.08
    # Berkeley's own status (florbetapir cut-off 1.11) differs for 1.10: reported, rule kept.
    differs = next(i for i in cohort.quality if i.kind == "amyloid_status_differs")
    assert differs.count == 1 and "011_S_0008" in differs.examples[0]
    assert pu["9"] == 1 and truth["9"] == 1                          # AD, no PET: by diagnosis

    pooled = build_cohort(*tables, config("amyloid.precedence=\"pooled\""), amyloid=EXAMPLE)
    assert per_subject(pooled, "truth")["5"] == 1                    # ADNIMERGE 1.20 counts
    loose = build_cohort(*tables, config("amyloid.qc_pass=[1, 2]"), amyloid=EXAMPLE)
    assert per_subject(loose, "truth")["3"] == 1                     # partial pass now used


def test_older_per_tracer_tables_tracer_from_file_name(tmp_path, tables):
    av45 = tmp_path / "UCBERKELEYAV45_01_14_21.csv"
    av45.write_text("RID,VISCODE,VISCODE2,EXAMDATE,SUMMARYSUVR_WHOLECEREBNORM,"
                    "SUMMARYSUVR_WHOLECEREBNORM_1.11CUTOFF\n"
                    "1,bl,bl,2010-01-05,1.30,1\n"
                    "5,bl,bl,1/15/2010,0.98,0\n")
    fbb = tmp_path / "UCBERKELEYFBB_04_26_22.csv"
    fbb.write_text("RID,VISCODE,VISCODE2,EXAMDATE,SUMMARYSUVR_WHOLECEREBNORM\n"
                   "2,bl,bl,2010-01-11,1.02\n")
    out = tmp_path / "cohort"
    result = runner.invoke(app, ["cohort", "build", str(tables[0]), str(tables[1]),
                                 str(out), "--amyloid", str(av45),
                                 "--amyloid", str(fbb), "--set", "check_scan_files=false"])
    assert result.exit_code == 0, result.output
    manifest = pd.read_csv(out / "manifest.csv", dtype={"subject_id": str}).set_index("subject_id")
    assert manifest.at["011_S_0001", "tracer"] == "AV45"
    assert manifest.at["011_S_0001", "suvr_gap_days"] == -5
    assert manifest.at["011_S_0002", "tracer"] == "FBB" and manifest.at["011_S_0002", "truth"] == 0
    assert manifest.at["011_S_0005", "suvr"] == 0.98                 # table before ADNIMERGE
    # Centiloids filled from the Berkeley conversion for AV45.
    assert manifest.at["011_S_0001", "centiloid"] == pytest.approx(188.22 * 1.30 - 189.16)
    # Both tables are recorded as inputs.
    assert (out / "cohort_report.md").read_text().count("- amyloid:") == 2


def test_same_scan_in_two_tables_is_kept_once(tmp_path):
    quality = QualityReport()
    a = pd.DataFrame({"PTID": ["011_S_0001"], "SCANDATE": ["2010-01-05"], "TRACER": ["FBP"],
                      "SUMMARY_SUVR": ["1.2"], "qc_flag": ["2"]})
    b = pd.DataFrame({"RID": ["1"], "EXAMDATE": ["2010-01-05"], "TRACER": ["AV45"],
                      "SUMMARYSUVR_WHOLECEREBNORM": ["1.25"]})
    from adni_pu.cohort.amyloid import load_amyloid_tables

    out = load_amyloid_tables([a, b.assign(RID=["011_S_0001"])], quality)
    assert len(out) == 1 and out["suvr"].iloc[0] == 1.2
    assert quality.count("duplicate_amyloid_measure") == 1


@pytest.mark.parametrize(("text", "name", "message"), [
    ("RID,TRACER,SUMMARY_SUVR\n1,FBP,1.1\n", "UCBERKELEY_AMY_6MM_01Jan2026.csv",
     r"missing column\(s\) date \(SCANDATE, EXAMDATE or date\).*columns found: \['RID', "),
    ("RID,SCANDATE,TRACER\n1,2010-01-01,FBP\n", "amy.csv", r"missing column\(s\) value"),
    ("RID,EXAMDATE,SUMMARYSUVR_WHOLECEREBNORM\n1,2010-01-01,1.1\n", "UCBERKELEYTAU_x.csv",
     "no TRACER column and the file name names no single tracer"),
    ("RID,SCANDATE,TRACER,SUMMARY_SUVR\n1,2010-01-01,FBP,high\n2,2010-01-01,FBP,low\n",
     "amy.csv", r"column SUMMARY_SUVR: expected numbers \(SUVRs\), found \['high', 'low'\]"),
    ("RID,SCANDATE,TRACER,SUMMARY_SUVR\n1,yesterday,FBP,1.1\n", "amy.csv",
     r"column SCANDATE: expected dates .* found \['yesterday'\]"),
    ("RID,SCANDATE,TRACER,SUMMARY_SUVR,qc_flag\n1,2010-01-01,FBP,1.1,0\n", "amy.csv",
     r"no usable amyloid measure \(amyloid_qc_excluded \(1\)\)"),
])
def test_malformed_tables_are_refused_naming_file_and_column(tmp_path, tables, text, name,
                                                            message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(CohortInputError, match=message) as info:
        build_cohort(*tables, config(), amyloid=path)
    assert f"amyloid ({name})" in str(info.value)
    out = tmp_path / "out"
    result = runner.invoke(app, ["cohort", "build", str(tables[0]), str(tables[1]),
                                 str(out), "--amyloid", str(path)])
    assert result.exit_code == 2 and result.output.startswith("error: ")
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


def test_tracer_names():
    assert [normalise_tracer(v) for v in ("FBP", "18F-AV45", "florbetaben", "PiB", "[11C]PIB",
                                          "NAV4694", "", "FMM")] == [
        "AV45", "AV45", "FBB", "PIB", "PIB", "NAV", None, "FMM"]


def test_centiloid_conversions_match_the_published_cut_offs():
    frame = pd.DataFrame({"tracer": ["AV45", "FBB", "PIB", "AV45"], "suvr": [1.11, 1.08, 1.4, 1.0],
                          "centiloid": [np.nan, np.nan, np.nan, 12.0]})
    cl = add_centiloids(frame, BERKELEY_CENTILOID)["centiloid"].tolist()
    assert cl[0] == pytest.approx(20, abs=0.5)          # florbetapir 1.11 ~ 20 CL
    assert cl[1] == pytest.approx(18, abs=0.5)          # florbetaben 1.08 ~ 18 CL
    assert np.isnan(cl[2])                              # no PIB conversion by default
    assert cl[3] == 12.0                                # a table's own Centiloid is kept
    slope, intercept = BERKELEY_CENTILOID["AV45"]
    assert round((20 - intercept) / slope, 2) == 1.11


def test_centiloid_preset(tables):
    cohort = build_cohort(*tables, config(preset="centiloid"), amyloid=EXAMPLE)
    truth, pu = per_subject(cohort, "truth"), per_subject(cohort, "pu_label")
    assert cohort.config.labels.scale == "centiloid"
    assert truth["2"] == 1 and truth["4"] == 1 and truth["7"] == 1   # 36.7, 41.0 (NAV), 21.6
    assert truth["8"] == 0 and pu["8"] == 0                          # 17.9 < 20 (SUVR 1.10)
    assert pu["7"] == 0 and pu["9"] == 1                             # labels: diagnosis only
    labelled = build_cohort(*tables, config("labels.centiloid_label_cutoff=20",
                                            preset="centiloid"), amyloid=EXAMPLE)
    assert per_subject(labelled, "label_reason")["7"] == "AV45 CL 21.6 >= 20"
    assert cohort.quality.count("tracer_without_cutoff") == 0
    assert cohort.quality.count("amyloid_status_differs") == 0       # 20 CL agrees here
    m = cohort.manifest.set_index("subject_id")
    assert m.at["011_S_0004", "subject_centiloid"] == 41.0
    # The threshold is a setting.
    strict = build_cohort(*tables, config("labels.centiloid_label_cutoff=40",
                                          "labels.centiloid_truth_cutoff=40",
                                          preset="centiloid"), amyloid=EXAMPLE)
    assert per_subject(strict, "truth")["2"] == 0 and per_subject(strict, "truth")["4"] == 1
    # A tracer left out of matching.tracer_priority is reported, not dropped silently.
    ranked = build_cohort(*tables, config('matching.tracer_priority=["AV45", "FBB"]',
                                          preset="centiloid"), amyloid=EXAMPLE)
    assert ranked.quality.count("tracer_not_in_priority") == 1
    assert pd.isna(per_subject(ranked, "truth")["4"])


def test_centiloid_preset_is_listed():
    result = runner.invoke(app, ["cohort", "presets"])
    assert result.exit_code == 0 and "centiloid" in result.output and "20 Centiloids" in result.output


def test_centiloid_report_and_saved_settings(tmp_path, tables):
    cohort = build_cohort(*tables, config(preset="centiloid"), amyloid=EXAMPLE)
    paths = write_cohort(cohort, tmp_path / "cohort")
    text = paths["report"].read_text()
    assert "an amyloid measure at or above 20 CL" in text
    assert "AV45: CL = 188.22 x SUVR -189.16" in text
    assert paths["histogram"].read_bytes()[:4] == b"\x89PNG"
    again = load_cohort_config(tmp_path / "cohort" / "cohort_config.toml")
    assert again.labels.scale == "centiloid" and again.amyloid == cohort.config.amyloid
    rebuilt = build_cohort(*tables, again, amyloid=EXAMPLE)
    pd.testing.assert_frame_equal(rebuilt.manifest, cohort.manifest)


def test_centiloid_preset_refuses_pib_without_conversion(tmp_path, tables):
    rows = clinical_rows()
    rows[1] = rows[1][:-3] + ",,,1.40"                    # 011_S_0001: PIB 1.40 only
    clinical = tmp_path / "pib.csv"
    clinical.write_text("\n".join(rows) + "\n")
    cohort = build_cohort(clinical, tables[1], config(preset="centiloid"))
    assert cohort.quality.count("no_centiloid_conversion") == 1
    assert pd.isna(per_subject(cohort, "truth")["1"])
    only_pib = tmp_path / "only_pib.csv"
    only_pib.write_text("\n".join(r.replace(",1.20,", ",,") for r in rows) + "\n")
    with pytest.raises(CohortInputError, match=r"no usable amyloid measure.*"
                                               r"no_centiloid_conversion \(1\)"):
        build_cohort(only_pib, tables[1], config(preset="centiloid"))
    # A cited conversion for the user's own PiB pipeline can be set.
    cfg = config("amyloid.centiloid_conversions.PIB=[93.7, -94.6]", preset="centiloid")
    assert per_subject(build_cohort(only_pib, tables[1], cfg), "truth")["1"] == 1
    with pytest.raises(ConfigError, match="centiloid_conversions.PIB"):
        config("amyloid.centiloid_conversions.PIB=[-1, 2]")
    with pytest.raises(ConfigError, match="unknown tracer"):
        config("amyloid.centiloid_conversions.FMM=[1, 2]")


def test_clinical_table_without_amyloid_is_refused(tmp_path, tables):
    clinical = tmp_path / "ADNIMERGE_noamyloid.csv"
    clinical.write_text("\n".join(clinical_rows(amyloid=False)) + "\n")
    with pytest.raises(CohortInputError) as info:
        build_cohort(clinical, tables[1], config())
    text = str(info.value)
    for part in ("ADNIMERGE_noamyloid.csv", "AV45, FBB or PIB", "--amyloid",
                 "labels.diagnosis_only=true", "preset paper"):
        assert part in text
    out = tmp_path / "out"
    args = ["cohort", "build", str(clinical), str(tables[1]), str(out),
            "--set", "check_scan_files=false"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "AV45, FBB or PIB" in result.output and not out.exists()
    # Said on purpose: labels by diagnosis alone, truth unknown.
    result = runner.invoke(app, [*args, "--set", "labels.diagnosis_only=true"])
    assert result.exit_code == 0, result.output
    subjects = pd.read_csv(out / "subjects.csv")
    # the AD subject is positive by its diagnosis; nobody else has a truth
    assert subjects.set_index("subject_id")["truth"].to_dict()["011_S_0009"] == 1
    assert subjects["truth"].isna().sum() == 8
    assert subjects.set_index("subject_id")["pu_label"].to_dict()["011_S_0009"] == 1
    assert subjects["pu_label"].sum() == 1
    # With the Berkeley table the same clinical table is fine.
    assert len(build_cohort(clinical, tables[1], config(), amyloid=EXAMPLE).manifest) == 9


def test_diagnosis_only_keeps_amyloid_for_the_truth(tables):
    cohort = build_cohort(*tables, config("labels.diagnosis_only=true"), amyloid=EXAMPLE)
    pu, truth = per_subject(cohort, "pu_label"), per_subject(cohort, "truth")
    assert pu["2"] == 0 and truth["2"] == 1                          # positive, not labelled
    assert pu["9"] == 1


def test_cli_out_is_a_file_and_build_prints_issues(tmp_path, tables):
    target = tmp_path / "taken"
    target.write_text("keep me\n")
    args = ["cohort", "build", str(tables[0]), str(tables[1]),
            "--amyloid", str(EXAMPLE)]
    result = runner.invoke(app, [*args, str(target)])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (f"error: output folder {target}: is a file; expected a folder "
                                     "(new or existing) for the cohort files")
    assert target.read_text() == "keep me\n"
    result = runner.invoke(app, [*args, str(target / "sub")])
    assert result.exit_code == 2 and "lies under" in result.output
    out = tmp_path / "cohort"
    for i in range(1, 9):  # s9.nii.gz is missing: left out, and said
        (tables[1].parent / f"s{i}.nii.gz").write_text(f"scan {i}")
    result = runner.invoke(app, [*args, str(out)])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "data-quality issue(s), most severe first:" in text
    assert "scan_file_missing: 1" in text and "(e.g. " in text      # the issue, not a count
    assert "s9.nii.gz" in (out / "excluded.csv").read_text()
    assert f"{out / 'quality.csv'}" in text
    assert f"next: read cohort_report.md, then adni-pu train {out / 'manifest.csv'}" \
        in text

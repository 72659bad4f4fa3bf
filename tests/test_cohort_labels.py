"""Label presets (paper, published-code, tracer-cutoffs, labels-equal-truth) and the
hidden-positive summary and warning, on a hand-made ADNIMERGE table."""

from __future__ import annotations

import pandas as pd
import pytest

from adni_pu.cohort import (
    CohortConfig,
    build_cohort,
    load_cohort_config,
    pu_summary,
    pu_task_lines,
    write_cohort,
)
from adni_pu.cohort.report import NO_HIDDEN_WARNING
from adni_pu.config import ConfigError

HEADER = "RID,PTID,VISCODE,EXAMDATE,DX_bl,DX,AGE,PTGENDER,AV45,FBB,PIB"
CLINICAL = [
    HEADER,
    # S1: CN, amyloid negative, two scanned visits
    "1,011_S_0001,bl,2010-01-10,CN,CN,70,Male,1.02,,",
    "1,011_S_0001,m06,2010-07-10,CN,CN,70,Male,,,",
    # S2: CN with AV45 1.10 (>= 1.08 paper, < 1.11 UCB, < 1.18 published)
    "2,011_S_0002,bl,2010-01-10,CN,CN,71,Female,1.10,,",
    # S3: AD, no PET
    "3,011_S_0003,bl,2010-01-10,AD,Dementia,72,Male,,,",
    # S4: LMCI with FBB 1.09
    "4,011_S_0004,bl,2010-01-10,LMCI,MCI,73,Female,,1.09,",
    # S5: CN converter: Dementia only at m24 (not scanned)
    "5,011_S_0005,bl,2010-01-10,CN,CN,74,Male,,,",
    "5,011_S_0005,m24,2012-01-10,CN,Dementia,74,Male,,,",
    # S6: CN with PIB 1.40 (>= 1.08, < 1.5)
    "6,011_S_0006,bl,2010-01-10,CN,CN,75,Female,,,1.40",
    # S7: CN with AV45 1.20 (>= 1.18)
    "7,011_S_0007,bl,2010-01-10,CN,CN,76,Male,1.20,,",
    # S8: EMCI with AV45 exactly 1.08
    "8,011_S_0008,bl,2010-01-10,EMCI,MCI,77,Female,1.08,,",
]
SCANS = ["subject,session,path"] + [f"sub-ADNI011S000{i},ses-M000,s{i}.nii.gz" for i in range(1, 9)]
SCANS.append("sub-ADNI011S0001,ses-M006,s1b.nii.gz")


@pytest.fixture
def tables(tmp_path):
    clinical = tmp_path / "ADNIMERGE.csv"
    clinical.write_text("\n".join(CLINICAL) + "\n")
    scans = tmp_path / "scans.csv"
    scans.write_text("\n".join(SCANS) + "\n")
    for row in SCANS[1:]:  # the scan files are there (a missing one is left out)
        (tmp_path / row.split(",")[2]).write_text(row)
    return clinical, scans


def per_subject(cohort, column):
    return cohort.subjects.set_index("subject_id")[column].to_dict()


def test_paper_preset(tables):
    """Labels: diagnosed patients only. Truth: the diagnosis, or SUVR >= 1.08. Everyone
    amyloid-positive without the diagnosis is a hidden positive in the unlabelled set."""
    cohort = build_cohort(*tables, load_cohort_config(preset="paper"))
    pu = per_subject(cohort, "pu_label")
    assert pu == {"011_S_0001": 0, "011_S_0002": 0, "011_S_0003": 1, "011_S_0004": 0,
                  "011_S_0005": 1, "011_S_0006": 0, "011_S_0007": 0, "011_S_0008": 0}
    truth = per_subject(cohort, "truth")
    # S3 (AD, no PET) and S5 (Dementia at m24, no PET) are positive by their diagnosis.
    assert truth == {"011_S_0001": 0, "011_S_0002": 1, "011_S_0003": 1, "011_S_0004": 1,
                     "011_S_0005": 1, "011_S_0006": 1, "011_S_0007": 1, "011_S_0008": 1}
    hidden = per_subject(cohort, "hidden_positive")
    assert {s for s, h in hidden.items() if h} == {
        "011_S_0002", "011_S_0004", "011_S_0006", "011_S_0007", "011_S_0008"}
    assert "Dementia (DX at m24)" in per_subject(cohort, "label_reason")["011_S_0005"]
    assert pd.isna(per_subject(cohort, "label_reason")["011_S_0007"])
    # Labels are per subject: every scan of a subject carries the same label and truth.
    m = cohort.manifest
    assert (m.groupby("subject_id")["pu_label"].nunique() == 1).all()
    assert set(m.loc[m["subject_id"] == "011_S_0001", "session_id"]) == {"bl", "m06"}
    summary = pu_summary(m)
    assert (summary["n_p"], summary["hidden_positive"], summary["truth_positive"]) == (2, 5, 7)
    assert summary["class_prior"] == 7 / 8 and summary["hidden_share"] == 5 / 7
    assert not any("WARNING" in line for line in pu_task_lines(m))


def test_truth_from_diagnosis_is_a_setting(tables):
    cfg = load_cohort_config(overrides=["labels.truth_from_diagnosis=false"])
    truth = per_subject(build_cohort(*tables, cfg), "truth")
    assert pd.isna(truth["011_S_0003"]) and pd.isna(truth["011_S_0005"])   # no PET
    assert truth["011_S_0002"] == 1 and truth["011_S_0001"] == 0


def test_labels_equal_truth_preset_warns_that_no_positive_is_hidden(tables, tmp_path, capsys):
    """The rule `paper` had before: every known positive labelled, so the labels equal the
    truth wherever it is known; the build output and the report say so loudly."""
    cohort = build_cohort(*tables, load_cohort_config(preset="labels-equal-truth"))
    pu, truth = per_subject(cohort, "pu_label"), per_subject(cohort, "truth")
    assert pu == {s: int(t) for s, t in truth.items()}
    assert sum(per_subject(cohort, "hidden_positive").values()) == 0
    lines = pu_task_lines(cohort.manifest)
    assert lines[0].startswith("n_p = 7 labelled positives of 8 subjects")
    assert "no unlabelled subject with a known truth is positive" in lines[1]
    paths = write_cohort(cohort, tmp_path / "out")
    assert NO_HIDDEN_WARNING in paths["report"].read_text()
    from typer.testing import CliRunner

    from adni_pu.cli.app import app

    clinical, scans = tables
    result = CliRunner().invoke(app, ["cohort", "build", str(clinical), str(scans),
                                      str(tmp_path / "cli"), "--preset", "labels-equal-truth",
                                      "--set", "check_scan_files=false"])
    assert result.exit_code == 0, result.output
    assert "WARNING: no unlabelled subject with a known truth is positive" in result.output
    assert "n_p = 7 labelled positives" in result.output
    paper = CliRunner().invoke(app, ["cohort", "build", str(clinical), str(scans),
                                     str(tmp_path / "cli-paper"), "--set",
                                     "check_scan_files=false"])
    assert paper.exit_code == 0, paper.output
    assert "5 hidden positives in the unlabelled set (71% of the positives)" in paper.output
    assert "WARNING: no unlabelled" not in paper.output


def test_paper_preset_scanned_visits_scope_ignores_unscanned_dementia(tables):
    cfg = load_cohort_config(overrides=['labels.diagnosis_scope="scanned-visits"'])
    assert per_subject(build_cohort(*tables, cfg), "pu_label")["011_S_0005"] == 0


def test_published_code_preset(tables):
    cohort = build_cohort(*tables, load_cohort_config(preset="published-code"))
    pu = per_subject(cohort, "pu_label")
    # MCI subjects (S4 LMCI, S8 EMCI) are left out, and listed with their reason.
    assert set(pu) == {"011_S_0001", "011_S_0002", "011_S_0003", "011_S_0005",
                       "011_S_0006", "011_S_0007"}
    assert cohort.excluded["reason"].str.contains("LMCI").any()
    assert cohort.excluded["reason"].str.contains("EMCI").any()
    assert cohort.quality.count("excluded_by_diagnosis") == 2
    assert pu["011_S_0007"] == 1          # 1.20 >= 1.18
    assert pu["011_S_0002"] == 0          # 1.10: hidden positive inside the unlabelled set
    hidden = per_subject(cohort, "hidden_positive")
    assert hidden == {"011_S_0001": 0, "011_S_0002": 1, "011_S_0003": 0, "011_S_0005": 0,
                      "011_S_0006": 0, "011_S_0007": 0}
    assert pu["011_S_0006"] == 1          # PIB 1.40 >= 1.18
    assert per_subject(cohort, "truth")["011_S_0002"] == 1   # truth at 1.08
    assert pu["011_S_0003"] == 1 and per_subject(cohort, "truth")["011_S_0003"] == 1   # AD


def test_tracer_cutoffs_preset(tables):
    cohort = build_cohort(*tables, load_cohort_config(preset="tracer-cutoffs"))
    pu, truth = per_subject(cohort, "pu_label"), per_subject(cohort, "truth")
    assert pu == {"011_S_0001": 0, "011_S_0002": 0, "011_S_0003": 1, "011_S_0004": 0,
                  "011_S_0005": 1, "011_S_0006": 0, "011_S_0007": 0, "011_S_0008": 0}
    assert truth["011_S_0002"] == 0                              # AV45 1.10 < 1.11
    assert truth["011_S_0004"] == 1                              # FBB 1.09 >= 1.08
    assert truth["011_S_0006"] == 0                              # PIB 1.40 < 1.5
    assert truth["011_S_0008"] == 0                              # AV45 1.08 < 1.11
    hidden = per_subject(cohort, "hidden_positive")
    assert {s for s, h in hidden.items() if h} == {"011_S_0004", "011_S_0007"}


def test_positive_diagnoses_is_a_setting(tables):
    cfg = load_cohort_config(overrides=['labels.positive_diagnoses=["MCI", "AD"]'])
    pu = per_subject(build_cohort(*tables, cfg), "pu_label")
    assert pu["011_S_0004"] == 1   # LMCI counts as MCI
    cfg = load_cohort_config(overrides=["labels.positive_diagnoses=[]"])
    assert per_subject(build_cohort(*tables, cfg), "pu_label")["011_S_0003"] == 0


def test_preset_precedence_and_bad_settings(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('preset = "published-code"\n[labels.label_cutoffs]\nAV45 = 1.25\n')
    cfg = load_cohort_config(path)
    assert cfg.preset == "published-code"
    assert cfg.labels.label_cutoffs == {"AV45": 1.25, "FBB": 1.18, "PIB": 1.18}
    assert cfg.labels.include_diagnoses == ["CN", "AD"]
    assert load_cohort_config(path, preset="paper").labels.include_diagnoses == []
    with pytest.raises(ConfigError, match="expected one of"):
        load_cohort_config(preset="nonsense")
    with pytest.raises(ConfigError, match="unknown tracer"):
        load_cohort_config(overrides=["labels.truth_cutoffs.XYZ=1.2"])
    with pytest.raises(ConfigError, match="expected at or above labels.truth_cutoffs.AV45"):
        load_cohort_config(overrides=["labels.label_cutoffs.AV45=1.05"])
    with pytest.raises(ConfigError, match="unknown setting"):
        load_cohort_config(overrides=["labels.hidden_positive_cutoffs.AV45=1.05"])
    assert CohortConfig().labels.label_cutoffs == {}
    assert not CohortConfig().labels.amyloid_labels()

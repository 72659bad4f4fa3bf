"""Cohort building: clinical tables + scan table -> PU labels, subject-level splits, manifest.

Library first; the CLI (``adni-pu cohort build|report``) only calls these::

    from adni_pu.cohort import build_cohort, load_cohort_config, write_cohort
    cohort = build_cohort("ADNIMERGE.csv", "prep/summary.csv", load_cohort_config(preset="paper"))
    cohort.manifest.head(); cohort.quality.to_frame()
    write_cohort(cohort, "cohort/")

See docs/cohort.md for the inputs, the presets and settings, and the manifest schema.
"""

from adni_pu.cohort.amyloid import load_amyloid_tables, read_amyloid_table
from adni_pu.cohort.config import (
    LABEL_PRESETS,
    PRESET_DESCRIPTIONS,
    AmyloidSettings,
    CohortConfig,
    LabelSettings,
    MatchingSettings,
    SplitSettings,
    load_cohort_config,
)
from adni_pu.cohort.files import read_manifest, report_from_path, write_cohort, write_manifest
from adni_pu.cohort.ids import SubjectIdWarning, normalise_subject_id
from adni_pu.cohort.leakage import check_manifest_leakage
from adni_pu.cohort.manifest import MANIFEST_COLUMNS, Cohort, build_cohort
from adni_pu.cohort.quality import CohortInputError, Issue, QualityReport
from adni_pu.cohort.report import (
    class_prior_table,
    counts_table,
    pu_summary,
    pu_task_lines,
    render_report,
)
from adni_pu.cohort.splits import (
    LeakageError,
    assert_manifest_no_leakage,
    assert_no_leakage,
    assign_splits,
    check_manifest_splits,
    kfold,
)
from adni_pu.cohort.suvr import CORTICAL_COMPOSITE, SuvrError, compute_suvr, suvr_table
from adni_pu.cohort.values import normalise_diagnosis, normalise_visit

__all__ = [
    "pu_summary",
    "pu_task_lines",
    "AmyloidSettings", "CORTICAL_COMPOSITE", "MANIFEST_COLUMNS", "LABEL_PRESETS",
    "PRESET_DESCRIPTIONS", "Cohort", "CohortConfig", "CohortInputError", "Issue",
    "LabelSettings", "LeakageError", "MatchingSettings", "QualityReport", "SplitSettings",
    "SubjectIdWarning", "SuvrError", "assert_manifest_no_leakage", "assert_no_leakage", "assign_splits",
    "build_cohort", "check_manifest_leakage", "check_manifest_splits", "class_prior_table",
    "compute_suvr", "counts_table", "kfold", "load_amyloid_tables", "load_cohort_config",
    "normalise_diagnosis", "normalise_subject_id", "normalise_visit", "read_amyloid_table",
    "read_manifest", "render_report", "report_from_path", "suvr_table", "write_cohort",
    "write_manifest",
]

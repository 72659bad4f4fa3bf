"""Build a cohort (clinical tables + scan table -> labelled, split manifest).

:func:`build_cohort` does all the work in memory and raises
:class:`~adni_pu.cohort.quality.CohortInputError` when the input cannot be used;
:func:`~adni_pu.cohort.files.write_cohort` then writes every file atomically (temporary
name, then rename), so a failed build leaves nothing behind.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from adni_pu.cohort.amyloid import (
    add_centiloids,
    combine_measures,
    compare_status,
    load_amyloid_tables,
    on_scale,
)
from adni_pu.cohort.amyloid_rules import MeasureRule
from adni_pu.cohort.config import CohortConfig, positive_class_text
from adni_pu.cohort.ids import is_rid, usable_id
from adni_pu.cohort.labels import label_subjects
from adni_pu.cohort.leakage import check_manifest_leakage
from adni_pu.cohort.matching import attach_visits, clinical_measures, match_amyloid, match_visits
from adni_pu.cohort.quality import QualityReport
from adni_pu.cohort.splits import assign_splits
from adni_pu.cohort.tables import apply, load_clinical, load_scans
from adni_pu.cohort.values import _missing
from adni_pu.errors import CohortInputError
from adni_pu.fileio import sha256_file

#: Manifest columns, in order (docs/cohort.md describes each).
MANIFEST_COLUMNS: tuple[str, ...] = (
    "subject_id", "session_id", "scan_id", "scan_path", "pu_label", "truth", "split", "fold",
    "hidden_positive", "dx", "dx_bl", "label_reason", "suvr", "tracer", "suvr_date",
    "suvr_gap_days", "subject_suvr", "subject_tracer", "visit", "visit_match",
    "visit_gap_days", "age", "sex", "examdate", "scan_date", "centiloid", "subject_centiloid",
)
EXCLUDED_COLUMNS: tuple[str, ...] = ("line", "subject", "session", "scan_path", "reason")


@dataclass
class Cohort:
    """A built cohort: per-scan manifest, per-subject table, exclusions and quality issues."""

    manifest: pd.DataFrame
    subjects: pd.DataFrame
    excluded: pd.DataFrame
    quality: QualityReport
    config: CohortConfig
    summary: dict[str, Any] = field(default_factory=dict)
    scan_base: Path | None = None

    def __repr__(self) -> str:
        return (f"Cohort({len(self.manifest)} scans, {self.manifest['subject_id'].nunique()} "
                f"subjects, {len(self.excluded)} excluded scans, {len(self.quality)} issues)")


def _examples(frame: pd.DataFrame, n: int = 5) -> list[str]:
    return [f"line {r}: {s} {v}" for r, s, v in
            zip(frame["_row"][:n], frame["subject_raw"][:n], frame["session_raw"][:n])]



def _describe_input(source: Any) -> dict[str, Any]:
    if isinstance(source, (str, Path)):
        path = Path(source)
        return {"path": str(path.resolve()), "sha256": sha256_file(path)}
    return {"path": None, "note": "in-memory DataFrame"}


AmyloidSource = str | Path | pd.DataFrame


def build_cohort(
    clinical: str | Path | pd.DataFrame,
    scans: str | Path | pd.DataFrame,
    config: CohortConfig | None = None,
    amyloid: AmyloidSource | list[AmyloidSource] | tuple[AmyloidSource, ...] | None = None,
    qc_ratings: str | Path | None = None,
) -> Cohort:
    """Turn a clinical table and a scan table into a labelled, split cohort.

    ``clinical``: ADNIMERGE(_<date>).csv or a generic table (see
    ``config.clinical_columns``); ``scans``: the preprocessing ``summary.csv`` or a generic
    ``subject, session, path[, date]`` table; ``amyloid``: one or several amyloid tables
    (UC Berkeley ``UCBERKELEY_AMY_6MM_<date>.csv``, the older per-tracer
    ``UCBERKELEYAV45/FBB_<date>.csv``, or ``subject, date, tracer, suvr``; see
    :mod:`adni_pu.cohort.amyloid`); ``qc_ratings``: a visual QC ``qc_ratings.tsv`` whose
    scans rated fail are left out (:mod:`adni_pu.cohort.qc_ratings`). Raises
    ``CohortInputError`` when the input cannot be used; everything else that is wrong is
    recorded in ``Cohort.quality``.
    """
    cfg = config or CohortConfig()
    if amyloid is None:
        amyloid_sources: list[AmyloidSource] = []
    elif isinstance(amyloid, (list, tuple)):
        amyloid_sources = list(amyloid)
    else:
        amyloid_sources = [amyloid]
    quality = QualityReport()
    visits, used_clin, clin_name = load_clinical(clinical, cfg.clinical_columns, quality)
    scan_table, used_scan, scan_name = load_scans(scans, cfg.scan_columns, quality)
    scan_base = Path(scans).parent.resolve() if isinstance(scans, (str, Path)) else Path.cwd()
    stable = f"scans ({scan_name})"
    if visits.empty:
        raise CohortInputError(f"clinical table {clin_name}: no usable rows "
                               f"(see the data-quality issues: {[i.kind for i in quality]})")

    # Scan subjects given as RIDs take the PTID the clinical table gives that RID.
    rid_map = {r: s for r, s in zip(visits["rid"], visits["subject_id"])
               if r is not None and not pd.isna(r) and s and not is_rid(s)}
    scan_table["subject_id"] = [rid_map.get(s, s) if is_rid(s) else s
                                for s in scan_table["subject_id"]]

    excluded: list[pd.DataFrame] = []

    def exclude(mask: pd.Series, kind: str, message: str, reason: str | pd.Series,
                severity: str = "warning") -> None:
        nonlocal scan_table
        if not mask.any():
            return
        rows = scan_table.loc[mask]
        quality.add(kind, stable, int(mask.sum()), message, "scan left out of the manifest",
                    _examples(rows), severity=severity)  # type: ignore[arg-type]
        excluded.append(pd.DataFrame({
            "line": rows["_row"], "subject": rows["subject_raw"], "session": rows["session_raw"],
            "scan_path": rows["scan_path"],
            "reason": reason if isinstance(reason, str) else reason.loc[rows.index]}))
        scan_table = scan_table.loc[~mask]

    if used_scan["status"]:
        usable = set(s.lower() for s in cfg.matching.usable_statuses)
        status = scan_table["status"]
        bad = status.notna() & ~status.isin(usable)
        reasons = status.where(bad)
        for value in sorted(set(reasons.dropna())):
            exclude(status == value, "scan_not_usable",
                    f"scans with status {value!r} (usable: {sorted(usable)})",
                    f"status {value}", severity="info")
    rated = None
    if qc_ratings is not None:  # a person's verdict, beside the automatic one
        from adni_pu.cohort.qc_ratings import apply_qc_ratings

        rated = apply_qc_ratings(scan_table, qc_ratings, scan_base, exclude, quality, stable)
    exclude(scan_table["subject_id"].isna(), "scan_without_subject",
            "scans with no subject id", "no subject id")
    # ids become file names (scan_id): a path such as ../../x is left out, and said
    for column, what, allowed in (
            ("subject_id", "subject id", "letters, digits, '_', '-' and '.', not starting with "
             "'.' or '-'; an ADNI PTID is NNN_S_NNNN"),
            ("session_id", "session", "no path separator, no leading '.'")):
        odd = ~scan_table[column].map(lambda v, strict=column == "subject_id": usable_id(
            None if _missing(v) else v, strict))
        exclude(odd.astype(bool), "scan_unusable_id",
                f"scans whose {what} is not an id (expected {allowed})",
                f"{what} is not an id (a path or odd characters)", severity="error")
    missing_path = apply(scan_table["scan_path"], _missing).astype(bool)
    exclude(missing_path, "scan_without_path", "scans with no file path", "no scan path")
    known = set(visits["subject_id"])
    exclude(~scan_table["subject_id"].isin(known), "scan_without_subject",
            "scans whose subject is not in the clinical table", "subject not in clinical table")
    exclude(scan_table["session_id"].isna() & scan_table["scan_date"].isna(),
            "scan_without_visit", "scans with neither a session/visit code nor a date",
            "no session or date")
    if cfg.check_scan_files:  # a manifest never lists a file that is not there
        def exists(p: str) -> bool:
            path = Path(p)
            return (path if path.is_absolute() else scan_base / path).exists()
        exclude(~scan_table["scan_path"].map(exists).astype(bool), "scan_file_missing",
                "scan files that do not exist (relative paths read from the scan table's "
                "folder; a folder converted or moved since?)", "scan file missing",
                severity="error")
    if scan_table.empty:
        reasons = ", ".join(f"{i.kind} ({i.count})" for i in quality if i.table == stable)
        raise CohortInputError(f"{scan_name}: no usable scans left ({reasons or 'no rows'}); "
                               "nothing written")

    # Several scans of one visit are legitimate (repeat acquisitions); keep and name them.
    scan_table = scan_table.copy()
    key = scan_table["subject_id"] + "|" + scan_table["session_id"].fillna(
        scan_table["scan_date"].dt.strftime("%Y-%m-%d")).fillna("?")
    run = scan_table.groupby(key, sort=False).cumcount() + 1
    repeats = scan_table.loc[key.duplicated(keep=False)]
    if len(repeats):
        quality.add("several_scans_per_visit", stable, int(key.duplicated().sum()),
                    "more than one scan for one subject and visit",
                    "all kept (scan_id gets _run-N); they share the subject's split",
                    _examples(repeats), severity="info")
    session_text = scan_table["session_id"].fillna(
        "date" + scan_table["scan_date"].dt.strftime("%Y%m%d")).fillna("unknown")
    scan_table["scan_id"] = ("sub-" + scan_table["subject_id"] + "_ses-" + session_text
                             + np.where(run > 1, "_run-" + run.astype(str), ""))

    # Visits.
    scan_table = match_visits(scan_table, visits, cfg.matching)
    none = scan_table["visit_match"] == "none"
    quality.add("scan_without_visit", stable, int(none.sum()),
                "scans whose visit code (and date) match no clinical visit of the subject",
                "kept without a visit diagnosis or exam date; labels still use the subject's "
                "other records", _examples(scan_table.loc[none]))
    via = scan_table["visit_match"].str.startswith("alias") | (scan_table["visit_match"] == "date")
    quality.add("visit_matched_indirectly", stable, int(via.sum()),
                "scans paired with a clinical visit through a code alias or by date",
                "kept; see the visit_match and visit_gap_days columns",
                [f"{s} {v} -> {m}" for s, v, m in zip(scan_table.loc[via, "subject_id"],
                                                      scan_table.loc[via, "session_raw"],
                                                      scan_table.loc[via, "visit_match"])],
                severity="info")
    scan_table = attach_visits(scan_table, visits)

    # Amyloid.
    measures = clinical_measures(visits)
    undated = measures["date"].isna()
    quality.add("amyloid_without_date", f"clinical ({clin_name})", int(undated.sum()),
                "amyloid measures at visits without an exam date",
                "cannot be paired in time; not used",
                [f"{s} {v} {t}" for s, v, t in zip(measures.loc[undated, "subject_id"],
                                                    measures.loc[undated, "visit"],
                                                    measures.loc[undated, "tracer"])])
    measures = measures.loc[~undated].drop(columns="visit")
    rule = MeasureRule(cfg.labels, cfg.amyloid.centiloid_conversions,
                       tuple(cfg.matching.tracer_priority), cfg.preset)
    tables = load_amyloid_tables(amyloid_sources, quality, cfg.amyloid, rule, rid_map)
    measures = combine_measures(measures, tables, cfg.amyloid, quality, f"clinical ({clin_name})",
                                rule.usable(tables))
    measures = on_scale(add_centiloids(measures, cfg.amyloid.centiloid_conversions), cfg.labels,
                        quality)
    compare_status(measures, cfg.labels, quality)
    unranked = ~measures["tracer"].isin(cfg.matching.tracer_priority)
    quality.add("tracer_not_in_priority", "amyloid", int(unranked.sum()),
                f"measures of tracers missing from matching.tracer_priority "
                f"{cfg.matching.tracer_priority}", "not paired with any scan",
                [f"{s} {t}" for s, t in zip(measures.loc[unranked, "subject_id"],
                                            measures.loc[unranked, "tracer"])])
    measures = measures.loc[~unranked]
    if measures.empty and not cfg.labels.diagnosis_only:
        raise CohortInputError(_no_amyloid_message(clin_name, used_clin, amyloid_sources, cfg,
                                                   quality))
    scan_table, outside = match_amyloid(scan_table, measures, cfg.matching)
    no_date = scan_table["scan_date"].isna()
    quality.add("scan_without_date", stable, int(no_date.sum()),
                "scans with no date of their own and no matched visit date",
                "no amyloid measure can be paired with them", _examples(scan_table.loc[no_date]))
    far = outside.notna()
    quality.add("amyloid_outside_window", stable, int(far.sum()),
                f"scans whose nearest amyloid measure is more than "
                f"{cfg.matching.amyloid_window_days} days away",
                "no measure paired with the scan (matching.amyloid_window_days)",
                [f"{s} {v}: {int(d)} days" for s, v, d in zip(
                    scan_table.loc[far, "subject_id"], scan_table.loc[far, "session_id"],
                    outside[far])], severity="info")

    # Subjects without scans are reported, not labelled.
    scanned = list(dict.fromkeys(scan_table["subject_id"]))
    unscanned = sorted(known - set(scanned))
    quality.add("subject_without_scan", f"clinical ({clin_name})", len(unscanned),
                "subjects in the clinical table with no usable scan",
                "not in the manifest (nothing to train or test on)", unscanned, severity="info")

    subjects = label_subjects(scanned, visits, scan_table, measures, cfg.labels, quality)
    out_subjects = subjects.loc[~subjects["included"]]
    if len(out_subjects):
        mask = scan_table["subject_id"].isin(set(out_subjects["subject_id"]))
        reason_of = dict(zip(out_subjects["subject_id"], out_subjects["exclusion"]))
        rows = scan_table.loc[mask]
        quality.add("excluded_by_diagnosis", "labels", len(out_subjects),
                    f"subjects whose baseline diagnosis is not in include_diagnoses "
                    f"{cfg.labels.include_diagnoses} (preset {cfg.preset})",
                    "their scans are left out of the manifest",
                    [f"{s}: {reason_of[s]}" for s in out_subjects["subject_id"]], severity="info")
        excluded.append(pd.DataFrame({
            "line": rows["_row"], "subject": rows["subject_raw"], "session": rows["session_raw"],
            "scan_path": rows["scan_path"],
            "reason": rows["subject_id"].map(reason_of)}))
        scan_table = scan_table.loc[~mask]
    included = subjects.loc[subjects["included"]].reset_index(drop=True)
    if included.empty:
        raise CohortInputError(
            "no subject left after include_diagnoses "
            f"{cfg.labels.include_diagnoses}; nothing written")

    included = assign_splits(included, cfg.split)
    manifest = _assemble(scan_table, included)
    if cfg.output.scan_paths != "as-given":
        manifest["scan_path"] = [_absolute(p, scan_base) for p in manifest["scan_path"]]
    check_manifest_leakage(manifest, scan_base)  # a scan file under two subjects, too

    excluded_frame = (pd.concat(excluded, ignore_index=True) if excluded
                      else pd.DataFrame(columns=list(EXCLUDED_COLUMNS)))
    summary = {
        "inputs": {"clinical": _describe_input(clinical), "scans": _describe_input(scans),
                   "amyloid": [_describe_input(a) for a in amyloid_sources] or None},
        "columns": {"clinical": used_clin, "scans": used_scan},
        "n_scans": int(len(manifest)), "n_subjects": int(manifest["subject_id"].nunique()),
        "n_excluded_scans": int(len(excluded_frame)),
        "positive_class": positive_class_text(cfg.labels),
    }
    if rated is not None:
        summary["inputs"]["qc_ratings"] = _describe_input(qc_ratings)
        summary["qc_ratings"] = rated
    return Cohort(manifest, included, excluded_frame, quality, cfg, summary, scan_base)


def _no_amyloid_message(clin_name: str, used: dict[str, str | None], sources: list,
                        cfg: CohortConfig, quality: QualityReport) -> str:
    """Why a cohort with no usable amyloid measure is refused, and the ways out."""
    scale = "Centiloids" if cfg.labels.scale == "centiloid" else "amyloid SUVR"
    what = "labels and sets the truth" if cfg.labels.amyloid_labels() else "sets the truth"
    left = ("known only where a positive diagnosis decides it, so no hidden positive can be "
            "found" if cfg.labels.truth_from_diagnosis else "unknown for every subject")
    need = (f"preset {cfg.preset} {what} by {scale}; give the UC Berkeley amyloid table "
            "with --amyloid, or set labels.diagnosis_only=true to label by diagnosis alone "
            f"(truth then {left})")
    columns = [used.get(t) for t in ("av45", "fbb", "pib")]
    if not sources and not any(columns):
        return (f"clinical table {clin_name}: no amyloid column (expected AV45, FBB or PIB, "
                "or clinical_columns.av45/fbb/pib) and no --amyloid table; " + need)
    issues = ", ".join(f"{i.kind} ({i.count})" for i in quality
                       if i.kind in {"no_centiloid_conversion", "amyloid_without_suvr",
                                     "amyloid_without_date", "implausible_suvr",
                                     "unparseable_number", "clinical_amyloid_superseded",
                                     "unparseable_date", "conflicting_amyloid_measure"})
    where = ", ".join([f"{c} in {clin_name}" for c in columns if c]
                      + [getattr(s, "name", "DataFrame") for s in sources])
    return (f"no usable amyloid measure in {where}" + (f" ({issues})" if issues else "")
            + "; " + need)


def _assemble(scans: pd.DataFrame, subjects: pd.DataFrame) -> pd.DataFrame:
    per_subject = subjects[["subject_id", "pu_label", "truth", "split", "fold", "hidden_positive",
                            "dx_bl", "label_reason", "amyloid_suvr", "amyloid_tracer",
                            "amyloid_centiloid"]].rename(
        columns={"amyloid_suvr": "subject_suvr", "amyloid_tracer": "subject_tracer",
                 "amyloid_centiloid": "subject_centiloid"})
    frame = scans.merge(per_subject, on="subject_id", how="inner", validate="many_to_one")
    frame = frame.sort_values(["split", "subject_id", "scan_date", "scan_id"],
                              na_position="last", kind="stable")
    return frame[list(MANIFEST_COLUMNS)].reset_index(drop=True)


def _absolute(path: str, base: Path) -> str:
    p = Path(path)
    return os.path.normpath(p if p.is_absolute() else base / p)

"""Reading clinical and scan tables into one normalised shape.

ADNIMERGE exports (``ADNIMERGE.csv``, ``ADNIMERGE_<date>.csv``) are read by their own
column names; any other table is read through a column mapping (see
:class:`~adni_pu.cohort.config.ClinicalColumns`). Subject ids (:mod:`adni_pu.cohort.ids`),
visit codes, dates, diagnoses and numbers (:mod:`adni_pu.cohort.values`) are normalised
as they are read, and everything that had to be changed or could not be read is recorded
in the :class:`~adni_pu.cohort.quality.QualityReport`.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from adni_pu.cohort.config import TRACERS, ClinicalColumns, ScanColumns
from adni_pu.cohort.ids import is_rid, normalise_subject_id
from adni_pu.cohort.quality import CohortInputError, QualityReport
from adni_pu.cohort.values import (
    _TWO_DIGIT_YEAR,
    DATE_FORMATS,
    _missing,
    date_problem,
    normalise_diagnosis,
    normalise_sex,
    normalise_visit,
    parse_dates,
    parse_numbers,
)

# --------------------------------------------------------------------------- dates


def read_dates(raw: pd.DataFrame, column: str, table: str, quality: QualityReport,
               action: str, remedy: str = "") -> pd.Series:
    """Dates of one column; unreadable ones are reported, and a column with dates but not
    one readable is refused (:class:`CohortInputError` naming the table, the column, the
    formats read and what was found), with ``remedy`` appended."""
    dates, bad = parse_dates(raw[column])
    if bad.any() and not dates.notna().any():
        raise CohortInputError(f"{table}: column {column}: {date_problem(raw.loc[bad, column])}"
                               + (f"; {remedy}" if remedy else ""))
    if bad.any():
        rows = raw.loc[bad]
        two_digit = sum(bool(_TWO_DIGIT_YEAR.match(str(v).strip())) for v in rows[column])
        what = "dates that could not be read (expected " + DATE_FORMATS + (
            f"; {two_digit} have two-digit years" if two_digit else "") + ")"
        _report_bad(quality, "unparseable_date", table, raw, bad, column, what, action)
    return dates


# --------------------------------------------------------------------------- reading


def apply(series: pd.Series, fn: Any) -> pd.Series:
    """``fn`` on every value, kept as Python objects (``None`` stays ``None``, not NaN)."""
    return pd.Series([fn(v) for v in series], index=series.index, dtype=object)


def _clean(series: pd.Series) -> pd.Series:
    """Text stripped, empty text and NaN as ``None``, as an object column."""
    values = series.astype(object)
    texts = pd.Series([isinstance(v, str) for v in values], index=values.index, dtype=bool)
    if texts.any():
        values = values.copy()
        values[texts] = values[texts].astype(str).str.strip().astype(object)
    missing = values.isna() | (texts & (values.astype(str) == ""))
    return values.where(~missing, None).astype(object)


def read_table(source: str | Path | pd.DataFrame, what: str) -> tuple[pd.DataFrame, str]:
    """A table as text columns (CSV, TSV or Parquet file, or a DataFrame) and its name.

    Everything is read as text so that unreadable numbers and dates can be reported
    instead of silently becoming missing.
    """
    if isinstance(source, pd.DataFrame):
        frame = source.copy()
        name = f"{what} table"
    else:
        path = Path(source)
        name = path.name
        if not path.is_file():
            raise CohortInputError(f"{what} table {path}: file not found")
        try:
            if path.suffix.lower() in {".parquet", ".pq"}:
                frame = pd.read_parquet(path)
            else:
                sep = "\t" if path.suffix.lower() in {".tsv", ".tab"} else ","
                frame = pd.read_csv(path, sep=sep, dtype=str, keep_default_na=True,
                                    skipinitialspace=True, low_memory=False)
        except Exception as exc:  # noqa: BLE001 - any reader failure is a bad input
            raise CohortInputError(f"{what} table {path}: cannot read ({exc})") from exc
    frame.columns = [str(c).strip() for c in frame.columns]
    for col in frame.columns:
        frame[col] = _clean(frame[col])
    if frame.empty:
        raise CohortInputError(f"{what} table {name}: no rows (columns found: {list(frame.columns)})")
    frame.insert(0, "_row", np.arange(2, len(frame) + 2))  # line number in a CSV file
    return frame, name


_CLINICAL_CANDIDATES: dict[str, tuple[str, ...]] = {
    "subject": ("PTID", "subject_id", "participant_id", "subject"),
    "rid": ("RID",),
    "visit": ("VISCODE", "VISCODE2", "session_id", "visit", "session", "visit_code"),
    "date": ("EXAMDATE", "exam_date", "visit_date", "date"),
    "dx": ("DX", "diagnosis", "dx"),
    "dx_bl": ("DX_bl", "diagnosis_bl", "dx_baseline"),
    "age": ("AGE", "age"),
    "sex": ("PTGENDER", "sex", "gender"),
    "av45": ("AV45", "suvr_av45"),
    "fbb": ("FBB", "suvr_fbb"),
    "pib": ("PIB", "suvr_pib"),
}

_SCAN_CANDIDATES: dict[str, tuple[str, ...]] = {
    "subject": ("subject_id", "subject", "participant_id", "PTID"),
    "session": ("session_id", "session", "visit", "VISCODE", "visit_code"),
    "path": ("preprocessed_path", "scan_path", "path", "filename", "image_path"),
    "date": ("scan_date", "acq_date", "acquisition_date", "date", "EXAMDATE"),
    "status": ("status",),
}


def resolve_columns(
    frame: pd.DataFrame,
    settings: Any,
    candidates: dict[str, tuple[str, ...]],
    required: list[tuple[str, ...]],
    table: str,
    settings_name: str,
) -> dict[str, str | None]:
    """Map each field of ``settings`` to a column of ``frame`` (or ``None``).

    A set name must exist; ``""`` searches ``candidates`` (case-insensitive); ``"-"``
    means absent. ``required`` lists groups of fields of which at least one must be
    found; otherwise :class:`CohortInputError` names what was expected and what was found.
    """
    present = [c for c in frame.columns if c != "_row"]
    lower = {c.lower(): c for c in present}
    out: dict[str, str | None] = {}
    wrong: list[str] = []
    for f in fields(settings):
        name = getattr(settings, f.name)
        if name == "-":
            out[f.name] = None
        elif name:
            if name in present:
                out[f.name] = name
            elif name.lower() in lower:
                out[f.name] = lower[name.lower()]
            else:
                wrong.append(f"{settings_name}.{f.name} = {name!r}")
                out[f.name] = None
        else:
            out[f.name] = next((lower[c.lower()] for c in candidates[f.name]
                                if c.lower() in lower), None)
    missing = []
    for group in required:
        if not any(out.get(g) for g in group):
            names = " or ".join(
                f"{g} ({'/'.join(candidates[g])})" if not getattr(settings, g) else
                f"{g} ({getattr(settings, g)})" for g in group)
            missing.append(names)
    if wrong or missing:
        parts = []
        if wrong:
            parts.append("configured column(s) not found: " + ", ".join(wrong))
        if missing:
            parts.append("missing required column(s): " + "; ".join(missing))
        raise CohortInputError(
            f"{table}: " + "; ".join(parts) + f". Columns found: {present}. "
            f"Set the names with --set {settings_name}.<field>=\"<column>\"."
        )
    return out


def _report_bad(quality: QualityReport, kind: str, table: str, frame: pd.DataFrame,
                bad: pd.Series, column: str, what: str, action: str) -> None:
    if bad.any():
        rows = frame.loc[bad]
        examples = [f"line {r}: {column}={v!r}" for r, v in zip(rows["_row"], rows[column])]
        quality.add(kind, table, int(bad.sum()), f"{what} in column {column}", action, examples)


def _drop_exact_duplicates(frame: pd.DataFrame, table: str, quality: QualityReport) -> pd.DataFrame:
    data_cols = [c for c in frame.columns if c != "_row"]
    dup = frame.duplicated(subset=data_cols, keep="first")
    if dup.any():
        rows = frame.loc[dup, "_row"].tolist()
        quality.add("duplicate_rows", table, int(dup.sum()),
                    "rows identical to an earlier row", "kept the first copy only",
                    [f"line {r}" for r in rows])
    return frame.loc[~dup]


def _text(frame: pd.DataFrame, column: str | None) -> pd.Series:
    if column is None:
        return pd.Series([None] * len(frame), index=frame.index, dtype=object)
    return frame[column]


def load_clinical(
    source: str | Path | pd.DataFrame,
    columns: ClinicalColumns,
    quality: QualityReport,
) -> tuple[pd.DataFrame, dict[str, str | None], str]:
    """Normalised clinical visits, one row per (subject, visit), the columns used, the name.

    Output columns: ``subject_id, rid, visit, examdate, dx, dx_raw, dx_bl, dx_bl_raw, age,
    sex, AV45, FBB, PIB, _row``. Exact duplicate rows are dropped once; several rows for
    one visit are merged (first value per column), a visit with two different diagnoses
    gets no diagnosis; all of it is reported.
    """
    raw, name = read_table(source, "clinical")
    table = f"clinical ({name})"
    used = resolve_columns(raw, columns, _CLINICAL_CANDIDATES,
                           [("subject", "rid"), ("visit", "date"),
                            ("dx", "dx_bl", "av45", "fbb", "pib")], table, "clinical_columns")
    raw = _drop_exact_duplicates(raw, table, quality)

    out = pd.DataFrame({"_row": raw["_row"]}, index=raw.index)
    subj = apply(_text(raw, used["subject"]), normalise_subject_id)
    rid = apply(_text(raw, used["rid"]), normalise_subject_id)
    rid = apply(rid, lambda v: v if is_rid(v) else None)
    # RID -> PTID from the rows that carry both; rows with only a RID borrow it.
    rid_map: dict[str, str] = {}
    for r, s in zip(rid, subj):
        if r and s and not is_rid(s):
            rid_map.setdefault(r, s)
    subj = [s if (s and not is_rid(s)) else rid_map.get(r or s or "", s or r)
            for s, r in zip(subj, rid)]
    out["subject_id"] = pd.Series(subj, index=raw.index, dtype=object)
    out["rid"] = rid
    no_subject = out["subject_id"].isna()
    if no_subject.any():
        quality.add("row_without_subject", table, int(no_subject.sum()),
                    "rows with no subject id", "left out",
                    [f"line {r}" for r in out.loc[no_subject, "_row"]])

    out["visit"] = apply(_text(raw, used["visit"]), normalise_visit)
    if used["date"]:
        out["examdate"] = read_dates(raw, used["date"], table, quality, "treated as missing",
                                     'or set clinical_columns.date="-" to match by visit '
                                     "code only (clinical amyloid values then have no date)")
    else:
        out["examdate"] = pd.Series(pd.NaT, index=raw.index, dtype="datetime64[ns]")
    no_key = out["visit"].isna() & out["examdate"].isna() & ~no_subject
    if no_key.any():
        quality.add("row_without_visit", table, int(no_key.sum()),
                    "rows with neither a visit code nor a date", "left out",
                    [f"line {r}" for r in out.loc[no_key, "_row"]])

    for field_name, col in (("dx", "dx"), ("dx_bl", "dx_bl")):
        rawdx = _text(raw, used[field_name])
        normalised, unknown = [], []
        for value, row in zip(rawdx, raw["_row"]):
            try:
                normalised.append(normalise_diagnosis(value))
            except ValueError:
                normalised.append(None)
                unknown.append(f"line {row}: {used[field_name]}={value!r}")
        out[col] = pd.Series(normalised, index=raw.index, dtype=object)
        out[f"{col}_raw"] = rawdx.where([v is not None for v in normalised], None)
        if unknown:
            quality.add("unknown_diagnosis", table, len(unknown),
                        f"diagnoses not in CN/SMC/EMCI/LMCI/MCI/AD/Dementia in {used[field_name]}",
                        "treated as missing", unknown)

    if used["age"]:
        age, bad = parse_numbers(raw[used["age"]])
        _report_bad(quality, "unparseable_number", table, raw, bad, used["age"],
                    "values that are not numbers", "treated as missing")
        out["age"] = age
    else:
        out["age"] = np.nan
    sexes, unknown = [], []
    for value, row in zip(_text(raw, used["sex"]), raw["_row"]):
        try:
            sexes.append(normalise_sex(value))
        except ValueError:
            sexes.append(None)
            unknown.append(f"line {row}: {used['sex']}={value!r}")
    out["sex"] = pd.Series(sexes, index=raw.index, dtype=object)
    if unknown:
        quality.add("unknown_sex", table, len(unknown), f"values of {used['sex']} not male/female",
                    "treated as missing", unknown)

    for tracer in TRACERS:
        col = used[tracer.lower()]
        if col is None:
            out[tracer] = np.nan
            continue
        values, bad = parse_numbers(raw[col])
        _report_bad(quality, "unparseable_number", table, raw, bad, col,
                    "values that are not numbers", "treated as missing")
        implausible = values.notna() & (values <= 0)
        _report_bad(quality, "implausible_suvr", table, raw, implausible, col,
                    "SUVR values <= 0 (missing-value codes such as -4?)", "treated as missing")
        out[tracer] = values.where(~implausible)

    out = out.loc[~no_subject & ~no_key]
    out = _merge_visit_rows(out, table, quality)
    return out.reset_index(drop=True), used, name


def _visit_key(frame: pd.DataFrame) -> pd.Series:
    date_text = frame["examdate"].dt.strftime("%Y-%m-%d")
    return frame["visit"].where(frame["visit"].notna(), "date:" + date_text.fillna(""))


def _merge_visit_rows(frame: pd.DataFrame, table: str, quality: QualityReport) -> pd.DataFrame:
    """One row per (subject, visit); conflicting diagnoses are blanked and reported."""
    frame = frame.copy()
    frame["_key"] = _visit_key(frame)
    groups = frame.groupby(["subject_id", "_key"], sort=False, dropna=False)
    sizes = groups["_row"].transform("size")
    if (sizes == 1).all():
        return frame.drop(columns="_key")
    single = frame.loc[sizes == 1]
    merged_rows: list[dict[str, Any]] = []
    dx_conflicts: list[str] = []
    value_conflicts: list[str] = []
    suvr_conflicts: list[str] = []
    dup_visits: list[str] = []
    n_dup_rows = 0
    for (subject, key), group in frame.loc[sizes > 1].groupby(["subject_id", "_key"], sort=False):
        n_dup_rows += len(group) - 1
        lines = ",".join(str(r) for r in group["_row"])
        dup_visits.append(f"{subject} {key} (lines {lines})")
        row: dict[str, Any] = {}
        for col in group.columns:
            values = group[col].dropna()
            row[col] = values.iloc[0] if len(values) else None
        dx_values = set(group["dx"].dropna())
        if len(dx_values) > 1:
            dx_conflicts.append(f"{subject} {key}: {sorted(dx_values)} (lines {lines})")
            row["dx"] = None
            row["dx_raw"] = None
        for col in ("examdate", "age", "sex", *TRACERS):
            if col in group and group[col].dropna().nunique() > 1:
                found = f"{subject} {key} {col}: {[str(v) for v in group[col].dropna().unique()]}"
                if col in TRACERS:  # an SUVR decides the truth: no row order may pick it
                    suvr_conflicts.append(f"{found} (lines {lines})")
                    row[col] = None
                else:
                    value_conflicts.append(found)
        row["_row"] = int(group["_row"].iloc[0])
        merged_rows.append(row)
    quality.add("duplicate_visit", table, n_dup_rows,
                "extra rows for a visit already on file (same subject and visit code)",
                "merged into one row per visit (first value of each column)", dup_visits)
    quality.add("conflicting_diagnosis", table, len(dx_conflicts),
                "visits with different diagnoses in different rows",
                "the visit gets no diagnosis (neither is used for labels)", dx_conflicts,
                severity="warning")
    quality.add("conflicting_values", table, len(value_conflicts),
                "visits whose rows disagree on a date or covariate",
                "kept the value of the first row", value_conflicts)
    quality.add("conflicting_amyloid_measure", table, len(suvr_conflicts),
                "visits whose rows disagree on an AV45/FBB/PIB SUVR",
                "none of the values is used (the row order decides nothing)", suvr_conflicts)
    merged = pd.DataFrame(merged_rows, columns=frame.columns)
    merged["examdate"] = pd.to_datetime(merged["examdate"])
    for col in ("age", *TRACERS):
        merged[col] = pd.to_numeric(merged[col], errors="coerce").astype("float64")
    out = pd.concat([single, merged], ignore_index=True).sort_values("_row", kind="stable")
    return out.drop(columns="_key")


def load_scans(
    source: str | Path | pd.DataFrame,
    columns: ScanColumns,
    quality: QualityReport,
) -> tuple[pd.DataFrame, dict[str, str | None], str]:
    """Normalised scan rows, the columns used and the table name.

    Output columns: ``subject_id, session_id, scan_path, scan_date, status, subject_raw,
    session_raw, _row``. Exact duplicate rows are dropped once (reported); nothing else is
    dropped here: unusable rows are flagged by :func:`adni_pu.cohort.manifest.build_cohort`.
    """
    raw, name = read_table(source, "scan")
    table = f"scans ({name})"
    used = resolve_columns(raw, columns, _SCAN_CANDIDATES,
                           [("subject",), ("session", "date"), ("path",)], table, "scan_columns")
    raw = _drop_exact_duplicates(raw, table, quality)
    out = pd.DataFrame({"_row": raw["_row"]}, index=raw.index)
    out["subject_raw"] = raw[used["subject"]]
    out["subject_id"] = apply(raw[used["subject"]], normalise_subject_id)
    out["session_raw"] = _text(raw, used["session"])
    out["session_id"] = apply(out["session_raw"], normalise_visit)
    out["scan_path"] = raw[used["path"]]
    if used["date"]:
        out["scan_date"] = read_dates(raw, used["date"], table, quality, "treated as missing",
                                      'or set scan_columns.date="-" to date scans by their '
                                      "matched visit")
    else:
        out["scan_date"] = pd.Series(pd.NaT, index=raw.index, dtype="datetime64[ns]")
    status = _text(raw, used["status"])
    out["status"] = apply(status, lambda v: None if _missing(v) else str(v).strip().lower())
    return out.reset_index(drop=True), used, name

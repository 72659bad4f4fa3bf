"""Amyloid measures from tables (``--amyloid``), their precedence, and Centiloids.

Three table shapes are read, each by its own column names (case-insensitive):

* UC Berkeley ``UCBERKELEY_AMY_6MM_<date>.csv``: ``RID`` (or ``PTID``), ``SCANDATE``,
  ``TRACER`` (FBP, FBB, NAV), ``SUMMARY_SUVR``, ``CENTILOIDS``, ``AMYLOID_STATUS``,
  ``qc_flag``;
* the older per-tracer ``UCBERKELEYAV45_<date>.csv`` / ``UCBERKELEYFBB_<date>.csv``:
  ``RID``, ``EXAMDATE``, ``SUMMARYSUVR_WHOLECEREBNORM`` (the tracer comes from a
  ``TRACER`` column or, failing that, the file name);
* a long table ``subject, date, tracer, suvr[, centiloid]`` (e.g. from
  :func:`adni_pu.cohort.suvr.suvr_table`).

Rows are dated by the PET scan, so pairing with an MRI scan is by date (see
:func:`adni_pu.cohort.matching.match_amyloid`), never by visit code. Everything left out
is reported in the :class:`~adni_pu.cohort.quality.QualityReport`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from adni_pu.cohort.amyloid_rules import MeasureRule, merge_same_scan
from adni_pu.cohort.config import MEASURE_TRACERS, AmyloidSettings, LabelSettings
from adni_pu.cohort.ids import is_rid, normalise_subject_id
from adni_pu.cohort.quality import CohortInputError, QualityReport
from adni_pu.cohort.tables import (
    _drop_exact_duplicates,
    _report_bad,
    apply,
    read_dates,
    read_table,
)
from adni_pu.cohort.values import _missing, parse_numbers

#: Columns of a measure table, in the order build_cohort uses them.
MEASURE_COLUMNS = ("subject_id", "date", "tracer", "suvr", "centiloid", "status", "source")

_TRACER_NAMES = {
    "AV45": "AV45", "FBP": "AV45", "FLORBETAPIR": "AV45",
    "FBB": "FBB", "FLORBETABEN": "FBB",
    "PIB": "PIB",
    "NAV": "NAV", "NAV4694": "NAV", "FLUTAFURANOL": "NAV",
}

# Candidate names per field, first found wins (matched case-insensitively).
_CANDIDATES: dict[str, tuple[str, ...]] = {
    "ptid": ("PTID", "subject_id", "subject", "participant_id"),
    "rid": ("RID",),
    "date": ("SCANDATE", "EXAMDATE", "date", "scan_date", "pet_date"),
    "tracer": ("TRACER",),
    "suvr": ("SUMMARY_SUVR", "SUMMARYSUVR_WHOLECEREBNORM", "suvr"),
    "centiloid": ("CENTILOIDS", "centiloid", "centiloids"),
    "qc": ("qc_flag",),
    "status": ("AMYLOID_STATUS",),
    "error": ("error",),
}
_EXPECTED = ("a UC Berkeley table (RID, SCANDATE, TRACER, SUMMARY_SUVR, CENTILOIDS, qc_flag), "
             "an older per-tracer one (RID, EXAMDATE, SUMMARYSUVR_WHOLECEREBNORM) or "
             "subject, date, tracer, suvr")


def normalise_tracer(value: Any) -> str | None:
    """AV45, FBB, PIB or NAV from the names ADNI tables use (FBP, 18F-AV45, florbetaben...).

    Unknown names are returned upper-cased (the caller reports them); empty gives ``None``.
    """
    if _missing(value):
        return None
    text = re.sub(r"^(?:\[?1[18]C?F?\]?)[-\s]*", "", str(value).strip().upper())
    text = re.sub(r"[\s_-]", "", text)
    return _TRACER_NAMES.get(text, text or None)


def tracer_from_name(name: str) -> str | None:
    """The one tracer a file name such as ``UCBERKELEYFBB_04_26_22.csv`` names, else None."""
    found = {_TRACER_NAMES[t] for t in re.findall(r"AV45|FBP|FBB|PIB|NAV", name.upper())}
    return found.pop() if len(found) == 1 else None


def _find(frame: pd.DataFrame) -> dict[str, str | None]:
    lower = {c.lower(): c for c in frame.columns if c != "_row"}
    return {key: next((lower[n.lower()] for n in names if n.lower() in lower), None)
            for key, names in _CANDIDATES.items()}


def _numbers(raw: pd.DataFrame, col: str, table: str, quality: QualityReport,
             what: str) -> tuple[pd.Series, pd.Series]:
    """Numbers of one column; a column with values but not one number is an input error."""
    values, bad = parse_numbers(raw[col])
    if bad.any() and not values.notna().any():
        shown = [str(v) for v in raw.loc[bad, col].head(3)]
        raise CohortInputError(f"{table}: column {col}: expected {what}, found {shown} "
                               "(no value in the column is a number)")
    _report_bad(quality, "unparseable_number", table, raw, bad, col,
                "values that are not numbers", "treated as missing")
    return values, bad


def read_amyloid_table(
    source: str | Path | pd.DataFrame,
    quality: QualityReport,
    settings: AmyloidSettings | None = None,
    rule: MeasureRule | None = None,
) -> pd.DataFrame:
    """One amyloid table as measures (``MEASURE_COLUMNS``), QC-filtered and normalised,
    one row per PET scan (see :func:`~adni_pu.cohort.amyloid_rules.merge_same_scan`).

    Raises :class:`CohortInputError` when the table lacks a subject, date or value column,
    names no tracer, has a column with no readable value, leaves no usable row, or (with
    ``rule``) gives no measure that rule can use. A table without ``qc_flag`` is reported
    (``amyloid_without_qc``): its rows are used without PET quality control.
    """
    settings = settings or AmyloidSettings()
    raw, name = read_table(source, "amyloid")
    table = f"amyloid ({name})"
    cols = _find(raw)
    found = [c for c in raw.columns if c != "_row"]
    missing = []
    if not (cols["ptid"] or cols["rid"]):
        missing.append("subject (RID, PTID or subject)")
    if not cols["date"]:
        missing.append("date (SCANDATE, EXAMDATE or date)")
    if not (cols["suvr"] or cols["centiloid"]):
        missing.append("value (SUMMARY_SUVR, SUMMARYSUVR_WHOLECEREBNORM, suvr or CENTILOIDS)")
    if missing:
        raise CohortInputError(f"{table}: missing column(s) {'; '.join(missing)}; expected "
                               f"{_EXPECTED}; columns found: {found}")
    fixed_tracer = None
    if not cols["tracer"]:
        fixed_tracer = tracer_from_name(name) if not isinstance(source, pd.DataFrame) else None
        if fixed_tracer is None:
            raise CohortInputError(
                f"{table}: no TRACER column and the file name names no single tracer; "
                f"expected a TRACER column (FBP/AV45, FBB, PIB, NAV) or a per-tracer file "
                f"name such as UCBERKELEYAV45_<date>.csv; columns found: {found}")
    raw = _drop_exact_duplicates(raw, table, quality)
    out = pd.DataFrame({"_row": raw["_row"]}, index=raw.index)

    ptid = apply(raw[cols["ptid"]], normalise_subject_id) if cols["ptid"] else None
    rid = apply(raw[cols["rid"]], normalise_subject_id) if cols["rid"] else None
    if ptid is None:
        out["subject_id"] = rid
    elif rid is None:
        out["subject_id"] = ptid
    else:
        out["subject_id"] = ptid.where(ptid.notna(), rid)
    no_subject = out["subject_id"].isna()
    if no_subject.any():
        quality.add("row_without_subject", table, int(no_subject.sum()),
                    "rows with no subject id", "measure left out",
                    [f"line {r}" for r in out.loc[no_subject, "_row"]])

    out["date"] = read_dates(raw, cols["date"], table, quality,
                             "measure left out (cannot be paired in time)")

    if fixed_tracer:
        out["tracer"] = fixed_tracer
    else:
        out["tracer"] = apply(raw[cols["tracer"]], normalise_tracer)
    unknown = out["tracer"].notna() & ~out["tracer"].isin(MEASURE_TRACERS)
    _report_bad(quality, "unknown_tracer", table, raw, unknown,
                cols["tracer"] or "TRACER", f"tracers other than {list(MEASURE_TRACERS)}",
                "measure left out")

    values = {}
    for key, what in (("suvr", "SUVRs"), ("centiloid", "Centiloids")):
        if cols[key]:
            values[key] = _numbers(raw, cols[key], table, quality, f"numbers ({what})")[0]
        else:
            values[key] = pd.Series(np.nan, index=raw.index)
    implausible = values["suvr"].notna() & (values["suvr"] <= 0)
    if cols["suvr"]:
        _report_bad(quality, "implausible_suvr", table, raw, implausible, cols["suvr"],
                    "SUVR values <= 0", "SUVR not used")
    out["suvr"] = values["suvr"].where(~implausible)
    out["centiloid"] = values["centiloid"]
    if cols["status"]:
        out["status"] = parse_numbers(raw[cols["status"]])[0]
    else:
        out["status"] = np.nan
    out["source"] = name

    empty = out["suvr"].isna() & out["centiloid"].isna()
    if empty.any():
        err = cols["error"]
        examples = [f"line {r}: {s}" + (f" ({e})" if err and e else "")
                    for r, s, e in zip(out.loc[empty, "_row"], out.loc[empty, "subject_id"],
                                       raw.loc[empty, err] if err else [None] * int(empty.sum()))]
        quality.add("amyloid_missing_value", table, int(empty.sum()),
                    "amyloid rows with neither an SUVR nor a Centiloid value",
                    "measure left out", examples)

    keep = (out["subject_id"].notna() & out["date"].notna() & ~empty
            & out["tracer"].notna() & ~unknown)
    if cols["qc"]:
        keep &= _qc_passes(raw, out, cols["qc"], settings.qc_pass, table, quality, keep)
    kept = merge_same_scan(out.loc[keep], table, quality)
    if kept.empty:
        kinds = ", ".join(f"{i.kind} ({i.count})" for i in quality if i.table == table)
        raise CohortInputError(f"{table}: no usable amyloid measure ({kinds or 'no rows'})")
    if rule is not None and not rule.usable(kept).any():
        shown = {k: (cols[k], raw.loc[kept.index, cols[k]]) for k in ("suvr", "centiloid")
                 if cols[k]}
        raise CohortInputError(f"{table}: {rule.why_none(kept, shown)}")
    if not cols["qc"]:
        quality.add("amyloid_without_qc", table, len(kept),
                    "measures used without PET quality control: the table has no qc_flag "
                    "column", "used as they are; check their QC (UC Berkeley tables carry "
                    "qc_flag, 2 = pass)", [f"columns found: {found}"])
    return kept[list(MEASURE_COLUMNS)].reset_index(drop=True)


def _qc_passes(raw: pd.DataFrame, out: pd.DataFrame, col: str, passing: list[int],
               table: str, quality: QualityReport, candidates: pd.Series) -> pd.Series:
    """Rows whose qc_flag is one of ``passing``; the others are reported per value."""
    flags, _ = parse_numbers(raw[col])
    ok = flags.isin([float(v) for v in passing])
    excluded = candidates & ~ok
    value = pd.Series(
        ["empty" if _missing(t) else (f"{f:g}" if pd.notna(f) else repr(t))
         for t, f in zip(raw.loc[excluded, col], flags[excluded])],
        index=raw.index[excluded], dtype=object)
    meaning = {"1": " (partial pass)", "0": " (fail)", "-1": " (not assessed)"}
    for flag, index in value.groupby(value, sort=True).groups.items():
        quality.add("amyloid_qc_excluded", table, len(index),
                    f"PET rows with {col} {flag}{meaning.get(flag, '')}; used: {passing} "
                    "(amyloid.qc_pass)", "measure left out",
                    [f"line {r}: {'RID ' if is_rid(s) else ''}{s} {d:%Y-%m-%d}" for r, s, d in zip(
                        raw.loc[index, "_row"], out.loc[index, "subject_id"],
                        out.loc[index, "date"])])
    return ok


def load_amyloid_tables(
    sources: list[str | Path | pd.DataFrame],
    quality: QualityReport,
    settings: AmyloidSettings | None = None,
    rule: MeasureRule | None = None,
    subject_map: dict[str, str] | None = None,
) -> pd.DataFrame:
    """All ``--amyloid`` tables as one measure table, each scan once.

    Each table is read (and judged) on its own by :func:`read_amyloid_table`. RIDs are
    turned into PTIDs through ``subject_map``. A scan (subject, date, tracer) found in
    several tables is kept from the first table given, whatever the values, and the others
    are reported (e.g. an AMY_6MM table next to an older AV45 one): the order of the
    ``--amyloid`` options is the precedence, never the order of rows.
    """
    frames = [read_amyloid_table(s, quality, settings, rule) for s in sources]
    if not frames:
        return empty_measures()
    measures = pd.concat(frames, ignore_index=True)
    if subject_map:
        measures["subject_id"] = [subject_map.get(s, s) if is_rid(s) else s
                                  for s in measures["subject_id"]]
    dup = measures.duplicated(subset=["subject_id", "date", "tracer"], keep="first")
    if dup.any():
        rows = measures.loc[dup]
        quality.add("duplicate_amyloid_measure", "amyloid", int(dup.sum()),
                    "PET scans (subject, date, tracer) found in more than one amyloid table",
                    "kept the row of the first --amyloid table given",
                    [f"{s} {d:%Y-%m-%d} {t} ({src})" for s, d, t, src in zip(
                        rows["subject_id"], rows["date"], rows["tracer"], rows["source"])],
                    severity="info")
    return measures.loc[~dup].reset_index(drop=True)


def empty_measures() -> pd.DataFrame:
    """A measure table with no rows and the right columns."""
    frame = pd.DataFrame({c: pd.Series(dtype=object) for c in MEASURE_COLUMNS})
    frame["date"] = pd.Series(dtype="datetime64[ns]")
    for col in ("suvr", "centiloid", "status"):
        frame[col] = pd.Series(dtype="float64")
    return frame


def combine_measures(clinical: pd.DataFrame, tables: pd.DataFrame | None,
                     settings: AmyloidSettings, quality: QualityReport,
                     clinical_table: str, usable: pd.Series | None = None) -> pd.DataFrame:
    """Clinical-table SUVRs and table measures, by ``settings.precedence``.

    ``usable`` (aligned with ``tables``): the table measures the label rule can use. Under
    ``tables-first`` only those supersede a subject's clinical values, so a row the rule
    cannot read (a text SUVR, a tracer without a cut-off) never erases a usable one.
    """
    clinical = clinical.copy()
    for col in ("centiloid", "status"):
        if col not in clinical:
            clinical[col] = np.nan
    clinical = clinical[list(MEASURE_COLUMNS)]
    if tables is None or tables.empty:
        return clinical.reset_index(drop=True)
    if settings.precedence == "pooled":
        drop = pd.Series(False, index=clinical.index)
    elif settings.precedence == "tables-only":
        drop = pd.Series(True, index=clinical.index)
    else:
        readable = tables if usable is None else tables.loc[usable.to_numpy(dtype=bool)]
        drop = clinical["subject_id"].isin(set(readable["subject_id"]))
        kept = sorted(set(clinical["subject_id"]) & (set(tables["subject_id"])
                                                     - set(readable["subject_id"])))
        quality.add("clinical_amyloid_kept", clinical_table, len(kept),
                    "subjects whose amyloid-table rows give no measure the label rule can "
                    "use (no readable value on its scale, or a tracer without a cut-off)",
                    "their clinical AV45/FBB/PIB values are used (amyloid.precedence = "
                    "tables-first)", kept, severity="info")
    if drop.any():
        rows = clinical.loc[drop]
        quality.add("clinical_amyloid_superseded", clinical_table, int(drop.sum()),
                    f"AV45/FBB/PIB values of the clinical table not used: the amyloid "
                    f"table(s) take precedence (amyloid.precedence = {settings.precedence})",
                    "measure not used", [f"{s} {t} {v:.3f}" for s, t, v in zip(
                        rows["subject_id"], rows["tracer"], rows["suvr"])], severity="info")
    parts = [f for f in (clinical.loc[~drop], tables) if not f.empty]
    return pd.concat(parts, ignore_index=True) if parts else empty_measures()


def add_centiloids(measures: pd.DataFrame, conversions: dict[str, list[float]]) -> pd.DataFrame:
    """Fill missing ``centiloid`` values from SUVRs: CL = slope x SUVR + intercept per tracer."""
    out = measures.copy()
    out["centiloid"] = pd.to_numeric(out["centiloid"], errors="coerce").astype("float64")
    for tracer, (slope, intercept) in conversions.items():
        todo = out["centiloid"].isna() & out["suvr"].notna() & (out["tracer"] == tracer)
        out.loc[todo, "centiloid"] = slope * out.loc[todo, "suvr"].astype(float) + intercept
    return out


def on_scale(measures: pd.DataFrame, labels: LabelSettings,
             quality: QualityReport) -> pd.DataFrame:
    """The measures that have a value on the label scale, with that value as ``value``."""
    column = "centiloid" if labels.scale == "centiloid" else "suvr"
    out = measures.copy()
    out["value"] = pd.to_numeric(out[column], errors="coerce").astype("float64")
    lost = out["value"].isna()
    if lost.any():
        rows = out.loc[lost]
        by_tracer = ", ".join(f"{t} {n}" for t, n in rows["tracer"].value_counts().items())
        if column == "centiloid":
            quality.add("no_centiloid_conversion", "amyloid", int(lost.sum()),
                        f"measures with no Centiloid value and no SUVR conversion for their "
                        f"tracer ({by_tracer})",
                        "not used; set amyloid.centiloid_conversions.<TRACER> = [slope, "
                        "intercept] only with a published conversion for your pipeline",
                        [f"{s} {t} SUVR {v}" for s, t, v in zip(
                            rows["subject_id"], rows["tracer"], rows["suvr"])])
        else:
            quality.add("amyloid_without_suvr", "amyloid", int(lost.sum()),
                        f"measures with a Centiloid but no SUVR ({by_tracer})",
                        "not used by an SUVR preset; --preset centiloid uses them",
                        [f"{s} {t} CL {v}" for s, t, v in zip(
                            rows["subject_id"], rows["tracer"], rows["centiloid"])])
    out = out.loc[~lost]
    if column == "suvr":
        # A tracer with no SUVR cut-off at all (NAV under the SUVR presets) is not paired:
        # it would take the place of a nearby measure that the rule can read.
        known = set(labels.label_cutoffs) | set(labels.truth_cutoffs)
        blind = ~out["tracer"].isin(known)
        if blind.any():
            rows = out.loc[blind]
            quality.add("tracer_without_cutoff", "amyloid", int(blind.sum()),
                        f"SUVR measures of tracers with no cut-off in this preset "
                        f"({', '.join(sorted(set(rows['tracer'])))})",
                        "not used; set labels.label_cutoffs / truth_cutoffs, or use "
                        "--preset centiloid", [f"{s} {t} SUVR {v:.3f}" for s, t, v in zip(
                            rows["subject_id"], rows["tracer"], rows["suvr"])])
            out = out.loc[~blind]
    return out.reset_index(drop=True)


def compare_status(measures: pd.DataFrame, labels: LabelSettings, quality: QualityReport) -> None:
    """Report measures whose Berkeley ``AMYLOID_STATUS`` differs from the truth rule.

    Berkeley's status uses its own tracer cut-offs, so e.g. florbetapir 1.08-1.11 is
    positive under the paper preset and negative in the table; the rule is kept.
    """
    from adni_pu.cohort.labels import cutoffs

    rows = []
    for subject, tracer, value, status, date in zip(
            measures["subject_id"], measures["tracer"], measures["value"],
            measures["status"], measures["date"]):
        truth_cut = cutoffs(labels, tracer)[1]
        if pd.isna(status) or truth_cut is None or status not in (0, 1):
            continue
        if int(value >= truth_cut) != int(status):
            rows.append(f"{subject} {date:%Y-%m-%d} {tracer} {value:g}: AMYLOID_STATUS "
                        f"{int(status)}, rule {int(value >= truth_cut)}")
    unit = "CL" if labels.scale == "centiloid" else "SUVR"
    quality.add("amyloid_status_differs", "amyloid", len(rows),
                f"measures whose table AMYLOID_STATUS differs from the truth cut-off ({unit})",
                "the rule's cut-off is used (AMYLOID_STATUS is not)", rows, severity="info")

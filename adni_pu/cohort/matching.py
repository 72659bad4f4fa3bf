"""Pairing each scan with its clinical visit and with the nearest amyloid measure.

A scan finds its visit by visit code first, then through the code aliases (screening
visits), then by date (nearest visit within a window, when the scan has a date). It
then gets the amyloid measure nearest in time within a window; the signed gap
``suvr_gap_days = measure date - scan date`` is recorded (negative: PET before MRI).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from adni_pu.cohort.config import TRACERS, MatchingSettings


def clinical_measures(visits: pd.DataFrame) -> pd.DataFrame:
    """The amyloid SUVRs of a clinical table in long form: subject_id, date, tracer, suvr.

    ADNIMERGE carries one SUVR per tracer per visit, dated by the visit's EXAMDATE.
    Measures at visits without a date cannot be paired in time and are left out here
    (they are counted by the builder).
    """
    parts = []
    for tracer in TRACERS:
        if tracer not in visits:
            continue
        sub = visits.loc[visits[tracer].notna(), ["subject_id", "examdate", "visit", tracer]]
        parts.append(pd.DataFrame({
            "subject_id": sub["subject_id"].to_numpy(),
            "date": sub["examdate"].to_numpy(),
            "visit": sub["visit"].to_numpy(),
            "tracer": tracer,
            "suvr": sub[tracer].to_numpy(dtype=float),
            "source": "clinical",
        }))
    if not parts:
        return pd.DataFrame(columns=["subject_id", "date", "visit", "tracer", "suvr", "source"])
    out = pd.concat(parts, ignore_index=True)
    out["date"] = pd.to_datetime(out["date"])
    return out


def _visit_key(visit: object, date: object) -> str | None:
    """The key a visit is known by: its code, or ``date:YYYY-MM-DD`` without one."""
    if isinstance(visit, str):
        return visit
    if pd.notna(date):
        return "date:" + pd.Timestamp(date).strftime("%Y-%m-%d")
    return None


def _visit_index(visits: pd.DataFrame) -> dict[str, dict[str, dict]]:
    """subject -> visit key -> the visit's record (first row per key)."""
    index: dict[str, dict[str, dict]] = {}
    for rec in visits.to_dict("records"):
        key = _visit_key(rec["visit"], rec["examdate"])
        if key is not None:
            index.setdefault(rec["subject_id"], {}).setdefault(key, rec)
    return index


def match_visits(scans: pd.DataFrame, visits: pd.DataFrame,
                 settings: MatchingSettings) -> pd.DataFrame:
    """Add ``visit`` (the clinical visit key), ``visit_match`` and ``visit_gap_days``.

    ``visit_match`` is ``code`` (same visit code), ``alias:<code>`` (through
    ``settings.visit_aliases``), ``date`` (nearest visit by date within
    ``settings.visit_window_days``) or ``none``. ``visit_gap_days`` is visit date minus
    scan date where both are known. A visit with no code is keyed ``date:YYYY-MM-DD``.
    """
    index = _visit_index(visits)
    visit_col, how, gap = [], [], []
    for subject, code, date in zip(scans["subject_id"], scans["session_id"], scans["scan_date"]):
        known = index.get(subject, {})
        found, kind, days = None, "none", np.nan
        if isinstance(code, str) and code in known:
            found, kind = code, "code"
        elif isinstance(code, str):
            for alias in settings.visit_aliases.get(code, []):
                if alias in known:
                    found, kind = alias, f"alias:{alias}"
                    break
        if found is None and pd.notna(date) and known:
            dated = [(abs((rec["examdate"] - date).days), key) for key, rec in known.items()
                     if pd.notna(rec["examdate"])]
            if dated:
                distance, key = min(dated)
                if distance <= settings.visit_window_days:
                    found, kind = key, "date"
        if found is not None and pd.notna(date) and pd.notna(known[found]["examdate"]):
            days = float((known[found]["examdate"] - date).days)
        visit_col.append(found)
        how.append(kind)
        gap.append(days)
    out = scans.copy()
    out["visit"] = pd.Series(visit_col, index=out.index, dtype=object)
    out["visit_match"] = pd.Series(how, index=out.index, dtype=object)
    out["visit_gap_days"] = gap
    return out


def attach_visits(scans: pd.DataFrame, visits: pd.DataFrame) -> pd.DataFrame:
    """Copy the matched visit's clinical fields onto each scan (examdate, dx, age, sex...).

    The scan date falls back to the visit's exam date when the scan table has none.
    """
    fields = ["examdate", "dx", "dx_raw", "age", "sex"]
    index = _visit_index(visits)
    rows = []
    for subject, key in zip(scans["subject_id"], scans["visit"]):
        rec = index.get(subject, {}).get(key) if isinstance(key, str) else None
        rows.append({f: (rec[f] if rec is not None else None) for f in fields})
    extra = pd.DataFrame(rows, index=scans.index, columns=fields)
    out = scans.copy()
    for f in fields:
        out[f] = extra[f].astype(object) if f in ("dx", "dx_raw", "sex") else extra[f]
    out["examdate"] = pd.to_datetime(out["examdate"])
    out["age"] = pd.to_numeric(out["age"], errors="coerce").astype("float64")
    out["scan_date"] = out["scan_date"].where(out["scan_date"].notna(), out["examdate"])
    return out


def match_amyloid(scans: pd.DataFrame, measures: pd.DataFrame,
                  settings: MatchingSettings) -> tuple[pd.DataFrame, pd.Series]:
    """Pair each scan with the nearest amyloid measure of its subject within the window.

    Adds ``suvr, tracer, suvr_date, suvr_gap_days`` (measure date minus scan date, days)
    and ``centiloid`` (NaN where the measure has none).
    Ties in distance go to the tracer listed first in ``settings.tracer_priority``, then
    to the earlier measure. Returns the scans and, per scan, the distance in days to the
    nearest measure outside the window (NaN where there is none or one was paired), for
    the quality report.
    """
    out = scans.copy()
    out["suvr"] = np.nan
    out["tracer"] = pd.Series([None] * len(out), index=out.index, dtype=object)
    out["suvr_date"] = pd.Series(pd.NaT, index=out.index, dtype="datetime64[ns]")
    out["suvr_gap_days"] = np.nan
    out["centiloid"] = np.nan
    outside = pd.Series(np.nan, index=out.index)
    # ``value``: the measure on the label scale (SUVR or Centiloid), where the builder set it.
    value = measures["value"] if "value" in measures else measures["suvr"]
    usable = measures.loc[measures["date"].notna() & value.notna()]
    usable = usable.loc[usable["tracer"].isin(settings.tracer_priority)]
    if usable.empty or out.empty:
        return out, outside
    rank = {t: i for i, t in enumerate(settings.tracer_priority)}
    left = pd.DataFrame({"_scan": out.index, "subject_id": out["subject_id"],
                         "scan_date": out["scan_date"]})
    left = left.loc[left["scan_date"].notna()]
    pairs = left.merge(usable, on="subject_id", how="inner")
    if pairs.empty:
        return out, outside
    pairs["gap"] = (pairs["date"] - pairs["scan_date"]).dt.days.astype(float)
    pairs["abs_gap"] = pairs["gap"].abs()
    pairs["rank"] = pairs["tracer"].map(rank)
    pairs = pairs.sort_values(["_scan", "abs_gap", "rank", "date"], kind="stable")
    best = pairs.drop_duplicates("_scan", keep="first").set_index("_scan")
    inside = best["abs_gap"] <= settings.amyloid_window_days
    hit = best.loc[inside]
    out.loc[hit.index, "suvr"] = hit["suvr"].astype(float)
    out.loc[hit.index, "tracer"] = hit["tracer"]
    out.loc[hit.index, "suvr_date"] = hit["date"]
    out.loc[hit.index, "suvr_gap_days"] = hit["gap"]
    if "centiloid" in hit:
        out.loc[hit.index, "centiloid"] = hit["centiloid"].astype(float)
    miss = best.loc[~inside]
    outside.loc[miss.index] = miss["abs_gap"]
    return out, outside

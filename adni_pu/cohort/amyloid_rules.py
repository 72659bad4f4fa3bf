"""Rules that keep amyloid measures honest: one value per PET scan, whatever the row order,
and only measures the label rule can read take the place of other sources.

* :func:`merge_same_scan`: several rows of one table for one PET scan (subject, date,
  tracer) become one measure when their values agree; when they disagree, none is used
  (the first row must not win: reversing a table would then flip a label).
* :class:`MeasureRule`: which measures the preset's rule can use (a value on its scale, a
  tracer with a cut-off, a tracer in ``matching.tracer_priority``), and why a table gives
  none. An unusable row never supersedes a usable clinical value, and a table with no
  usable measure stops the build.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from adni_pu.cohort.config import LabelSettings
from adni_pu.cohort.quality import QualityReport

_KEY = ["subject_id", "date", "tracer"]


def _label(subject: str) -> str:
    return f"RID {subject}" if str(subject).isdigit() else str(subject)


def _agreeing(values: pd.Series) -> tuple[bool, float]:
    """Whether the present values agree (to 1e-6), and that value (NaN when none)."""
    present = values.dropna().astype(float)
    if present.empty:
        return True, np.nan
    agree = bool(np.ptp(present.to_numpy()) <= 1e-6)
    return agree, float(present.min())


def merge_same_scan(measures: pd.DataFrame, table: str, quality: QualityReport) -> pd.DataFrame:
    """One row per PET scan (``subject_id, date, tracer``) of one table, order-independent.

    Rows that agree on SUVR and Centiloid (a value missing in one row is taken from the
    other) are merged into one (``duplicate_amyloid_measure``, info); rows that disagree are
    all left out (``conflicting_amyloid_measure``, warning, naming the lines). An
    ``AMYLOID_STATUS`` that differs between merged rows is dropped. ``measures`` needs
    ``_row`` (file line numbers) besides the measure columns.
    """
    dup = measures.duplicated(_KEY, keep=False)
    if not dup.any():
        return measures
    merged, conflicts, repeats, n_repeat = [], [], [], 0
    for _, group in measures.loc[dup].groupby(_KEY, sort=True):
        lines = sorted(int(r) for r in group["_row"])
        subject, date, tracer = (group.iloc[0][k] for k in _KEY)
        where = f"{_label(subject)} {date:%Y-%m-%d} {tracer} (lines {', '.join(map(str, lines))})"
        suvr_ok, suvr = _agreeing(group["suvr"])
        cl_ok, cl = _agreeing(group["centiloid"])
        if not (suvr_ok and cl_ok):
            shown = "; ".join(
                f"line {int(r)}: SUVR {s:g}" + (f", CL {c:g}" if pd.notna(c) else "")
                if pd.notna(s) else f"line {int(r)}: CL {c:g}"
                for r, s, c in sorted(zip(group["_row"], group["suvr"], group["centiloid"])))
            conflicts.append(f"{where}: {shown}")
            continue
        status_ok, status = _agreeing(group["status"])
        row = group.sort_values("_row").iloc[0].copy()
        row["suvr"], row["centiloid"] = suvr, cl
        row["status"] = status if status_ok else np.nan
        merged.append(row)
        repeats.append(where)
        n_repeat += len(group) - 1
    quality.add("duplicate_amyloid_measure", table, n_repeat,
                "extra rows for a PET scan (subject, date, tracer) already in this table, "
                "with the same SUVR and Centiloid", "merged into one measure", repeats,
                severity="info")
    quality.add("conflicting_amyloid_measure", table, len(conflicts),
                "PET scans (subject, date, tracer) with rows that disagree on the SUVR or "
                "Centiloid", "none of the rows is used (the row order decides nothing); the "
                "subject keeps its other measures", conflicts)
    parts = [measures.loc[~dup]]
    if merged:
        parts.append(pd.DataFrame(merged, columns=measures.columns))
    out = pd.concat(parts).sort_values("_row", kind="stable")
    for col in ("suvr", "centiloid", "status"):
        out[col] = pd.to_numeric(out[col], errors="coerce").astype("float64")
    out["date"] = pd.to_datetime(out["date"])
    return out


@dataclass(frozen=True)
class MeasureRule:
    """The measures a preset's rule can use: a value on its scale from a tracer it reads."""

    labels: LabelSettings
    conversions: dict[str, list[float]]
    priority: tuple[str, ...]
    preset: str = ""

    def _suvr_tracers(self) -> set[str]:
        return set(self.labels.label_cutoffs) | set(self.labels.truth_cutoffs)

    def usable(self, measures: pd.DataFrame) -> pd.Series:
        """Per measure: can the rule use it (before pairing with a scan in time)?"""
        tracer = measures["tracer"]
        suvr = pd.to_numeric(measures["suvr"], errors="coerce").notna()
        if self.labels.scale == "centiloid":
            cl = pd.to_numeric(measures["centiloid"], errors="coerce").notna()
            ok = cl | (suvr & tracer.isin(set(self.conversions)))
        else:
            ok = suvr & tracer.isin(self._suvr_tracers())
        return (ok & tracer.isin(set(self.priority))).astype(bool)

    def why_none(self, measures: pd.DataFrame,
                 raw_values: dict[str, tuple[str, pd.Series]]) -> str:
        """Why none of ``measures`` (one table's rows after QC) can be used.

        ``raw_values``: ``"suvr"`` / ``"centiloid"`` -> (column name, text values as read,
        aligned with ``measures``), to show what was found.
        """
        n = len(measures)
        suvr = pd.to_numeric(measures["suvr"], errors="coerce").notna()
        cl = pd.to_numeric(measures["centiloid"], errors="coerce").notna()
        parts = []
        if self.labels.scale == "centiloid":
            need = "Centiloids (a CENTILOIDS value, or an SUVR of a tracer with a conversion)"
            convertible = suvr & measures["tracer"].isin(set(self.conversions))
            missing = ~(cl | convertible)
            if missing.any():
                parts.append(f"{int(missing.sum())} of {n} have neither a Centiloid nor a "
                             "convertible SUVR" + _found(raw_values, ("suvr", "centiloid"),
                                                         missing))
        else:
            tracers = sorted(self._suvr_tracers())
            need = f"SUVRs of {', '.join(tracers)} (the tracers with a cut-off)"
            if (~suvr).any():
                has_cl = int((~suvr & cl).sum())
                parts.append(f"{int((~suvr).sum())} of {n} have no readable SUVR"
                             + _found(raw_values, ("suvr",), ~suvr)
                             + (f", {has_cl} of them a Centiloid (--preset centiloid reads "
                                "Centiloids)" if has_cl else ""))
            blind = suvr & ~measures["tracer"].isin(set(tracers))
            if blind.any():
                names = ", ".join(sorted(set(measures.loc[blind, "tracer"])))
                parts.append(f"{int(blind.sum())} are of tracers with no SUVR cut-off ({names})")
        unranked = ~measures["tracer"].isin(set(self.priority))
        if unranked.any():
            names = ", ".join(sorted(set(measures.loc[unranked, "tracer"])))
            parts.append(f"{int(unranked.sum())} are of tracers missing from "
                         f"matching.tracer_priority ({names})")
        preset = f"preset {self.preset}" if self.preset else "the label rule"
        return (f"no measure {preset} can use: it reads {need}; of the {n} rows that passed "
                f"QC, {'; '.join(parts) or 'none is usable'}")


def _found(raw_values: dict[str, tuple[str, pd.Series]], keys: tuple[str, ...],
           mask: pd.Series) -> str:
    """`` (column X: found ...)`` for the value columns ``keys``, at most three values each."""
    shown = []
    for key in keys:
        if key not in raw_values:
            continue
        column, values = raw_values[key]
        texts = ["empty/NA" if v is None or (isinstance(v, float) and np.isnan(v)) else repr(v)
                 for v in values[mask].head(3)]
        shown.append(f"column {column}: found {', '.join(texts)}")
    return f" ({'; '.join(shown)})" if shown else ""

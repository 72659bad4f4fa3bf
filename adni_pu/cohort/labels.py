"""Positive-unlabelled labels and evaluation truth, decided once per SUBJECT.

Labels are per subject, not per scan: the paper's rule reads "a subject is a labelled
positive if ...", and the splits are by subject, so every scan of one subject carries
the same ``pu_label``, ``hidden_positive`` and ``truth``. The per-scan amyloid measure is
still in the manifest (``suvr``, ``tracer``, ``suvr_gap_days``) for anyone who wants a
per-scan rule.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from adni_pu.cohort.config import LabelSettings
from adni_pu.cohort.quality import QualityReport

SUBJECT_COLUMNS = (
    "subject_id", "included", "exclusion", "dx_bl", "dx_bl_raw", "sex", "age",
    "positive_dx", "pu_label", "hidden_positive", "truth", "label_reason",
    "amyloid_suvr", "amyloid_tracer", "n_amyloid", "amyloid_centiloid",
)


def _norm(values: Any) -> set[str]:
    return {str(v).strip().lower() for v in values if v is not None and not pd.isna(v)}


def baseline_diagnosis(group: list[dict]) -> tuple[str | None, str | None, set[str]]:
    """(normalised, raw) baseline diagnosis of one subject's visit records, and all DX_bl seen.

    DX_bl where present; otherwise DX at the ``bl`` visit; otherwise DX at the earliest
    dated visit.
    """
    bl = [(r["dx_bl"], r["dx_bl_raw"]) for r in group if not _empty(r["dx_bl"])]
    if bl:
        return bl[0][0], (bl[0][1] if not _empty(bl[0][1]) else bl[0][0]), {b for b, _ in bl}
    with_dx = [r for r in group if not _empty(r["dx"])]
    at_bl = [r for r in with_dx if r["visit"] == "bl"]
    if at_bl:
        return at_bl[0]["dx"], at_bl[0]["dx_raw"], set()
    if with_dx:
        first = min(with_dx, key=lambda r: (pd.isna(r["examdate"]),
                                            r["examdate"] if pd.notna(r["examdate"]) else 0))
        return first["dx"], first["dx_raw"], set()
    return None, None, set()


def _diagnoses_in_scope(group: list[dict], scanned: set[str], scope: str) -> list[tuple[str, str]]:
    """(value, where) pairs of the diagnoses that count for the label.

    ``any-visit``: DX at every visit and DX_bl; ``scanned-visits``: DX at visits with a
    scan; ``baseline``: DX_bl and DX at the ``bl`` visit.
    """
    out: list[tuple[str, str]] = []
    for rec in group:
        visit = rec["visit"] if isinstance(rec["visit"], str) else "?"
        key = visit if visit != "?" else (
            "date:" + rec["examdate"].strftime("%Y-%m-%d") if pd.notna(rec["examdate"]) else "?")
        if (scope == "any-visit" or (scope == "scanned-visits" and key in scanned)
                or (scope == "baseline" and visit == "bl")):
            out += [(str(v), f"DX at {visit}") for v in (rec["dx_raw"], rec["dx"]) if not _empty(v)]
        if scope in ("any-visit", "baseline"):
            out += [(str(v), "DX_bl") for v in (rec["dx_bl_raw"], rec["dx_bl"]) if not _empty(v)]
    return out


def cutoffs(settings: LabelSettings, tracer: str) -> tuple[float | None, float | None]:
    """(label, truth) cut-offs for one tracer on the settings' scale.

    The label cut-off is ``None`` where an amyloid measure of that tracer makes no label
    (the ``paper`` preset, ``diagnosis_only``, or a tracer missing from ``label_cutoffs``).
    """
    if settings.scale == "centiloid":
        label, truth = settings.centiloid_label_cutoff, settings.centiloid_truth_cutoff
    else:
        label = settings.label_cutoffs.get(tracer)
        truth = settings.truth_cutoffs.get(tracer)
    if settings.diagnosis_only:
        label = None
    return label, truth


def _num(value: Any) -> float | None:
    """A float, or None for a missing value (so equal measures compare equal in a set)."""
    return None if value is None or pd.isna(value) else float(value)


def _nan(value: float | None) -> float:
    return np.nan if value is None else value


def _empty(value: Any) -> bool:
    return value is None or (not isinstance(value, str) and pd.isna(value))


def label_subjects(
    subject_ids: list[str],
    visits: pd.DataFrame,
    scans: pd.DataFrame,
    measures: pd.DataFrame,
    settings: LabelSettings,
    quality: QualityReport,
) -> pd.DataFrame:
    """One row per subject: inclusion, ``pu_label``, ``hidden_positive``, ``truth``, why.

    ``hidden_positive`` is 1 for an unlabelled subject whose truth is positive.

    ``scans`` are the usable, matched scans (with ``visit``, ``suvr``, ``centiloid``,
    ``tracer``, ``suvr_date``); ``measures`` every amyloid measure (used when
    ``amyloid_scope`` is ``any``). The cut-offs compare SUVRs or Centiloids
    (``settings.scale``).
    """
    column = "centiloid" if settings.scale == "centiloid" else "suvr"
    unit = "CL" if settings.scale == "centiloid" else "SUVR"
    positive = _norm(settings.positive_diagnoses)
    include = _norm(settings.include_diagnoses)
    visits_by: dict[str, list[dict]] = {}
    for rec in visits.to_dict("records"):
        visits_by.setdefault(rec["subject_id"], []).append(rec)
    scanned_by: dict[str, set[str]] = {}
    paired_by: dict[str, set[tuple]] = {}
    for subject, visit, tracer, value, suvr, cl, date in zip(
            scans["subject_id"], scans["visit"], scans["tracer"], scans[column], scans["suvr"],
            scans["centiloid"], scans["suvr_date"]):
        if isinstance(visit, str):
            scanned_by.setdefault(subject, set()).add(visit)
        if pd.notna(value):
            paired_by.setdefault(subject, set()).add(
                (tracer, float(value), date, _num(suvr), _num(cl)))
    measures_by: dict[str, list[tuple]] = {}
    for subject, tracer, value, suvr, cl, date in zip(
            measures["subject_id"], measures["tracer"], measures[column], measures["suvr"],
            measures["centiloid"], measures["date"]):
        if pd.notna(value):
            measures_by.setdefault(subject, []).append(
                (tracer, float(value), date, _num(suvr), _num(cl)))
    rows = []
    bl_conflicts, no_cutoff = [], []
    for subject in subject_ids:
        group = visits_by.get(subject, [])
        dx_bl, dx_bl_raw, seen = baseline_diagnosis(group)
        if len(seen) > 1:
            bl_conflicts.append(f"{subject}: DX_bl {sorted(seen)}")
        sexes = [r["sex"] for r in group if not _empty(r["sex"])]
        ages = [r["age"] for r in group if not _empty(r["age"])]
        ages_bl = [r["age"] for r in group if r["visit"] == "bl" and not _empty(r["age"])]
        age = float(ages_bl[0]) if ages_bl else (float(min(ages)) if ages else np.nan)
        row: dict[str, Any] = {
            "subject_id": subject, "dx_bl": dx_bl, "dx_bl_raw": dx_bl_raw,
            "sex": sexes[0] if sexes else None, "age": age,
            "included": True, "exclusion": None,
        }
        if include and not ({str(dx_bl).lower(), str(dx_bl_raw).lower()} & include):
            row["included"] = False
            row["exclusion"] = (f"baseline diagnosis {dx_bl_raw or 'missing'} not in "
                                f"include_diagnoses {settings.include_diagnoses}")

        scanned = scanned_by.get(subject, set())
        dx_hits = [(v, w) for v, w in _diagnoses_in_scope(group, scanned, settings.diagnosis_scope)
                   if v.lower() in positive]
        row["positive_dx"] = bool(dx_hits)

        if settings.amyloid_scope == "paired":
            found = sorted(paired_by.get(subject, set()), key=lambda m: (m[0], m[1]))
        else:
            found = measures_by.get(subject, [])
        label_hit, truth_pos, truth_known = None, False, False
        amyloid_labels = settings.amyloid_labels()
        best_score, best = -np.inf, (np.nan, None, np.nan)
        for tracer, value, _date, suvr, cl in found:
            label_cut, truth_cut = cutoffs(settings, tracer)
            if truth_cut is None or (label_cut is None and amyloid_labels):
                no_cutoff.append(f"{subject}: {tracer} {value:.3f}")
            if label_cut is not None and value >= label_cut and label_hit is None:
                label_hit = f"{tracer} {unit} {value:.{1 if unit == 'CL' else 3}f} >= {label_cut:g}"
            if truth_cut is not None:
                truth_known = True
                truth_pos = truth_pos or value >= truth_cut
                # The deciding measure: highest SUVR relative to its cut-off, highest CL.
                score = value - truth_cut if unit == "CL" else value / truth_cut
                if score > best_score:
                    best_score, best = score, (_nan(suvr), tracer, _nan(cl))
        if settings.truth_from_diagnosis and dx_hits:
            truth_known = truth_pos = True
        pu = bool(dx_hits) or label_hit is not None
        reasons = [f"{dx_hits[0][0]} ({dx_hits[0][1]})"] if dx_hits else []
        if label_hit:
            reasons.append(label_hit)
        row.update({
            "pu_label": int(pu),
            "hidden_positive": int(truth_pos and not pu),
            "truth": (1 if truth_pos else 0) if truth_known else pd.NA,
            "label_reason": "; ".join(reasons) or None,
            "amyloid_suvr": best[0], "amyloid_tracer": best[1], "n_amyloid": int(len(found)),
            "amyloid_centiloid": best[2],
        })
        rows.append(row)
    quality.add("conflicting_baseline_diagnosis", "clinical", len(bl_conflicts),
                "subjects whose rows disagree on DX_bl", "used the first row's DX_bl",
                bl_conflicts)
    quality.add("tracer_without_cutoff", "labels", len(no_cutoff),
                "amyloid measures of a tracer with no label or truth cut-off set",
                "not used for that decision; set labels.label_cutoffs / truth_cutoffs "
                "(or use --preset centiloid)",
                no_cutoff)
    out = pd.DataFrame(rows, columns=list(SUBJECT_COLUMNS))
    out["truth"] = out["truth"].astype("Int64")
    return out

"""Scan <-> visit matching (code, alias, date) and nearest amyloid within a window."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from adni_pu.cohort.config import MatchingSettings
from adni_pu.cohort.matching import attach_visits, match_amyloid, match_visits

T = pd.Timestamp


def visits_table() -> pd.DataFrame:
    return pd.DataFrame({
        "subject_id": ["A", "A", "A"],
        "visit": ["bl", "m06", "m12"],
        "examdate": [T("2010-01-01"), T("2010-07-01"), T("2011-01-01")],
        "dx": ["CN", "MCI", "MCI"], "dx_raw": ["CN", "MCI", "MCI"],
        "age": [70.0, 70.0, 70.0], "sex": ["F", "F", "F"],
    })


def scans_table(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["subject_id", "session_id", "scan_date"]).astype(
        {"scan_date": "datetime64[ns]"})


def test_visits_by_code_alias_and_date_within_window():
    scans = scans_table([
        ("A", "m06", None),                # same code
        ("A", "sc", None),                 # alias sc -> bl
        ("A", "m36", T("2011-01-20")),     # no m36 row; m12 is 19 days away
        ("A", "m48", T("2012-06-01")),     # nearest visit 517 days away: none
        ("B", "bl", None),                 # subject unknown
    ])
    out = match_visits(scans, visits_table(), MatchingSettings(visit_window_days=90))
    assert out["visit"].tolist() == ["m06", "bl", "m12", None, None]
    assert out["visit_match"].tolist() == ["code", "alias:bl", "date", "none", "none"]
    assert out["visit_gap_days"].iloc[2] == pytest.approx(-19.0)
    attached = attach_visits(out, visits_table())
    assert attached["scan_date"].iloc[0] == T("2010-07-01")   # from the visit
    assert attached["scan_date"].iloc[2] == T("2011-01-20")   # its own date wins
    assert attached["dx"].iloc[1] == "CN"
    narrow = match_visits(scans, visits_table(), MatchingSettings(visit_window_days=10))
    assert narrow["visit_match"].iloc[2] == "none"


def measures_table(rows) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["subject_id", "date", "tracer", "suvr"])
    frame["date"] = pd.to_datetime(frame["date"])
    return frame


def test_nearest_amyloid_within_window_and_signed_gap():
    scans = scans_table([("A", "bl", T("2010-01-01")), ("A", "m06", T("2010-07-01")),
                         ("A", "m60", T("2015-01-01")), ("C", "bl", T("2010-01-01"))])
    measures = measures_table([
        ("A", "2009-12-01", "AV45", 1.00),
        ("A", "2010-08-01", "AV45", 1.20),
        ("A", "2010-08-01", "FBB", 1.30),
        ("C", "2008-01-01", "AV45", 1.50),
    ])
    out, outside = match_amyloid(scans, measures, MatchingSettings(amyloid_window_days=365))
    assert out["suvr"].iloc[0] == pytest.approx(1.00)
    assert out["suvr_gap_days"].iloc[0] == pytest.approx(-31.0)     # PET before MRI
    assert out["suvr"].iloc[1] == pytest.approx(1.20)               # tie: AV45 listed first
    assert out["tracer"].iloc[1] == "AV45"
    assert out["suvr_gap_days"].iloc[1] == pytest.approx(31.0)
    assert np.isnan(out["suvr"].iloc[2]) and outside.iloc[2] > 365  # too far: not paired
    assert np.isnan(out["suvr"].iloc[3]) and outside.iloc[3] == pytest.approx(731.0)
    fbb_first = MatchingSettings(tracer_priority=["FBB", "AV45", "PIB"])
    out, _ = match_amyloid(scans, measures, fbb_first)
    assert out["tracer"].iloc[1] == "FBB" and out["suvr"].iloc[1] == pytest.approx(1.30)
    wide, _ = match_amyloid(scans, measures, MatchingSettings(amyloid_window_days=4000))
    assert wide["suvr"].iloc[2] == pytest.approx(1.20)


def test_equal_distance_goes_to_the_earlier_measure():
    scans = scans_table([("A", "bl", T("2010-01-01"))])
    measures = measures_table([("A", "2010-01-31", "AV45", 1.3), ("A", "2009-12-02", "AV45", 1.0)])
    out, _ = match_amyloid(scans, measures, MatchingSettings())
    assert out["suvr"].iloc[0] == pytest.approx(1.0)


def test_scan_without_date_gets_no_measure():
    scans = scans_table([("A", "bl", None)])
    measures = measures_table([("A", "2010-01-01", "AV45", 1.3)])
    out, outside = match_amyloid(scans, measures, MatchingSettings())
    assert np.isnan(out["suvr"].iloc[0]) and np.isnan(outside.iloc[0])

"""Normalising one clinical value: visit codes, diagnoses, sex, dates and numbers.

ADNI tables spell these many ways (``m06``/``M6``/``ses-M006``, ``Dementia``/``AD``,
``9/8/2005``/``2005-09-08``); the cohort builder reads every table through these, so two
tables that spell a value differently still agree. Subject ids are in
:mod:`adni_pu.cohort.ids`.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

_MONTH = re.compile(r"^(?:ses-)?(?:m|month)[-_]?(\d{1,3})$", re.IGNORECASE)
_YEAR = re.compile(r"^(?:ses-)?(?:y|year)[-_]?(\d{1,2})$", re.IGNORECASE)


def _missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and np.isnan(value):
        return True
    if value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, str) and value.strip() == ""


def normalise_visit(value: Any) -> str | None:
    """Canonical ADNI visit code: ``bl``, ``sc``, ``scmri``, ``nv``, ``m06``, ``m12``, ...

    BIDS sessions map by month (``ses-M000`` -> ``bl``, ``ses-M006`` -> ``m06``,
    ``ses-M108`` -> ``m108``); ``m6``, ``M06`` and ``month6`` -> ``m06``; ``y1`` ->
    ``m12``. Other codes (``init``, ``uns1``, ...) are kept in lower case.
    """
    if _missing(value):
        return None
    text = str(value).strip().lower()
    if text.startswith("ses-"):
        text = text[4:]
    if text in {"bl", "baseline", "m0", "m00", "m000"}:
        return "bl"
    match = _MONTH.match(text)
    if match:
        month = int(match.group(1))
        return "bl" if month == 0 else f"m{month:02d}"
    match = _YEAR.match(text)
    if match:
        month = 12 * int(match.group(1))
        return "bl" if month == 0 else f"m{month:02d}"
    return text or None


_DX = {
    "cn": "CN", "nl": "CN", "normal": "CN", "smc": "CN",
    "mci": "MCI", "emci": "MCI", "lmci": "MCI",
    "ad": "AD", "dementia": "AD",
}


def normalise_diagnosis(value: Any) -> str | None:
    """Diagnosis as CN, MCI or AD (ADNIMERGE DX, DX_bl and older "NL to MCI" forms).

    DX_bl's SMC counts as CN, EMCI and LMCI as MCI; DX's Dementia as AD. A conversion such
    as ``MCI to Dementia`` gives the diagnosis reached. Unknown text raises ``ValueError``;
    empty values give ``None``.
    """
    if _missing(value):
        return None
    text = str(value).strip().lower()
    if " to " in text:
        text = text.rsplit(" to ", 1)[1].strip()
    if text not in _DX:
        raise ValueError(f"unknown diagnosis {value!r}")
    return _DX[text]


def normalise_sex(value: Any) -> str | None:
    """``M`` or ``F`` from Male/Female/M/F/1/2 (ADNI codes 1 male, 2 female)."""
    if _missing(value):
        return None
    text = str(value).strip().lower()
    if text in {"m", "male", "1", "man"}:
        return "M"
    if text in {"f", "female", "2", "woman"}:
        return "F"
    raise ValueError(f"unknown sex {value!r}")


def parse_dates(values: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Dates from ISO text (``2005-09-08``) or ADNI's US form (``9/8/2005``).

    Returns the parsed dates (NaT where missing or unreadable) and a mask of the
    values that were present but could not be read.
    """
    text = values.astype("string").str.strip()
    present = text.notna() & (text != "")
    out = pd.to_datetime(text.where(present), format="ISO8601", errors="coerce")
    retry = present & out.isna()
    if retry.any():
        us = pd.to_datetime(text[retry], format="%m/%d/%Y", errors="coerce")
        out = out.copy()
        out[retry] = us
    bad = present & out.isna()
    return out.astype("datetime64[ns]"), bad


_TWO_DIGIT_YEAR = re.compile(r"^\d{1,2}[/.-]\d{1,2}[/.-]\d{2}$")
DATE_FORMATS = "YYYY-MM-DD (2016-05-24) or M/D/YYYY (5/24/2016)"


def date_problem(values: pd.Series) -> str:
    """What is wrong with unreadable date texts, in words (the formats read, and why not)."""
    texts = list(dict.fromkeys(str(v).strip() for v in values if not _missing(v)))
    if texts and all(_TWO_DIGIT_YEAR.match(t) for t in texts):
        return (f"expected dates as {DATE_FORMATS}; found MM/DD/YY dates with two-digit "
                f"years, e.g. {texts[:3]}, which are not read (the century is not written): "
                "export the table again with four-digit years")
    return f"expected dates as {DATE_FORMATS}; found {texts[:3]}"


def parse_numbers(values: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Floats from text; returns the numbers (NaN where missing or unreadable) and a mask
    of the values that were present but were not numbers."""
    text = values.astype("string").str.strip()
    present = text.notna() & (text != "")
    out = pd.to_numeric(text.where(present), errors="coerce").astype("float64")
    bad = present & (out.isna() | ~np.isfinite(out.fillna(0.0)))
    out = out.where(~bad)
    return out, bad

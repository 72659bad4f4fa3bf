"""A subject's identity: its canonical id, whatever the spelling of the table or file name.

ADNI writes one participant's PTID many ways: ``002_S_0004`` (ADNIMERGE), ``002-S-0004``,
``ADNI_002_S_0004`` (ADNI's own file names), ``ADNI002S0004`` and ``sub-ADNI002S0004``
(Clinica's adni-to-bids), ``002s0004``, in any case. :func:`normalise_subject_id` maps each
to one key, ``002_S_0004``, and every place that compares subjects (the cohort builder,
the manifest checks, the leakage guard of train and evaluate) compares that key, so a
subject spelled two ways is one subject. An id that looks like a PTID but is not one
(``02_S_4``, ``002_S_04x``) is kept as written, with a :class:`SubjectIdWarning` naming
it, since it matches no other spelling of its subject. Other cohorts' ids are kept as they
are (less a BIDS ``sub-`` prefix).
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from adni_pu.cohort.values import _missing
from adni_pu.errors import AdniPuWarning

#: An ADNI PTID in any spelling: an optional ``sub-`` and ``ADNI`` prefix, the 3-digit site,
#: ``S`` and the roster number (4 digits; ADNI4 has 5), with ``_``, ``-`` or nothing between.
_PTID = re.compile(r"^(?:sub-)?(?:ADNI)?[_-]?(\d{3})[_-]?S[_-]?(\d{4,5})$", re.IGNORECASE)
#: What a PTID spelled wrongly looks like: digits, ``S`` and a digit, with separators or
#: the ``ADNI`` prefix (``02_S_4``, ``002_S_04x``, ``ADNI_2_S_4``).
_PTID_LIKE = re.compile(r"^(?:sub-)?(?:ADNI[_-]?)?\d{1,6}[_-]?S[_-]?\d[\w-]*$", re.IGNORECASE)
_RID = re.compile(r"^\d+(?:\.0+)?$")


class SubjectIdWarning(AdniPuWarning):
    """A subject id that looks like an ADNI PTID but does not parse as one."""


def normalise_subject_id(value: Any) -> str | None:
    """Canonical subject id: ADNI PTID ``011_S_0002`` where the value is one.

    Accepts PTIDs in every spelling ADNI and BIDS use (``011_S_0002``, ``011-S-0002``,
    ``ADNI_011_S_0002``, ``ADNI011S0002``, ``sub-ADNI011S0002``, ``011s0002``, any case)
    and bare RIDs (``2`` -> ``"2"``, resolved to a PTID later through the clinical table).
    Other ids lose a leading ``sub-`` and are kept as they are, so non-ADNI tables work
    too; one that looks like a PTID but does not parse is kept with a
    :class:`SubjectIdWarning`. Empty values give ``None``.
    """
    if _missing(value):
        return None
    text = str(value).strip()
    match = _PTID.match(text)
    if match:
        return f"{match.group(1)}_S_{match.group(2)}"
    if _RID.match(text):
        return str(int(float(text)))
    if _PTID_LIKE.match(text):
        warnings.warn(f"subject id {text!r} looks like an ADNI PTID but is not one (expected "
                      "NNN_S_NNNN: a 3-digit site, S and a 4- or 5-digit roster number, as "
                      "002_S_0004); it is kept as written, so it matches no other spelling "
                      "of its subject", SubjectIdWarning, stacklevel=2)
    if text.lower().startswith("sub-"):
        text = text[4:]
    return text or None


_USABLE_ID = re.compile(r"^\w[\w.-]*$")
_NO_PATH = re.compile(r"^[^/\\.\x00-\x1f][^/\\\x00-\x1f]*$")


def usable_id(value: str | None, strict: bool = True) -> bool:
    """Whether a normalised subject (``strict``) or session id can be part of a file name
    (``scan_id`` ``sub-<subject>_ses-<session>``). A subject id holds letters, digits,
    ``_``, ``-`` and ``.``, starting with a letter, digit or ``_``: ``../../x`` and
    ``/etc/x`` are not ids (an ADNI PTID is ``NNN_S_NNNN``). A session only may not hold a
    path separator or a control character, nor start with a dot. None (no id) is left to
    the missing-id checks."""
    return value is None or bool((_USABLE_ID if strict else _NO_PATH).match(str(value)))


def is_rid(subject_id: str | None) -> bool:
    """Whether a normalised subject id is a bare ADNI RID (digits only)."""
    return bool(subject_id) and str(subject_id).isdigit()


def scans_by_subject(frame: Any) -> Any:
    """``frame`` with each ``subject_id`` in its canonical form
    (:func:`~adni_pu.cohort.ids.normalise_subject_id`), so a subject spelled two ways
    (``002_S_0004``, ``ADNI_002_S_0004``) is counted once when rows are grouped by subject."""
    return frame.assign(subject_id=[normalise_subject_id(s) or str(s)
                                    for s in frame["subject_id"]])

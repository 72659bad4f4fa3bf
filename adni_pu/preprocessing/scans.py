"""Scan records and the naming rules of discovery: a leaf module of preprocessing.

:class:`Scan` (who, which visit, where), :class:`Excluded` and :class:`Discovery`, the
BIDS-style labels of output files, the name rules of single files, DICOM detection and
date parsing. Both :mod:`.io` (discovery and reading) and :mod:`.adni_layout` (ADNI
downloads) import these; this module imports neither, so they form no import circle.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from adni_pu.errors import ScanError

NIFTI_SUFFIXES = (".nii", ".nii.gz")


@dataclass(frozen=True)
class Scan:
    """One input scan: who, which visit, and where it lives (a file or a DICOM folder).

    ``acquisition_date`` (``YYYY-MM-DD``), ``image_id`` and ``series_description`` are
    known for an ADNI download (and from a CSV that has them); they go into summary.csv,
    where the cohort builder matches the scan to its clinical visit by date.
    """

    subject_id: str
    session_id: str
    path: Path
    acquisition_date: str = ""
    image_id: str = ""
    series_description: str = ""

    def summary_fields(self) -> dict[str, str]:
        """This scan's identifying columns of summary.csv."""
        return {"subject_id": self.subject_id, "session_id": self.session_id,
                "acquisition_date": self.acquisition_date, "image_id": self.image_id,
                "series_description": self.series_description, "input_path": str(self.path)}

    @property
    def label(self) -> str:
        """BIDS-style prefix of every output file of this scan."""
        return f"sub-{bids_label(self.subject_id)}_ses-{bids_label(self.session_id)}"

    def out_dir(self, output: Path) -> Path:
        """Folder of this scan's anatomical outputs under ``output`` (BIDS ``anat``; its QC
        picture goes to ``sub-S/figures/``)."""
        return (
            Path(output)
            / f"sub-{bids_label(self.subject_id)}"
            / f"ses-{bids_label(self.session_id)}"
            / "anat"
        )


DEFAULT_SESSION = "01"

#: summary.csv statuses of inputs found but not processed (see :class:`Excluded`).
NOT_T1 = "not-t1"
EXTRA_T1 = "extra-t1"


@dataclass(frozen=True)
class Excluded:
    """An input found but not processed, and why: a series that is not a T1 (``not-t1``),
    a T1 beaten by another of the same visit (``extra-t1``), or an image folder that
    cannot be used (``failed``). Each becomes a summary.csv row with the reason in ``error``.
    """

    scan: Scan
    status: str
    reason: str

    def row(self) -> dict:
        """This input's summary.csv row."""
        return {**self.scan.summary_fields(), "status": self.status, "preprocessed_path": "",
                "error": self.reason, "seconds": 0.0}


@dataclass
class Discovery:
    """What :func:`discover` found: the scans to process and the inputs left out."""

    scans: list[Scan]
    excluded: list[Excluded]


#: Prefix of the label of an identifier with no ASCII letters or digits (:func:`bids_label`).
HASHED_LABEL_PREFIX = "hash"


def bids_label(text: str) -> str:
    """``text`` with everything but ASCII letters and digits removed (BIDS labels are
    alphanumeric ASCII).

    An identifier with none of them (a name in another script, Chinese say) still names a
    scan: its label is :data:`HASHED_LABEL_PREFIX` and the first 12 hex digits of the
    SHA-256 of its UTF-8 bytes (``hash8d1e9cbbf0a3``): stable from run to run, so a rerun
    resumes, and distinct for distinct names. The identifier itself stays in summary.csv
    and the sidecar (``subject_id``, ``session_id``) beside the label (``scan_label``).
    Only an empty identifier is refused.
    """
    text = str(text)
    label = re.sub(r"[^A-Za-z0-9]", "", text)
    if label:
        return label
    if not text.strip():
        raise ScanError(f"identifier {text!r} is empty; expected a name to give its files")
    return HASHED_LABEL_PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _is_nifti(path: Path) -> bool:
    return path.is_file() and path.name.lower().endswith(NIFTI_SUFFIXES)


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".nii.gz", ".nii"):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def _bids_entity(name: str, key: str) -> str | None:
    match = re.search(rf"(?:^|_){key}-([A-Za-z0-9]+)", name)
    return match.group(1) if match else None


def scan_from_file(path: Path) -> Scan:
    """The scan of one NIfTI file outside a BIDS tree: a BIDS-style name
    (``sub-01_ses-M12_run-2_T1w.nii.gz``) gives its subject and session (run appended, as in
    a BIDS tree); any other name is the subject, with the default session."""
    stem = _stem(path)
    subject = _bids_entity(stem, "sub")
    if subject is None:
        return Scan(stem, DEFAULT_SESSION, path)
    session = _bids_entity(stem, "ses") or DEFAULT_SESSION
    run = _bids_entity(stem, "run")
    return Scan(subject, f"{session}run{run}" if run is not None else session, path)


def _looks_like_dicom(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            handle.seek(128)
            return handle.read(4) == b"DICM"
    except OSError:
        return False


def _dicom_dirs(root: Path) -> list[Path]:
    found = []
    for folder, _dirs, files in os.walk(root):
        files = [f for f in files if not f.startswith(".")]
        if any(_looks_like_dicom(Path(folder) / f) for f in files[:5]):
            found.append(Path(folder))
    return sorted(found)


def parse_date(text: str) -> str | None:
    """``YYYY-MM-DD`` from an ISO date (time allowed) or ADNI's ``m/d/YYYY``; None if neither."""
    text = text.strip()
    match = re.match(r"^(\d{4})-(\d{1,2})-(\d{1,2})(?:$|[ T_])", text)
    if match:
        parts = (match.group(1), match.group(2), match.group(3))
    else:
        match = re.match(r"^(\d{1,2})/(\d{1,2})/(\d{4})$", text)
        if not match:
            return None
        parts = (match.group(3), match.group(1), match.group(2))
    try:
        return dt.date(int(parts[0]), int(parts[1]), int(parts[2])).isoformat()
    except ValueError:
        return None

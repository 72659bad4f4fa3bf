"""ADNI's own download layout: ``ADNI/<PTID>/<series description>/<date_time>/<image ID>/``.

An IDA download (NIfTI or DICOM) puts each image in a folder named by its image ID
(``I238623``), under its acquisition date and time (``2011-05-02_13_45_10.0``), under its
series description with spaces and punctuation turned into underscores
(``Accelerated_Sagittal_MPRAGE``, ``MPR__GradWarp__B1_Correction__N3__Scaled``), under the
subject's PTID (``011_S_0002``). Read here: subject = PTID, session = acquisition date
(``20110502``), the date, image ID and series description kept in the scan record; T1
series kept and the others skipped by description; one T1 per subject and date chosen by
the rule of :class:`~adni_pu.preprocessing.config.DiscoverySettings`. Everything left out
is returned with its reason, for summary.csv.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from .config import DiscoverySettings
from .scans import (
    DEFAULT_SESSION,
    EXTRA_T1,
    NOT_T1,
    Excluded,
    Scan,
    _dicom_dirs,
    _is_nifti,
    _looks_like_dicom,
    parse_date,
)

#: An ADNI PTID folder: site, ``S``, roster number (``011_S_0002``; ADNI4 has 5 digits).
PTID = re.compile(r"^\d{3}_S_\d{4,5}$", re.IGNORECASE)
#: An acquisition date(-time) folder: ``2011-05-02_13_45_10.0`` (the time part optional).
DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}(?:_\d{2}_\d{2}_\d{2}(?:\.\d+)?)?$")
LAYOUT = "<PTID>/<series description>/<date_time>/<image ID>/"


def _dirs(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def _subject_dirs(root: Path) -> list[Path]:
    """The PTID folders of ``root``, of ``root/ADNI``, or ``root`` itself when it is one."""
    if PTID.match(root.name):
        return [root]
    for base in (root, root / "ADNI"):
        found = [p for p in _dirs(base) if PTID.match(p.name)]
        if found:
            return found
    return []


def is_adni_download(root: Path) -> bool:
    """Whether ``root`` holds PTID folders with ``<series>/<date_time>/`` folders below."""
    return any(DATE_TIME.match(d.name) for subject in _subject_dirs(root)
               for series in _dirs(subject) for d in _dirs(series))


def _search(patterns: tuple[str, ...], text: str) -> int | None:
    """Index of the first pattern found in ``text`` (case-insensitive), or None."""
    for i, pattern in enumerate(patterns):
        if re.search(pattern, text, re.IGNORECASE):
            return i
    return None


def _text(description: str) -> str:
    """What the patterns are matched against: lower case, underscores read as spaces."""
    return description.lower().replace("_", " ")


def series_skip_reason(description: str, settings: DiscoverySettings) -> str | None:
    """None for a T1 series to keep; otherwise why the series is skipped."""
    text = _text(description)
    i = _search(settings.skip_series, text)
    if i is not None:
        return (f"series {description!r} is not a T1 scan (matches discovery.skip_series "
                f"pattern {settings.skip_series[i]!r})")
    if _search(settings.t1_series, text) is None:
        return f"series {description!r} is not a T1 scan (matches no discovery.t1_series pattern)"
    return None


@dataclass(frozen=True)
class _Candidate:
    scan: Scan
    date_time: str
    run: int


def _rank(c: _Candidate, settings: DiscoverySettings) -> tuple:
    """Sort key of the per-visit rule: preference, not a fallback, time, image ID, file."""
    text = _text(c.scan.series_description)
    pref = _search(settings.prefer_series, text)
    digits = re.sub(r"\D", "", c.scan.image_id)
    return (len(settings.prefer_series) if pref is None else pref,
            _search(settings.fallback_series, text) is not None,
            c.date_time, int(digits) if digits else float("inf"), c.scan.image_id,
            str(c.scan.path))


_WHY = ("its series comes earlier in discovery.prefer_series",
        "this series is a repeat or a copy: discovery.fallback_series",
        "it was acquired earlier that day", "its image ID is smaller",
        "its image ID is smaller", "its file name comes first")


def _image_folder(ptid: str, folder: Path, rel: tuple[str, ...],
                  settings: DiscoverySettings) -> tuple[list[_Candidate], list[Excluded]]:
    series, date_time, image_id = rel
    date = parse_date(date_time.split("_")[0]) if DATE_TIME.match(date_time) else None
    stub = Scan(ptid, (date or "").replace("-", "") or DEFAULT_SESSION, folder, date or "",
                image_id, series)
    if date is None:
        return [], [Excluded(stub, "failed", (
            f"{folder}: expected an acquisition date folder such as 2011-05-02_13_45_10.0 "
            f"above the image ID folder ({LAYOUT}), found {date_time!r}"))]
    why = series_skip_reason(series, settings)
    if why is not None:
        return [], [Excluded(stub, NOT_T1, why)]
    images = sorted(p for p in folder.rglob("*") if _is_nifti(p) and not p.name.startswith("."))
    if not images:
        images = _dicom_dirs(folder)
    if not images:
        return [], [Excluded(stub, "failed", (
            f"{folder}: expected NIfTI (.nii/.nii.gz) or DICOM files in this image folder, "
            "found none"))]
    return [_Candidate(replace(stub, path=p), date_time, k) for k, p in enumerate(images)], []


def _misplaced(folder: Path, files: list[str]) -> bool:
    """Whether ``folder`` itself holds image files (it should not, above an image folder)."""
    names = [f for f in files if not f.startswith(".")]
    return any(_is_nifti(folder / f) for f in names) or any(
        _looks_like_dicom(folder / f) for f in names[:5])


def discover_adni(root: Path, settings: DiscoverySettings) -> tuple[list[Scan], list[Excluded]]:
    """Scans of an ADNI download and the inputs left out (not T1, extra T1, unusable)."""
    candidates: list[_Candidate] = []
    excluded: list[Excluded] = []
    for subject_dir in _subject_dirs(root):
        ptid = subject_dir.name
        for folder, dirs, files in os.walk(subject_dir):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            rel = Path(folder).relative_to(subject_dir).parts
            if len(rel) == 3:
                dirs[:] = []
                found, left = _image_folder(ptid, Path(folder), rel, settings)
                candidates += found
                excluded += left
            elif _misplaced(Path(folder), files):
                excluded.append(Excluded(Scan(ptid, DEFAULT_SESSION, Path(folder)), "failed", (
                    f"{folder}: image files outside ADNI's layout (expected them in "
                    f"{LAYOUT})")))
    groups: dict[tuple[str, str], list[_Candidate]] = {}
    for c in candidates:
        groups.setdefault((c.scan.subject_id, c.scan.acquisition_date), []).append(c)
    scans: list[Scan] = []
    for group in groups.values():
        ordered = sorted(group, key=lambda c: _rank(c, settings))
        if settings.per_visit == "all":
            for c in ordered:
                run = f"run{c.run + 1}" if c.run else ""
                scans.append(replace(c.scan, session_id=c.scan.session_id + c.scan.image_id + run))
            continue
        best = ordered[0]
        scans.append(best.scan)
        best_key = _rank(best, settings)
        for other in ordered[1:]:
            key = _rank(other, settings)
            why = _WHY[next(i for i, (a, b) in enumerate(zip(best_key, key)) if a != b)]
            excluded.append(Excluded(other.scan, EXTRA_T1, (
                f"another T1 of {best.scan.subject_id} on {best.scan.acquisition_date} is "
                f"processed instead: {best.scan.series_description} {best.scan.image_id} "
                f"({why}; discovery.per_visit=one)")))
    scans.sort(key=lambda s: (s.subject_id, s.session_id))
    excluded.sort(key=lambda e: (e.scan.subject_id, e.scan.session_id, str(e.scan.path)))
    return scans, excluded

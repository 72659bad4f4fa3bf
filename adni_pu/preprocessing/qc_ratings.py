"""Visual QC ratings: a rater's pass / fail / unsure per scan, as a TSV file.

``qc_ratings.tsv`` has one header line and one line per rated scan::

    scan_id<TAB>rating<TAB>note<TAB>rater<TAB>date
    sub-002S0002_ses-bl<TAB>fail<TAB>mask cuts the occipital lobe<TAB>ab<TAB>2026-12-07T08:02:11Z

``scan_id`` is the scan's label in the preprocessing folder (``scan_label`` of its sidecar,
``sub-<subject>_ses-<session>``), ``rating`` one of :data:`RATINGS`. The HTML report
(:mod:`.qc_report`) writes it (a download), ``adni-pu qc OUTPUT --ratings FILE`` loads it
back into the report (to resume), ``adni-pu qc OUTPUT --merge A --merge B`` merges two
raters' files, and ``adni-pu cohort build --qc-ratings FILE`` leaves out the scans rated
fail. A file that names a scan the folder does not hold, holds a rating that is not one of
:data:`RATINGS`, or rates one scan twice is refused with the line that does it.
"""

from __future__ import annotations

import datetime as _dt
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from adni_pu.errors import DataFormatError
from adni_pu.fileio import atomic_write_text

RATINGS = ("pass", "fail", "unsure")
COLUMNS = ("scan_id", "rating", "note", "rater", "date")


@dataclass(frozen=True)
class Rating:
    """One scan's rating by one rater (``line``: where it was read, 0 when made here)."""

    scan_id: str
    rating: str
    note: str = ""
    rater: str = ""
    date: str = ""
    line: int = 0


def _clean(text: str) -> str:
    """One TSV field: tabs and line breaks become spaces."""
    return " ".join(str(text).replace("\t", " ").splitlines()).strip()


def read_ratings(path: str | Path, known: Iterable[str] | None = None) -> dict[str, Rating]:
    """The ratings of ``path``, scan id -> :class:`Rating`, checked line by line.

    ``known``: the scan ids of the folder the ratings are for; a line naming another scan
    is refused. Raises :class:`DataFormatError` naming the file and the line.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError as exc:
        raise DataFormatError(f"{path}: ratings file not found (expected a qc_ratings.tsv "
                              "saved from the QC report, OUTPUT/qc/index.html)") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{path}: cannot read the ratings file ({exc})") from exc
    lines = text.splitlines()
    header = lines[0].split("\t") if lines else []
    if [h.strip().lower() for h in header] != list(COLUMNS):
        raise DataFormatError(f"{path} line 1: expected the header {chr(9).join(COLUMNS)!r} "
                              f"(tab-separated), found {lines[0][:80]!r}" if lines else
                              f"{path}: empty file; expected a header line "
                              f"{chr(9).join(COLUMNS)!r}")
    known_ids = None if known is None else set(known)
    out: dict[str, Rating] = {}
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != len(COLUMNS):
            raise DataFormatError(f"{path} line {number}: expected {len(COLUMNS)} tab-separated "
                                  f"fields ({', '.join(COLUMNS)}), found {len(fields)}")
        scan_id, rating, note, rater, date = (f.strip() for f in fields)
        if rating.lower() not in RATINGS:
            raise DataFormatError(f"{path} line {number}: rating {rating!r} of {scan_id!r} is "
                                  f"not one of {', '.join(RATINGS)}")
        if known_ids is not None and scan_id not in known_ids:
            raise DataFormatError(f"{path} line {number}: scan {scan_id!r} is not in the "
                                  "preprocessing folder (expected a scan_label of one of its "
                                  "sidecars, e.g. sub-<subject>_ses-<session>)")
        if scan_id in out:
            raise DataFormatError(f"{path} line {number}: scan {scan_id!r} is rated twice "
                                  f"(first on line {out[scan_id].line}); keep one line per scan")
        out[scan_id] = Rating(scan_id, rating.lower(), note, rater, date, number)
    return out


def ratings_text(ratings: Iterable[Rating]) -> str:
    """The TSV text of ``ratings`` (header first; tabs and line breaks in fields become
    spaces)."""
    rows = ["\t".join(COLUMNS)]
    rows += ["\t".join(_clean(v) for v in (r.scan_id, r.rating, r.note, r.rater, r.date))
             for r in ratings]
    return "\n".join(rows) + "\n"


def keep_copy(path: Path) -> Path | None:
    """Copy an existing ``path`` to ``<name>.<UTC time>.bak`` beside it before it is replaced
    (a ratings file is a person's work: never lost to a rewrite); the copy's path, or None."""
    if not path.exists():
        return None
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    copy = path.with_name(f"{path.name}.{stamp}.bak")
    shutil.copy2(path, copy)
    return copy


def write_ratings(path: str | Path, ratings: Iterable[Rating]) -> tuple[Path, Path | None]:
    """Write ``ratings`` to ``path`` atomically, first copying a file already there
    (:func:`keep_copy`); returns the path and the copy (or None)."""
    path = Path(path)
    copy = keep_copy(path)
    return atomic_write_text(path, ratings_text(ratings)), copy


@dataclass(frozen=True)
class Disagreement:
    """A scan two raters rated differently."""

    scan_id: str
    first: Rating
    second: Rating


def merge_ratings(first: dict[str, Rating], second: dict[str, Rating]
                  ) -> tuple[list[Rating], list[Disagreement]]:
    """Two raters' ratings as one list, and where they disagree.

    A scan rated alike by both keeps that rating (the notes joined); a scan rated by one
    only keeps that one's rating; a scan rated differently becomes ``unsure`` with both
    ratings in its note, so it is kept by ``cohort build`` until a third look (load the
    merged file into the report and rate it) settles it. Order: the first file's scans,
    then the second's.
    """
    merged: list[Rating] = []
    disagreements: list[Disagreement] = []
    for scan_id in dict.fromkeys([*first, *second]):
        a, b = first.get(scan_id), second.get(scan_id)
        if a is None or b is None:
            merged.append(_unplaced(a or b))  # type: ignore[arg-type]
            continue
        raters = "+".join(dict.fromkeys(x for x in (a.rater, b.rater) if x))
        date = max(a.date, b.date)
        if a.rating == b.rating:
            note = "; ".join(dict.fromkeys(n for n in (a.note, b.note) if n))
            merged.append(Rating(scan_id, a.rating, note, raters, date))
            continue
        disagreements.append(Disagreement(scan_id, a, b))
        note = " / ".join(f"{r.rater or '?'}: {r.rating}" + (f" ({r.note})" if r.note else "")
                          for r in (a, b))
        merged.append(Rating(scan_id, "unsure", "raters disagree: " + note, raters, date))
    return merged, disagreements


def _unplaced(r: Rating) -> Rating:
    return Rating(r.scan_id, r.rating, r.note, r.rater, r.date)


def disagreements_text(disagreements: list[Disagreement]) -> str:
    """TSV of the disagreements: scan id, each rater's rating and note."""
    rows = ["scan_id\trater_1\trating_1\tnote_1\trater_2\trating_2\tnote_2"]
    for d in disagreements:
        rows.append("\t".join(_clean(v) for v in (
            d.scan_id, d.first.rater, d.first.rating, d.first.note, d.second.rater,
            d.second.rating, d.second.note)))
    return "\n".join(rows) + "\n"

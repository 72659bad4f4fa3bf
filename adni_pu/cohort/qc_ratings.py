"""Visual QC ratings in the cohort: ``cohort build --qc-ratings qc_ratings.tsv``.

A scan rated ``fail`` is left out of the manifest and listed in ``excluded.csv`` with the
rater and the rater's note, the way every other exclusion is (``build_cohort``'s
``exclude``). A scan rated ``unsure`` is kept: an automatic refusal already removes what
the checks can see, and a doubt is not a verdict; the unsure scans are counted and named in
the data-quality issues (``scan_rated_unsure``) so the report shows them, and a rater who
wants one out rates it ``fail``. ``pass`` and unrated scans are kept.

The ratings name scans by their label in the preprocessing folder (the ``scan_label`` of
each sidecar); a row of the scan table (``summary.csv``) is matched to its label by its
``preprocessed_path``, which the sidecar records among its outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from adni_pu.cohort.quality import QualityReport
from adni_pu.errors import CohortInputError


def _labels_by_volume(folder: Path) -> tuple[list[str], dict[Path, str]]:
    """The scan ids of preprocessing ``folder`` and preprocessed volume -> scan id (of the
    scans that have a volume)."""
    from adni_pu.preprocessing.qc_group import load_sidecars
    from adni_pu.preprocessing.qc_report import scan_id

    records = load_sidecars(folder)
    by_volume: dict[Path, str] = {}
    for r in records:
        volume = (r.get("outputs") or {}).get("preproc")
        if volume:  # relative to the folder (BIDS layout) or to the sidecar (earlier layout)
            for base in (folder, Path(r["_sidecar"]).parent):
                by_volume[(base / volume).resolve()] = scan_id(r)
    return [scan_id(r) for r in records], by_volume


def apply_qc_ratings(scan_table: pd.DataFrame, path: str | Path, scan_base: Path,
                     exclude: Callable[..., None], quality: QualityReport, table: str) -> dict:
    """Leave out the scans of ``scan_table`` rated fail in ``path`` (through ``exclude``,
    reason ``"rated fail by <rater>: <note>"``) and record the unsure ones in ``quality``.

    ``scan_base``: the scan table's folder, the preprocessing folder whose sidecars the
    ratings name. Raises :class:`CohortInputError` when that folder holds no sidecars, and
    (through :func:`~adni_pu.preprocessing.qc_ratings.read_ratings`) ``DataFormatError``
    naming the line of a bad ratings file. Returns counts for ``cohort.json``.
    """
    from adni_pu.preprocessing.qc_ratings import read_ratings

    known, by_volume = _labels_by_volume(scan_base)
    if not known:
        raise CohortInputError(
            f"--qc-ratings {path}: {scan_base} holds no scan records "
            "(sub-*/ses-*/anat/*_desc-preproc_T1w.json); the ratings name the scans of a "
            "preprocessing folder: give its summary.csv as SCANS")
    ratings = read_ratings(path, known)

    def label(p: object) -> str | None:
        if not isinstance(p, str) or not p:
            return None
        volume = Path(p) if Path(p).is_absolute() else scan_base / p
        return by_volume.get(volume.resolve())

    labels = scan_table["scan_path"].map(label)
    found = set(labels.dropna())
    lost = [f"line {r.line}: {x}" for x, r in ratings.items()
            if r.rating == "fail" and x in set(by_volume.values()) and x not in found]
    quality.add("qc_rating_unmatched", table, len(lost),
                f"scans rated fail in {Path(path).name} whose volume no row of the scan table "
                "names (preprocessed_path; a moved folder, or another summary.csv)",
                "rating not applied: check that SCANS is the rated folder's summary.csv",
                lost, severity="warning")
    rating = labels.map(lambda x: ratings[x].rating if x in ratings else None)
    failed = rating == "fail"
    reason = labels.map(lambda x: _reason(ratings[x]) if x in ratings else "")
    exclude(failed, "scan_rated_fail",
            f"scans rated fail in the visual QC ({Path(path).name})", reason, severity="info")
    unsure = rating == "unsure"
    quality.add("scan_rated_unsure", table, int(unsure.sum()),
                f"scans rated unsure in the visual QC ({Path(path).name})",
                "kept (unsure is not a verdict: rate them fail to leave them out)",
                [f"{x}: {ratings[x].note}" if ratings[x].note else x
                 for x in labels[unsure]], severity="info")
    counts = {r: sum(1 for x in ratings.values() if x.rating == r)
              for r in ("pass", "fail", "unsure")}
    return {"ratings": len(ratings), **counts, "left_out": int(failed.sum()),
            "kept_unsure": int(unsure.sum())}


def _reason(r) -> str:
    who = f" by {r.rater}" if r.rater else ""
    return f"rated fail{who} in the visual QC" + (f": {r.note}" if r.note else "")

"""Validation of a cohort manifest as it is read: every value training relies on is checked.

A manifest may be edited by hand or written by another tool; a value the trainer does not
expect must not change what it learns without a word (``pu_label = 2`` would train as
unlabelled, ``split = "Train "`` rows would be dropped). :func:`validate_manifest` refuses
such values with a :class:`~adni_pu.errors.ManifestError` naming the file, the column, the
lines, what was expected and what was found. The one thing it repairs is the spelling of a
split (case, surrounding spaces), with a :class:`ManifestWarning`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from adni_pu.errors import AdniPuWarning, ManifestError

#: Columns every manifest needs (training, evaluation and the report read them).
REQUIRED_COLUMNS: tuple[str, ...] = ("subject_id", "scan_path", "pu_label", "truth", "split")
#: The splits a manifest may name.
SPLITS: tuple[str, ...] = ("train", "val", "test")
_SHOWN = 5


class ManifestWarning(AdniPuWarning):
    """A manifest value that was read after a harmless repair (e.g. ``"Train "`` -> ``"train"``)."""


def _text(value: Any) -> str | None:
    """The value as stripped text; ``None`` where it is missing or empty."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    text = str(value).strip()
    return text or None


def _where(frame: pd.DataFrame, index: list[Any], csv: bool) -> str:
    """``line 3`` / ``lines 3, 5 (and 4 more)`` (CSV) or ``row 1`` (Parquet)."""
    pos = [frame.index.get_loc(i) for i in index]
    numbers = [p + 2 if csv else p for p in pos]
    word = ("line" if csv else "row") + ("s" if len(numbers) > 1 else "")
    more = f" (and {len(numbers) - _SHOWN} more)" if len(numbers) > _SHOWN else ""
    return f"{word} {', '.join(str(n) for n in numbers[:_SHOWN])}{more}"


def _refuse(path: Path, frame: pd.DataFrame, column: str, bad: pd.Series, expected: str,
            csv: bool) -> None:
    index = list(frame.index[bad.to_numpy(dtype=bool)])
    if not index:
        return
    found = sorted({repr(str(v)) if _text(v) is not None else "empty"
                    for v in frame.loc[index, column]}, key=str)
    raise ManifestError(f"manifest {path}: column {column}: expected {expected}; found "
                        f"{', '.join(found[:_SHOWN])} on {_where(frame, index, csv)}")


def _binary(x: float) -> bool:
    return x in (0.0, 1.0)


def _fold(x: float) -> bool:
    return x.is_integer() and x >= -1


def _number_ok(values: pd.Series, test: Callable[[float], bool], empty_ok: bool) -> pd.Series:
    """Per value: is it a number that passes ``test`` (or missing, with ``empty_ok``)?"""
    def ok(value: Any) -> bool:
        text = _text(value)
        if text is None:
            return empty_ok
        try:
            return test(float(text))
        except ValueError:
            return False
    return pd.Series([ok(v) for v in values], index=values.index, dtype=bool)


def validate_manifest(frame: pd.DataFrame, path: str | Path) -> pd.DataFrame:
    """Check a manifest read from ``path``; returns it with its split names repaired.

    Required columns (``REQUIRED_COLUMNS``); a subject id and a scan path on every row;
    ``pu_label`` 0 or 1 on every row; ``truth`` and ``hidden_positive`` 0, 1 or empty;
    ``fold`` a whole number >= -1 or empty; ``split`` one of ``train``, ``val``, ``test``;
    no row given twice and no scan on two rows; one ``pu_label``, ``truth`` and
    ``hidden_positive`` per subject (ids compared in canonical form). A split written in
    another case or with spaces around it is repaired, with a :class:`ManifestWarning`;
    any other value raises :class:`ManifestError`.
    """
    path = Path(path)
    csv = path.suffix != ".parquet"
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ManifestError(f"manifest {path}: not a cohort manifest; missing column(s) "
                            f"{missing}, expected {list(REQUIRED_COLUMNS)}; found "
                            f"{list(frame.columns)}")
    for column, what in (("subject_id", "a subject id"), ("scan_path", "a scan path")):
        _refuse(path, frame, column, frame[column].map(_text).isna(), f"{what} on every row",
                csv)
    _refuse(path, frame, "pu_label", ~_number_ok(frame["pu_label"], _binary, False),
            "0 or 1 on every row (1 labelled positive, 0 unlabelled)", csv)
    for column in ("truth", "hidden_positive"):
        if column in frame:
            _refuse(path, frame, column, ~_number_ok(frame[column], _binary, True),
                    "0, 1 or empty", csv)
    if "fold" in frame:
        _refuse(path, frame, "fold", ~_number_ok(frame["fold"], _fold, True),
                "a whole number from -1 (no fold) up, or empty", csv)
    _refuse_repeats(frame, path, csv)
    _refuse_contradictions(frame, path, csv)
    return _repair_splits(frame, path, csv)


#: The per-subject columns: one value for all of a subject's rows.
SUBJECT_COLUMNS: tuple[str, ...] = ("pu_label", "truth", "hidden_positive")


def _refuse_repeats(frame: pd.DataFrame, path: Path, csv: bool) -> None:
    """Refuse a row given twice, or one scan file on two rows: either counts that scan
    twice (twice the weight in training, twice in the metrics) without a word."""
    text = frame.astype("string").fillna("")
    same = text.duplicated(keep=False)
    if same.any():
        first = text[same].groupby(list(text.columns), sort=False).groups
        groups = [list(index) for index in first.values()]
        shown = "; ".join(_where(frame, g, csv) for g in groups[:_SHOWN])
        raise ManifestError(
            f"manifest {path}: the same row is given more than once ({shown}); a repeated "
            "row would count its scan twice in training and in the metrics. Keep one of each")
    scans = frame["scan_path"].map(lambda v: os.path.normpath(_text(v) or ""))
    twice = scans.duplicated(keep=False)
    if twice.any():
        groups = [list(g.index) for _, g in scans[twice].groupby(scans[twice], sort=False)]
        shown = "; ".join(f"{scans[g[0]]} on {_where(frame, g, csv)}" for g in groups[:_SHOWN])
        raise ManifestError(
            f"manifest {path}: column scan_path: expected each scan once; found the same "
            f"scan on several rows ({shown}). Keep one row per scan")


def _refuse_contradictions(frame: pd.DataFrame, path: Path, csv: bool) -> None:
    """Refuse a subject (by canonical id: ``002_S_0004`` = ``sub-ADNI002S0004``) whose
    rows disagree on a per-subject label (:data:`SUBJECT_COLUMNS`; an empty truth is not
    a disagreement): which one training used would depend on the row order."""
    from adni_pu.cohort.ids import normalise_subject_id

    subject = frame["subject_id"].map(lambda v: normalise_subject_id(v) or "")
    for column in SUBJECT_COLUMNS:
        if column not in frame:
            continue
        values = pd.to_numeric(frame[column].map(_text), errors="coerce")
        known = values.notna()
        per = values[known].groupby(subject[known]).nunique()
        bad = list(per.index[per > 1])
        if not bad:
            continue
        parts = []
        for sid in bad[:_SHOWN]:
            rows = frame.index[(subject == sid) & known]
            said = [f"{values[i]:g} on {_where(frame, [i], csv)}"
                    + ("" if str(frame.at[i, "subject_id"]).strip() == sid
                       else f" (as {frame.at[i, 'subject_id']!r})") for i in rows[:_SHOWN]]
            parts.append(f"subject {sid}: " + ", ".join(said))
        more = f" (and {len(bad) - _SHOWN} more subjects)" if len(bad) > _SHOWN else ""
        raise ManifestError(
            f"manifest {path}: column {column}: expected one value per subject (it labels "
            f"the subject, not the scan); found {'; '.join(parts)}{more}. Fix or remove the "
            "rows that are wrong")


def _repair_splits(frame: pd.DataFrame, path: Path, csv: bool) -> pd.DataFrame:
    raw = frame["split"]
    text = raw.map(_text)
    clean = text.map(lambda v: v.lower() if v is not None else None)
    _refuse(path, frame, "split", ~clean.isin(SPLITS),
            f"one of {', '.join(SPLITS)} on every row", csv)
    changed = clean != raw.map(lambda v: v if isinstance(v, str) else None)
    if changed.any():
        index = list(frame.index[changed.to_numpy(dtype=bool)])
        pairs = sorted({f"{v!r} -> {c!r}" for v, c in zip(raw[changed], clean[changed])})
        warnings.warn(f"manifest {path}: column split: read {', '.join(pairs)} on "
                      f"{_where(frame, index, csv)} (split names are lower case, without "
                      "spaces)", ManifestWarning, stacklevel=3)
        frame = frame.copy()
        frame["split"] = clean
    return frame

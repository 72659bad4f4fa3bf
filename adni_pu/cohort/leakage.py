"""The one leakage guard: each subject, and each image, in one split only, and each image once.

Two rows are the same subject when their ids have one canonical form
(:func:`~adni_pu.cohort.ids.normalise_subject_id`: ``002_S_0004``, ``ADNI_002_S_0004`` and
``sub-ADNI002S0004`` are one subject), and the same scan when their files hold the same
image (:func:`~adni_pu.data.image_identity.image_key`: the decoded voxels, grid and
orientation, so a gunzipped or re-gzipped copy is caught; the file's SHA-256 is the fast
first check, and a file that cannot be decoded is keyed by its bytes, one that cannot be
read by its resolved path). So a test subject's scan listed in train under another id, a
training subject spelled another way in val, or one image listed twice in a split (a
symlink or a copy under another session) is caught, not just a repeated raw id.

- :func:`check_manifest_leakage` checks every pair of a manifest's splits, and each split
  for an image listed twice; training calls it before its run folder exists, and the
  cohort builder before it writes anything.
- :func:`scan_table` gives the keys of a manifest's rows; training keeps those of its train
  and val rows as ``RUN/scans.csv`` (:data:`RUN_RECORD`).
- :func:`assert_no_leakage` checks rows to be evaluated against what a run trained or
  selected on (its record, or bare subject ids). A record written before image keys were
  kept (no ``image_key`` column) is compared by file hash.

Every leak raises :class:`~adni_pu.errors.LeakageError` naming the ids, the rows or files
and the splits; an image twice in one split raises :class:`~adni_pu.errors.ManifestError`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from adni_pu.errors import LeakageError, ManifestError

#: The run folder's record of the scans a run trained and selected on.
RUN_RECORD = "scans.csv"
RECORD_COLUMNS: tuple[str, ...] = ("split", "subject_id", "canonical_id", "session_id",
                                   "scan_path", "file", "sha256", "image_key")
_SHOWN = 5


def canonical_id(value: object) -> str:
    """The canonical subject id (``""`` for an empty one)."""
    from adni_pu.cohort.ids import normalise_subject_id

    return normalise_subject_id(value) or ""


def _file_of(value: object, base: Path | None) -> Path:
    path = Path(str(value))
    if base is not None and not path.is_absolute():
        path = base / path
    return path.resolve()


def content_key(file: Path, cache: dict[Path, str] | None = None) -> str:
    """``sha256:<hex>`` of a file's bytes, or ``path:<resolved path>`` when it is no
    readable file; ``cache`` (resolved path -> key) reads a file listed twice once."""
    if cache is not None and file in cache:
        return cache[file]
    from adni_pu.fileio import sha256_file

    try:
        key = f"sha256:{sha256_file(file)}" if file.is_file() else f"path:{file}"
    except OSError:
        key = f"path:{file}"
    if cache is not None:
        cache[file] = key
    return key


def image_content_key(file: Path, file_key: str, cache: dict[str, str] | None = None) -> str:
    """The key of the image in ``file``: ``image:<hex>`` of its decoded content
    (:func:`~adni_pu.data.image_identity.image_key`), or ``file_key`` (its bytes' or path's
    key) when it is no readable NIfTI file. ``cache`` (file key -> image key) decodes the
    same bytes once: same bytes, same image."""
    if not file_key.startswith("sha256:"):
        return file_key
    if cache is not None and file_key in cache:
        return cache[file_key]
    from adni_pu.data.image_identity import image_key

    key = image_key(file) or file_key
    if cache is not None:
        cache[file_key] = key
    return key


def scan_table(frame: pd.DataFrame, base: Path | None = None, hash_files: bool = True,
               source: str | Path | None = None) -> pd.DataFrame:
    """The guard's keys of each manifest row: ``split, subject_id, canonical_id,
    session_id, scan_path, file, sha256, image_key`` and ``where`` (``line 5``, or ``row 4``
    of a Parquet ``source``).

    ``file`` is the resolved scan path (relative paths from ``base``); ``sha256`` its file
    key (:func:`content_key`) and ``image_key`` its image's key
    (:func:`image_content_key`), or both the path key when ``hash_files`` is false or the
    frame has no ``scan_path``. ``frame`` keeps the index it was read with, so ``where``
    names the file's line.
    """
    parquet = source is not None and Path(source).suffix == ".parquet"
    index = list(frame.index)
    has_paths = "scan_path" in frame.columns
    files = [_file_of(p, base) for p in frame["scan_path"]] if has_paths else [None] * len(frame)
    cache: dict[Path, str] = {}
    keys = [("" if f is None else content_key(f, cache) if hash_files else f"path:{f}")
            for f in files]
    images: dict[str, str] = {}
    image_keys = [image_content_key(f, k, images) if f is not None and hash_files else k
                  for f, k in zip(files, keys)]
    return pd.DataFrame({
        "split": frame["split"].astype(str).to_numpy() if "split" in frame else "",
        "subject_id": frame["subject_id"].astype(str).to_numpy(),
        "canonical_id": [canonical_id(s) for s in frame["subject_id"]],
        "session_id": (frame["session_id"].fillna("").astype(str).to_numpy()
                       if "session_id" in frame else ""),
        "scan_path": frame["scan_path"].astype(str).to_numpy() if has_paths else "",
        "file": ["" if f is None else str(f) for f in files],
        "sha256": keys,
        "image_key": image_keys,
        "where": [f"line {i + 2}" if source is not None and not parquet
                  and pd.api.types.is_integer(i) else f"row {i}" for i in index],
    })


def scan_column(*tables: pd.DataFrame) -> str:
    """The column scans are compared by: ``image_key`` where every table has one, else
    ``sha256`` (the file hashes of a run record written before image keys were kept)."""
    return ("image_key" if all("image_key" in tb.columns for tb in tables) else "sha256")


def find_leaks(table: pd.DataFrame, pairs: Iterable[tuple[str, str]] | None = None,
               by: str | None = None) -> list[tuple[str, str, pd.DataFrame]]:
    """Keys found in more than one ``group`` of ``table``: ``(kind, key, rows)`` with kind
    ``"subject"`` (canonical id) or ``"scan"`` (the image key, or ``by``: ``sha256``),
    subjects first.

    ``pairs`` limits the check to those pairs of groups (default: every pair). A scan
    whose rows are all one subject already reported is not reported again.
    """
    wanted = None if pairs is None else {frozenset(p) for p in pairs}
    found: list[tuple[str, str, pd.DataFrame]] = []
    reported: set[str] = set()
    for kind, column in (("subject", "canonical_id"), ("scan", by or scan_column(table))):
        rows = table[table[column].astype(str) != ""]
        groups: dict[str, set[str]] = {}
        for key, group in zip(rows[column], rows["group"]):
            groups.setdefault(key, set()).add(group)
        for key, seen in sorted(groups.items()):
            if len(seen) < 2:
                continue
            if wanted is not None and not any(p <= seen for p in wanted):
                continue
            these = rows[rows[column] == key]
            if kind == "scan" and set(these["canonical_id"]) <= reported:
                continue
            if kind == "subject":
                reported.add(str(key))
            found.append((kind, str(key), these))
    return found


def _describe(kind: str, key: str, rows: pd.DataFrame) -> str:
    def one(r: Any) -> str:
        if kind == "subject":
            spelled = "" if r.subject_id == key else f", as {r.subject_id!r}"
            return f"{r.where} in {r.group}{spelled}"
        return f"{r.where} in {r.group}: {r.scan_path} (subject {r.subject_id})"

    parts = "; ".join(one(r) for r in rows.drop_duplicates(["group", "where"]).head(
        _SHOWN).itertuples())
    groups = sorted(set(rows["group"]))
    if kind == "subject":
        label = f"subject {key}"
    elif key.startswith("sha256:"):
        label = f"one scan (sha256 {key[7:19]}...)"
    elif key.startswith("image:"):
        label = f"one image (decoded content {key[6:18]}...)"
    else:
        label = f"one scan file ({key[5:]})"
    return f"{label}: {groups} ({parts})"


def check_manifest_leakage(frame: pd.DataFrame, base: Path | None = None,
                           source: str | Path | None = None, hash_files: bool = True
                           ) -> pd.DataFrame:
    """Refuse a manifest in which a subject (by canonical id) or a scan (by content, with
    ``base``: the folder relative scan paths start from) is in more than one split.

    Returns the :func:`scan_table` of the rows (for the run's record). Raises
    :class:`LeakageError` naming each shared subject or scan, its rows and its splits.
    """
    table = scan_table(frame, base, hash_files and base is not None, source)
    table["group"] = table["split"]
    leaks = find_leaks(table)
    if leaks:
        where = f"manifest {source}: " if source is not None else ""
        n_sub = sum(kind == "subject" for kind, _, _ in leaks)
        counts = ", ".join(part for part in (
            f"{n_sub} subject(s)" if n_sub else "",
            f"{len(leaks) - n_sub} scan(s)" if len(leaks) > n_sub else "") if part)
        shown = "; ".join(_describe(*leak) for leak in leaks[:_SHOWN])
        more = f" ... ({len(leaks) - _SHOWN} more)" if len(leaks) > _SHOWN else ""
        raise LeakageError(
            f"{where}data leakage: {counts} in more than one split: {shown}{more}. Each "
            "subject (whatever the spelling of its id) and each image (whatever the file it "
            "is saved in) belongs in one split; rebuild the cohort, or move or remove these "
            "rows")
    refuse_repeated_images(table, source)
    return table


def refuse_repeated_images(table: pd.DataFrame, source: str | Path | None = None) -> None:
    """Refuse one image on several rows of one split (a :func:`scan_table` with ``group``):
    a symlink, a copy or a re-saved file listed again, under the same subject or another,
    would count that image twice in training or in the metrics. Raises
    :class:`ManifestError` naming the rows."""
    column = scan_column(table)
    rows = table[table[column].astype(str) != ""]
    twice = rows[rows.duplicated(["group", column], keep=False)]
    if twice.empty:
        return
    groups = [g for _, g in twice.groupby(["group", column], sort=False)]
    shown = "; ".join(
        f"{g['group'].iloc[0]}: " + ", ".join(
            f"{r.where} {r.scan_path} (subject {r.subject_id}, session {r.session_id})"
            for r in g.head(_SHOWN).itertuples()) for g in groups[:_SHOWN])
    more = f" ... ({len(groups) - _SHOWN} more)" if len(groups) > _SHOWN else ""
    where = f"manifest {source}: " if source is not None else ""
    raise ManifestError(
        f"{where}column scan_path: expected each image once; found {len(groups)} image(s) "
        f"on several rows of one split ({shown}{more}): the same image (by its decoded "
        "content, whatever the file) would count twice. Keep one row per image")


def assert_no_leakage(
    train_subjects: Iterable[object] | pd.DataFrame,
    eval_subjects: Iterable[object] | pd.DataFrame,
    what: str = "evaluation",
    seen_in: str = "training",
    advice: str = "Splits must be by subject; rebuild the cohort or remove these subjects.",
) -> None:
    """Refuse to evaluate on a subject or a scan seen in training (or, per ``seen_in``,
    in selection).

    Each side is bare subject ids, or a :func:`scan_table` (then scans with the same
    content are caught too, under any id). Ids are compared in canonical form, so
    ``sub-ADNI011S0002`` and ``011_S_0002`` are the same subject. Raises
    :class:`LeakageError` listing every shared subject (or scan), saying where they were
    seen (``seen_in``) and what to do (``advice``).
    """
    seen, evaluated = _as_table(train_subjects, "seen"), _as_table(eval_subjects, "evaluated")
    by = scan_column(seen, evaluated)
    leaks = find_leaks(pd.concat([seen, evaluated], ignore_index=True), by=by)
    subjects = [key for kind, key, _ in leaks if kind == "subject"]
    if subjects:
        shown = ", ".join(subjects[:20]) + (f" ... ({len(subjects) - 20} more)"
                                            if len(subjects) > 20 else "")
        raise LeakageError(f"data leakage: {len(subjects)} {what} subject(s) were also in "
                           f"{seen_in}: {shown}. {advice}")
    scans = [rows for kind, _, rows in leaks if kind == "scan"]
    if scans:
        def pair(rows: pd.DataFrame) -> str:
            ev = rows[rows["group"] == "evaluated"].iloc[0]
            old = rows[rows["group"] == "seen"].iloc[0]
            return (f"{ev['where']}: {ev['scan_path']} (subject {ev['subject_id']}) = "
                    f"{old['scan_path']} (subject {old['subject_id']})")

        shown = "; ".join(pair(r) for r in scans[:_SHOWN]) + (
            f" ... ({len(scans) - _SHOWN} more)" if len(scans) > _SHOWN else "")
        how = "decoded content" if by == "image_key" else "sha256"
        raise LeakageError(f"data leakage: {len(scans)} {what} scan(s) hold the same image "
                           f"({how}) as scans of {seen_in}, under other subject ids: "
                           f"{shown}. {advice}")


def _as_table(side: Iterable[object] | pd.DataFrame, group: str) -> pd.DataFrame:
    if isinstance(side, pd.DataFrame):
        table = side.copy()
        for column in ("scan_path", "where", "sha256", "subject_id"):
            if column not in table:
                table[column] = ""
        # recomputed, not read: a run record keeps the canonical ids of the parser it was
        # written with, and the evaluated ids are compared with today's
        table["canonical_id"] = [canonical_id(s) for s in table["subject_id"]]
        table["sha256"] = table["sha256"].fillna("").astype(str)
        if "image_key" in table:
            table["image_key"] = table["image_key"].fillna("").astype(str)
        table["canonical_id"] = table["canonical_id"].fillna("").astype(str)
    else:
        ids = [s for s in side]
        table = pd.DataFrame({"subject_id": [str(s) for s in ids],
                              "canonical_id": [canonical_id(s) for s in ids],
                              "sha256": "", "image_key": "", "scan_path": "",
                              "where": ""})
    table["group"] = group
    return table


def check_manifest_splits(manifest: pd.DataFrame) -> None:
    """Raise :class:`LeakageError` if a subject (by canonical id) has rows in more than one
    split; :func:`check_manifest_leakage` without the scan contents."""
    check_manifest_leakage(manifest)


def assert_manifest_no_leakage(manifest: pd.DataFrame, eval_split: str = "test",
                               base: Path | None = None) -> None:
    """The guard on a manifest: no subject (and, with ``base``, no scan's content) in two
    splits. ``eval_split`` is kept for callers of earlier versions: every pair of splits is
    checked."""
    del eval_split
    check_manifest_leakage(manifest, base)

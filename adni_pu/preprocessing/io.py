"""Input discovery, reading and validation of T1 scans, and atomic output writing.

Discovery turns what a user has (a BIDS dataset, an ADNI download, a folder of NIfTI
files, a CSV of subject/session/path, DICOM series folders, a single file, or a Python
list) into a list of :class:`Scan`, and the inputs it leaves out into :class:`Excluded`.
Reading returns a float32 volume with its voxel-to-RAS affine and refuses, with a
message naming the file, what was expected and what was found, anything that is not a
plausible 3D T1 scan.
"""

from __future__ import annotations

import csv
import gzip
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from adni_pu.data.integrity import error_text, open_nifti
from adni_pu.errors import ScanError
from adni_pu.fileio import write_temporary as write_file_atomic  # tests replace it here

from .adni_layout import discover_adni, is_adni_download
from .config import DiscoverySettings, ValidationSettings
from .scans import (  # noqa: F401 - re-exported: io is where callers have found them
    DEFAULT_SESSION,
    EXTRA_T1,
    NIFTI_SUFFIXES,
    NOT_T1,
    Discovery,
    Excluded,
    Scan,
    _bids_entity,
    _dicom_dirs,
    _is_nifti,
    _looks_like_dicom,
    _stem,
    bids_label,
    parse_date,
    scan_from_file,
)


def _is_bids(root: Path) -> bool:
    """A BIDS dataset: some ``sub-*`` folder with ``anat/`` or ``ses-*/anat/`` data.

    Files named ``sub-*`` in a plain folder do not make it BIDS.
    """
    for sub in root.glob("sub-*"):
        if sub.is_dir() and ((sub / "anat").is_dir()
                             or any(p.is_dir() for p in sub.glob("ses-*/anat"))):
            return True
    return False


def _discover_bids(root: Path) -> list[Scan]:
    scans = []
    patterns = ("sub-*/anat/*_T1w.nii*", "sub-*/ses-*/anat/*_T1w.nii*")
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            if not path.name.lower().endswith(NIFTI_SUFFIXES):
                continue
            subject = _bids_entity(path.name, "sub") or path.parts[-3].removeprefix("sub-")
            session = _bids_entity(path.name, "ses") or DEFAULT_SESSION
            run = _bids_entity(path.name, "run")
            if run is not None:
                session = f"{session}run{run}"
            scans.append(Scan(subject, session, path))
    return scans


def read_scan_list_csv(path: Path) -> list[Scan]:
    """Scans from a CSV with columns subject(_id), session(_id) (optional) and path.

    Relative paths are taken relative to the CSV's folder. Optional columns
    ``acquisition_date`` (or ``scan_date``; ISO or m/d/YYYY), ``image_id`` and
    ``series_description`` are kept in the scan record and in summary.csv. A row without
    a path, or whose subject or session has no letter or digit (in any script: ``..``,
    ``-``), is refused naming its line, before any scan is read: such an id is a slip in
    the table, not a name.
    """
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        raise ScanError(f"{path}: expected a CSV with a header and one row per scan, found none")
    cols = {c.lower().strip(): c for c in rows[0]}
    subj = cols.get("subject_id") or cols.get("subject")
    sess = cols.get("session_id") or cols.get("session")
    pcol = cols.get("path") or cols.get("input_path")
    dcol = cols.get("acquisition_date") or cols.get("scan_date")
    icol, scol = cols.get("image_id"), cols.get("series_description")
    if subj is None or pcol is None:
        raise ScanError(
            f"{path}: expected columns subject (or subject_id), session (optional) and path, "
            f"found {list(rows[0])}"
        )
    scans = []
    for line, row in enumerate(rows, start=2):
        subject = (row.get(subj) or "").strip()
        session = (row.get(sess) or "").strip() if sess else ""
        for col, value in ((subj, subject), (sess, session or DEFAULT_SESSION)):
            if not any(ch.isalnum() for ch in value):
                raise ScanError(f"{path}: line {line}: column {col}: expected an id with "
                                f"letters or digits, found {value!r}")
        if not (row.get(pcol) or "").strip():
            raise ScanError(f"{path}: line {line}: column {pcol}: expected the scan's path, "
                            "found nothing")
        p = Path(row[pcol].strip())
        if not p.is_absolute():
            p = path.parent / p
        date = (row.get(dcol) or "").strip() if dcol else ""
        if date and parse_date(date) is None:
            raise ScanError(f"{path}: line {line}: column {dcol}: expected a date such as "
                            f"2011-05-02 or 5/2/2011, found {date!r}")
        scans.append(Scan(subject, session or DEFAULT_SESSION, p,
                          parse_date(date) or "",
                          (row.get(icol) or "").strip() if icol else "",
                          (row.get(scol) or "").strip() if scol else ""))
    return scans


def discover_scans(
    source: str | Path | Sequence[Scan | str | Path], settings: DiscoverySettings | None = None
) -> list[Scan]:
    """Every scan to process in ``source`` (see :func:`discover`; the left-out inputs dropped)."""
    return discover(source, settings).scans


def discover(
    source: str | Path | Sequence[Scan | str | Path], settings: DiscoverySettings | None = None
) -> Discovery:
    """The scans in ``source`` and the inputs left out of them, with reasons.

    ``source``: a BIDS folder, an ADNI download (``ADNI/<PTID>/<series>/<date_time>/<image
    ID>/``, see :mod:`adni_pu.preprocessing.adni_layout`), a folder of NIfTI files or
    DICOM series, a CSV, a single file, or a list. In a plain folder, each
    ``*.nii[.gz]`` file is a scan whose subject is the file name (without extension; a
    BIDS-style name gives its ``sub-`` and ``ses-`` labels, :func:`scan_from_file`),
    and each folder holding DICOM files is a series whose subject is its first folder
    below ``source`` (session: its last folder, when deeper).
    """
    if not isinstance(source, (str, Path)):
        scans = []
        for item in source:
            if isinstance(item, Scan):
                scans.append(item)
            else:
                scans.append(scan_from_file(Path(item)))
        return Discovery(_check_unique(scans), [])
    root = Path(source)
    if not root.exists():
        raise ScanError(f"{root}: input not found (expected a folder, a CSV or a NIfTI file)")
    if root.is_file():
        if root.suffix.lower() == ".csv":
            return Discovery(_check_unique(read_scan_list_csv(root)), [])
        return Discovery([scan_from_file(root)], [])
    excluded: list[Excluded] = []
    if _is_bids(root):
        scans = _discover_bids(root)
    elif is_adni_download(root):
        scans, excluded = discover_adni(root, settings or DiscoverySettings())
    else:
        scans = []
        for path in sorted(root.iterdir()):
            if path.is_file() and path.name.lower().endswith(NIFTI_SUFFIXES):
                scans.append(scan_from_file(path))
        for folder in _dicom_dirs(root):
            rel = folder.relative_to(root).parts
            if not rel:
                scans.append(Scan(root.name, DEFAULT_SESSION, folder))
            else:
                session = rel[-1] if len(rel) > 1 else DEFAULT_SESSION
                scans.append(Scan(rel[0], session, folder))
    if not scans:
        left = "".join(f"; {e.status}: {e.reason}" for e in excluded[:3])
        more = f" (and {len(excluded) - 3} more)" if len(excluded) > 3 else ""
        raise ScanError(
            f"{root}: found no scans (expected BIDS sub-*/[ses-*/]anat/*_T1w.nii[.gz], an ADNI "
            "download ADNI/<PTID>/<series>/<date_time>/<image ID>/, *.nii[.gz] files, or "
            f"DICOM series folders){left}{more}"
        )
    return Discovery(_check_unique(scans), excluded)


def _check_unique(scans: list[Scan]) -> list[Scan]:
    """Refuse two scans with one output name, or one subject (by canonical id:
    ``002_S_0004`` = ``ADNI_002_S_0004``) and session under two spellings of its id: the
    second would be preprocessed again under another name and counted as another scan."""
    from adni_pu.cohort.ids import normalise_subject_id

    seen: dict[str, Path] = {}
    spelled: dict[tuple[str, str], Scan] = {}
    for scan in scans:
        key = scan.label
        if key in seen:
            raise ScanError(
                f"two scans map to the same output {key}: {seen[key]} and {scan.path}; "
                "give them distinct subject/session ids (e.g. with a CSV)"
            )
        seen[key] = scan.path
        subject = normalise_subject_id(scan.subject_id) or scan.subject_id
        first = spelled.setdefault((subject, scan.session_id), scan)
        if first.subject_id != scan.subject_id:
            raise ScanError(
                f"two scans are one subject and session under two spellings of its id: "
                f"{first.path} ({first.subject_id!r}) and {scan.path} ({scan.subject_id!r}) "
                f"are both subject {subject}, session {scan.session_id}; give them distinct "
                "session ids (e.g. with a CSV), or remove one")
    return scans


# ----------------------------------------------------------------------------- reading


def _read_dicom(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    import SimpleITK as sitk

    reader = sitk.ImageSeriesReader()
    ids = reader.GetGDCMSeriesIDs(str(folder))
    if not ids:
        raise ScanError(f"{folder}: expected a DICOM series, found no readable DICOM files")
    if len(ids) > 1:
        raise ScanError(
            f"{folder}: expected one DICOM series per folder, found {len(ids)}; "
            "put each series in its own folder"
        )
    files = reader.GetGDCMSeriesFileNames(str(folder), ids[0])
    check_dicom_series(folder, [Path(f) for f in files])
    reader.SetFileNames(files)
    image = reader.Execute()
    return sitk_to_array_affine(image)


#: Slice gaps that differ from the series' median gap by more than this share are refused.
SLICE_GAP_TOLERANCE = 0.1


def check_dicom_series(folder: Path, files: Sequence[Path]) -> None:
    """Refuse a DICOM series that would silently become a wrong volume.

    Before conversion: every DICOM file of the folder must be in the series (the reader
    leaves out files it cannot parse, e.g. a truncated slice, and would stack the rest),
    no two slices may share a position, and the slices must be evenly spaced along the
    slice normal (a gap of twice the spacing is a missing slice). Series without positions
    (one multi-frame file) are not checked here. Raises :class:`ScanError` naming the files.
    """
    import pydicom

    on_disk = [p for p in sorted(folder.iterdir())
               if p.is_file() and not p.name.startswith(".") and _looks_like_dicom(p)]
    used = {Path(f).resolve() for f in files}
    left = [p.name for p in on_disk if p.resolve() not in used]
    if left:
        shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
        raise ScanError(f"{folder}: DICOM series: {len(left)} of {len(on_disk)} slice files "
                        f"cannot be read as part of it ({shown}); expected every file of the "
                        "folder in one readable series (a truncated or foreign file?)")
    if len(files) < 3:
        return
    where = []
    for f in files:
        try:
            ds = pydicom.dcmread(str(f), stop_before_pixels=True)
            pos = np.asarray([float(v) for v in ds.ImagePositionPatient])
            ori = np.asarray([float(v) for v in ds.ImageOrientationPatient])
        except Exception:  # noqa: BLE001 - no usable position: nothing to check
            return
        where.append((float(np.cross(ori[:3], ori[3:]) @ pos), Path(f).name))
    where.sort()
    gaps = np.diff([w[0] for w in where])
    step = float(np.median(gaps))
    for k, gap in enumerate(gaps):
        a, b = where[k][1], where[k + 1][1]
        if abs(gap) < 1e-3 * max(abs(step), 1e-3):
            raise ScanError(f"{folder}: DICOM series: slices {a} and {b} have the same "
                            "position; expected one slice per position (a duplicate file?)")
        if abs(gap - step) > SLICE_GAP_TOLERANCE * abs(step):
            missing = f", about {round(gap / step) - 1} missing slice(s)" if gap > step else ""
            raise ScanError(f"{folder}: DICOM series: slices {a} and {b} are {gap:.3g} mm "
                            f"apart; expected even spacing of {step:.3g} mm{missing}")


def sitk_to_array_affine(image) -> tuple[np.ndarray, np.ndarray]:
    """A SimpleITK image as (x, y, z) array and voxel-to-RAS affine."""
    import SimpleITK as sitk

    data = sitk.GetArrayFromImage(image)
    data = np.transpose(data, tuple(range(data.ndim))[::-1])
    dim = image.GetDimension()
    direction = np.asarray(image.GetDirection()).reshape(dim, dim)
    spacing = np.asarray(image.GetSpacing())
    origin = np.asarray(image.GetOrigin())
    affine = np.eye(4)
    lps_to_ras = np.diag([-1.0, -1.0, 1.0])
    affine[:3, :3] = lps_to_ras @ (direction[:3, :3] * spacing[:3])
    affine[:3, 3] = lps_to_ras @ origin[:3]
    return data, affine


def read_volume(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Raw (array, affine) of a NIfTI file or DICOM series folder, without validation."""
    path = Path(path)
    if not path.exists():
        raise ScanError(f"{path}: file not found (expected a NIfTI file or a DICOM folder)")
    if path.is_dir():
        try:
            return _read_dicom(path)
        except ScanError:
            raise
        except Exception as exc:  # noqa: BLE001 - name the folder and the cause
            raise ScanError(f"{path}: cannot read DICOM series ({exc})") from exc
    # the header first (adni_pu.data.integrity): a misnamed, damaged or truncated file, or a
    # header claiming more voxels than a T1 has, is refused before its data are read
    img = open_nifti(path, ScanError)
    try:
        data = np.asarray(img.dataobj, dtype=np.float32)
        affine = np.asarray(img.affine, dtype=np.float64)
    except MemoryError as exc:
        raise ScanError(f"{path}: not enough memory to read its {img.shape} voxels "
                        f"({img.get_data_dtype()}); expected a T1 scan that fits") from exc
    except Exception as exc:  # noqa: BLE001 - a damaged gzip stream, ...
        raise ScanError(
            f"{path}: cannot read as NIfTI (expected a complete .nii/.nii.gz file; "
            f"found {error_text(exc)})"
        ) from exc
    return data, affine


def validate_volume(
    data: np.ndarray, affine: np.ndarray, path: str | Path, rules: ValidationSettings
) -> np.ndarray:
    """The checked 3D volume (a singleton 4th axis dropped), or :class:`ScanError`."""
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        raise ScanError(
            f"{path}: expected a 3D volume (or 4D with one volume), found shape {data.shape}"
        )
    small = [n for n in data.shape if n < rules.min_voxels_per_axis]
    big = [n for n in data.shape if n > rules.max_voxels_per_axis]
    if small or big:
        raise ScanError(
            f"{path}: expected {rules.min_voxels_per_axis}-{rules.max_voxels_per_axis} voxels "
            f"per axis, found shape {data.shape}"
        )
    if not np.all(np.isfinite(affine)) or abs(np.linalg.det(affine[:3, :3])) < 1e-9:
        rows = np.round(np.asarray(affine, dtype=float), 4).tolist()  # one line in summary.csv
        raise ScanError(f"{path}: expected an invertible voxel-to-world affine, found {rows}")
    spacing = np.sqrt((affine[:3, :3] ** 2).sum(axis=0))
    if np.any(spacing < rules.min_spacing_mm) or np.any(spacing > rules.max_spacing_mm):
        raise ScanError(
            f"{path}: expected voxel spacing in [{rules.min_spacing_mm}, "
            f"{rules.max_spacing_mm}] mm, found {tuple(round(float(s), 3) for s in spacing)}"
        )
    extent = spacing * np.asarray(data.shape)
    if np.any(extent < rules.min_extent_mm) or np.any(extent > rules.max_extent_mm):
        raise ScanError(
            f"{path}: expected a field of view of {rules.min_extent_mm}-{rules.max_extent_mm} mm "
            f"per axis (a head), found {tuple(round(float(e)) for e in extent)} mm"
        )
    finite = np.isfinite(data)
    if not finite.all():
        raise ScanError(
            f"{path}: expected finite intensities, found {int((~finite).sum())} NaN/inf voxels"
        )
    lo, hi = float(data.min()), float(data.max())
    if hi - lo <= 0:
        raise ScanError(f"{path}: expected an image, found a constant volume (all {lo})")
    return data


def load_scan(
    path: str | Path, rules: ValidationSettings | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Read and validate a scan: (3D float32 array, voxel-to-RAS affine)."""
    data, affine = read_volume(path)
    return validate_volume(data, affine, path, rules or ValidationSettings()), affine


# ----------------------------------------------------------------------------- orientation


def to_canonical(data: np.ndarray, affine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reorient voxel axes to the closest RAS+ order (pure permutation/flip, no resampling)."""
    import nibabel as nib

    img = nib.as_closest_canonical(nib.Nifti1Image(data, affine))
    return np.asarray(img.dataobj), img.affine


def from_canonical(
    data: np.ndarray, canonical_affine: np.ndarray, native_affine: np.ndarray
) -> np.ndarray:
    """Undo :func:`to_canonical`: put an array on the canonical grid back onto the native grid."""
    import nibabel as nib

    ornt_native = nib.io_orientation(native_affine)
    ornt_canon = nib.io_orientation(canonical_affine)
    transform = nib.orientations.ornt_transform(ornt_canon, ornt_native)
    return nib.orientations.apply_orientation(data, transform)


# ----------------------------------------------------------------------------- writing


def nifti_bytes(
    data: np.ndarray, affine: np.ndarray, dtype: type | str = np.float32, mni: bool = False
) -> bytes:
    """A gzip-compressed NIfTI-1 file in memory (so writing can be all-or-nothing).

    ``mni`` marks the sform as MNI152 space (code 4) instead of scanner space (code 1).
    """
    import nibabel as nib

    img = nib.Nifti1Image(np.asarray(data).astype(dtype), affine)
    img.header.set_data_dtype(dtype)
    img.header.set_xyzt_units("mm")
    img.set_qform(affine, code=1)
    img.set_sform(affine, code=4 if mni else 1)
    # no time stamp in the gzip header: the same volume gives the same bytes on every run
    return gzip.compress(img.to_bytes(), compresslevel=4, mtime=0)



def write_outputs(files: dict[Path, bytes], last: Iterable[Path] = ()) -> None:
    """Write every file to a temporary name first, then rename all into place.

    Files in ``last`` (the sidecar, the marker of a finished scan) are renamed after the
    rest. If any write fails (full disk, no permission) every temporary file is removed
    and nothing is renamed, so no half-written output is left behind.
    """
    last = [Path(p) for p in last]
    order = [p for p in files if p not in last] + [p for p in last if p in files]
    temps: dict[Path, Path] = {}
    try:
        for path in order:
            temps[path] = write_file_atomic(path, files[path])
    except BaseException:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        raise
    for path in order:
        os.replace(temps[path], path)

"""Cheap checks that NIfTI volumes are whole and plausible, from their headers alone.

A truncated volume otherwise fails deep inside the data loader, after the run folder has
been written, with a traceback that names no file; a damaged header claiming billions of
voxels makes the reader allocate them before anything refuses the file. The checks here
read the header and the file's size only: an uncompressed ``.nii`` must hold the bytes its
header promises, and a ``.nii.gz`` must end with a gzip trailer whose length field matches
them (the stream is decompressed in full only when it does not, to tell a damaged file from
a multi-member gzip stream). :func:`open_nifti` is the one way every scan reader (raw scans
in preprocessing, model-grid volumes in training, evaluation and prediction) opens a file.
"""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path
from typing import Any

#: The most voxels (all axes together) a header may claim: a 0.5 mm whole-head T1 has about
#: 110 million, so a header claiming more than this is damaged, and is refused before its
#: data (up to 8 bytes a voxel) would be read into memory.
MAX_VOXELS = 400_000_000

GZIP_MAGIC = b"\x1f\x8b"


def error_text(exc: BaseException) -> str:
    """An exception as one line that always says something (MemoryError has no text)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def inspect_nifti(path: Path) -> tuple[Any, str | None]:
    """(the NIfTI image, with its data not read, None) or (None, why it cannot be used)."""
    import nibabel as nib

    if not path.exists():
        return None, "not found"
    if path.is_dir():
        return None, "is a folder; expected a NIfTI file (.nii or .nii.gz)"
    if not path.is_file():
        return None, "is not a regular file; expected a NIfTI file (.nii or .nii.gz)"
    try:
        with open(path, "rb") as handle:
            magic = handle.read(2)
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or error_text(exc)})"
    name = path.name.lower()
    if magic == GZIP_MAGIC and not name.endswith(".gz"):
        return None, ("holds gzip-compressed data but is not named .gz; a compressed NIfTI "
                      "file must be named .nii.gz (rename it)")
    if name.endswith(".gz") and magic != GZIP_MAGIC:
        return None, ("is named .gz but is not gzip-compressed; an uncompressed NIfTI file "
                      "must be named .nii (rename it)")
    try:
        img = nib.load(str(path))
        shape = tuple(int(n) for n in img.shape)
        # the file's own data offset: a loaded image's header has it reset to 0
        offset = int(getattr(img.dataobj, "offset", img.header.get_data_offset()))
        itemsize = int(img.header.get_data_dtype().itemsize)
    except Exception as exc:  # noqa: BLE001 - any unreadable header is this file's problem
        return None, (f"cannot read as NIfTI ({error_text(exc)}); expected a complete "
                      "NIfTI-1/2 file (.nii or .nii.gz)")
    if not isinstance(img, (nib.Nifti1Image, nib.Nifti2Image)):
        return None, f"expected a NIfTI-1/2 image, found {type(img).__name__}"
    voxels = math.prod(shape)
    if voxels > MAX_VOXELS:
        return None, (f"its header claims shape {shape} ({voxels:,} voxels); expected at most "
                      f"{MAX_VOXELS:,} voxels for a T1 scan: the header is damaged")
    expected = offset + voxels * itemsize
    if not name.endswith(".gz"):
        size = path.stat().st_size
        if size < expected:
            return None, (f"expected {expected} bytes (header and image), found {size}: the "
                          "file is truncated")
        return img, None
    with open(path, "rb") as handle:
        handle.seek(-4, 2)
        isize = int.from_bytes(handle.read(4), "little")
    if isize == expected % (1 << 32):
        return img, None
    try:  # a multi-member stream has another trailer: decompress (without keeping) to be sure
        with gzip.open(path, "rb") as handle:
            total = 0
            for block in iter(lambda: handle.read(1 << 22), b""):
                total += len(block)
                if total >= expected:
                    return img, None
    except (OSError, EOFError, zlib.error) as exc:
        return None, (f"cannot read as NIfTI: the gzip stream is damaged or truncated "
                      f"({error_text(exc)})")
    return None, (f"cannot read as NIfTI: expected {expected} bytes once decompressed, found "
                  f"{total}: truncated")


def volume_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as a whole NIfTI volume, or None if it looks whole."""
    return inspect_nifti(Path(path))[1]


def open_nifti(path: str | Path, error: type[Exception] | None = None) -> Any:
    """The NIfTI image at ``path`` (header read, data not yet), or ``error`` (default
    :class:`~adni_pu.errors.DataFormatError`) saying ``<path>: <why>`` when it is missing,
    a folder, misnamed (gzip data in a ``.nii``), not NIfTI, claims more than
    :data:`MAX_VOXELS` voxels, or is shorter than its header promises."""
    from adni_pu.errors import DataFormatError

    img, why = inspect_nifti(Path(path))
    if why is not None:
        raise (error or DataFormatError)(f"{path}: {why}")
    return img

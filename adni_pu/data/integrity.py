"""Cheap checks that a manifest's NIfTI volumes are whole, before a run folder is made.

A truncated volume otherwise fails deep inside the data loader, after the run folder has
been written, with a traceback that names no file. :func:`check_volume_files` reads each
file's header only: an uncompressed ``.nii`` must hold the bytes its header promises, and
a ``.nii.gz`` must end with a gzip trailer whose length field matches them (the stream is
decompressed in full only when it does not, to tell a damaged file from a multi-member
gzip stream).
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterable
from pathlib import Path


def volume_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as a whole NIfTI volume, or None if it looks whole."""
    import nibabel as nib
    import numpy as np

    if not path.is_file():
        return "not found"
    try:
        img = nib.load(str(path))
        header = img.header
        expected = int(header.get_data_offset()) + int(
            np.prod(img.shape, dtype=np.int64)) * header.get_data_dtype().itemsize
    except Exception as exc:  # noqa: BLE001 - any unreadable header is this file's problem
        return f"cannot read its header ({' '.join(str(exc).split())})"
    if not path.name.lower().endswith(".gz"):
        size = path.stat().st_size
        if size < expected:
            return (f"expected {expected} bytes (header and image), found {size}: the file "
                    "is truncated")
        return None
    with open(path, "rb") as handle:
        handle.seek(-4, 2)
        isize = int.from_bytes(handle.read(4), "little")
    if isize == expected % (1 << 32):
        return None
    try:  # a multi-member stream has another trailer: decompress to be sure
        with gzip.open(path, "rb") as handle:
            total = sum(len(block) for block in iter(lambda: handle.read(1 << 22), b""))
    except (OSError, EOFError, zlib.error) as exc:
        return f"the gzip stream is damaged or truncated ({' '.join(str(exc).split())})"
    if total < expected:
        return f"expected {expected} bytes once decompressed, found {total}: truncated"
    return None


def check_volume_files(paths: Iterable[Path], source: str | Path) -> None:
    """Raise :class:`~adni_pu.errors.ManifestError` naming every NIfTI volume of ``paths``
    (the scans of manifest ``source``) that is missing, unreadable or truncated."""
    from adni_pu.errors import ManifestError

    nifti = [p for p in dict.fromkeys(paths) if p.name.lower().endswith((".nii", ".nii.gz"))]
    bad = [(p, why) for p in nifti if (why := volume_problem(p)) is not None]
    if not bad:
        return
    shown = "; ".join(f"{p}: {why}" for p, why in bad[:3])
    more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
    raise ManifestError(f"{source}: {len(bad)} scan(s) cannot be used: {shown}{more}; "
                        "preprocess them again or remove their rows")

"""An image's identity is its image: a key of a NIfTI volume's decoded content.

Two files hold the same image when they decode to the same voxel values on the same grid,
whatever their bytes: ``gunzip``, a re-gzip at another level, a re-save as float32 or with
a scale factor, or with the axes stored in another order all change the file's SHA-256 but
not the image. :func:`image_key` hashes what the image is:

- the voxel values after nibabel's scaling (``scl_slope``/``scl_inter``), as float32 (the
  dtype the model reads; -0.0 is read as 0.0 and every NaN as one NaN);
- in the closest canonical (RAS+) orientation, so a flipped or transposed storage of the
  same voxels on the same world grid is the same image;
- with its shape and its voxel-to-world affine rounded to :data:`AFFINE_DECIMALS` decimals
  (a tolerance of 1e-4 mm, far below any voxel size), as re-saving rounds the affine.

The key reads the whole file, so the leakage guard (:mod:`adni_pu.cohort.leakage`) first
compares file hashes (:func:`~adni_pu.fileio.sha256_file`: the same bytes are the same image
without decoding) and decodes each distinct file once.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

#: The affine is compared to this many decimals (mm): 1e-4 mm.
AFFINE_DECIMALS = 4
#: The prefix of a decoded-content key (a file that cannot be decoded keeps its file key).
IMAGE_PREFIX = "image:"


def image_key(path: str | Path) -> str | None:
    """``image:<sha256>`` of the decoded image at ``path`` (a NIfTI file), or None when it
    cannot be read as one (the caller keeps the file's own hash then)."""
    import nibabel as nib

    from adni_pu.data.integrity import inspect_nifti

    img, why = inspect_nifti(Path(path))
    if why is not None:
        return None
    try:
        canonical = nib.as_closest_canonical(img)
        data = np.asarray(canonical.get_fdata(dtype=np.float64), dtype=np.float32)
    except Exception:  # noqa: BLE001 - undecodable data: this file is keyed by its bytes
        return None
    while data.ndim > 3 and data.shape[-1] == 1:  # a 3D image stored with a 4th axis of 1
        data = data[..., 0]
    data = data + np.float32(0.0)  # -0.0 -> 0.0
    nan = np.isnan(data)
    if nan.any():
        data[nan] = np.float32("nan")
    affine = np.round(np.asarray(canonical.affine, dtype=np.float64), AFFINE_DECIMALS) + 0.0
    digest = hashlib.sha256()
    digest.update(f"shape={tuple(int(n) for n in data.shape)};".encode())
    digest.update(("affine=" + ",".join(f"{v:.{AFFINE_DECIMALS}f}" for v in affine.ravel())
                   + ";").encode())
    digest.update(np.ascontiguousarray(data).tobytes())
    return IMAGE_PREFIX + digest.hexdigest()

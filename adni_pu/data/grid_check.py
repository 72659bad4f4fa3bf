"""The one input check of every model-grid volume that a command reads.

``train``, ``evaluate`` and ``predict`` all read model-grid volumes through the volume
pipeline (:mod:`adni_pu.data.volumes`), whose cached stage runs this check on each file:

- before the data are read (:func:`header_problem`, from the header alone): the file exists,
  is a file (not a folder), is NIfTI named as it is compressed, claims no more voxels than
  :data:`adni_pu.data.integrity.MAX_VOXELS` and holds the bytes its header promises, is one
  3D volume (a 4th axis of length 1 is dropped, as the loader does; a 4D series is refused),
  and, where the grid is checked, has the grid's shape after RAS reorientation;
- once read (:func:`content_problem`): every voxel is finite (no NaN or inf) and the
  volume is not constant (an all-zero file is not a brain).

A NaN voxel would otherwise make the model's output NaN, an all-zero file would be scored
as if it were a scan, and a 4D file would fail inside the network. Each problem is a
:class:`~adni_pu.errors.ManifestError` saying ``<file>: <what was expected, what was found>``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from adni_pu.data.integrity import inspect_nifti
from adni_pu.errors import ManifestError

#: What the check covers; part of the volume pipeline's disk-cache key, so that items cached
#: before a check was added (or changed) are computed, and checked, again.
CHECKS = "header, voxel limit, size, 3D, grid shape; finite, not constant"


def canonical_shape(img: Any) -> tuple[int, ...]:
    """The first three axes' sizes of ``img`` once reoriented to RAS, from its header only
    (``nibabel.as_closest_canonical`` would read the data to reorder them). A degenerate
    affine has no orientation: the axes as stored."""
    import nibabel as nib

    ornt = nib.io_orientation(img.affine)
    if np.isnan(ornt).any():
        return tuple(int(n) for n in img.shape[:3])
    shape = [0, 0, 0]
    for axis, (target, _) in enumerate(ornt[:3]):
        shape[int(target)] = int(img.shape[axis])
    return tuple(shape)


def canonical_affine(img: Any) -> np.ndarray:
    """The voxel-to-world affine of ``img`` once reoriented to RAS, from its header only
    (a degenerate affine as it is)."""
    import nibabel as nib

    ornt = nib.io_orientation(img.affine)
    if np.isnan(ornt).any():
        return np.asarray(img.affine)
    return img.affine @ nib.orientations.inv_ornt_aff(ornt, img.shape[:3])


def spatial_problem(img: Any, grid_shape: tuple[int, int, int] | None) -> str | None:
    """Why the (readable) NIfTI ``img`` is not one 3D model-grid volume, or None."""
    shape = tuple(int(n) for n in img.shape)
    dims = shape[:3] if len(shape) == 4 and shape[3] == 1 else shape
    if len(dims) == 4:
        return (f"is a 4D series of {dims[3]} volumes (shape {shape}); expected one 3D "
                "model-grid volume")
    if len(dims) != 3:
        return f"expected one 3D model-grid volume, found a {len(dims)}D image of shape {shape}"
    if grid_shape is not None and canonical_shape(img) != tuple(grid_shape):
        return (f"expected a model-grid volume of shape {tuple(grid_shape)} (after RAS "
                f"reorientation), found {canonical_shape(img)}; run `adni-pu preprocess` "
                "first")
    return None


def header_problem(path: str | Path, grid_shape: tuple[int, int, int] | None = None
                   ) -> str | None:
    """Why the file at ``path`` cannot be a model-grid volume, from its header and size
    alone (nothing is read into memory), or None. ``grid_shape``: also require that shape."""
    img, why = inspect_nifti(Path(path))
    return why if why is not None else spatial_problem(img, grid_shape)


def content_problem(data: Any) -> str | None:
    """Why the intensities ``data`` (a NumPy array or a torch tensor) cannot be a model
    input: NaN or inf voxels, or a constant volume. None when they can."""
    import torch

    values = data.as_tensor() if hasattr(data, "as_tensor") else torch.as_tensor(data)
    finite = torch.isfinite(values)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        return f"expected finite intensities, found {bad} NaN/inf voxel(s)"
    lo, hi = float(values.min()), float(values.max())
    if hi <= lo:
        return f"expected an image, found a constant volume (every voxel {lo:g})"
    return None


def check_header(path: str | Path, grid_shape: tuple[int, int, int] | None = None) -> str:
    """``path`` as a string, or :class:`ManifestError` from :func:`header_problem`: the
    pipeline's step before it reads a volume."""
    why = header_problem(path, grid_shape)
    if why is not None:
        raise ManifestError(f"{path}: {why}")
    return str(path)


def check_content(image: Any) -> Any:
    """``image`` (the loader's channel-first volume, with its file in ``meta``), or
    :class:`ManifestError` from :func:`content_problem`: the pipeline's step after reading."""
    why = content_problem(image)
    if why is not None:
        meta = getattr(image, "meta", None) or {}
        raise ManifestError(f"{meta.get('filename_or_obj', 'model-grid volume')}: {why}")
    return image


def read_model_grid(path: str | Path, grid_shape: tuple[int, int, int] | None = None
                    ) -> np.ndarray:
    """The float32 intensities of a model-grid volume in RAS voxel order, after the whole
    check (header before reading, intensities after): for readers outside the pipeline."""
    import nibabel as nib

    check_header(path, grid_shape)
    img = nib.as_closest_canonical(nib.load(str(path)))
    data = np.asarray(img.dataobj, dtype=np.float32)
    data = data[..., 0] if data.ndim == 4 else data  # the header check allows only 1 volume
    why = content_problem(data)
    if why is not None:
        raise ManifestError(f"{path}: {why}")
    return data


def header_step(grid_shape: tuple[int, int, int] | None) -> Any:
    """:func:`check_header` bound to the grid shape (None: the shape is not checked)."""
    return functools.partial(check_header, grid_shape=grid_shape)


def check_volume_files(paths: Iterable[Path], source: str | Path,
                       grid_shape: tuple[int, int, int] | None = None) -> None:
    """Raise :class:`~adni_pu.errors.ManifestError` naming every model-grid volume of
    ``paths`` (the scans of manifest ``source``) that is missing, a folder, not NIfTI,
    truncated, not 3D or (with ``grid_shape``) not of the grid's shape: the header half of
    this check, for every file before any is read."""
    bad = [(p, why) for p in dict.fromkeys(paths)
           if (why := header_problem(p, grid_shape)) is not None]
    if not bad:
        return
    shown = "; ".join(f"{p}: {why}" for p, why in bad[:3])
    more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
    raise ManifestError(f"{source}: {len(bad)} scan(s) cannot be used: {shown}{more}; "
                        "preprocess them again or remove their rows")

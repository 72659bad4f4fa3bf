"""Registration to the MNI152 template (ANTs affine, optional SyN) and warping helpers.

Arrays here are on grids described by a voxel-to-RAS affine (nibabel's convention);
ANTs works in LPS, so :func:`to_ants` converts. The fixed image is nilearn's bundled
ICBM 2009a brain (``adni_pu.atlas``) resampled to ``resolution_mm`` (2 mm by default:
an affine has 12 parameters, and at 2 mm the fit takes a few seconds on one core and
gives the same result to well below a voxel of the model grid).
"""

from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .config import RegistrationSettings

_LPS = np.diag([-1.0, -1.0, 1.0])


def to_ants(data: np.ndarray, affine: np.ndarray):
    """An ANTs image of ``data`` on the grid ``affine`` (voxel -> RAS mm)."""
    import ants

    m = np.asarray(affine, dtype=np.float64)
    spacing = np.sqrt((m[:3, :3] ** 2).sum(axis=0))
    direction = _LPS @ (m[:3, :3] / spacing)
    origin = _LPS @ m[:3, 3]
    return ants.from_numpy(
        np.ascontiguousarray(data, dtype=np.float32),
        origin=tuple(float(v) for v in origin),
        spacing=tuple(float(v) for v in spacing),
        direction=direction,
    )


def grid_affine(spacing: float, shape: tuple[int, ...], ref_affine: np.ndarray,
                ref_shape: tuple[int, ...]) -> tuple[np.ndarray, tuple[int, int, int]]:
    """An axis-aligned grid of ``spacing`` mm covering the same box as (ref_affine, ref_shape)."""
    ref_spacing = np.sqrt((ref_affine[:3, :3] ** 2).sum(axis=0))
    extent = ref_spacing * np.asarray(ref_shape)
    new_shape = tuple(int(max(1, np.ceil(e / spacing))) for e in extent)
    affine = np.array(ref_affine, dtype=np.float64)
    affine[:3, :3] = ref_affine[:3, :3] / ref_spacing * spacing
    return affine, new_shape  # type: ignore[return-value]


@functools.lru_cache(maxsize=4)
def template_at(resolution_mm: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The MNI152 template brain, its brain mask, and its affine at ``resolution_mm``."""
    from adni_pu import atlas

    img = atlas.load_template("t1")
    if abs(resolution_mm - float(img.header.get_zooms()[0])) < 1e-6:
        data = np.asarray(img.dataobj, dtype=np.float32)
        affine = img.affine
    else:
        affine, shape = grid_affine(resolution_mm, img.shape[:3], img.affine, img.shape[:3])
        data = atlas.resample_to(img, affine, shape, order=1).astype(np.float32)
    mask = template_brain_mask(data)
    return data, mask, affine


def template_brain_mask(template: np.ndarray) -> np.ndarray:
    """Brain mask of the (skull-stripped) template: non-background, holes filled."""
    from scipy import ndimage

    mask = template > 0.05 * float(np.percentile(template[template > 0], 99))
    return ndimage.binary_fill_holes(mask)


@dataclass
class Registration:
    """Result of registering a scan to the template.

    ``fwd`` maps native images into template space and ``inv`` back (ANTs transform
    files, as ``ants.apply_transforms`` expects them); ``template_to_native`` is the
    affine part as a 4x4 RAS matrix mapping template points (mm) to native points.
    """

    fwd: list[str]
    inv: list[str]
    inv_invert: list[bool]
    template_to_native: np.ndarray
    similarity: float
    workdir: str
    files: dict[str, bytes] = field(default_factory=dict)


def _affine_from_mat(path: str) -> np.ndarray:
    """4x4 RAS matrix (fixed -> moving points) of an ITK affine transform file."""
    import ants

    tx = ants.read_transform(path)
    p = np.asarray(tx.parameters, dtype=np.float64)
    c = np.asarray(tx.fixed_parameters, dtype=np.float64)
    a = p[:9].reshape(3, 3)
    t = p[9:12]
    offset = t + c - a @ c
    out = np.eye(4)
    out[:3, :3] = _LPS @ a @ _LPS
    out[:3, 3] = _LPS @ offset
    return out


def register_to_template(
    data: np.ndarray,
    affine: np.ndarray,
    settings: RegistrationSettings,
    mask: np.ndarray | None = None,
) -> Registration:
    """Register a (skull-stripped) brain to the MNI152 template brain.

    ``mask`` (native brain mask) zeroes everything outside the brain first. The result
    keeps its transform files in a temporary folder (``workdir``) and also as bytes in
    ``files`` (``affine.mat`` and, for SyN, ``warp.nii.gz``) for the outputs.
    """
    import ants

    moving_data = np.where(mask, data, 0).astype(np.float32) if mask is not None else data
    tdata, tmask, taffine = template_at(float(settings.resolution_mm))
    fixed = to_ants(tdata, taffine)
    # register at about the template's resolution: downsample fine native scans first
    moving = to_ants(moving_data, affine)
    spacing = np.sqrt((affine[:3, :3] ** 2).sum(axis=0))
    if np.min(spacing) < settings.resolution_mm * 0.75:
        moving = ants.resample_image(moving, (settings.resolution_mm,) * 3, False, 0)
    workdir = tempfile.mkdtemp(prefix="adni_pu_reg_")
    # antspyx 0.6 ignores its ``random_seed`` argument (it only reads ``ants.config``); the
    # ANTs library itself takes the seed of its metric sampling from ANTS_RANDOM_SEED, so set
    # that, or every run samples differently (system time). Multi-threaded Mattes can still
    # differ in the last digits; one thread per worker (the default) is reproducible.
    os.environ["ANTS_RANDOM_SEED"] = str(settings.random_seed)
    kind = "Affine" if settings.transform == "affine" else "SyN"
    result = ants.registration(
        fixed=fixed,
        moving=moving,
        type_of_transform=kind,
        outprefix=os.path.join(workdir, "reg_"),
        aff_metric=settings.metric,
        aff_iterations=tuple(settings.iterations),
        aff_shrink_factors=tuple(settings.shrink_factors),
        aff_smoothing_sigmas=tuple(settings.smoothing_sigmas),
        reg_iterations=tuple(settings.syn_iterations),
        random_seed=settings.random_seed,
        verbose=False,
    )
    fwd = list(result["fwdtransforms"])
    inv = list(result["invtransforms"])
    mat = next(p for p in fwd if p.endswith(".mat"))
    inv_invert = [p.endswith(".mat") for p in inv]
    warped = result["warpedmovout"].numpy()
    similarity = _correlation(warped, tdata, tmask)
    files = {"affine.mat": Path(mat).read_bytes()}
    for p in fwd:
        if p.endswith(".nii.gz"):
            files["warp.nii.gz"] = Path(p).read_bytes()
    return Registration(
        fwd=fwd,
        inv=inv,
        inv_invert=inv_invert,
        template_to_native=_affine_from_mat(mat),
        similarity=similarity,
        workdir=workdir,
        files=files,
    )


def _correlation(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    """Pearson correlation of ``a`` and ``b`` inside ``mask`` (0 when either is constant)."""
    x = a[mask].astype(np.float64)
    y = b[mask].astype(np.float64)
    x -= x.mean()
    y -= y.mean()
    denom = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denom) if denom > 0 else 0.0


def _warp(data: np.ndarray, affine: np.ndarray, out_affine: np.ndarray,
          out_shape: tuple[int, ...], interpolation: str, transforms: list[str],
          invert: list[bool] | None = None) -> np.ndarray:
    import ants

    ref = to_ants(np.zeros(out_shape, dtype=np.float32), out_affine)
    extra = {} if invert is None else {"whichtoinvert": invert}
    out = ants.apply_transforms(fixed=ref, moving=to_ants(data, affine), transformlist=transforms,
                                interpolator=interpolation, **extra)
    return out.numpy()


def warp_to_template(
    data: np.ndarray,
    affine: np.ndarray,
    reg: Registration,
    out_affine: np.ndarray,
    out_shape: tuple[int, ...],
    interpolation: str = "linear",
) -> np.ndarray:
    """Resample a native array onto a template-space grid through the registration."""
    return _warp(data, affine, out_affine, out_shape, interpolation, reg.fwd)


def warp_to_native(
    data: np.ndarray,
    affine: np.ndarray,
    reg: Registration,
    out_affine: np.ndarray,
    out_shape: tuple[int, ...],
    interpolation: str = "linear",
) -> np.ndarray:
    """Resample a template-space array onto a native grid through the inverse registration."""
    return _warp(data, affine, out_affine, out_shape, interpolation, reg.inv, reg.inv_invert)


def cleanup(reg: Registration) -> None:
    """Remove the registration's temporary transform files."""
    import shutil

    shutil.rmtree(reg.workdir, ignore_errors=True)

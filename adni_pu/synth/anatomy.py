"""Template-space anatomy the generator starts from: tissue maps, regions, head layers.

Everything is computed once per process and resolution from the bundled MNI152 template
and AAL atlas (``adni_pu.atlas``), on an MNI-aligned "head" grid that leaves room for a
skull, scalp and neck around the brain.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from adni_pu import atlas

# Head box (mm, MNI): brain plus skull and scalp, and the neck below it.
HEAD_BOX_MIN: tuple[float, float, float] = (-100.0, -142.0, -120.0)
HEAD_BOX_MAX: tuple[float, float, float] = (100.0, 106.0, 112.0)

# Regions (AAL names) of the Alzheimer-type cortical thinning and of amyloid uptake.
AD_CORTEX_REGIONS: tuple[str, ...] = (
    "Temporal_*", "ParaHippocampal_*", "Fusiform_*", "Parietal_*", "Angular_*",
    "SupraMarginal_*", "Precuneus_*", "Cingulate_Post_*",
)
AMYLOID_REGIONS: tuple[str, ...] = (
    "Frontal_*", "Cingulate_*", "Precuneus_*", "Parietal_*", "Temporal_*", "Angular_*",
    "SupraMarginal_*", "Insula_*",
)


@dataclass(frozen=True)
class Anatomy:
    """Template-space maps on the head grid (``affine``, ``shape``); all float32 or bool."""

    affine: np.ndarray
    shape: tuple[int, int, int]
    spacing: float
    gm: np.ndarray
    wm: np.ndarray
    csf: np.ndarray
    brain: np.ndarray
    """Brain (GM + WM + CSF inside the template brain mask) probability."""
    hippocampus: np.ndarray
    """Soft weight of both hippocampi (where hippocampal atrophy acts)."""
    ad_cortex: np.ndarray
    """Soft weight of the cortex where Alzheimer-type thinning acts (0.3 elsewhere)."""
    ventricle_distance: np.ndarray
    """Distance (mm) to the lateral ventricles (0 inside)."""
    depth: np.ndarray
    """Distance (mm) inside the brain hull from its surface (0 outside)."""
    hull_distance: np.ndarray
    """Distance (mm) outside a smooth hull of the brain (0 inside): where skull layers go."""
    neck: np.ndarray
    """Soft tissue below the brain (bool)."""
    cerebellum: np.ndarray
    amyloid_pattern: np.ndarray
    """Relative amyloid uptake pattern in the cortex (mean 1 over the uptake regions)."""


def head_grid(spacing: float) -> tuple[np.ndarray, tuple[int, int, int]]:
    """MNI-aligned (RAS) head grid at ``spacing`` mm: affine and shape."""
    lo = np.asarray(HEAD_BOX_MIN)
    hi = np.asarray(HEAD_BOX_MAX)
    shape = tuple(int(np.ceil((h - lo_) / spacing)) + 1 for lo_, h in zip(lo, hi))
    affine = np.diag([spacing, spacing, spacing, 1.0])
    affine[:3, 3] = lo
    return affine, shape  # type: ignore[return-value]


def _soft(mask: np.ndarray, sigma_vox: float) -> np.ndarray:
    from scipy.ndimage import gaussian_filter

    out = gaussian_filter(mask.astype(np.float32), sigma_vox)
    peak = float(out.max())
    return out / peak if peak > 0 else out


@functools.lru_cache(maxsize=4)
def build_anatomy(spacing: float = 2.0) -> Anatomy:
    """Compute (once per process and spacing) the template-space maps on the head grid."""
    from scipy.ndimage import binary_fill_holes, distance_transform_edt, gaussian_filter

    affine, shape = head_grid(spacing)
    t1 = atlas.resample_to(atlas.load_template("t1"), affine, shape, order=1)
    gm = atlas.resample_to(atlas.load_template("gm"), affine, shape, order=1)
    wm = atlas.resample_to(atlas.load_template("wm"), affine, shape, order=1)
    scale = 255.0 if max(gm.max(), wm.max()) > 1.5 else 1.0
    gm = np.clip(gm / scale, 0, 1).astype(np.float32)
    wm = np.clip(wm / scale, 0, 1).astype(np.float32)
    brain_mask = t1 > 0.5 * float(np.percentile(t1[t1 > 0], 5))
    brain_mask = binary_fill_holes(brain_mask)
    brain = np.clip(_soft(brain_mask, 0.6 / spacing) * 1.0, 0, 1)
    brain = np.maximum(brain, np.clip(gm + wm, 0, 1)).astype(np.float32)
    total = gm + wm
    over = total > brain
    gm[over] *= brain[over] / total[over]
    wm[over] *= brain[over] / total[over]
    csf = np.clip(brain - gm - wm, 0, 1).astype(np.float32)

    labels = atlas.resample_to(atlas.load_template("aal"), affine, shape, order=0)

    def region(patterns: tuple[str, ...]) -> np.ndarray:
        return np.isin(labels, atlas.region_values(patterns))

    hippocampus = _soft(region(atlas.HIPPOCAMPUS_LEFT + atlas.HIPPOCAMPUS_RIGHT), 1.0 / spacing)
    ad_cortex = 0.3 + 0.7 * _soft(region(AD_CORTEX_REGIONS), 6.0 / spacing)
    cerebellum = region(atlas.CEREBELLUM_REGIONS)

    # Depth inside the brain, and a smooth hull around it (where the skull starts).
    depth = distance_transform_edt(brain_mask).astype(np.float32) * spacing
    hull = gaussian_filter(brain_mask.astype(np.float32), 6.0 / spacing) > 0.25
    hull = binary_fill_holes(hull)
    hull_distance = distance_transform_edt(~hull).astype(np.float32) * spacing

    # Lateral ventricles: deep CSF near the midline.
    x, y, z = _world_axes(affine, shape)
    central = (np.abs(x) < 32) & (y > -60) & (y < 35) & (z > -12) & (z < 38)
    ventricles = (csf > 0.5) & central & (depth > 8.0)
    ventricle_distance = distance_transform_edt(~ventricles).astype(np.float32) * spacing

    # Neck: an elliptic column of soft tissue under the skull base.
    neck = ((x / 48.0) ** 2 + ((y + 25.0) / 50.0) ** 2 < 1.0) & (z < -45.0)

    amyloid = region(AMYLOID_REGIONS)
    pattern = 0.6 + 0.4 * _soft(region(("Precuneus_*", "Cingulate_Post_*", "Frontal_*")),
                                5.0 / spacing)
    pattern = np.where(amyloid, pattern, 0.5 * pattern).astype(np.float32)
    weight = gm * amyloid
    pattern /= float((pattern * weight).sum() / max(weight.sum(), 1e-6))

    return Anatomy(
        affine=affine, shape=shape, spacing=spacing, gm=gm, wm=wm, csf=csf, brain=brain,
        hippocampus=hippocampus.astype(np.float32), ad_cortex=ad_cortex.astype(np.float32),
        ventricle_distance=ventricle_distance, depth=depth, hull_distance=hull_distance,
        neck=neck, cerebellum=cerebellum, amyloid_pattern=pattern,
    )


def _world_axes(affine: np.ndarray, shape: tuple[int, int, int]):
    """Broadcastable world x, y, z (mm) of an axis-aligned grid."""
    axes = [affine[a, a] * np.arange(n, dtype=np.float32) + affine[a, 3]
            for a, n in enumerate(shape)]
    return axes[0][:, None, None], axes[1][None, :, None], axes[2][None, None, :]

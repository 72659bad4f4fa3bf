"""Attribution maps of one model-grid volume, on the model grid (``monai.visualize``).

Every method explains the positive (amyloid) logit of a :class:`GridModel`:

- ``gradcam``: Grad-CAM at the last pooled feature map of each branch of each 3-branch CNN
  in the model (three for a single network, three per member of an averaged one), with
  the activations and gradients that MONAI's ``GradCAM`` hooks record
  (``ModelWithHooks``), one forward and one backward pass for all branches. Two changes
  from textbook Grad-CAM, both because one logit is explained across three branches:
  each feature position's value is the sum over channels of gradient x activation at that
  position (HiResCAM, Draelos & Carin 2020) rather than of the channel's *mean* gradient x
  activation, so a position the logit does not read (outside the hippocampus label of a
  ``roi_pool`` branch, or a flattened feature with no weight) gets nothing, and a branch's
  map sums to its first-order share of the logit, the same scale for all three; and the map
  keeps its sign (no ReLU): a branch whose evidence points to the negative class is shown,
  negative, instead of being cut to zero. With the ReLU, which branches got a map at all
  depended on the sign of each branch's evidence, which the initial weights set: on the
  demo's runs the left box got 78-88 % of each group map and the right box 1-6 % for a
  bilateral disease, trained or re-initialised (docs/interpret.md). For a branch that
  ends in a global average pool (no label channel) the gradient is the same at every
  position and the map is signed Grad-CAM. Each branch's map is placed on the region it
  saw (the whole crop for ``brain``, its box for ``hipp_l``/``hipp_r``; MONAI's upsampler
  would stretch it over the whole grid), each feature at the centre of its receptive
  field, and scaled by features / voxels so that its sum on the grid stays its sum over
  feature positions. Signed: tables and shares use |map|.
- ``occlusion``: MONAI ``OcclusionSensitivity``: each ``patch``^3 block of the crop (the part
  of the grid the model sees) is set to the subject's mean brain intensity (z-score about 0
  in the model's input) with no overlap; the map is ``logit - logit with the block occluded``
  (positive: the block pushed the call towards the positive class). Signed.
- ``gradients``: MONAI ``SmoothGrad`` (magnitude): the root mean square, over ``samples``
  noisy copies, of the gradient of the logit with respect to the grid volume; it passes
  through the resize and both box crops, so all three branches are in the one map.
  ``samples = 1`` with ``noise = 0`` is plain ``VanillaGrad``'s magnitude. Non-negative.

The subject's brain mask is held fixed (:class:`GridModel`), so noise and occlusion change
intensities inside the brain, never which voxels are brain.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from adni_pu.errors import VolumeRunError
from adni_pu.interpret.grid_model import GridModel, as_batch

METHODS: tuple[str, ...] = ("gradcam", "occlusion", "gradients")


@dataclass
class MapSettings:
    """Settings of the three methods (recorded in interpret.json)."""

    patch: int = 16
    """Occlusion block side in grid voxels (16 = 24 mm at 1.5 mm)."""
    occlusion_batch: int = 8
    """Occluded copies scored per forward pass."""
    samples: int = 8
    """SmoothGrad noisy copies per volume."""
    noise: float = 0.1
    """SmoothGrad noise SD as a fraction of the volume's intensity range."""
    seed: int = 0
    """Seed of the SmoothGrad noise (per volume, so a map does not depend on the order)."""

    def __post_init__(self) -> None:
        from adni_pu.errors import ConfigError

        if self.patch < 1 or self.occlusion_batch < 1 or self.samples < 1:
            raise ConfigError(f"patch, occlusion_batch, samples: expected >= 1, found "
                              f"{self.patch}, {self.occlusion_batch}, {self.samples}")
        if self.noise < 0:
            raise ConfigError(f"noise: expected >= 0, found {self.noise}")


def identity(x: Any) -> Any:
    """A ``postprocessing`` for MONAI's ``GradCAM`` that keeps magnitudes as they are (its
    default normaliser flips them; docs/interpret.md)."""
    return x


# --------------------------------------------------------------------------- Grad-CAM


def branch_layers(model: nn.Module) -> list[tuple[str, str]]:
    """(branch name, module name) of the last pooled feature map of every branch of every
    3-branch CNN inside ``model`` (names relative to ``model``)."""
    from adni_pu.models.cnn3d import ThreeBranchCNN3D

    out = []
    for prefix, module in model.named_modules():
        if not isinstance(module, ThreeBranchCNN3D):
            continue
        for branch, sub in module.branches.items():
            pools = [n for n, m in sub.blocks.named_children() if isinstance(m, nn.MaxPool3d)]
            if not pools:
                raise VolumeRunError(f"branch {branch}: no pooling layer to take Grad-CAM at")
            out.append((branch, ".".join(p for p in (prefix, "branches", branch, "blocks",
                                                     pools[-1]) if p)))
    if not out:
        raise VolumeRunError(f"gradcam needs the 3-branch CNN (cnn3d); this run's model is "
                             f"{type(model).__name__}; use --method gradients or occlusion")
    return out


def feature_geometry(blocks: nn.Module, upto: str) -> tuple[list[float], list[float]]:
    """Per axis, where feature ``j`` of layer ``upto`` of a branch sits in its input:
    ``offset + j * jump`` voxels (the centre of its receptive field), through the branch's
    unpadded convolutions and poolings."""
    offset, jump = [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]
    for name, module in blocks.named_children():
        if isinstance(module, (nn.Conv3d, nn.MaxPool3d, nn.AvgPool3d)):
            size, stride, pad = (_triple(getattr(module, k)) for k in
                                 ("kernel_size", "stride", "padding"))
            dil = _triple(getattr(module, "dilation", 1))
            for a in range(3):
                offset[a] += ((size[a] - 1) * dil[a] / 2.0 - pad[a]) * jump[a]
                jump[a] *= stride[a]
        if name == upto:
            break
    return offset, jump


def _triple(value: Any) -> tuple[int, int, int]:
    return tuple(value) if isinstance(value, (tuple, list)) else (int(value),) * 3  # type: ignore[return-value]


def to_input_space(raw: torch.Tensor, offset: list[float], jump: list[float],
                   size: tuple[int, ...]) -> torch.Tensor:
    """A feature map (1 x 1 x f^3) on its branch's input voxels (``size``): each feature at
    the centre of its receptive field, trilinear in between, the edge value beyond.
    (MONAI's default upsampler stretches the map over the whole input instead, which
    shifts it by up to half a receptive field with unpadded convolutions.)"""
    import torch.nn.functional as F

    axes = []
    for a, (n_in, n_feat) in enumerate(zip(size, raw.shape[2:])):
        q = (torch.arange(n_in, dtype=torch.float64) - offset[a]) / jump[a]
        q = q.clamp(0, n_feat - 1)
        axes.append(2 * q / (n_feat - 1) - 1 if n_feat > 1 else torch.zeros_like(q))
    d, h, w = torch.meshgrid(*axes, indexing="ij")
    grid = torch.stack([w, h, d], dim=-1)[None].to(raw.dtype)  # grid_sample wants (x, y, z)
    return F.grid_sample(raw, grid, mode="bilinear", align_corners=True)


def gradcam_map(grid_model: GridModel, volume: np.ndarray) -> np.ndarray:
    """Signed, element-wise Grad-CAM (HiResCAM) of every branch, mapped back to the voxels
    that branch saw, summed (see the module docstring)."""
    import torch.nn.functional as F
    from monai.visualize.class_activation_maps import ModelWithHooks

    layers = branch_layers(grid_model.model)
    hooks = getattr(grid_model, "_gradcam", None)
    if hooks is None:  # built once per model: it registers its own hooks
        hooks = ModelWithHooks(grid_model, [f"model.{n}" for _, n in layers],
                               register_forward=True, register_backward=True)
        grid_model._gradcam = hooks
    hooks.activations.clear()
    hooks.gradients.clear()  # never a gradient left from the previous volume
    data = grid_model.data
    _, acti, grad = hooks(as_batch(volume, grid_model._device()), class_idx=0)
    if len(grad) != len(layers):
        raise VolumeRunError("gradcam: a branch's feature map got no gradient")
    out = torch.zeros(tuple(data.grid_shape), dtype=torch.float64)
    crop = grid_model.crop
    for (branch, name), a, g in zip(layers, acti, grad):
        raw = (g * a).sum(1, keepdim=True).detach().double().cpu()  # 1 x 1 x features
        blocks = grid_model.model.get_submodule(name.rsplit(".", 1)[0])
        offset, jump = feature_geometry(blocks, name.rsplit(".", 1)[1])
        if branch == "brain":  # the branch saw the crop resized to brain_size
            seen = to_input_space(raw, offset, jump, tuple(data.brain_size))
            up = F.interpolate(seen, size=tuple(data.crop_shape), mode="trilinear",
                               align_corners=False)[0, 0]
            region = crop
        else:  # the branch saw its box of the crop, voxel for voxel
            up = to_input_space(raw, offset, jump, tuple(data.hipp_size))[0, 0]
            box = grid_model.boxes[branch]
            region = tuple(slice(c.start + s.start, c.start + s.stop)
                           for c, s in zip(crop, box))
        # density: each feature's share spread over the voxels it stands for, so the map's
        # sum on the grid is (up to the edges) its sum over feature positions, signed
        out[region] += up * (raw.numel() / up.numel())
    grid_model.model.zero_grad(set_to_none=True)
    return out.numpy().astype(np.float32)


# --------------------------------------------------------------------------- occlusion


def occlusion_map(grid_model: GridModel, volume: np.ndarray, brain: np.ndarray,
                  settings: MapSettings) -> np.ndarray:
    """``logit - logit with the block occluded`` for every ``patch``^3 block of the crop."""
    from monai.visualize import OcclusionSensitivity

    from adni_pu.interpret.grid_model import CropView

    value = float(volume[brain].mean()) if brain.any() else 0.0
    view = CropView(grid_model).eval()  # MONAI restores the wrapper's mode on the way out
    occ = OcclusionSensitivity(nn_module=view, mask_size=settings.patch,
                               n_batch=settings.occlusion_batch, mode=value, overlap=0.0,
                               activate=False, verbose=False)
    crop = as_batch(volume, grid_model._device())[(slice(None), slice(None), *grid_model.crop)]
    with torch.no_grad(), warnings.catch_warnings():
        # MONAI 1.6 indexes with lists, which torch 2.9+ deprecates (a warning per block)
        warnings.filterwarnings("ignore", message="Using a non-tuple sequence")
        base = float(view(crop)[0, 0])
        occluded, _ = occ(crop)
    out = np.zeros(tuple(grid_model.data.grid_shape), dtype=np.float32)
    occluded = occluded[0, 0].detach().cpu().numpy()  # MONAI 1.6: 1 x 1 x crop (no class axis)
    if occluded.ndim == 4:  # the class axis some MONAI versions add last
        occluded = occluded[..., 0]
    out[grid_model.crop] = base - occluded
    return out


# --------------------------------------------------------------------------- gradients


def gradient_map(grid_model: GridModel, volume: np.ndarray, settings: MapSettings) -> np.ndarray:
    """SmoothGrad magnitude of the logit with respect to the grid volume."""
    from monai.visualize import SmoothGrad

    x = as_batch(volume, grid_model._device())
    smooth = SmoothGrad(grid_model, stdev_spread=settings.noise, n_samples=settings.samples,
                        magnitude=True, verbose=False)
    state = torch.random.get_rng_state()
    torch.manual_seed(settings.seed)
    try:
        grad = smooth(x, index=0)
    finally:
        torch.random.set_rng_state(state)
    grid_model.model.zero_grad(set_to_none=True)
    return grad[0, 0].detach().cpu().numpy().astype(np.float32)


def attribution_map(method: str, grid_model: GridModel, volume: np.ndarray,
                    brain: np.ndarray, settings: MapSettings | None = None) -> np.ndarray:
    """The ``method`` map of one grid volume (grid-shaped float32); ``brain`` is the
    volume's brain mask, held fixed while it is perturbed."""
    settings = settings or MapSettings()
    if method not in METHODS:
        raise VolumeRunError(f"method: expected one of {', '.join(METHODS)}, found {method!r}")
    grid_model.set_brain_mask(brain)
    grid_model.eval()  # MONAI's wrappers put a module back in the mode they found it in
    try:
        if method == "gradcam":
            return gradcam_map(grid_model, volume)
        if method == "occlusion":
            return occlusion_map(grid_model, volume, brain, settings)
        return gradient_map(grid_model, volume, settings)
    finally:
        grid_model.eval()

"""The Self-PU paper's 3-branch 3D CNN for ADNI: whole brain plus both hippocampi.

Each branch is ``depth`` blocks of Conv3d(k) - BN - ReLU - MaxPool(3, stride 2) (the paper:
two blocks, 16 and 32 channels, no padding), with its own weights. The branch inputs are
the whole brain resized to 50^3 and the left and right hippocampus boxes of 30^3 voxels;
their flattened features are concatenated and go through FC 256 - BN - ReLU - FC 1.

Options for small cohorts (not in the paper): ``global_pool`` ends every branch in a
channel mean, so the head gets 3 x C features instead of thousands; ``roi_pool`` (with
``global_pool``) averages a hippocampus branch's feature maps inside the atlas hippocampus
label that the data pipeline passes as the box's second channel (``data.hipp_mask``), the
region where atrophy shows, instead of over the whole box; ``brain_roi`` likewise adds the
mean of the brain branch's feature maps inside the box around the lateral ventricles
(``data.ventricle_mask``) to its whole-brain mean.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import nn

from adni_pu.config import preset_table
from adni_pu.errors import ConfigError

BRANCHES: tuple[str, str, str] = ("brain", "hipp_l", "hipp_r")

CNN3D_PRESETS: dict[str, dict[str, Any]] = {
    # The paper: two conv blocks of 16 and 32 channels, FC 256.
    "paper": {"channels": (16, 32), "hidden": 256},
    # Twice the channels: more capacity at the same depth.
    "wide": {"channels": (32, 64), "hidden": 512},
    # A third block (64 channels): a larger receptive field, fewer features to the FC layer.
    "deep": {"channels": (16, 32, 64), "hidden": 256},
}


def _side_after(size: int, depth: int, kernel: int, padding: int, pool: int,
                stride: int) -> int:
    for _ in range(depth):
        size = size + 2 * padding - kernel + 1
        size = (size - pool) // stride + 1
    return size


class Branch3D(nn.Module):
    """Conv3d - BN - ReLU - MaxPool blocks, flattened at the end."""

    def __init__(self, in_channels: int, channels: Sequence[int], kernel_size: int = 3,
                 padding: int = 0, pool_size: int = 3, pool_stride: int = 2,
                 global_pool: bool = False) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = in_channels
        for cout in channels:
            layers += [
                nn.Conv3d(cin, cout, kernel_size, padding=padding, bias=False),
                nn.BatchNorm3d(cout), nn.ReLU(inplace=True),
                nn.MaxPool3d(pool_size, stride=pool_stride),
            ]
            cin = cout
        if global_pool:
            layers.append(nn.AdaptiveAvgPool3d(1))
        self.blocks = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Features of ``x`` (B x C x D x H x W), flattened to B x F (F = C with
        ``global_pool``: the mean of each channel over the volume)."""
        return self.blocks(x).flatten(1)


@dataclass(frozen=True)
class BranchGeometry:
    """The conv/pool geometry of every branch's blocks: Conv3d(``kernel_size``, zero
    ``padding``), then MaxPool3d(``pool_size``, stride ``pool_stride``) (the paper's: 3, 0,
    3, 2). :func:`build_cnn3d` takes these four as keyword settings too."""

    kernel_size: int = 3
    padding: int = 0
    pool_size: int = 3
    pool_stride: int = 2


class ThreeBranchCNN3D(nn.Module):
    """Brain, left and right hippocampus branches with separate weights; one logit out.

    ``forward(x)`` takes a dict with keys ``brain`` (B x 1 x 50^3 by default), ``hipp_l``
    and ``hipp_r`` (B x 1 x 30^3), or a (brain, hipp_l, hipp_r) tuple, and returns the
    logits (shape B). ``geometry``: the branches' conv/pool sizes (:class:`BranchGeometry`;
    None: the paper's).
    """

    def __init__(self, channels: Sequence[int] = (16, 32), hidden: int = 256,
                 brain_size: int | Sequence[int] = 50, hipp_size: int | Sequence[int] = 30,
                 in_channels: int = 1, geometry: BranchGeometry | None = None,
                 dropout: float = 0.0, global_pool: bool = False, roi_pool: bool = False,
                 brain_roi: bool = False) -> None:
        super().__init__()
        geometry = geometry or BranchGeometry()
        kernel_size, padding = geometry.kernel_size, geometry.padding
        pool_size, pool_stride = geometry.pool_size, geometry.pool_stride
        if (roi_pool or brain_roi) and not global_pool:
            raise ConfigError("roi_pool, brain_roi: need global_pool (a label channel "
                              "chooses where a branch's feature maps are averaged)")
        self.roi_pool, self.brain_roi = roi_pool, brain_roi
        channels = tuple(int(c) for c in channels)
        if not channels or any(c < 1 for c in channels):
            raise ConfigError(f"channels: expected positive channel counts, found {channels}")
        if hidden < 1:
            raise ConfigError(f"hidden: expected a positive width, found {hidden}")
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"dropout: expected a value in [0, 1), found {dropout}")
        self.channels = channels
        self.brain_size = _triple(brain_size, "brain_size")
        self.hipp_size = _triple(hipp_size, "hipp_size")
        n_features = 0
        for name, size in (("brain", self.brain_size), ("hipp_l", self.hipp_size),
                           ("hipp_r", self.hipp_size)):
            sides = [_side_after(s, len(channels), kernel_size, padding, pool_size,
                                 pool_stride) for s in size]
            if min(sides) < 1:
                raise ConfigError(
                    f"{name} input of {size} voxels is too small for {len(channels)} "
                    f"conv/pool blocks (kernel {kernel_size}, pool {pool_size}/{pool_stride})")
            n_features += channels[-1] * (1 if global_pool else sides[0] * sides[1] * sides[2])
        n_features += channels[-1] if brain_roi else 0  # the brain's mean inside the box
        self.branches = nn.ModuleDict(
            {name: Branch3D(in_channels, channels, **asdict(geometry),
                            global_pool=global_pool and not self._labelled(name))
             for name in BRANCHES})
        self.n_features = n_features
        head: list[nn.Module] = [nn.Linear(n_features, hidden), nn.BatchNorm1d(hidden),
                                 nn.ReLU(inplace=True)]
        if dropout > 0:
            head.append(nn.Dropout(dropout))
        head.append(nn.Linear(hidden, 1))
        self.classifier = nn.Sequential(*head)

    def forward(self, x: Mapping[str, torch.Tensor] | Sequence[torch.Tensor]) -> torch.Tensor:
        """One logit per example (shape B)."""
        if isinstance(x, Mapping):
            missing = [k for k in BRANCHES if k not in x]
            if missing:
                raise KeyError(f"input dict lacks {missing}; expected keys {list(BRANCHES)}")
            inputs = [x[k] for k in BRANCHES]
        else:
            if len(x) != 3:
                raise ValueError(f"expected 3 inputs (brain, hipp_l, hipp_r), found {len(x)}")
            inputs = list(x)
        feats = [self._branch(k, t) for k, t in zip(BRANCHES, inputs)]
        return self.classifier(torch.cat(feats, dim=1)).squeeze(-1)

    def _labelled(self, name: str) -> bool:
        """Whether branch ``name``'s input ends in a label channel (roi_pool, brain_roi)."""
        return self.brain_roi if name == "brain" else self.roi_pool

    def _branch(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """One branch's features. With a label channel (``roi_pool`` for the hippocampus
        boxes, ``brain_roi`` for the brain) the input's last channel is the label, and the
        feature maps are averaged inside it (resampled to their grid): a hippocampus branch
        gives only that mean, the brain branch its whole-volume mean and that mean."""
        if not self._labelled(name):
            return self.branches[name](x)
        if x.shape[1] < 2:
            setting = "ventricle_mask" if name == "brain" else "hipp_mask"
            raise ValueError(f"{name}: expected the image and its label as 2 channels, found "
                             f"{x.shape[1]} (set data.{setting} = true)")
        maps = self.branches[name].blocks(x[:, :-1])
        weight = nn.functional.adaptive_avg_pool3d(x[:, -1:], maps.shape[2:])
        total = weight.sum(dim=(2, 3, 4)).clamp_min(1e-6)
        inside = (maps * weight).sum(dim=(2, 3, 4)) / total
        return torch.cat([maps.mean(dim=(2, 3, 4)), inside], 1) if name == "brain" else inside


def _triple(value: int | Sequence[int], name: str) -> tuple[int, int, int]:
    out = (int(value),) * 3 if isinstance(value, int) else tuple(int(v) for v in value)
    if len(out) != 3 or min(out) < 1:
        raise ConfigError(f"{name}: expected one size or three positive sizes, found {value}")
    return out  # type: ignore[return-value]


def build_cnn3d(preset: str = "paper", **overrides: Any) -> nn.Module:
    """The 3-branch 3D CNN from a preset (``paper``, ``wide``, ``deep``) plus overrides
    (:class:`ThreeBranchCNN3D`'s settings, with :class:`BranchGeometry`'s given by name)."""
    kwargs = {**preset_table(CNN3D_PRESETS, preset), **overrides}
    sizes = {f.name: kwargs.pop(f.name) for f in fields(BranchGeometry) if f.name in kwargs}
    if sizes:
        kwargs["geometry"] = BranchGeometry(**sizes)
    return ThreeBranchCNN3D(**kwargs)

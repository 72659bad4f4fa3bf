"""Grad-CAM (adni_pu.interpret): maps show the model, not the architecture.

Each branch's map goes where that branch looked and keeps its sign: a network whose only
informative branch is the right hippocampus box gets its whole map there, whichever way
its evidence points (Grad-CAM's ReLU used to cut a branch with negative evidence to zero,
so which box got a map depended on the initial weights), and a mirror-symmetric network
on a mirror-symmetric volume gets the same mass in both boxes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adni_pu.data.volume_config import VolumeDataConfig
from adni_pu.interpret.grid_model import GridModel
from adni_pu.interpret.maps import attribution_map
from adni_pu.models.cnn3d import ThreeBranchCNN3D

# the model grid (1.5 mm), small branch inputs; 15-voxel boxes, which do not overlap
DATA = dict(brain_size=(24, 24, 24), hipp_size=(15, 15, 15), hipp_margin=0, cache="none")


def _volume(data: VolumeDataConfig, seed: int = 0) -> np.ndarray:
    """A textured ellipsoid brain on the grid (no two voxels alike)."""
    grid = np.indices(data.grid_shape).astype(np.float32)
    centre = np.array(data.grid_shape, dtype=np.float32)[:, None, None, None] / 2
    radii = np.array([55, 70, 55], dtype=np.float32)[:, None, None, None]
    inside = (((grid - centre) / radii) ** 2).sum(0) < 1
    texture = np.random.default_rng(seed).normal(100.0, 20.0, size=data.grid_shape)
    return np.where(inside, texture, 0.0).astype(np.float32)


def _regions(model: GridModel) -> dict[str, tuple[slice, ...]]:
    """Each box on the grid."""
    return {k: tuple(slice(c.start + s.start, c.start + s.stop)
                     for c, s in zip(model.crop, model.boxes[k]))
            for k in ("hipp_l", "hipp_r")}


def _network(informative: tuple[str, ...], sign: float, global_pool: bool
             ) -> ThreeBranchCNN3D:
    """A one-block 3-branch CNN whose head reads only the ``informative`` branches' features,
    each with the same weight of sign ``sign`` (the hidden layer passes them on, positive)."""
    torch.manual_seed(0)
    net = ThreeBranchCNN3D((3,), 4, brain_size=24, hipp_size=15, global_pool=global_pool)
    net.eval()
    with torch.no_grad():
        first, last = net.classifier[0], net.classifier[-1]
        first.weight.zero_()
        first.bias.zero_()
        start = 0
        for branch, side in (("brain", 24), ("hipp_l", 15), ("hipp_r", 15)):
            width = net.branches[branch](torch.zeros(1, 1, side, side, side)).shape[1]
            if branch in informative:
                first.weight[:, start:start + width] = 1.0 / width
            start += width
        assert start == net.n_features
        last.weight.fill_(sign)
        last.bias.zero_()
    return net


def _mass(heat: np.ndarray, model: GridModel) -> dict[str, float]:
    absolute = np.abs(heat.astype(np.float64))
    total = absolute.sum()
    out = {k: float(absolute[r].sum() / total) for k, r in _regions(model).items()}
    out["total"] = float(total)
    return out


@pytest.mark.parametrize("global_pool", [True, False])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_network_reading_only_the_right_box_gets_its_map_there(sign, global_pool):
    data = VolumeDataConfig(**DATA)
    volume = _volume(data)
    model = GridModel(_network(("hipp_r",), sign, global_pool), data)
    heat = attribution_map("gradcam", model, volume, volume != 0)
    mass = _mass(heat, model)
    assert mass["total"] > 0
    assert mass["hipp_r"] > 0.999 and mass["hipp_l"] < 1e-6, mass
    # the evidence's sign is kept: the map sums, with its sign, to about the branch's share
    # of the logit (the head is linear in the pooled features here)
    assert np.sign(heat.sum()) == sign
    with torch.no_grad():
        logit = float(model(torch.as_tensor(volume)[None, None]))
    assert heat.sum() == pytest.approx(logit - float(model.model.classifier[-1].bias.detach()),
                                       rel=0.05)


def test_a_network_reading_only_the_whole_brain_puts_its_map_on_the_crop_not_the_boxes():
    data = VolumeDataConfig(**DATA)
    volume = _volume(data)
    model = GridModel(_network(("brain",), -1.0, True), data)
    heat = attribution_map("gradcam", model, volume, volume != 0)
    mass = _mass(heat, model)
    box_volume = np.prod(data.hipp_size) / np.prod(data.crop_shape)
    assert mass["total"] > 0
    for key in ("hipp_l", "hipp_r"):  # no more than the box's share of the crop, about
        assert mass[key] < 3 * box_volume, mass
    assert np.abs(heat[tuple(slice(0, o) for o in data.crop_origin())]).sum() == 0


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_mirror_symmetric_network_on_a_mirrored_volume_gets_equal_mass_in_both_boxes(sign):
    """The right box's content is the left box's mirrored left-right, and the right
    branch's kernels are the left branch's mirrored: both branches compute the same
    features, so the two boxes must get the same mass, mirrored."""
    data = VolumeDataConfig(**DATA)
    volume = _volume(data, seed=1)
    net = _network(("hipp_l", "hipp_r"), sign, True)
    with torch.no_grad():
        left, right = net.branches["hipp_l"].blocks, net.branches["hipp_r"].blocks
        right[0].weight.copy_(left[0].weight.flip(2))  # kernels mirrored along x
        right[1].load_state_dict(left[1].state_dict())
    model = GridModel(net, data)
    regions = _regions(model)
    volume[regions["hipp_r"]] = volume[regions["hipp_l"]][::-1]
    heat = attribution_map("gradcam", model, volume, volume != 0)
    mass = _mass(heat, model)
    assert mass["total"] > 0 and mass["hipp_l"] > 0.45
    assert mass["hipp_l"] == pytest.approx(mass["hipp_r"], rel=1e-4)
    np.testing.assert_allclose(heat[regions["hipp_r"]], heat[regions["hipp_l"]][::-1],
                               rtol=1e-4, atol=1e-6 * np.abs(heat).max())


def test_positions_the_logit_does_not_read_get_nothing():
    """A flattened network whose head reads one feature position of the right box: the map
    sits on that feature's receptive-field centre (box voxel 2 + 2 * 1 = 4 on each axis,
    trilinear to its neighbours), not over the whole box, as Grad-CAM's channel-mean
    gradient would spread it."""
    data = VolumeDataConfig(**DATA)
    volume = _volume(data, seed=2)
    net = _network((), 1.0, False)
    side = 6  # 15 -> conv 13 -> pool 6
    brain = net.branches["brain"](torch.zeros(1, 1, 24, 24, 24)).shape[1]
    per_channel = side ** 3
    position = (1 * side + 1) * side + 1  # feature (1, 1, 1)
    with torch.no_grad():
        for c in range(3):
            column = brain + 3 * per_channel + c * per_channel + position  # after hipp_l's
            net.classifier[0].weight[:, column] = 1.0
    model = GridModel(net, data)
    heat = attribution_map("gradcam", model, volume, volume != 0)
    box = np.abs(heat[_regions(model)["hipp_r"]].astype(np.float64))
    assert box.sum() > 0 and box.sum() == pytest.approx(np.abs(heat).sum())
    assert box[3:6, 3:6, 3:6].sum() > 0.999 * box.sum()
    assert np.unravel_index(int(box.argmax()), box.shape) == (4, 4, 4)

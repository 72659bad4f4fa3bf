"""Train-time augmentation of whole volume batches, on any device, drawn from per-item keys.

A batch is a dict of channel-first tensors: ``brain`` (B x C x 50^3) and ``hipp_l`` /
``hipp_r`` (B x C x (30 + 2 margin)^3, the cached boxes with their margin). The steps, in
order, each a small dictionary transform (MONAI's shape: keys in, keys out):

1. :class:`RandBoxShiftd`: each hippocampus box cut at a random place inside its margin;
2. :class:`RandFlipSwapd`: a left-right flip that also swaps ``hipp_l`` and ``hipp_r``
   (MONAI has no such transform: a mirrored right hippocampus looks like a left one);
3. :class:`RandAffineBatchd`: per branch, a small rotation and isotropic scaling about the
   centre, resampled for the whole batch at once by MONAI's ``AffineTransform``
   (bilinear, border padding; rotation matrices in the convention of MONAI's
   ``create_rotate``, ``create_scale``);
4. :class:`RandIntensityd`: one intensity scale and shift for all branches, then optional
   Gaussian noise, on the image channel only (never on a label channel).

Random parameters are not drawn from a generator's state: each item's are a counter-based
hash of its key (:func:`item_keys`: the run's seed, the epoch, the training entry and the
how-many-th time the entry appears in the epoch). A batch is therefore the same on every
data path (device-resident or loader), device, number of loader workers and distributed
shard, and after a resume from a checkpoint. The parameters are drawn on the host for the
whole batch in a few numpy operations; the tensors never leave the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

BRANCHES: tuple[str, str, str] = ("brain", "hipp_l", "hipp_r")

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)

# Columns of an item's uniform draws (fixed, so turning one step off leaves the others'
# draws as they were).
_START_L, _START_R, _FLIP, _AFFINE, _ANGLES, _SCALE = 0, 3, 6, 7, 10, 19
_INTENSITY, _FACTOR, _SHIFT, _N_DRAWS = 22, 23, 24, 25


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 arrays (wraps modulo 2^64)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _u64(values: Any) -> np.ndarray:
    """Integers (any sign, any size) as uint64 modulo 2^64."""
    return np.asarray([int(v) % (1 << 64) for v in np.atleast_1d(values)], dtype=np.uint64)


def occurrences(entries: np.ndarray) -> np.ndarray:
    """For each position, how many times its entry appeared earlier in ``entries``."""
    entries = np.asarray(entries, dtype=np.int64)
    n = len(entries)
    order = np.argsort(entries, kind="stable")
    ordered = entries[order]
    first = np.ones(n, dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    out = np.empty(n, dtype=np.int64)
    out[order] = np.arange(n) - start
    return out


def item_keys(seed: int, entries: np.ndarray) -> np.ndarray:
    """One uint64 key per position of an epoch's ``entries`` (training entry ids in batch
    order): a hash of ``seed`` (the trainer passes the run's seed and the epoch), the entry
    and its occurrence so far, so an entry drawn twice in an epoch is augmented twice."""
    entries = np.asarray(entries, dtype=np.int64)
    with np.errstate(over="ignore"):
        base = _mix(_u64(seed) + _GOLDEN)
        key = _mix(base ^ (entries.astype(np.uint64) * _GOLDEN))
        return _mix(key + occurrences(entries).astype(np.uint64) * _M1)


def uniforms(keys: np.ndarray, n: int = _N_DRAWS) -> np.ndarray:
    """``len(keys) x n`` uniform numbers in [0, 1), the same for the same key."""
    keys = np.asarray(keys, dtype=np.uint64)
    with np.errstate(over="ignore"):
        counters = (np.arange(1, n + 1, dtype=np.uint64) * _GOLDEN)[None, :]
        bits = _mix(_mix(keys[:, None] + counters))
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


@dataclass(frozen=True)
class AugmentSettings:
    """The augmentation's distributions (the fields of ``VolumeDataConfig`` of that name)."""

    hipp_size: tuple[int, int, int] = (30, 30, 30)
    hipp_margin: int = 4
    translate: bool = True
    flip_prob: float = 0.5
    affine_prob: float = 0.3
    rotate_deg: float = 5.0
    scale_range: float = 0.05
    intensity_prob: float = 0.5
    intensity_scale: float = 0.1
    intensity_shift: float = 0.1
    noise_std: float = 0.0

    @classmethod
    def of(cls, config: Any) -> AugmentSettings:
        """The settings of a ``VolumeDataConfig`` (or any object with these fields)."""
        return cls(**{f: getattr(config, f) for f in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Draws:
    """One batch's random parameters (host arrays, one row per item)."""

    start: dict[str, np.ndarray]
    """Box start inside the margin per hippocampus key, B x 3 ints."""
    flip: np.ndarray
    affine: np.ndarray
    """B x 3 booleans: the affine applies to branch k of item b."""
    angles: np.ndarray
    """B x 3 x 3 radians: per branch, rotation about the array's axes 0, 1, 2."""
    scale: np.ndarray
    """B x 3 isotropic scale factors per branch."""
    intensity: np.ndarray
    factor: np.ndarray
    shift: np.ndarray
    noise_seed: int


def draw(keys: np.ndarray, s: AugmentSettings) -> Draws:
    """The random parameters of the items with these keys (the old per-item ones:
    ``randint(0, 2 m + 1)`` box starts, Bernoulli flips and affines, U(-r, r) angles,
    1 + U(-s, s) scales, 1 + U(-a, a) intensity factors and U(-b, b) shifts)."""
    u = uniforms(keys)
    m = s.hipp_margin
    if s.translate and m > 0:
        span = 2 * m + 1
        start = {k: np.minimum((u[:, c:c + 3] * span).astype(np.int64), span - 1)
                 for k, c in (("hipp_l", _START_L), ("hipp_r", _START_R))}
    else:
        start = {k: np.full((len(u), 3), m, np.int64) for k in ("hipp_l", "hipp_r")}
    radians = math.radians(s.rotate_deg)
    noise_seed = int(_mix(np.bitwise_xor.reduce(np.asarray(keys, np.uint64)[None, :],
                                                axis=1) + _M2)[0] >> np.uint64(1))
    return Draws(
        start=start,
        flip=u[:, _FLIP] < s.flip_prob,
        affine=u[:, _AFFINE:_AFFINE + 3] < s.affine_prob,
        angles=((u[:, _ANGLES:_ANGLES + 9] * 2 - 1) * radians).reshape(-1, 3, 3),
        scale=1.0 + (u[:, _SCALE:_SCALE + 3] * 2 - 1) * s.scale_range,
        intensity=u[:, _INTENSITY] < s.intensity_prob,
        factor=1.0 + (u[:, _FACTOR] * 2 - 1) * s.intensity_scale,
        shift=(u[:, _SHIFT] * 2 - 1) * s.intensity_shift,
        noise_seed=noise_seed,
    )


def rotation_matrices(angles: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``n x 4 x 4`` homogeneous matrices ``create_rotate(3, angles) @ create_scale(3, 1/s)``
    in MONAI's convention (``rotate_order="XYZ"``: Rx @ Ry @ Rz), for n items at once."""
    c, s = np.cos(angles), np.sin(angles)
    n = len(angles)
    one, zero = np.ones(n), np.zeros(n)
    rx = np.stack([one, zero, zero, zero, c[:, 0], -s[:, 0], zero, s[:, 0], c[:, 0]], 1)
    ry = np.stack([c[:, 1], zero, s[:, 1], zero, one, zero, -s[:, 1], zero, c[:, 1]], 1)
    rz = np.stack([c[:, 2], -s[:, 2], zero, s[:, 2], c[:, 2], zero, zero, zero, one], 1)
    rot = rx.reshape(n, 3, 3) @ ry.reshape(n, 3, 3) @ rz.reshape(n, 3, 3)
    out = np.zeros((n, 4, 4))
    out[:, :3, :3] = rot / np.asarray(scale, dtype=float)[:, None, None]
    out[:, 3, 3] = 1.0
    return out


# --------------------------------------------------------------------------- the transforms


class RandBoxShiftd:
    """Cut each hippocampus box (``hipp_size``) out of its cached margin, at the drawn start
    (the centre when translation is off): one gather for the whole batch."""

    keys = ("hipp_l", "hipp_r")

    def __init__(self, size: tuple[int, int, int]) -> None:
        self.size = tuple(int(v) for v in size)

    def __call__(self, data: dict[str, torch.Tensor], draws: Draws) -> dict[str, torch.Tensor]:
        out = dict(data)
        for key in self.keys:
            out[key] = shift_boxes(data[key], draws.start[key], self.size)
        return out


def shift_boxes(x: torch.Tensor, start: np.ndarray, size: tuple[int, ...]) -> torch.Tensor:
    """``x[b, :, s0:s0+n0, s1:s1+n1, s2:s2+n2]`` with per-item starts ``s`` (B x 3)."""
    if len(np.unique(start, axis=0)) == 1:  # one start for all (evaluation): a view
        s = [int(v) for v in start[0]]
        return x[:, :, s[0]:s[0] + size[0], s[1]:s[1] + size[1], s[2]:s[2] + size[2]]
    dev = x.device
    st = torch.as_tensor(start, dtype=torch.long).to(dev, non_blocking=True)
    b = torch.arange(x.shape[0], device=dev).view(-1, 1, 1, 1, 1)
    c = torch.arange(x.shape[1], device=dev).view(1, -1, 1, 1, 1)
    i = (st[:, 0, None] + torch.arange(size[0], device=dev)).view(-1, 1, size[0], 1, 1)
    j = (st[:, 1, None] + torch.arange(size[1], device=dev)).view(-1, 1, 1, size[1], 1)
    k = (st[:, 2, None] + torch.arange(size[2], device=dev)).view(-1, 1, 1, 1, size[2])
    return x[b, c, i, j, k]


class RandFlipSwapd:
    """Mirror the first spatial axis (RAS x, left-right) of the drawn items and swap their
    ``hipp_l`` and ``hipp_r``: a mirrored right hippocampus is a left one."""

    keys = BRANCHES

    def __call__(self, data: dict[str, torch.Tensor], draws: Draws) -> dict[str, torch.Tensor]:
        if not draws.flip.any():
            return data
        out = dict(data)
        sel = torch.as_tensor(draws.flip).to(data["brain"].device, non_blocking=True)
        sel = sel.view(-1, 1, 1, 1, 1)
        out["brain"] = torch.where(sel, data["brain"].flip(2), data["brain"])
        out["hipp_l"] = torch.where(sel, data["hipp_r"].flip(2), data["hipp_l"])
        out["hipp_r"] = torch.where(sel, data["hipp_l"].flip(2), data["hipp_r"])
        return out


class RandAffineBatchd:
    """Per branch, rotate and scale the drawn items about their centre with MONAI's
    ``AffineTransform`` (normalised coordinates, bilinear, border padding), all channels
    (a label channel moves with its image); only the drawn items are resampled."""

    keys = BRANCHES

    def __init__(self) -> None:
        from monai.networks.layers import AffineTransform

        self.warp = AffineTransform(normalized=True, mode="bilinear", padding_mode="border",
                                    align_corners=False, reverse_indexing=True)

    def __call__(self, data: dict[str, torch.Tensor], draws: Draws) -> dict[str, torch.Tensor]:
        out = dict(data)
        for k, key in enumerate(self.keys):
            idx = np.flatnonzero(draws.affine[:, k])
            if len(idx) == 0:
                continue
            x = data[key]
            theta = torch.as_tensor(rotation_matrices(draws.angles[idx, k], draws.scale[idx, k]),
                                    dtype=torch.float32).to(x.device, non_blocking=True)
            rows = torch.as_tensor(idx).to(x.device, non_blocking=True)
            warped = self.warp(x.index_select(0, rows).float(), theta).to(x.dtype)
            out[key] = x.index_copy(0, rows, warped)
        return out


class RandIntensityd:
    """One intensity scale and shift per drawn item for all branches, then Gaussian noise
    (``noise_std``), on channel 0 (the image) only."""

    keys = BRANCHES

    def __init__(self, noise_std: float = 0.0) -> None:
        self.noise_std = float(noise_std)

    def __call__(self, data: dict[str, torch.Tensor], draws: Draws) -> dict[str, torch.Tensor]:
        any_intensity = bool(draws.intensity.any())
        if not any_intensity and self.noise_std <= 0:
            return data
        dev = data["brain"].device
        factor = np.where(draws.intensity, draws.factor, 1.0)
        shift = np.where(draws.intensity, draws.shift, 0.0)
        f = torch.as_tensor(factor, dtype=torch.float32).to(dev, non_blocking=True)
        s = torch.as_tensor(shift, dtype=torch.float32).to(dev, non_blocking=True)
        gen = None
        if self.noise_std > 0:
            gen = torch.Generator(device=dev)
            gen.manual_seed(draws.noise_seed)
        out = dict(data)
        for key in self.keys:
            x = data[key]
            image = x[:, :1]
            view = (-1,) + (1,) * (x.dim() - 1)
            if any_intensity:
                image = image * f.view(view) + s.view(view)
            if gen is not None:
                image = image + self.noise_std * torch.randn(
                    image.shape, generator=gen, device=dev, dtype=image.dtype)
            out[key] = torch.cat([image, x[:, 1:]], dim=1) if x.shape[1] > 1 else image
        return out


class VolumeAugment:
    """The augmentation of :mod:`this module <adni_pu.data.volume_augment>` for one
    configuration: ``augment(batch, keys)`` returns the augmented batch (boxes cut to
    ``hipp_size``); ``centre(batch)`` cuts the boxes at their centre (evaluation)."""

    def __init__(self, settings: AugmentSettings) -> None:
        self.settings = settings
        self.box = RandBoxShiftd(settings.hipp_size)
        self.flip = RandFlipSwapd()
        self.affine = RandAffineBatchd()
        self.intensity = RandIntensityd(settings.noise_std)

    def __call__(self, batch: dict[str, torch.Tensor], keys: np.ndarray
                 ) -> dict[str, torch.Tensor]:
        s = self.settings
        d = draw(keys, s)
        out = self.box(batch, d)
        if s.flip_prob > 0:
            out = self.flip(out, d)
        if s.affine_prob > 0:
            out = self.affine(out, d)
        if s.intensity_prob > 0 or s.noise_std > 0:
            out = self.intensity(out, d)
        return out

    def centre(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        m = self.settings.hipp_margin
        start = np.full((1, 3), m, np.int64)
        out = dict(batch)
        for key in ("hipp_l", "hipp_r"):
            out[key] = shift_boxes(batch[key], start, self.settings.hipp_size)
        return out

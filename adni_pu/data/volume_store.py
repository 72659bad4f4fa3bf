"""A split's cached volumes stacked once on the training device, and batches gathered there.

:class:`VolumeStore` holds the image channel of every item's cached stage (the whole brain
at ``brain_size`` and the hippocampus boxes with their margin) as three tensors, in float32
or a smaller storage type (``store_dtype``: float16 and bfloat16 round each value; uint8
keeps 256 levels between each volume's minimum and maximum; ``auto``: float16 on a GPU,
float32 on the CPU, where converting float16 costs more than the memory it saves). A
batch is one gather by example index, converted to float32. :func:`store_plan` decides
whether the store fits: the GPU's free memory (``torch.cuda.mem_get_info``), or the host's
available memory for a CPU run.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

log = logging.getLogger("adni_pu.volumes")

_STORAGE = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
            "uint8": torch.uint8}
KEYS: tuple[str, str, str] = ("brain", "hipp_l", "hipp_r")


def item_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """Shape of each stored image (one channel) of a ``VolumeDataConfig``."""
    m = config.hipp_margin
    hipp = (1, *(s + 2 * m for s in config.hipp_size))
    return {"brain": (1, *config.brain_size), "hipp_l": hipp, "hipp_r": hipp}


def storage_type(config: Any, device: torch.device) -> str:
    """The storage type ``config.store_dtype`` means on ``device``."""
    if config.store_dtype != "auto":
        return str(config.store_dtype)
    return "float32" if device.type == "cpu" else "float16"


def store_bytes(n_items: int, config: Any, dtype: str) -> int:
    """Bytes a store of ``n_items`` takes (uint8 adds two float32 numbers per image)."""
    voxels = sum(int(np.prod(s)) for s in item_shapes(config).values())
    extra = 3 * 2 * 4 if dtype == "uint8" else 0
    return n_items * (voxels * _STORAGE[dtype].itemsize + extra)


def free_bytes(device: torch.device) -> int | None:
    """Free memory on ``device`` (GPU: ``torch.cuda.mem_get_info``; CPU: the host's
    MemAvailable), or None when it cannot be told."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as fh:
                for line in fh:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        pages = getattr(os, "sysconf_names", {}).get("SC_AVPHYS_PAGES")
        if pages is not None:
            return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return None


@dataclass(frozen=True)
class StorePlan:
    """Whether the volumes are stored on the device (``use_store``), and why."""

    use_store: bool
    needed: int
    free: int | None
    reason: str


def store_plan(n_items: int, config: Any, device: torch.device) -> StorePlan:
    """``store = "loader"``: never; ``"device"``: always (a failed allocation still falls
    back); ``"auto"``: when the store takes at most half the free memory (the rest is for
    the model, its activations and the evaluation splits)."""
    dtype = storage_type(config, device)
    needed = store_bytes(n_items, config, dtype)
    if config.store == "loader":
        return StorePlan(False, needed, None, "store = 'loader'")
    free = free_bytes(device)
    if config.store == "device" or free is None or needed <= free // 2:
        return StorePlan(True, needed, free, f"store = {config.store!r}")
    return StorePlan(False, needed, free,
                     f"the {n_items} volumes need {needed / 2**20:.0f} MiB as "
                     f"{dtype}, more than half the {free / 2**20:.0f} MiB free "
                     f"on {device}")


class VolumeStore:
    """The images of ``n`` cached items on one device: ``gather(rows)`` gives float32
    B x 1 x ... tensors of the rows (example indices)."""

    def __init__(self, tensors: dict[str, torch.Tensor],
                 ranges: dict[str, torch.Tensor] | None = None) -> None:
        self.tensors = tensors
        self.ranges = ranges
        """uint8 only: per image its minimum and its step (n x 2, float32)."""

    @classmethod
    def build(cls, items: Any, n: int, config: Any, device: torch.device) -> VolumeStore:
        """Read the ``n`` cached items (``items(i)`` -> dict of 1 x ... tensors) once."""
        dtype = storage_type(config, device)
        shapes = item_shapes(config)
        host = {k: torch.empty((n, *shapes[k]), dtype=_STORAGE[dtype]) for k in KEYS}
        ranges = {k: torch.zeros((n, 2), dtype=torch.float32) for k in KEYS}
        for i in range(n):
            item = items(i)
            for key in KEYS:
                x = torch.as_tensor(item[key], dtype=torch.float32)[:1]
                if x.shape != shapes[key]:
                    raise ValueError(f"item {i} {key}: expected shape {shapes[key]}, "
                                     f"found {tuple(x.shape)}")
                if dtype == "uint8":
                    lo, hi = float(x.min()), float(x.max())
                    step = (hi - lo) / 255.0 if hi > lo else 1.0
                    ranges[key][i] = torch.tensor([lo, step])
                    x = torch.round((x - lo) / step).clamp_(0, 255)
                host[key][i] = x.to(_STORAGE[dtype])
        tensors = {k: v.to(device) for k, v in host.items()}
        return cls(tensors, {k: v.to(device) for k, v in ranges.items()}
                   if dtype == "uint8" else None)

    @property
    def nbytes(self) -> int:
        total = sum(t.numel() * t.element_size() for t in self.tensors.values())
        if self.ranges is not None:
            total += sum(t.numel() * t.element_size() for t in self.ranges.values())
        return total

    def __len__(self) -> int:
        return int(self.tensors["brain"].shape[0])

    def gather(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """The float32 images of ``rows`` (a long tensor on the store's device)."""
        out = {}
        for key, t in self.tensors.items():
            x = t[rows].float()  # indexing: CPU index_select is slow on 16-bit types
            if self.ranges is not None:
                lo, step = self.ranges[key][rows].unbind(1)
                x = x * step.view(-1, 1, 1, 1, 1) + lo.view(-1, 1, 1, 1, 1)
            out[key] = x
        return out

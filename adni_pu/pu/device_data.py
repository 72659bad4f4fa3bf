"""Device data: the training device, tensors moved there once, and batches gathered on it.

Tensor data sets (MNIST, CIFAR-10) live on the training device for the whole run
(:meth:`DeviceData.resident`) and batches are gathered by index there. A data set that
assembles its own batches (``load_batches``: the ADNI volumes, stored on the device once and
augmented there in whole batches, :mod:`adni_pu.data.volumes`) is asked for them; other
map-style data sets go through a ``DataLoader`` with the planned batches as its sampler.
:meth:`DeviceData.predict_logits` is the one inference function: training, selection,
evaluate, predict and the benchmarks score models through it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn


def resolve_device(name: str, what: str = "device") -> torch.device:
    """The torch device of ``name``: ``auto`` (CUDA when available, else the CPU), ``cpu``,
    ``cuda``, ``cuda:N`` or ``mps``.

    A name that is none of these, or a device this machine does not have, is a
    :class:`~adni_pu.errors.DeviceError` whose one line names the device, says why (torch
    built without CUDA, no GPU visible, N GPUs) and what to use instead; ``what`` is how
    the user gave it (``--device``, ``train.device``).
    """
    from adni_pu.errors import DeviceError

    text = str(name).strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    kind, colon, index = text.partition(":")
    if kind == "cuda" and (not colon or index.isdigit()):
        if not torch.cuda.is_available():
            why = (f"torch {torch.__version__} is built without CUDA"
                   if torch.version.cuda is None else
                   f"no GPU is visible to torch {torch.__version__} (CUDA "
                   f"{torch.version.cuda}; CUDA_VISIBLE_DEVICES="
                   f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r})")
            raise DeviceError(f"{what} {name}: CUDA is not available on this machine ({why}); "
                              f"use {_choice(what, 'cpu')} or auto")
        count = torch.cuda.device_count()
        if index and int(index) >= count:
            raise DeviceError(f"{what} {name}: this machine has {count} GPU(s), "
                              f"cuda:0 to cuda:{count - 1}; use one of those, or cuda")
        return torch.device(text)
    if text == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise DeviceError(f"{what} {name}: Apple's MPS is not available on this machine; "
                              f"use {_choice(what, 'cpu')} or auto")
        return torch.device("mps")
    raise DeviceError(f"{what} {name!r}: expected auto, cpu, cuda, cuda:N (N: the GPU's "
                      "number) or mps")


def _choice(what: str, value: str) -> str:
    """``--device cpu`` or ``train.device="cpu"``: how to give ``value`` the way ``what``
    was given."""
    return f"{what} {value}" if what.startswith("-") else f'{what}="{value}"'


def configure_torch(device: torch.device, threads: int, deterministic: bool) -> None:
    """CPU threads (0: PyTorch's choice) and deterministic kernels where asked."""
    if threads > 0:
        torch.set_num_threads(threads)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = False


def epoch_means(values: dict[str, list[Any]]) -> dict[str, Any]:
    """Mean of each statistic over an epoch's batches, read from the device in one go.

    Values are summed in batch order in float64 on the host, exactly as the per-batch reads
    of earlier versions did, so metrics.csv keeps its numbers. A statistic may be a vector
    per batch (one entry per network of a stack, :mod:`adni_pu.pu.population`): its mean is
    then a list, entry by entry.
    """
    tensors = [v for vals in values.values() for v in vals if isinstance(v, torch.Tensor)]
    read = iter(torch.stack(tensors).cpu().tolist()) if tensors else iter(())
    return {key: _ordered_mean([next(read) if isinstance(v, torch.Tensor) else float(v)
                                for v in vals])
            for key, vals in values.items()}


def _ordered_mean(rows: list[Any]) -> Any:
    """The mean of ``rows`` summed in their order (per entry when the rows are lists)."""
    if isinstance(rows[0], list):
        return [_ordered_mean([row[m] for row in rows]) for m in range(len(rows[0]))]
    total = 0.0
    for row in rows:
        total += row
    return total / len(rows)


def to_device(x: Any, device: torch.device) -> Any:
    """Move a tensor, or a dict/list/tuple of tensors, to ``device``."""
    if isinstance(x, torch.Tensor):
        return x.to(device, non_blocking=True)
    if isinstance(x, dict):
        return {k: to_device(v, device) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(to_device(v, device) for v in x)
    return x


def channels_last(model: nn.Module) -> nn.Module:
    """Channels-last layout (3-D or 2-D, by the model's convolution weights)."""
    ranks = {p.dim() for p in model.parameters()}
    if 5 in ranks:
        return model.to(memory_format=torch.channels_last_3d)
    if 4 in ranks:
        return model.to(memory_format=torch.channels_last)
    return model


def to_layout(x: Any, enabled: bool) -> Any:
    """Channels-last copies of the 4-D / 5-D tensors in ``x`` (when ``enabled``)."""
    if not enabled:
        return x
    if isinstance(x, torch.Tensor):
        if x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        if x.dim() == 5:
            return x.contiguous(memory_format=torch.channels_last_3d)
        return x
    if isinstance(x, dict):
        return {k: to_layout(v, enabled) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(to_layout(v, enabled) for v in x)
    return x


def scoring_inputs(split: Any) -> Any:
    """The inputs a split is scored on: its un-augmented ``eval_x`` where it has one."""
    return split.eval_x if split.eval_x is not None else split.x


class DeviceData:
    """Puts examples on one device, in one memory layout, with one autocast setting.

    ``batch_size`` is the loader's batch for map-style data, ``eval_batch_size`` the slice
    of a resident tensor scored at once; ``collate`` and ``num_workers`` go to the loader.
    """

    def __init__(self, device: torch.device, *, batch_size: int = 8,
                 eval_batch_size: int = 1024, amp: bool = False, layout: bool = False,
                 collate: Callable[[list[Any]], Any] | None = None,
                 num_workers: int = 0) -> None:
        self.device = device
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.amp = amp
        self.layout = layout
        self.collate = collate
        self.num_workers = num_workers
        self._resident: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def autocast(self) -> contextlib.AbstractContextManager:
        """bfloat16 autocast on the device when ``amp`` is on."""
        if not self.amp:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def resident(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` on the device (moved, in the configured layout, once per run)."""
        key = id(x)
        if key not in self._resident:
            self._resident[key] = (x, to_layout(x.to(self.device), self.layout))
        return self._resident[key][1]

    def rows(self, idx: np.ndarray) -> torch.Tensor:
        """Example indices as an index tensor on the device."""
        return torch.from_numpy(np.asarray(idx, dtype=np.int64)).to(self.device)

    def iterate(self, x: Any, index_batches: list[np.ndarray]) -> Iterator[Any]:
        """Yield the inputs of each batch of example indices of one split (on the device)."""
        if isinstance(x, torch.Tensor):
            on_device = self.resident(x)
            for idx in index_batches:
                yield on_device[self.rows(idx)]
            return
        if hasattr(x, "load_batches"):  # un-augmented batches of a volume data set
            for xb in x.load_batches(index_batches, self.device, num_workers=self.num_workers):
                yield to_layout(xb, self.layout)
            return
        loader = torch.utils.data.DataLoader(
            x, batch_sampler=[list(map(int, b)) for b in index_batches],
            num_workers=self.num_workers, collate_fn=self.collate,
            pin_memory=self.device.type == "cuda", persistent_workers=False,
        )
        for xb in loader:
            yield to_layout(to_device(xb, self.device), self.layout)

    def training_batches(self, x: Any, plan: Any, entries: Any, augment: str = "none",
                         crop_padding: int = 4, augment_seed: int = 0
                         ) -> Iterator[tuple[Any, torch.Tensor, torch.Tensor]]:
        """Inputs, PU labels and example indices of each batch of an epoch's ``plan``
        (:class:`~adni_pu.pu.batching.EpochPlan` of :class:`~adni_pu.pu.batching.Entries`),
        gathered on the device; ``augment = "crop-flip"`` crops and mirrors resident image
        batches with a generator seeded by ``augment_seed``. A data set with
        ``load_batches`` augments its own batches (a ``train`` volume data set), from keys
        of ``augment_seed`` (the run's seed and the epoch), each training entry and its
        occurrence in the epoch (:func:`adni_pu.data.volume_augment.item_keys`)."""
        s_all = torch.split(torch.from_numpy(entries.s[plan.order]).to(self.device), plan.sizes)
        idx_all = torch.split(self.rows(entries.base[plan.order]), plan.sizes)
        if not isinstance(x, torch.Tensor):
            index_batches = [entries.base[b] for b in plan.batches]
            if hasattr(x, "load_batches"):
                from adni_pu.data.volume_augment import item_keys

                keys = np.split(item_keys(augment_seed, plan.order), plan.starts[1:])
                inputs: Iterator[Any] = (to_layout(xb, self.layout) for xb in x.load_batches(
                    index_batches, self.device, keys=keys, num_workers=self.num_workers))
            else:
                inputs = self.iterate(x, index_batches)
            yield from zip(inputs, s_all, idx_all)
            return
        on_device = self.resident(x)
        if augment == "crop-flip":
            from adni_pu.data.benchmarks import crop_flip

            gen = torch.Generator(device=self.device)
            gen.manual_seed(augment_seed)
        for s, idx in zip(s_all, idx_all):
            xb = on_device[idx]
            if augment == "crop-flip":
                xb = to_layout(crop_flip(xb, crop_padding, gen), self.layout)
            yield xb, s, idx

    @torch.no_grad()
    def predict_logits(self, model: nn.Module | Callable[[Any], torch.Tensor],
                       x: Any) -> np.ndarray:
        """Logits of ``model`` (in evaluation mode) for every example of ``x``: a tensor
        (slices of its resident copy, no gathers) or a map-style data set (the loader)."""
        was_training = getattr(model, "training", False)
        if isinstance(model, nn.Module):
            model.eval()
        n = len(x)
        with self.autocast():
            if isinstance(x, torch.Tensor):
                on_device = self.resident(x)
                size = self.eval_batch_size
                out = [model(on_device[i:i + size]).float() for i in range(0, n, size)]
            else:
                size = self.batch_size
                batches = [np.arange(i, min(i + size, n)) for i in range(0, n, size)]
                out = [model(xb).float() for xb in self.iterate(x, batches)]
        if isinstance(model, nn.Module):
            model.train(was_training)
        return torch.cat(out).cpu().numpy() if out else np.zeros(0, np.float32)

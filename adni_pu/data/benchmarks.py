"""Adapters that turn MNIST and CIFAR-10 into the PU problems of the Self-PU paper."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch

from adni_pu.data import readers
from adni_pu.data.pu import (
    CIFAR10_POSITIVE_CLASSES,
    MNIST_POSITIVE_CLASSES,
    PUData,
    Scheme,
    binarize,
    make_pu_data,
)
from adni_pu.errors import ConfigError

BenchmarkName = Literal["mnist", "cifar10"]

# Defaults of the paper: the prior the published code and nnPU use, and the model.
PAPER_PRIOR = {"mnist": 0.49, "cifar10": 0.40}
PAPER_MODEL = {"mnist": "mlp6", "cifar10": "cnn13"}


def _to_tensor(images: np.ndarray, mean: np.ndarray, std: np.ndarray) -> torch.Tensor:
    x = torch.from_numpy(images.astype(np.float32) / 255.0)
    # N x H x W -> N x 1 x H x W; N x H x W x C -> N x C x H x W
    x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)
    shape = (1, -1, 1, 1)
    return ((x - torch.as_tensor(mean).view(shape)) / torch.as_tensor(std).view(shape)).contiguous()


def load_benchmark(
    name: BenchmarkName,
    data_dir: str | Path,
    n_labelled: int = 1000,
    prior: float | None = None,
    scheme: Scheme = "case-control",
    val_fraction: float = 0.1,
    seed: int = 0,
    cache_dir: str | Path | None = None,
    train_limit: int | None = None,
    test_limit: int | None = None,
) -> PUData:
    """Read a benchmark and build its PU splits (positives: even digits / vehicles).

    Pixels are scaled to [0, 1] and standardised per channel with the training split's
    statistics. ``prior=None`` uses the paper's value (0.49 MNIST, 0.40 CIFAR-10).
    ``train_limit`` / ``test_limit`` keep a seeded random subset of each split (for short
    smoke runs on a CPU; results made so must say it).
    """
    if name == "mnist":
        data = readers.load_mnist(data_dir)
        positive = MNIST_POSITIVE_CLASSES
    elif name == "cifar10":
        data = readers.load_cifar10(data_dir, cache_dir=cache_dir)
        positive = CIFAR10_POSITIVE_CLASSES
    else:
        raise ConfigError(f"benchmark {name!r}: expected 'mnist' or 'cifar10'")
    data = readers.TrainTest(_subset(data.train, train_limit, seed),
                             _subset(data.test, test_limit, seed + 1), data.name, data.source)
    train_images = data.train.images.astype(np.float32) / 255.0
    axes = (0, 1, 2)
    mean = np.atleast_1d(train_images.mean(axis=axes)).astype(np.float32)
    std = np.atleast_1d(train_images.std(axis=axes)).astype(np.float32)
    del train_images
    x_train = _to_tensor(data.train.images, mean, std)
    x_test = _to_tensor(data.test.images, mean, std)
    pu = make_pu_data(
        x_train, binarize(data.train.labels, positive),
        x_test, binarize(data.test.labels, positive),
        n_labelled=n_labelled,
        prior=PAPER_PRIOR[name] if prior is None else prior,
        scheme=scheme, val_fraction=val_fraction, seed=seed, name=name,
    )
    pu.info["source"] = data.source
    pu.info["train_limit"] = train_limit
    pu.info["test_limit"] = test_limit
    pu.info["positive_classes"] = list(positive)
    return pu


def _subset(part: readers.LabelledArrays, limit: int | None, seed: int) -> readers.LabelledArrays:
    if limit is None or limit >= len(part.labels):
        return part
    if limit < 1:
        raise ConfigError(f"subset limit {limit}: expected a positive number of examples")
    idx = np.sort(np.random.default_rng(seed).choice(len(part.labels), limit, replace=False))
    return readers.LabelledArrays(part.images[idx], part.labels[idx])


def crop_flip(x: torch.Tensor, padding: int, generator: torch.Generator) -> torch.Tensor:
    """Random crop after zero padding and random left-right mirror, for a batch N x C x H x W.

    Vectorised on ``x``'s device: one gather builds every crop, so a batch costs a few
    kernels whatever its size. The draws come from ``generator`` (seeded by the caller), so
    a run is reproducible on one device type. Zero padding is the channel mean once the
    images are standardised.
    """
    n, _, h, w = x.shape
    device = x.device
    shift = torch.randint(0, 2 * padding + 1, (2, n), generator=generator, device=device)
    flip = torch.rand(n, generator=generator, device=device) < 0.5
    if padding:
        x = torch.nn.functional.pad(x, (padding, padding, padding, padding))
    rows = (shift[0][:, None] + torch.arange(h, device=device))[:, None, :, None]
    cols = shift[1][:, None] + torch.arange(w, device=device)
    cols = torch.where(flip[:, None], cols.flip(1), cols)[:, None, None, :]
    batch = torch.arange(n, device=device)[:, None, None, None]
    channel = torch.arange(x.shape[1], device=device)[None, :, None, None]
    return x[batch, channel, rows, cols]

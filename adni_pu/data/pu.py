"""Positive-unlabelled construction from a fully labelled data set.

Binarise classes, draw ``n_labelled`` labelled positives with a seeded generator, carve a
validation split that keeps the PU structure out of the training split, and leave the
official test split untouched. Every example carries its PU label ``s`` (1 labelled
positive, 0 unlabelled) and, for evaluation only, its true label ``truth``.

Schemes (du Plessis et al.; Kiryo et al.):

- ``case-control`` (nnPU, Self-PU): the unlabelled set is the whole training split, so it
  still contains the labelled positives; its positive fraction is the class prior.
- ``censoring``: the unlabelled set is the training split minus the labelled positives; its
  positive fraction is lower than the prior (``prior_u``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from adni_pu.errors import ConfigError, PUConstructionError

Scheme = Literal["case-control", "censoring"]

MNIST_POSITIVE_CLASSES = (0, 2, 4, 6, 8)
CIFAR10_POSITIVE_CLASSES = (0, 1, 8, 9)  # airplane, automobile, ship, truck


@dataclass
class PUSplit:
    """One split. ``x`` is a tensor of examples or a map-style dataset returning ``x[i]``."""

    x: Any
    truth: np.ndarray
    labelled: np.ndarray
    name: str = "train"
    eval_x: Any = None
    """Optional un-augmented view of ``x`` (same items, same order) used for scoring, e.g.
    trusted-set selection on an augmented training split; None scores ``x`` itself."""

    def __post_init__(self) -> None:
        self.truth = np.asarray(self.truth, dtype=np.float64)
        self.labelled = np.asarray(self.labelled, dtype=bool)
        if len(self.truth) != len(self.labelled) or len(self.truth) != len(self.x):
            raise PUConstructionError(
                f"{self.name} split: {len(self.x)} examples, {len(self.truth)} true labels and "
                f"{len(self.labelled)} PU labels; expected the same number"
            )
        if self.eval_x is not None and len(self.eval_x) != len(self.x):
            raise PUConstructionError(
                f"{self.name} split: eval_x has {len(self.eval_x)} examples, x has "
                f"{len(self.x)}; expected the same number"
            )

    def __len__(self) -> int:
        return len(self.truth)

    def positive_indices(self) -> np.ndarray:
        """Indices of the labelled positives (D_P)."""
        return np.flatnonzero(self.labelled)

    def unlabelled_indices(self, scheme: Scheme) -> np.ndarray:
        """Indices of the unlabelled set (D_U) under ``scheme``."""
        if scheme == "case-control":
            return np.arange(len(self))
        return np.flatnonzero(~self.labelled)


@dataclass
class PUData:
    """The PU splits of one data set and the class prior used for training."""

    train: PUSplit
    val: PUSplit
    test: PUSplit
    prior: float
    scheme: Scheme = "case-control"
    name: str = "data"
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_prior(self.prior)
        for split in (self.train, self.val):
            if not split.labelled.any():
                raise PUConstructionError(f"{split.name} split has no labelled positive")
            if len(split.unlabelled_indices(self.scheme)) == 0:
                raise PUConstructionError(f"{split.name} split has no unlabelled example")
        if len(self.test) == 0:
            raise PUConstructionError("test split is empty")

    def training_priors(self, configured: float | None) -> tuple[float, float]:
        """(class prior, prior of D_U) that the risks use: the data's prior, which a prior
        set in the training settings must equal (else the risks would use one value and
        the unlabelled prior, and data.json, another)."""
        if configured is not None and not math.isclose(configured, self.prior):
            raise ConfigError(
                f"prior = {configured} in the training settings differs from the class prior "
                f"{self.prior} the data were built with; set the prior once")
        prior = float(configured if configured is not None else self.prior)
        return prior, prior if self.scheme == "case-control" else self.prior_u

    @property
    def prior_u(self) -> float:
        """Positive fraction expected inside the unlabelled set of the training split."""
        return unlabelled_prior(self.prior, len(self.train), int(self.train.labelled.sum()),
                                self.scheme)


def check_prior(prior: float) -> float:
    """Refuse a class prior outside the open interval (0, 1)."""
    if not (0.0 < float(prior) < 1.0):
        raise PUConstructionError(f"class prior {prior!r}: expected a number strictly in (0, 1)")
    return float(prior)


def unlabelled_prior(prior: float, n_total: int, n_labelled: int, scheme: Scheme) -> float:
    """P(y=+1) inside D_U: the prior itself (case-control) or what censoring leaves."""
    if scheme == "case-control":
        return prior
    rest = n_total - n_labelled
    if rest <= 0:
        raise PUConstructionError("censoring leaves no unlabelled example")
    value = (prior * n_total - n_labelled) / rest
    if not 0.0 <= value < 1.0:
        raise PUConstructionError(
            f"prior {prior} with {n_labelled} labelled of {n_total} leaves an unlabelled prior "
            f"of {value:.3f}; expected a value in [0, 1)"
        )
    return value


def binarize(labels: np.ndarray, positive_classes: tuple[int, ...]) -> np.ndarray:
    """1 where the class is one of ``positive_classes``, else 0."""
    return np.isin(np.asarray(labels), positive_classes).astype(np.int64)


def make_pu_data(
    x_train: Any,
    y_train: np.ndarray,
    x_test: Any,
    y_test: np.ndarray,
    n_labelled: int,
    prior: float | None = None,
    scheme: Scheme = "case-control",
    val_fraction: float = 0.1,
    seed: int = 0,
    name: str = "data",
) -> PUData:
    """Build PU splits from binary labels (1 positive, 0 negative).

    ``n_labelled`` labelled positives are drawn from the whole training split; a seeded
    ``val_fraction`` of the training split becomes the validation split, taking the
    labelled positives that fall in it (so the label budget stays ``n_labelled``).
    ``prior=None`` takes the true positive fraction of the training split.
    """
    y_train = np.asarray(y_train, dtype=np.int64)
    y_test = np.asarray(y_test, dtype=np.int64)
    n = len(y_train)
    if scheme not in ("case-control", "censoring"):
        raise PUConstructionError(f"scheme {scheme!r}: expected 'case-control' or 'censoring'")
    if n == 0:
        raise PUConstructionError("training split is empty")
    if len(y_test) == 0:
        raise PUConstructionError("test split is empty")
    positives = np.flatnonzero(y_train == 1)
    if not 0 < n_labelled <= len(positives):
        raise PUConstructionError(
            f"n_labelled={n_labelled}: expected between 1 and the {len(positives)} positives "
            "of the training split"
        )
    if not 0.0 < val_fraction < 1.0:
        raise PUConstructionError(f"val_fraction={val_fraction}: expected a number in (0, 1)")
    prior = float(y_train.mean()) if prior is None else check_prior(prior)
    rng = np.random.default_rng(seed)
    labelled = np.zeros(n, dtype=bool)
    labelled[rng.choice(positives, size=n_labelled, replace=False)] = True
    order = rng.permutation(n)
    n_val = int(round(val_fraction * n))
    val_idx, train_idx = np.sort(order[:n_val]), np.sort(order[n_val:])
    for part, idx in (("validation", val_idx), ("training", train_idx)):
        if len(idx) == 0 or not labelled[idx].any():
            raise PUConstructionError(
                f"the {part} part gets no labelled positive with n_labelled={n_labelled} and "
                f"val_fraction={val_fraction}; raise one of them"
            )
    train = PUSplit(_take(x_train, train_idx), y_train[train_idx], labelled[train_idx], "train")
    val = PUSplit(_take(x_train, val_idx), y_train[val_idx], labelled[val_idx], "val")
    test = PUSplit(x_test, y_test, np.zeros(len(y_test), dtype=bool), "test")
    info = {
        "n_labelled": int(n_labelled),
        "n_labelled_train": int(train.labelled.sum()),
        "n_labelled_val": int(val.labelled.sum()),
        "n_train": len(train), "n_val": len(val), "n_test": len(test),
        "true_prior_train": float(y_train.mean()),
        "prior": prior, "scheme": scheme, "val_fraction": val_fraction, "seed": seed,
    }
    return PUData(train, val, test, prior, scheme, name, info)


def _take(x: Any, idx: np.ndarray) -> Any:
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return x[torch.as_tensor(idx)] if isinstance(x, torch.Tensor) else x[idx]
    return torch.utils.data.Subset(x, idx.tolist())

"""Batch plans: which training entries each mini-batch holds and where its rows sit.

Pure numpy, made on the host once per epoch from the epoch's random stream, so the
training loop never waits for the device to learn a batch's make-up. The training
entries are D_P (the labelled positives, PU label 1) followed by D_U (PU label 0); under
the case-control scheme D_U holds the labelled positives again (the nnPU convention).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from adni_pu.data.pu import PUSplit


@dataclass(frozen=True)
class Entries:
    """The training entries: ``base[i]`` is entry i's example index, ``s[i]`` its PU label."""

    base: np.ndarray
    s: np.ndarray
    n_p: int
    n_u: int

    @classmethod
    def of(cls, train: PUSplit, scheme: str) -> Entries:
        p_idx = train.positive_indices()
        u_idx = train.unlabelled_indices(scheme)  # type: ignore[arg-type]
        base = np.concatenate([p_idx, u_idx]).astype(np.int64)
        s = np.concatenate([np.ones(len(p_idx)), np.zeros(len(u_idx))]).astype(np.int64)
        return cls(base, s, len(p_idx), len(u_idx))


RoundBatches = Callable[[int, int], int]
"""(batches, entries) -> batches: every distributed rank gets the same number."""


def epoch_batches(entries: Entries, rng: np.random.Generator, batch_size: int,
                  positive_share: float = 0.0, round_batches: RoundBatches | None = None
                  ) -> list[np.ndarray]:
    """Entry indices per batch, each batch holding D_P and D_U in the data's ratio (or, with
    ``positive_share``, a fixed number of labelled positives per batch)."""
    if positive_share > 0:
        return oversampled_batches(entries, rng, batch_size, positive_share, round_batches)
    n = len(entries.base)
    n_batches = max(1, math.ceil(n / batch_size))
    if round_batches is not None:
        n_batches = round_batches(n_batches, n)
    p_perm = rng.permutation(entries.n_p)
    u_perm = entries.n_p + rng.permutation(entries.n_u)
    p_chunks = np.array_split(p_perm, n_batches)
    u_chunks = np.array_split(u_perm, n_batches)
    return [np.concatenate([p, u]) for p, u in zip(p_chunks, u_chunks)]


def oversampled_batches(entries: Entries, rng: np.random.Generator, batch_size: int,
                        positive_share: float, round_batches: RoundBatches | None = None
                        ) -> list[np.ndarray]:
    """Every batch holds round(share * batch_size) labelled positives and the rest
    unlabelled; the epoch is one pass over D_U, and the positives come from successive
    random permutations of D_P (each used about equally often; a positive can appear twice
    in a batch only where two permutations meet)."""
    n_p, n_u = entries.n_p, entries.n_u
    n_pos = round(positive_share * batch_size) if n_p else 0
    n_batches = max(1, math.ceil(n_u / (batch_size - n_pos)))
    if round_batches is not None:
        n_batches = round_batches(n_batches, n_u + n_batches * n_pos)
    need = n_batches * n_pos
    cycles = [rng.permutation(n_p) for _ in range(-(-need // max(n_p, 1)))]
    p_all = np.concatenate(cycles)[:need] if cycles else np.zeros(0, np.int64)
    u_perm = n_p + rng.permutation(n_u)
    p_chunks = np.split(p_all, n_batches)
    u_chunks = np.array_split(u_perm, n_batches)
    return [np.concatenate([p, u]) for p, u in zip(p_chunks, u_chunks)]


@dataclass(frozen=True)
class EpochPlan:
    """An epoch's batches laid end to end: ``order`` holds every batch's entries in turn."""

    batches: list[np.ndarray]
    sizes: list[int]
    starts: np.ndarray
    order: np.ndarray

    @classmethod
    def of(cls, batches: list[np.ndarray]) -> EpochPlan:
        sizes = [len(b) for b in batches]
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        order = np.concatenate(batches) if batches else np.zeros(0, np.int64)
        return cls(batches, sizes, starts, order)

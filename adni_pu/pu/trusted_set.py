"""Self-paced trusted set: confident pseudo-positives and pseudo-negatives taken out of D_U.

At each selection the unlabelled examples (labelled positives excluded) are scored by the
selecting model. Half of the target size goes to the highest scores (pseudo-positive),
half to the lowest (pseudo-negative), so the set is balanced by construction. With
replacement ("in-and-out") every selection starts from scratch; without it, earlier members
stay and only new ones are added. Each member stores its target: the hard pseudo-label, or
the selecting model's probability at selection time (soft labels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np


@dataclass
class TrustedSet:
    """Members (indices into the training split), pseudo-labels and stored targets."""

    indices: np.ndarray
    pseudo_labels: np.ndarray
    targets: np.ndarray
    epoch: int = -1

    @classmethod
    def empty(cls) -> TrustedSet:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))

    def __len__(self) -> int:
        return len(self.indices)

    def membership(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(is_member, target) arrays over all ``n`` training examples."""
        member = np.zeros(n, dtype=bool)
        target = np.zeros(n, dtype=np.float32)
        member[self.indices] = True
        target[self.indices] = self.targets
        return member, target

    def label_accuracy(self, truth: np.ndarray) -> float:
        """Fraction of members whose pseudo-label equals the hidden true label."""
        if len(self) == 0:
            return float("nan")
        return float((truth[self.indices] == self.pseudo_labels).mean())

    def state(self) -> dict[str, object]:
        return {"indices": self.indices, "pseudo_labels": self.pseudo_labels,
                "targets": self.targets, "epoch": self.epoch}

    @classmethod
    def from_state(cls, state: dict[str, object]) -> TrustedSet:
        return cls(np.asarray(state["indices"]), np.asarray(state["pseudo_labels"]),
                   np.asarray(state["targets"], dtype=np.float32), int(state["epoch"]))


def target_size(
    epoch: int,
    pool: int,
    rate: float,
    start: int,
    end: int,
    every: int,
    schedule: Literal["linear", "fixed"] = "linear",
) -> int:
    """Size of the trusted set chosen at ``epoch``.

    "linear": the size that a ramp from 0 at ``start`` to ``rate * pool`` at ``end`` reaches
    at the end of the interval this selection serves (``epoch + every``), so a selection
    every 10 epochs over epochs 10-50 gives 1/4, 2/4, 3/4 and 4/4 of the final size.
    "fixed": ``rate * pool`` at every selection. The size is even (balanced halves).
    """
    full = rate * pool
    if schedule == "fixed":
        size = full
    else:
        span = max(end - start, 1)
        size = full * min(1.0, max(0.0, (epoch - start + every) / span))
    half = int(size) // 2
    return 2 * half


def select_trusted_set(
    scores: np.ndarray,
    candidates: np.ndarray,
    size: int,
    labels: Literal["hard", "soft", "entropy"] = "soft",
    previous: TrustedSet | None = None,
    replacement: bool = True,
    epoch: int = -1,
) -> TrustedSet:
    """Choose a balanced trusted set of ``size`` among ``candidates``.

    ``scores`` are the selecting model's probabilities for all training examples (only the
    ``candidates`` entries are read). Ties are broken by index, so a selection is
    deterministic.
    """
    size = min(int(size), len(candidates) - len(candidates) % 2)
    half = max(size // 2, 0)
    keep = TrustedSet.empty() if (replacement or previous is None) else previous
    kept_pos = keep.indices[keep.pseudo_labels == 1]
    kept_neg = keep.indices[keep.pseudo_labels == 0]
    pool = np.setdiff1d(candidates, keep.indices, assume_unique=False)
    order = pool[np.lexsort((pool, scores[pool]))]  # ascending score, ties by index
    need_pos = max(half - len(kept_pos), 0)
    need_neg = max(half - len(kept_neg), 0)
    if need_pos + need_neg > len(order):
        need_pos = need_neg = len(order) // 2
    new_neg = order[:need_neg]
    new_pos = order[len(order) - need_pos:] if need_pos else order[:0]
    new_idx = np.concatenate([new_pos, new_neg]).astype(np.int64)
    new_lab = np.concatenate([np.ones(len(new_pos), np.int64), np.zeros(len(new_neg), np.int64)])
    if labels == "hard" or labels == "entropy":
        new_tgt = new_lab.astype(np.float32)
    else:
        new_tgt = scores[new_idx].astype(np.float32)
    return TrustedSet(
        np.concatenate([keep.indices, new_idx]).astype(np.int64),
        np.concatenate([keep.pseudo_labels, new_lab]).astype(np.int64),
        np.concatenate([keep.targets, new_tgt]).astype(np.float32),
        epoch,
    )


def score_band(scores: np.ndarray, trusted: TrustedSet) -> tuple[float, float]:
    """``(t_lo, t_hi)``: the highest pseudo-negative and the lowest pseudo-positive score of
    ``trusted`` under ``scores`` (the selecting model's probabilities over the training
    split). The positives left in D_U minus the trusted set score strictly inside the band;
    a side without members is open (-inf / +inf)."""
    pos = trusted.indices[trusted.pseudo_labels == 1]
    neg = trusted.indices[trusted.pseudo_labels == 0]
    t_hi = float(scores[pos].min()) if len(pos) else float("inf")
    t_lo = float(scores[neg].max()) if len(neg) else float("-inf")
    return t_lo, t_hi


def band_positives(scores: np.ndarray, labelled: np.ndarray, trusted: TrustedSet
                   ) -> np.ndarray:
    """Indices of the labelled positives whose score lies strictly inside the trusted set's
    band (:func:`score_band`): under SCAR, a sample of the positives left in D_U minus the
    trusted set."""
    t_lo, t_hi = score_band(scores, trusted)
    inside = labelled & (scores > t_lo) & (scores < t_hi)
    return np.flatnonzero(inside).astype(np.int64)


def band_prior(prior_u: float, n_u: int, n_trusted: int, f_band: float,
               n_copies: int = 0) -> float:
    """Positive fraction of D_U minus a trusted set of ``n_trusted`` members and minus the
    ``n_copies`` labelled positives D_U also holds (case-control), when a fraction ``f_band``
    of the other positives lies inside the band:
    (pi_u n_u - n_copies) f_band / (n_u - n_copies - n_trusted), clipped to [1e-3, 1 - 1e-3]."""
    left = max(n_u - n_copies - n_trusted, 1)
    return clip_prior((prior_u * n_u - n_copies) * f_band / left)


def clip_prior(value: float) -> float:
    """A class prior estimate kept inside [1e-3, 1 - 1e-3] (the risks divide by 1 - pi)."""
    return float(min(max(value, 1e-3), 1 - 1e-3))

"""The class prior from positive and unlabelled data alone: best-bin estimation (BBE).

Every risk here needs the class prior pi. A cohort without amyloid PET has no truth to count
it from, so it is estimated from the PU data themselves, with the mixture-proportion
estimator of Garg et al. (NeurIPS 2021, "Mixture proportion estimation and PU learning: a
modern approach"), written here from the paper:

1. a classifier that separates the labelled positives from the unlabelled examples (the
   ``naive`` method trains exactly that) scores held-out labelled positives P and held-out
   unlabelled examples U (the validation split, never the test split);
2. for every threshold t, q_p(t) and q_u(t) are the fractions of P and of U scoring at or
   above t. Above a threshold where only positives remain, U holds alpha q_p(t) of its
   examples, so q_u(t) / q_p(t) estimates alpha, the positive fraction of U;
3. the threshold is the one with the smallest upper confidence bound (DKW inequality):
   q_u/q_p + (1 + gamma) / q_p * (sqrt(log(1/delta) / 2 n_u) + sqrt(log(1/delta) / 2 n_p)),
   with the paper's delta = 0.1 and gamma = 0.01.

:func:`estimate_prior` adds a percentile bootstrap over the held-out examples (it shows the
sampling error of P and U, not the classifier's training variance) and turns alpha into the
class prior of the PU scheme: alpha is pi itself in case-control data (U is a sample of
everyone), and the positive fraction left among the unlabelled under censoring.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from adni_pu.errors import ConfigError

DELTA = 0.1
GAMMA = 0.01
METHOD = "bbe"


def best_bin_alpha(scores_p: np.ndarray, scores_u: np.ndarray, delta: float = DELTA,
                   gamma: float = GAMMA) -> float:
    """BBE's estimate of alpha, the positive fraction of U, from held-out scores of a
    P-vs-U classifier (higher: more like the labelled positives). In [0, 1]."""
    p = np.sort(np.asarray(scores_p, dtype=np.float64))
    u = np.sort(np.asarray(scores_u, dtype=np.float64))
    n_p, n_u = len(p), len(u)
    if n_p == 0 or n_u == 0:
        raise ConfigError(f"prior estimation with {n_p} labelled positives and {n_u} "
                          "unlabelled held-out examples: expected at least one of each")
    thresholds = np.unique(u)
    # fractions at or above each threshold
    q_u = (n_u - np.searchsorted(u, thresholds, side="left")) / n_u
    q_p = (n_p - np.searchsorted(p, thresholds, side="left")) / n_p
    usable = q_p > 0
    if not usable.any():  # every positive scores below every unlabelled example
        return 1.0
    q_u, q_p = q_u[usable], q_p[usable]
    slack = math.sqrt(math.log(1 / delta) / (2 * n_u)) + math.sqrt(math.log(1 / delta) / (2 * n_p))
    upper = q_u / q_p + (1 + gamma) * slack / q_p
    best = int(np.argmin(upper))
    return float(min(q_u[best] / q_p[best], 1.0))


@dataclass(frozen=True)
class PriorEstimate:
    """An estimated class prior with its bootstrap interval, as runs record it."""

    value: float
    ci_low: float
    ci_high: float
    method: str
    alpha: float
    """The positive fraction of the unlabelled held-out examples (what BBE estimates)."""
    n_positive: int
    n_unlabelled: int
    n_bootstrap: int

    def record(self) -> dict[str, Any]:
        """The form written to ``run.json`` / ``result.json`` under ``prior_estimate``."""
        return asdict(self)


def prior_from_alpha(alpha: float, scheme: Literal["case-control", "censoring"],
                     n_labelled: int, n_total: int) -> float:
    """The class prior pi of a split from alpha, the positive fraction of its unlabelled
    examples: alpha itself in case-control data; under censoring the labelled positives
    plus alpha of the rest, over everyone."""
    if scheme == "case-control":
        return alpha
    return (n_labelled + alpha * (n_total - n_labelled)) / n_total


def estimate_prior(scores_p: np.ndarray, scores_u: np.ndarray,
                   scheme: Literal["case-control", "censoring"], n_labelled: int,
                   n_total: int, n_bootstrap: int = 1000, level: float = 0.95,
                   seed: int = 0) -> PriorEstimate:
    """The class prior from held-out P-vs-U scores (:func:`best_bin_alpha`), clipped to
    [1e-3, 1 - 1e-3] so every risk can use it, with a percentile bootstrap interval
    (``n_bootstrap`` resamples of P and of U, seeded). ``n_labelled`` / ``n_total``: the
    split whose prior is wanted (for :func:`prior_from_alpha` under censoring)."""
    p = np.asarray(scores_p, dtype=np.float64)
    u = np.asarray(scores_u, dtype=np.float64)
    alpha = best_bin_alpha(p, u)
    rng = np.random.default_rng(seed)
    boot = np.array([best_bin_alpha(p[rng.integers(0, len(p), len(p))],
                                    u[rng.integers(0, len(u), len(u))])
                     for _ in range(n_bootstrap)])
    tail = (1 - level) / 2
    lo, hi = (np.quantile(boot, [tail, 1 - tail]) if n_bootstrap else (alpha, alpha))

    def prior(a: float) -> float:
        # alpha kept off 0 and 1, so that under censoring the prior exceeds the labelled
        # fraction and every risk can use it
        a = float(np.clip(a, 1e-3, 1 - 1e-3))
        return float(np.clip(prior_from_alpha(a, scheme, n_labelled, n_total), 1e-3, 1 - 1e-3))

    return PriorEstimate(prior(alpha), prior(lo), prior(hi), METHOD, alpha, len(p), len(u),
                         n_bootstrap)

"""Best-bin estimation of the class prior (Garg et al. 2021) and its bootstrap interval."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adni_pu.errors import ConfigError
from adni_pu.pu.prior_estimate import (
    best_bin_alpha,
    estimate_prior,
    prior_from_alpha,
)


def _mixture(alpha: float, n_p: int, n_u: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores of a P-vs-U classifier: positives around +2, negatives around -2."""
    rng = np.random.default_rng(seed)
    p = rng.normal(2.0, 1.0, n_p)
    n_pos_u = round(alpha * n_u)
    u = np.concatenate([rng.normal(2.0, 1.0, n_pos_u), rng.normal(-2.0, 1.0, n_u - n_pos_u)])
    return p, u


def test_best_bin_follows_the_papers_rule_on_hand_made_scores():
    p = np.array([0.9, 0.8, 0.7, 0.2])
    u = np.array([0.95, 0.85, 0.3, 0.1, 0.05, 0.02])
    slack = (math.sqrt(math.log(10) / 12) + math.sqrt(math.log(10) / 8)) * 1.01
    candidates = []
    for t in sorted(set(u)):  # every threshold of U, fractions at or above it
        q_u = np.mean(u >= t)
        q_p = np.mean(p >= t)
        if q_p > 0:
            candidates.append((q_u / q_p + slack / q_p, q_u / q_p))
    assert best_bin_alpha(p, u) == pytest.approx(min(candidates)[1])


@pytest.mark.parametrize("alpha", [0.1, 0.3, 0.6])
def test_best_bin_recovers_the_mixture_proportion(alpha):
    p, u = _mixture(alpha, 2000, 4000, seed=1)
    assert best_bin_alpha(p, u) == pytest.approx(alpha, abs=0.04)


def test_the_estimate_has_a_seeded_bootstrap_interval_around_the_truth():
    p, u = _mixture(0.3, 500, 1000, seed=2)
    est = estimate_prior(p, u, "case-control", n_labelled=500, n_total=1500,
                         n_bootstrap=200, seed=0)
    assert est.ci_low <= est.value <= est.ci_high
    assert est.ci_low <= 0.3 <= est.ci_high
    assert est.ci_high - est.ci_low < 0.2
    assert est == estimate_prior(p, u, "case-control", 500, 1500, n_bootstrap=200, seed=0)
    record = est.record()
    assert {"value", "ci_low", "ci_high", "method"} <= set(record)
    assert record["method"] == "bbe"


def test_censoring_turns_the_unlabelled_fraction_into_the_class_prior():
    # 100 labelled positives of 1,000; 20 % of the other 900 are positive
    assert prior_from_alpha(0.2, "censoring", 100, 1000) == pytest.approx(0.28)
    assert prior_from_alpha(0.2, "case-control", 100, 1000) == 0.2


def test_no_held_out_positives_is_an_error_that_says_so():
    with pytest.raises(ConfigError, match="0 labelled positives"):
        best_bin_alpha(np.array([]), np.array([0.1, 0.2]))


def test_an_alpha_near_zero_still_gives_a_usable_prior_under_censoring():
    # every unlabelled example scores below every labelled positive: the top bin holds
    # one unlabelled example, the smallest alpha the thresholds can give
    p = np.linspace(5, 6, 50)
    u = np.linspace(-6, -5, 200)
    assert best_bin_alpha(p, u) == pytest.approx(1 / 200)
    est = estimate_prior(p, u, "censoring", n_labelled=50, n_total=250, n_bootstrap=20)
    assert est.value > 50 / 250  # above the labelled fraction, as the censoring risk needs

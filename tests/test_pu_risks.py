"""The PU risk that selection re-applies to recorded logits (``criteria.pu_risks``, numpy)
equals the trainer's (``losses.pu_risk``, torch) for both labelling schemes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adni_pu.pu import criteria, losses
from adni_pu.pu.metrics import sigmoid


@pytest.mark.parametrize("scheme", ["case-control", "censoring"])
def test_selection_risk_is_the_trainers_pu_risk(scheme: str) -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 50))
    labelled = rng.random(50) < 0.3
    u_mask = np.ones(50, bool) if scheme == "case-control" else ~labelled
    prior, prior_u = 0.4, (0.4 if scheme == "case-control" else 0.3)
    got = criteria.pu_risks(sigmoid(-logits), sigmoid(logits), labelled, u_mask, prior,
                             prior_u)
    for row, value in zip(logits, got):
        t = torch.from_numpy(row)
        want = losses.pu_risk(t[torch.from_numpy(labelled)], t[torch.from_numpy(u_mask)],
                              prior, prior_u).unbiased
        assert value == pytest.approx(float(want), abs=1e-12)

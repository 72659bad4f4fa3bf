"""The per-batch objective as functions of tensors and settings (adni_pu.pu.objective), for
one network: its B logits with the row sets as 0/1 masks."""

from __future__ import annotations

import pytest
import torch

from adni_pu.pu import losses, objective
from adni_pu.pu.config import SelfPUConfig


def _batch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(12, generator=g)
    s = torch.tensor([1, 1, 1, 1] + [0] * 8)
    return logits, s, torch.arange(4), torch.arange(4, 12)


def _rows(**sets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Row sets of a 12-row batch as masks, from index tensors."""
    rows = {"valid": torch.ones(12)}
    for name, idx in sets.items():
        rows[name] = torch.zeros(12).index_fill_(0, idx, 1.0)
    return rows


def test_baselines_are_the_risks_of_losses():
    logits, s, pos, unl = _batch()
    rows = _rows(pos=pos, unl=unl)
    naive, stats = objective.baseline_loss("naive", logits, s, rows, 0.4, 0.4, 0.0, 1.0)
    assert torch.allclose(naive, losses.naive_pn_loss(logits, s)) and "nn_correction" not in stats
    risk = losses.pu_risk(logits[pos], logits[unl], 0.4, 0.4)
    upu, _ = objective.baseline_loss("upu", logits, s, rows, 0.4, 0.4, 0.0, 1.0)
    assert torch.equal(upu, risk.unbiased)
    _, stats = objective.baseline_loss("nnpu", logits, s, rows, 0.4, 0.4, 0.0, 1.0)
    assert torch.equal(stats["loss"], risk.non_negative.detach().double())


def test_student_loss_mixes_trusted_cross_entropy_and_the_pu_risk_by_the_trusted_share():
    logits, s, pos, _ = _batch()
    trusted, rest = torch.arange(4, 7), torch.arange(7, 12)
    rows = _rows(pos=pos, trusted=trusted, rest=rest)
    targets = rows["trusted"].clone()  # soft label 1 on the trusted rows
    sp = SelfPUConfig(reweight=False)
    loss, pu_obj, stats = objective.student_loss(logits, rows, sp, 0.3, 0.0, 1.0, targets,
                                                 None)
    ce = losses.soft_cross_entropy(logits[trusted], torch.ones(3)).mean()
    risk = losses.pu_risk(logits[pos], logits[rest], 0.3)
    expected_obj, _ = losses.nnpu_step_objective(risk, 0.0, 1.0)
    assert torch.allclose(pu_obj, expected_obj)
    assert torch.allclose(loss, 3 / 12 * ce + 9 / 12 * expected_obj)
    assert float(stats["trusted_in_batch"]) == pytest.approx(3 / 12)


def test_distillation_without_a_second_student_or_teacher_adds_nothing():
    logits, s, _, _ = _batch()
    rows = _rows(outside=torch.arange(12))
    stats: dict = {}
    extra = objective.distillation(logits, s, rows, logits.sum(), SelfPUConfig(), 5.0, None,
                                   None, stats)
    assert float(extra) == 0.0 and stats == {}

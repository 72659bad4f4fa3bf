"""The per-batch objective as functions of tensors and settings (adni_pu.pu.selfpu_loss)."""

from __future__ import annotations

import torch

from adni_pu.pu import losses, selfpu_loss
from adni_pu.pu.config import SelfPUConfig


def _batch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(12, generator=g)
    s = torch.tensor([1, 1, 1, 1] + [0] * 8)
    return logits, s, torch.arange(4), torch.arange(4, 12)


def test_baselines_are_the_risks_of_losses():
    logits, s, pos, unl = _batch()
    naive, stats = selfpu_loss.baseline_loss("naive", logits, s, pos, unl, 0.4, 0.4, 0.0, 1.0)
    assert torch.equal(naive, losses.naive_pn_loss(logits, s)) and "nn_correction" not in stats
    risk = losses.pu_risk(logits[pos], logits[unl], 0.4, 0.4)
    upu, _ = selfpu_loss.baseline_loss("upu", logits, s, pos, unl, 0.4, 0.4, 0.0, 1.0)
    assert torch.equal(upu, risk.unbiased)
    _, stats = selfpu_loss.baseline_loss("nnpu", logits, s, pos, unl, 0.4, 0.4, 0.0, 1.0)
    assert torch.equal(stats["loss"], risk.non_negative.detach().double())


def test_student_loss_mixes_trusted_cross_entropy_and_the_pu_risk_by_the_trusted_share():
    logits, s, pos, _ = _batch()
    trusted, rest = torch.arange(4, 7), torch.arange(7, 12)
    target = torch.ones(3)
    sp = SelfPUConfig(reweight=False)
    loss, pu_obj, stats = selfpu_loss.student_loss(
        logits, pos=pos, trusted=trusted, rest_u=rest, n=12, phase=2, sp=sp, prior_rest=0.3,
        beta=0.0, gamma=1.0, trusted_target=lambda: target, calibrate=None)
    ce = losses.soft_cross_entropy(logits[trusted], target).mean()
    risk = losses.pu_risk(logits[pos], logits[rest], 0.3)
    expected_obj, _ = losses.nnpu_step_objective(risk, 0.0, 1.0)
    assert torch.allclose(pu_obj, expected_obj)
    assert torch.allclose(loss, 3 / 12 * ce + 9 / 12 * expected_obj)
    assert stats["trusted_in_batch"] == 3 / 12


def test_distillation_without_a_second_student_or_teacher_adds_nothing():
    logits, s, _, _ = _batch()
    stats: dict = {}
    extra = selfpu_loss.distillation(logits, None, s, torch.arange(12), logits.sum(),
                                     SelfPUConfig(), 5.0, None, stats)
    assert float(extra) == 0.0 and stats == {}

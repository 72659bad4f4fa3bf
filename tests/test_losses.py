"""PU risks against hand-computed values, and Kiryo's non-negative step rule."""

from __future__ import annotations

import math

import pytest
import torch

from adni_pu.pu import losses


def sig(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def test_sigmoid_loss_values():
    z = torch.tensor([0.0, 2.0, -1.0])
    assert losses.sigmoid_loss(z, 1.0).tolist() == pytest.approx([0.5, sig(-2), sig(1)])
    assert losses.sigmoid_loss(z, -1.0).tolist() == pytest.approx([0.5, sig(2), sig(-1)])


def test_upu_by_hand():
    gp = torch.tensor([1.0, -0.5])
    gu = torch.tensor([0.2, -1.0, 3.0])
    pi = 0.3
    r_p = pi * (sig(-1.0) + sig(0.5)) / 2
    e_u = (sig(0.2) + sig(-1.0) + sig(3.0)) / 3
    e_p_neg = (sig(1.0) + sig(-0.5)) / 2
    risk = losses.pu_risk(gp, gu, pi)
    assert risk.positive.item() == pytest.approx(r_p)
    assert risk.negative.item() == pytest.approx(e_u - pi * e_p_neg)
    assert losses.upu_loss(gp, gu, pi).item() == pytest.approx(r_p + e_u - pi * e_p_neg)


def test_censoring_scale():
    gp, gu = torch.tensor([0.5]), torch.tensor([-0.5, 0.1])
    pi, pi_u = 0.5, 0.4
    risk = losses.pu_risk(gp, gu, pi, pi_u)
    expected = (1 - pi) / (1 - pi_u) * ((sig(-0.5) + sig(0.1)) / 2 - pi_u * sig(0.5))
    assert risk.negative.item() == pytest.approx(expected)


def test_weighted_unlabelled_term():
    gp, gu = torch.tensor([0.0]), torch.tensor([1.0, -1.0])
    w = torch.tensor([1.0, 0.0])
    risk = losses.pu_risk(gp, gu, 0.5, weights_u=w)
    assert risk.negative.item() == pytest.approx(sig(1.0) / 2 - 0.5 * 0.5)


def test_nnpu_switch_fires_only_below_minus_beta():
    # Positives scored very positive, unlabelled too: R_n goes negative.
    gp = torch.tensor([5.0, 5.0], requires_grad=True)
    gu = torch.tensor([5.0, 5.0, -5.0], requires_grad=True)
    risk = losses.pu_risk(gp, gu, 0.9)
    assert risk.negative.item() < 0
    objective, fired = losses.nnpu_step_objective(risk, beta=0.0, gamma=1.0)
    assert fired
    assert objective.item() == pytest.approx(-risk.negative.item())
    assert risk.non_negative.item() == pytest.approx(risk.positive.item())
    # with a large beta the correction does not fire and the step is on R_p + R_n
    objective, fired = losses.nnpu_step_objective(risk, beta=10.0)
    assert not fired
    assert objective.item() == pytest.approx(risk.unbiased.item())
    # gamma scales the ascent step
    objective, _ = losses.nnpu_step_objective(risk, beta=0.0, gamma=0.5)
    assert objective.item() == pytest.approx(-0.5 * risk.negative.item())


def test_nnpu_gradient_ascends_on_negative_part():
    gu = torch.tensor([-5.0, -5.0], requires_grad=True)  # U pushed hard to negative
    gp = torch.tensor([5.0])
    risk = losses.pu_risk(gp, gu, 0.9)
    objective, fired = losses.nnpu_step_objective(risk)
    objective.backward()
    assert fired
    # minimising -R_n raises R_n = E_U[sigmoid(g_u)] - ...: a descent step moves the
    # unlabelled logits up, undoing the over-fitting that drove R_n below zero
    assert (gu.grad < 0).all()


def test_naive_pn_is_bce_against_pu_label():
    z = torch.tensor([0.0, 2.0])
    s = torch.tensor([1, 0])
    expected = (math.log(2) + math.log(1 + math.exp(2))) / 2
    assert losses.naive_pn_loss(z, s).item() == pytest.approx(expected)


def test_entropy_and_soft_cross_entropy():
    z = torch.tensor([0.0, 3.0])
    h = losses.entropy(z)
    assert h[0].item() == pytest.approx(math.log(2))
    p = sig(3.0)
    assert h[1].item() == pytest.approx(-(p * math.log(p) + (1 - p) * math.log(1 - p)))
    ce = losses.soft_cross_entropy(z, torch.tensor([1.0, p]))
    assert ce[1].item() == pytest.approx(h[1].item())


def test_zero_one_pu_risk_estimates_error():
    gp = torch.tensor([1.0, 1.0, -1.0, 1.0])  # 1/4 positives misclassified
    gu = torch.tensor([1.0, -1.0, -1.0, 1.0])
    pi = 0.5
    value = losses.zero_one_pu_risk(gp, gu, pi)
    assert value == pytest.approx(pi * 0.25 + 0.5 - pi * 0.75)

"""Self-calibration (meta step): hypergradient vs finite differences, weights, no BN leak."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from adni_pu.pu import calibration, losses


def tiny_setup(seed=0, bn=False):
    torch.manual_seed(seed)
    layers = [nn.Linear(3, 4)]
    if bn:
        layers.append(nn.BatchNorm1d(4))
    layers += [nn.Tanh(), nn.Linear(4, 1)]
    net = nn.Sequential(*layers)

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(x).squeeze(-1)

    model = Wrap().double()
    x = torch.randn(6, 3, dtype=torch.float64)
    x_val = torch.randn(8, 3, dtype=torch.float64)
    s_val = torch.tensor([1, 1, 1, 0, 0, 0, 0, 0])

    def objective(params):
        logits = calibration.functional_forward(model, params, x_val)
        return losses.pu_risk(logits[s_val == 1], logits, 0.4).unbiased

    return model, x, objective


def per_example_terms(model, x, params=None):
    logits = model(x) if params is None else calibration.functional_forward(model, params, x)
    return losses.entropy(logits), losses.sigmoid_loss(logits, -1.0)


def test_hypergradient_matches_finite_difference():
    model, x, objective = tiny_setup()
    delta = 0.5
    h, l_neg = per_example_terms(model, x)
    u = calibration.hypergradient(model, h, l_neg, objective, delta)
    names, params = calibration.virtual_parameters(model)
    n = x.shape[0]
    eps = 1e-6
    for kind in (0, 1):
        for i in range(n):
            values = []
            for sign in (1.0, -1.0):
                w = torch.zeros(2, n, dtype=torch.float64)
                w[kind, i] = sign * eps
                hh, ll = per_example_terms(model, x)
                loss = (w[0] * hh + w[1] * ll).sum() / n
                grads = torch.autograd.grad(loss, params)
                moved = {nm: p - delta * g for nm, p, g in zip(names, params, grads)}
                values.append(objective(moved).item())
            fd = -(values[0] - values[1]) / (2 * eps)
            assert u[kind, i].item() == pytest.approx(fd, rel=1e-4, abs=1e-9)


def test_sign_flip_negates_entropy_hypergradient():
    model, x, objective = tiny_setup()
    h, l_neg = per_example_terms(model, x)
    u = calibration.hypergradient(model, h, l_neg, objective, 0.5)
    h, l_neg = per_example_terms(model, x)
    flipped = calibration.hypergradient(model, h, l_neg, objective, 0.5, sign_flip=True)
    torch.testing.assert_close(flipped[0], -u[0])
    torch.testing.assert_close(flipped[1], u[1])


def test_weights_non_negative_normalised_and_capped():
    raw = torch.tensor([[0.5, -1.0, 0.2, 0.0, 3.0, 1.0, 0.7, 0.4],
                        [0.5, 2.0, -0.1, 0.0, 1.0, 0.0, 0.0, 0.1]])
    w = calibration.normalise_weights(raw, batch_size=16, cap=1 / 16)
    assert (w.ce >= 0).all() and (w.pu >= 0).all()
    torch.testing.assert_close(w.ce + w.pu, torch.ones(8))
    assert w.ce.sum().item() <= 1.0 + 1e-6  # cap: 16 * 1/16
    assert w.ce[1] == 0 and w.pu[1] == 1  # only the nnPU term helps
    assert w.ce[3] == 0 and w.pu[3] == 1  # nothing helps: plain nnPU
    assert w.capped > 0
    # without a binding cap the normalisation is per example
    loose = calibration.normalise_weights(raw, batch_size=16, cap=1.0)
    assert loose.ce[0].item() == pytest.approx(0.5)
    assert loose.ce[4].item() == pytest.approx(0.75)


def test_virtual_step_leaves_batchnorm_statistics_alone():
    model, x, objective = tiny_setup(bn=True)
    model.train()
    logits = model(x)  # the real forward updates the running statistics once
    bn = model.net[1]
    before_mean = bn.running_mean.clone()
    before_var = bn.running_var.clone()
    before_count = bn.num_batches_tracked.clone()
    w = calibration.calibration_weights(
        model, losses.entropy(logits), losses.sigmoid_loss(logits, -1.0), objective,
        calibration.MetaStep(step_size=0.1, cap=1 / 16), batch_size=6)
    torch.testing.assert_close(bn.running_mean, before_mean)
    torch.testing.assert_close(bn.running_var, before_var)
    assert bn.num_batches_tracked == before_count
    assert (w.ce >= 0).all()
    # the real step can still back-propagate through the same forward
    logits.sum().backward()
    assert model.net[0].weight.grad is not None


def test_running_batchnorm_mode_scores_like_evaluation_and_restores_the_mode():
    model, x, _ = tiny_setup(bn=True)
    model.train()
    model(x)  # running statistics now differ from any other batch's own
    bn = model.net[1]
    before = (bn.running_mean.clone(), bn.running_var.clone(), bn.num_batches_tracked.clone())
    x_val = torch.randn(8, 3, dtype=torch.float64) + 2.0  # a batch unlike the training one
    params = dict(model.named_parameters())
    running = calibration.functional_forward(model, params, x_val, bn="running")
    batch = calibration.functional_forward(model, params, x_val, bn="batch")
    assert model.training and bn.training  # the call put the mode back
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(running.detach(), model(x_val))
    model.train()
    with torch.no_grad():
        # train mode normalises by the batch itself: the validation batch's mean is removed
        pre = model.net[0](x_val)
        expected = model.net[3](torch.tanh((pre - pre.mean(0)) / torch.sqrt(
            pre.var(0, unbiased=False) + bn.eps) * bn.weight + bn.bias)).squeeze(-1)
        torch.testing.assert_close(batch.detach(), expected)
    assert not torch.allclose(running, batch)
    for value, old in zip((bn.running_mean, bn.running_var, bn.num_batches_tracked), before):
        torch.testing.assert_close(value, old)
    # the hypergradient flows through the running-statistics forward too
    logits = model(x)

    def objective(p):
        out = calibration.functional_forward(model, p, x_val, bn="running")
        return losses.pu_risk(out[:3], out, 0.4).unbiased

    raw = calibration.hypergradient(model, losses.entropy(logits),
                                    losses.sigmoid_loss(logits, -1.0), objective, 0.1)
    assert raw.shape == (2, 6) and raw.abs().sum() > 0


@pytest.mark.parametrize("bn, sign_flip", [(False, False), (True, False), (True, True)])
def test_forward_mode_hypergradient_equals_the_double_backward_one(bn, sign_flip):
    """At w = 0 the virtual step does not move the parameters: one backward pass of the
    validation objective and one JVP of the batch's terms give today's hypergradient
    (float64, 1e-6), BatchNorm in training mode included."""
    model, x, objective = tiny_setup(seed=3, bn=bn)
    rest = torch.tensor([0, 2, 3, 5])

    def terms_at(params):
        logits = calibration.functional_forward(model, params, x)[rest]
        return losses.entropy(logits), losses.sigmoid_loss(logits, -1.0)

    logits = model(x)[rest]
    h, l_neg = losses.entropy(logits), losses.sigmoid_loss(logits, -1.0)
    expected = calibration.hypergradient(model, h, l_neg, objective, 0.5, sign_flip)
    running = [b.clone() for b in model.buffers()]
    got = calibration.hypergradient_jvp(model, terms_at, objective, 0.5, sign_flip)
    assert got.shape == expected.shape == (2, 4)
    assert expected.abs().max() > 1e-4  # not a comparison of zeros
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-9)
    # the forward-mode pass leaves the real BatchNorm statistics alone
    assert all(torch.equal(a, b) for a, b in zip(running, model.buffers()))
    weights = calibration.calibration_weights(
        model, h, l_neg, objective, calibration.MetaStep(0.5, 1.0, sign_flip), 6,
        terms_at=terms_at)
    torch.testing.assert_close(weights.raw, expected, rtol=1e-6, atol=1e-9)

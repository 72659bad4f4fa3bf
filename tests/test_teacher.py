"""Mean teachers: EMA arithmetic, uniform averaging, BN buffers averaged or recomputed, a real
consistency gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from adni_pu.pu.teacher import (
    MeanTeacher,
    batchnorm_buffers,
    recompute_batchnorm,
    sigmoid_rampup,
    teacher_consistency,
)


def small():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3), nn.Linear(3, 1))


def test_ema_update_follows_formula():
    student = small()
    teacher = MeanTeacher(student, "ema", decay=0.9)
    teacher.update(student)  # first step: rate min(0, 0.9) = 0 -> copy
    teacher.update(student)  # second: rate min(0.5, 0.9)
    before = teacher.model[0].weight.clone()
    with torch.no_grad():
        student[0].weight.add_(1.0)
    for _ in range(5):
        teacher.update(student)
    # rates: min(1 - 1/(t+1), 0.9) for t = 2..6 -> 0.667, 0.75, 0.8, 0.833, 0.857
    keep = 1.0
    for t in range(2, 7):
        keep *= min(1 - 1 / (t + 1), 0.9)
    expected = before * keep + (before + 1.0) * (1 - keep)
    torch.testing.assert_close(teacher.model[0].weight, expected)


def test_uniform_average_is_mean_of_snapshots():
    student = small()
    teacher = MeanTeacher(student, "uniform")
    snapshots = []
    for k in range(4):
        with torch.no_grad():
            student[0].bias.fill_(float(k))
        snapshots.append(student[0].bias.clone())
        teacher.update(student)
    torch.testing.assert_close(teacher.model[0].bias, torch.stack(snapshots).mean(0))


def test_batchnorm_buffers_are_averaged():
    student = small()
    teacher = MeanTeacher(student, "ema", decay=0.5)
    teacher.update(student)
    with torch.no_grad():
        student[1].running_mean.fill_(2.0)
    teacher.update(student)  # rate min(0.5, 0.5)
    torch.testing.assert_close(teacher.model[1].running_mean, torch.full((3,), 1.0))
    assert not any(p.requires_grad for p in teacher.model.parameters())


def test_teacher_consistency_gives_the_student_a_gradient():
    student = small()
    teacher = MeanTeacher(student, "ema")
    with torch.no_grad():
        teacher.model[2].bias.add_(2.0)  # teacher disagrees
    x = torch.randn(8, 2)
    student.train()
    loss = teacher_consistency(student(x).squeeze(-1), teacher.model, x)
    loss.backward()
    assert loss.item() > 0
    assert student[2].weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in teacher.model.parameters())
    # the published code's softmax over one logit is identically 1: no signal at all
    one_logit = student(x)
    published = (torch.softmax(one_logit, 1) - torch.softmax(teacher.model(x), 1)).pow(2).mean()
    assert published.item() == 0.0


def test_rampup():
    assert sigmoid_rampup(0, 10) == pytest.approx(torch.exp(torch.tensor(-5.0)).item())
    assert sigmoid_rampup(10, 10) == 1.0
    assert sigmoid_rampup(3, 0) == 1.0


def with_dropout():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 3), nn.Dropout(0.5), nn.BatchNorm1d(3), nn.ReLU(),
                         nn.Linear(3, 1))


def _update_with_moving_student(teacher: MeanTeacher, student: nn.Module, steps: int) -> None:
    x = torch.randn(16, 2)
    for k in range(steps):
        with torch.no_grad():
            student[0].weight.add_(0.1 * (k + 1))
        student.train()
        student(x)  # moves the student's running statistics
        teacher.update(student)


def test_batchnorm_recompute_gives_the_training_data_statistics():
    student = with_dropout()
    teacher = MeanTeacher(student, "uniform", bn="recompute")
    _update_with_moving_student(teacher, student, 3)
    weights = {k: v.clone() for k, v in teacher.model.named_parameters()}
    x = torch.randn(300, 2) * 3 + 1
    recompute_batchnorm(teacher.model, [x])  # one batch: mean and unbiased variance exactly
    with torch.no_grad():
        hidden = teacher.model[0](x)  # the pre-BN activations (dropout is not applied)
    bn = teacher.model[2]
    torch.testing.assert_close(bn.running_mean, hidden.mean(0))
    torch.testing.assert_close(bn.running_var, hidden.var(0, unbiased=True))
    for k, v in teacher.model.named_parameters():
        torch.testing.assert_close(v, weights[k], rtol=0, atol=0)
    assert not teacher.model.training and bn.momentum == 0.1  # momentum put back
    # batches of unequal sizes weigh by size: the running mean is the mean of every example
    recompute_batchnorm(teacher.model, [x[:250], x[250:]])
    torch.testing.assert_close(bn.running_mean, hidden.mean(0))
    # and the running variance that of every example, not a mean of the batches' variances
    torch.testing.assert_close(bn.running_var, hidden.var(0))
    # and the averaging leaves recomputed statistics alone (the next epoch's targets use them)
    stats = bn.running_mean.clone(), bn.running_var.clone()
    _update_with_moving_student(teacher, student, 2)
    torch.testing.assert_close(bn.running_mean, stats[0], rtol=0, atol=0)
    torch.testing.assert_close(bn.running_var, stats[1], rtol=0, atol=0)


def test_uniform_average_of_three_snapshots_is_their_mean_for_every_weight():
    student = small()
    teacher = MeanTeacher(student, "uniform", bn="recompute")
    snapshots = []
    for k in range(3):
        with torch.no_grad():
            for p in student.parameters():
                p.add_(torch.randn_like(p) * (k + 1))
        snapshots.append({n: p.clone() for n, p in student.named_parameters()})
        teacher.update(student)
    for name, p in teacher.model.named_parameters():
        torch.testing.assert_close(p, torch.stack([s[name] for s in snapshots]).mean(0))


def test_batchnorm_buffer_names_and_bad_mode():
    assert batchnorm_buffers(small()) == {"1.running_mean", "1.running_var",
                                          "1.num_batches_tracked"}
    with pytest.raises(ValueError, match="expected 'average' or 'recompute'"):
        MeanTeacher(small(), bn="swa")  # type: ignore[arg-type]


def test_batchnorm_recompute_is_exact_when_batches_are_not_mixed():
    """Ordered chunks (labelled positives first, as the trainer's entries are) must give the
    variance of all examples: per-chunk variances would miss the spread between the chunks."""
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(2)
    model = nn.Sequential(bn)
    x = torch.cat([torch.randn(300, 2) + 3.0, torch.randn(700, 2) - 1.0])
    recompute_batchnorm(model, [x[i:i + 8] for i in range(0, len(x), 8)])
    torch.testing.assert_close(bn.running_mean, x.mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bn.running_var, x.var(0), rtol=1e-5, atol=1e-5)
    assert float(bn.running_var.min()) > 3.0  # a mean of the chunks' variances is about 1
    assert not model.training


@pytest.mark.parametrize("mode", ["ema", "uniform"])
def test_device_rate_and_ramp_equal_the_host_ones(mode):
    """A step replayed as a graph keeps the update count and the epoch on the device: the
    rate, the averaging and the ramp computed there equal the host forms."""
    torch.manual_seed(0)
    student = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    host = MeanTeacher(student, mode=mode, decay=0.9)
    device = MeanTeacher(student, mode=mode, decay=0.9)
    count = torch.zeros((), dtype=torch.float64)
    for _ in range(15):
        with torch.no_grad():
            for p in student.parameters():
                p.add_(torch.randn_like(p))
        keep = device.rate(count)
        assert keep.item() == pytest.approx(host.rate(), abs=1e-15)
        host.update(student)
        device.average(student, keep)
        count += 1
    for a, b in zip(host.model.state_dict().values(), device.model.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), rtol=1e-6, atol=1e-7)
    for epoch in (-1.0, 0.0, 0.3, 2.5, 5.0, 7.0):
        ramp = sigmoid_rampup(torch.tensor(epoch, dtype=torch.float64), 5)
        assert ramp.dtype == torch.float32
        assert ramp.item() == sigmoid_rampup(epoch, 5)
    assert sigmoid_rampup(torch.tensor(3.0), 0).item() == 1.0

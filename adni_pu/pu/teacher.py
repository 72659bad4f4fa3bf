"""Mean teachers: averages of a student's weights that grade the student (phase 3).

"ema" is the exponential moving average of Tarvainen & Valpola (decay ``min(1 - 1/(t+1),
decay)``, so early steps are not dominated by the initial copy); "uniform" reproduces the
published Self-PU code, whose "EMA" is an equal-weight average of all snapshots. With
``bn="average"`` BatchNorm running statistics are averaged the same way as the weights and
integer buffers (the batch counter) are copied; with ``bn="recompute"`` the BatchNorm buffers
are left alone by the averaging and set by :func:`recompute_batchnorm` from the training
inputs instead (stochastic weight averaging, Izmailov et al. 2018): the statistics of averaged
weights are not the average of the statistics.
"""

from __future__ import annotations

from collections.abc import Iterable
from copy import deepcopy
from typing import Any, Literal

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from adni_pu.pu.stack import Stack, key


class MeanTeacher:
    """A frozen copy of a student whose weights follow the student's by averaging."""

    def __init__(self, student: nn.Module, mode: Literal["ema", "uniform"] = "ema",
                 decay: float = 0.999, bn: Literal["average", "recompute"] = "average",
                 copy: bool = True) -> None:
        """A teacher starting as a copy of ``student`` (``copy=False``: ``student`` itself
        becomes the teacher's model, e.g. a stack of teachers)."""
        if mode not in ("ema", "uniform"):
            raise ValueError(f"teacher mode {mode!r}: expected 'ema' or 'uniform'")
        if bn not in ("average", "recompute"):
            raise ValueError(f"teacher BatchNorm {bn!r}: expected 'average' or 'recompute'")
        self.model = deepcopy(student) if copy else student
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.mode = mode
        self.decay = decay
        self.bn = bn
        self.steps = 0

    def rate(self, steps: torch.Tensor | None = None) -> Any:
        """Weight kept from the current teacher at the next update; after ``steps`` updates
        (a device tensor, for a step replayed as a graph) instead of :attr:`steps`."""
        t = self.steps if steps is None else steps
        uniform = 1.0 - 1.0 / (t + 1)
        if self.mode == "uniform":
            return uniform
        return min(uniform, self.decay) if steps is None else uniform.clamp(max=self.decay)

    def update(self, student: nn.Module) -> None:
        """Move the teacher towards ``student`` by one averaging step."""
        self.average(student, self.rate())
        self.steps += 1

    @torch.no_grad()
    def average(self, student: nn.Module, keep: float | torch.Tensor) -> None:
        """teacher <- keep x teacher + (1 - keep) x student (``keep``: a number, or a 0-d
        float64 device tensor); the integer buffers are copied. :attr:`steps` is the
        caller's."""
        if not hasattr(self, "_pairs"):  # tensors to average, gathered once (fused updates)
            t_float, s_float, t_int, s_int = [], [], [], []
            skip = batchnorm_buffers(self.model) if self.bn == "recompute" else set()
            buffers = [(t, s) for (name, t), s in zip(self.model.named_buffers(),
                                                      student.buffers()) if name not in skip]
            for t, s in [*zip(self.model.parameters(), student.parameters()), *buffers]:
                (t_float if t.dtype.is_floating_point else t_int).append(t)
                (s_float if t.dtype.is_floating_point else s_int).append(s)
            self._pairs = (t_float, s_float, t_int, s_int)
        t_float, s_float, t_int, s_int = self._pairs
        if isinstance(keep, torch.Tensor):  # both weights rounded from float64, as host numbers are
            torch._foreach_mul_(t_float, keep.float())
            torch._foreach_add_(t_float, torch._foreach_mul([s.detach() for s in s_float],
                                                            (1.0 - keep).float()))
        else:
            torch._foreach_mul_(t_float, keep)
            torch._foreach_add_(t_float, [s.detach() for s in s_float], alpha=1.0 - keep)
        for t, s in zip(t_int, s_int):
            t.copy_(s)

    def state_dict(self) -> dict[str, object]:
        return {"model": self.model.state_dict(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.model.load_state_dict(state["model"])  # type: ignore[arg-type]
        self.steps = int(state["steps"])  # type: ignore[arg-type]


def batchnorm_buffers(model: nn.Module) -> set[str]:
    """The names of the BatchNorm running statistics (and batch counters) of ``model``
    (a :class:`~adni_pu.pu.stack.Stack`: of its members, under the stack's names)."""
    if isinstance(model, Stack):
        inner = batchnorm_buffers(model.skeleton)
        return {key(name) for name in model.buffer_names if model.inner_name(name) in inner}
    return {f"{prefix}.{name}" if prefix else name
            for prefix, module in model.named_modules() if isinstance(module, _BatchNorm)
            for name, _ in module.named_buffers(recurse=False)}


@torch.no_grad()
def recompute_batchnorm(model: nn.Module, batches: Iterable[Any]) -> None:
    """Set every BatchNorm's running statistics to those of ``batches``, weights unchanged.

    One forward pass with only the BatchNorm layers in training mode (dropout and the rest
    stay in evaluation mode, so the pass is deterministic), as
    ``torch.optim.swa_utils.update_bn`` does; but each BatchNorm's input is summed per
    channel (sum and sum of squares, float64) over every example of every batch, so the
    running mean and (unbiased) variance are those of all examples whatever the batches
    hold: averaging per-batch variances would drop the spread between batch means, which is
    large when batches are not mixed (e.g. labelled positives first). The model is left in
    evaluation mode.
    """
    norms = [m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
    if not norms:
        return
    sums: dict[int, list[Any]] = {}

    def accumulate(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        x = inputs[0].detach().double()
        dims = [d for d in range(x.dim()) if d != 1]
        entry = sums.setdefault(id(module), [0, 0.0, 0.0])
        entry[0] += x.numel() // x.shape[1]
        entry[1] = entry[1] + x.sum(dim=dims)
        entry[2] = entry[2] + (x * x).sum(dim=dims)

    for m in norms:
        m.reset_running_stats()  # the batch counter then counts this pass's batches
    hooks = [m.register_forward_pre_hook(accumulate) for m in norms]
    model.eval()
    for m in norms:
        m.train()
    try:
        for xb in batches:
            model(xb)
    finally:
        for hook in hooks:
            hook.remove()
        model.eval()
    for m in norms:
        if id(m) not in sums:
            continue
        n, total, squares = sums[id(m)]
        mean = total / n
        var = (squares - n * mean * mean) / max(n - 1, 1)
        m.running_mean.copy_(mean.to(m.running_mean.dtype))
        m.running_var.copy_(var.clamp(min=0).to(m.running_var.dtype))


def _batch_size(x: Any) -> int:
    """Examples in a batch: a tensor, or a dict/list/tuple holding tensors."""
    if isinstance(x, torch.Tensor):
        return len(x)
    values = x.values() if isinstance(x, dict) else x
    return next(len(v) for v in values if isinstance(v, torch.Tensor))


def sigmoid_rampup(epoch: Any, length: int) -> Any:
    """exp(-5 (1 - t)^2) ramp from 0 to 1 over ``length`` epochs (Laine & Aila); for an
    ``epoch`` that is a device tensor (a step replayed as a graph), a float32 tensor."""
    if isinstance(epoch, torch.Tensor):
        if length <= 0:
            return torch.ones_like(epoch, dtype=torch.float32)
        t = (epoch / length).clamp(0.0, 1.0)
        return torch.exp((-5.0 * (1.0 - t) ** 2).float())  # float32 as the host form
    if length <= 0:
        return 1.0
    t = min(max(epoch / length, 0.0), 1.0)
    return float(torch.exp(torch.tensor(-5.0 * (1.0 - t) ** 2)))


def teacher_logits(teacher: nn.Module, x: object) -> torch.Tensor:
    """The teacher's logits on ``x`` as consistency targets: evaluation mode, no gradient,
    float32 (under bf16 autocast too). ``teacher``: one network, or a stack of them."""
    teacher.eval()
    with torch.no_grad():
        return teacher(x).float()


def teacher_consistency(student_logits: torch.Tensor, teacher: nn.Module, x: object
                        ) -> torch.Tensor:
    """MSE between the student's and the teacher's probabilities; gradient to the student only.

    The published code computes a softmax over a single logit, which is identically 1, so
    its consistency loss is always zero; this one compares sigmoid probabilities.
    """
    target = torch.sigmoid(teacher_logits(teacher, x))
    return ((torch.sigmoid(student_logits) - target) ** 2).mean()

"""A population per step: several runs (seeds) trained at once, every network in one stack.

:func:`fit_population` trains K :class:`~adni_pu.pu.trainer.Trainer` runs of one method, one
seed each, in lockstep. Everything that happens once per epoch stays each run's own (the
Self-PU selection, evaluation and model selection, checkpoints, the run folder), so each
run's folder looks as if it had trained alone. The batches are the exception: the K runs'
M = K x S networks (S students per run: one for a baseline, Self-PU's two) are one
:class:`~adni_pu.pu.stack.Stack`, stepped by one Adam, their teachers another stack; each
run's batch plan, validation batches and trusted sets become 0/1 masks (M x B), and the
losses of every phase are computed for all M networks at once by the objective the
ordinary engine uses (:func:`adni_pu.pu.objective.step_loss`, here with M x B logits). A
run then costs about what one network costs in launches, which is what bounds a small
model on a GPU.

The numbers equal separate runs up to rounding (tests/test_population.py): one Adam over
stacked weights is M Adams, a masked mean is the mean over the rows, and every network's
loss touches only its own weights. Not supported here (refused with the setting named):
distributed training, ``compile``, models with dropout, inputs other than tensors, and
runs whose settings differ in anything but the seed and the class prior. The prior may
differ because every network's risks take their own run's prior (``--prior estimate``
gives each seed the estimate from its own PU data).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn

from adni_pu import config as cfgmod
from adni_pu.errors import ConfigError
from adni_pu.pu import objective
from adni_pu.pu.batching import EpochPlan
from adni_pu.pu.device_data import epoch_means
from adni_pu.pu.loop import FitResult, OutOfTime, run_epochs
from adni_pu.pu.replay import StepReplay
from adni_pu.pu.stack import Stack
from adni_pu.pu.teacher import MeanTeacher
from adni_pu.pu.trainer import Trainer

Stats = dict[str, Any]


def _shared_settings(trainer: Trainer) -> dict[str, Any]:
    """The settings every run of a population must share: all but the seed and the class
    prior (the stacked step feeds each network its own run's prior)."""
    settings = cfgmod.to_dict(trainer.cfg)
    for own in ("seed", "prior"):
        settings.pop(own)
    return settings


def check_population(trainers: Sequence[Trainer]) -> None:
    """Refuse what the stacked step does not do (module docstring), naming the setting."""
    if not trainers:
        raise ConfigError("a population needs at least one run")
    first = _shared_settings(trainers[0])
    for t in trainers[1:]:
        other = _shared_settings(t)
        if other != first:
            diff = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
            raise ConfigError(f"population runs differ in {diff}: expected the same settings "
                              "apart from the seed and the class prior")
    cfg = trainers[0].cfg
    if cfg.compile:
        raise ConfigError("compile = true in a population: expected false (the stacked step "
                          "is not compiled)")
    for t in trainers:
        if t.ddp is not None:
            raise ConfigError("a population with distributed training: expected one process")
        if not isinstance(t.data.train.x, torch.Tensor):
            raise ConfigError("a population over a map-style data set: expected tensor data "
                              "(MNIST, CIFAR-10)")
        model = t.state.students[0].model
        if any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
            raise ConfigError(f"model {cfg.model!r} has dropout: a population needs a model "
                              "without dropout")


def fit_population(trainers: Sequence[Trainer], deadline: float | None = None,
                   finish_first_epoch: bool = True, capture: bool = False
                   ) -> list[FitResult]:
    """Fit every run of ``trainers`` (each resumes from its own folder) together.

    ``deadline`` and ``finish_first_epoch`` as in :meth:`Trainer.fit`; a run's epoch time in
    its metrics is the population's. ``capture``: each epoch's step is replayed as a CUDA
    graph (:mod:`adni_pu.pu.replay`; a CUDA device only).
    """
    check_population(trainers)
    if capture and trainers[0].device.type != "cuda":
        raise ConfigError(f"capture on device {trainers[0].device.type!r}: CUDA graphs need "
                          "a CUDA device")
    return run_epochs(list(trainers), partial(train_epoch, trainers, capture=capture),
                      deadline, finish_first_epoch)


# ---------------------------------------------------------------------- one epoch


def _stacked_optimizer(stack: Stack, members: list[torch.optim.Optimizer],
                       capture: bool = False) -> torch.optim.Adam:
    """One Adam over the stack with the members' settings and (stacked) moments; on a GPU
    the fused kernel (one launch per step; elementwise like the members' own), capturable
    in a CUDA graph with ``capture``."""
    params = stack.stacked_parameters()
    fused = params[0].device.type == "cuda"
    opt = torch.optim.Adam(params, fused=fused, capturable=capture)
    group = members[0].param_groups[0]
    opt.param_groups[0].update({k: v for k, v in group.items()
                                if k not in ("params", "fused", "foreach", "capturable")})
    if not members[0].state:
        return opt
    for j, p in enumerate(stack.stacked_parameters()):
        states = [o.state[o.param_groups[0]["params"][j]] for o in members]
        steps = {float(s["step"]) for s in states}
        if len(steps) > 1:
            raise ConfigError(f"population networks have taken different numbers of Adam steps "
                              f"{sorted(steps)}: expected runs at the same epoch")
        step = states[0]["step"].clone()
        opt.state[p] = {"step": step.to(p.device) if fused else step,
                        **{name: torch.stack([s[name] for s in states])
                           for name in ("exp_avg", "exp_avg_sq")}}
    return opt


def _unstack_optimizer(opt: torch.optim.Adam, stack: Stack,
                       members: list[torch.optim.Optimizer]) -> None:
    """Write the stacked Adam's moments back into each member's optimiser."""
    for j, p in enumerate(stack.stacked_parameters()):
        state = opt.state[p]
        for m, o in enumerate(members):
            o.state[o.param_groups[0]["params"][j]] = {
                "step": state["step"].detach().to("cpu", copy=True),  # members: not fused
                **{name: state[name][m].clone() for name in ("exp_avg", "exp_avg_sq")}}


class _Masks:
    """The epoch's row sets of every network (:meth:`~adni_pu.pu.strategies.Baseline.
    row_sets`) as 0/1 device masks, M x batches x B, each run's batch padded to the
    longest of the runs' (B rows; "valid" marks the run's own)."""

    def __init__(self, trainers: Sequence[Trainer], plans: list[EpochPlan], phase: int,
                 device: torch.device) -> None:
        self.width = max(max(p.sizes) for p in plans)
        masks: dict[str, list[np.ndarray]] = {}
        for t, plan in zip(trainers, plans):
            for sets in t.strategy.row_sets(plan, phase):
                for name, mask in sets.items():
                    masks.setdefault(name, []).append(self.padded(plan, mask))
        self.masks = {name: torch.from_numpy(np.stack(rows)).to(device)
                      for name, rows in masks.items()}

    def padded(self, plan: EpochPlan, values: np.ndarray) -> np.ndarray:
        """An epoch-long array (rows end to end) as batches x B, zero where padded."""
        out = np.zeros((len(plan.sizes), self.width), dtype=np.float32)
        batch = np.repeat(np.arange(len(plan.sizes)), plan.sizes)
        out[batch, np.arange(len(batch)) - plan.starts[batch]] = values
        return out

    def batch(self, b: int) -> dict[str, torch.Tensor]:
        return {name: mask[:, b] for name, mask in self.masks.items()}


class _MixUp:
    """VPU's MixUp draws of every run (:meth:`~adni_pu.pu.strategies.VPU.mixup`) per
    network on the device: the weights (M x batches) and the partner positions (M x
    batches x B; a padding row is its own partner)."""

    def __init__(self, lam: torch.Tensor, partner: torch.Tensor) -> None:
        self.lam, self.partner = lam, partner

    @classmethod
    def of(cls, trainers: Sequence[Trainer], plans: list[EpochPlan], width: int,
           students: int, device: torch.device) -> _MixUp | None:
        draws = [t.strategy.mixup(plan) for t, plan in zip(trainers, plans)]
        if draws[0] is None:
            return None
        lam, partner = [], []
        for plan, mix in zip(plans, draws):
            assert mix is not None
            rows = np.tile(np.arange(width), (len(plan.sizes), 1))
            for b in range(len(plan.sizes)):
                _, where = mix.batch(plan, b)
                rows[b, :len(where)] = where
            lam.append(mix.lam)
            partner.append(rows)
        return cls(torch.tensor(np.stack(lam), dtype=torch.float32,
                                device=device).repeat_interleave(students, 0),
                   torch.from_numpy(np.stack(partner)).to(device).repeat_interleave(students, 0))

    def batch(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lam[:, b].contiguous(), self.partner[:, b].contiguous()


def _check_plans(plans: list[EpochPlan]) -> None:
    counts = sorted({len(p.sizes) for p in plans})
    if len(counts) > 1:
        raise ConfigError(f"population runs have {counts} batches this epoch: expected one "
                          "number (training splits of about one size)")


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` with zero rows appended up to ``rows`` rows."""
    if len(x) == rows:
        return x
    return torch.cat([x, x.new_zeros((rows - len(x), *x.shape[1:]))])


def per_network(parts: Sequence[torch.Tensor], width: int, students: int) -> torch.Tensor:
    """Each run's part of a batch padded to ``width`` rows, stacked, and repeated for each
    of the run's ``students`` (M x width x ...)."""
    return torch.stack([pad_rows(v, width) for v in parts]).repeat_interleave(students, 0)


def train_epoch(trainers: Sequence[Trainer], epoch: int, deadline: float | None = None,
                capture: bool = False) -> list[dict[str, float]]:
    """One epoch of every run at once; returns each run's mean statistics (as
    :meth:`Trainer.train_epoch` does for one). ``capture``: the step is replayed as a CUDA
    graph (:mod:`adni_pu.pu.replay`), captured afresh each epoch."""
    lead, cfg = trainers[0], trainers[0].cfg
    phase = lead.strategy.phase(epoch)
    n_students = len(lead.state.students)
    device = lead.device
    torch.manual_seed(cfg.seed * 100_003 + epoch)
    plans, metas, inputs = [], [], []
    for t in trainers:
        plan, meta, batches = t.plan_epoch(epoch, phase)
        plans.append(plan)
        metas.append(meta)
        inputs.append(batches)
    _check_plans(plans)
    masks = _Masks(trainers, plans, phase, device)
    width = masks.width
    mixes = _MixUp.of(trainers, plans, width, n_students, device)
    students = [st for t in trainers for st in t.state.students]
    stack = Stack([st.model for st in students]).train()
    members = [st.optimizer for st in students]
    opt = _stacked_optimizer(stack, members, capture)
    teachers = None
    if students[0].teacher is not None:
        first = students[0].teacher
        teachers = MeanTeacher(Stack([st.teacher.model for st in students]), first.mode,
                               first.decay, first.bn, copy=False)
        teachers.steps = first.steps
    ctx = StepContext(trainers, phase, n_students, device)
    n_batches = len(plans[0].sizes)
    # the epoch's progress at each batch and the teachers' update count, on the device
    progress = epoch + torch.arange(n_batches, dtype=torch.float64, device=device) / n_batches
    updates = torch.full((), float(0 if teachers is None else teachers.steps),
                         dtype=torch.float64, device=device)

    def step(x: torch.Tensor, s: torch.Tensor, idx: torch.Tensor,
             rows: dict[str, torch.Tensor], meta: tuple[torch.Tensor, ...] | None,
             at: torch.Tensor, mix: tuple[torch.Tensor, torch.Tensor] | None) -> Stats:
        with lead.run.device_data.autocast():
            logits = stack(x, rows["valid"]).float()
            mixed = None
            if mix is not None:
                mixed = stack(objective.mix_inputs(x, mix[1], mix[0]), rows["valid"]).float()
            batch = objective.StepBatch(
                x, s, idx, at, None if meta is None else objective.ValidationBatch(*meta),
                1.0 if mix is None else mix[0])
            loss, stats = ctx.loss(stack, logits, batch, rows,
                                   None if teachers is None else teachers.model, mixed)
        opt.zero_grad(set_to_none=True)
        loss.sum().backward()
        opt.step()
        if teachers is not None:
            teachers.average(stack, teachers.rate(updates))
            updates.add_(1)
        return stats

    replay = StepReplay(step, capture)
    values: dict[str, list[Any]] = {}
    for b in range(n_batches):
        if deadline is not None and time.monotonic() > deadline:
            raise OutOfTime
        xs, ss, idxs = zip(*(next(it) for it in inputs))
        stats = replay(per_network(xs, width, n_students),
                       per_network(ss, width, n_students).float(),
                       per_network(idxs, width, n_students),
                       masks.batch(b), ctx.meta_batch([next(m) for m in metas]), progress[b],
                       None if mixes is None else mixes.batch(b))
        if teachers is not None:
            teachers.steps += 1
        for key, value in stats.items():
            values.setdefault(key, []).append(value)
    stack.unstack_into([st.model for st in students])
    _unstack_optimizer(opt, stack, members)
    if teachers is not None:
        teachers.model.unstack_into([st.teacher.model for st in students])
        for st in students:
            st.teacher.steps = teachers.steps
    with warnings.catch_warnings():  # the members' own optimisers did not step: the stack's did
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
        for st in students:
            st.scheduler.step()
    return _epoch_means(values, trainers)


def _epoch_means(values: dict[str, list[Any]], trainers: Sequence[Trainer]
                 ) -> list[dict[str, float]]:
    """Each run's statistics (``student/key``) as means over the epoch's batches
    (:func:`device_data.epoch_means`, per network)."""
    names = [(i, st.name) for i, t in enumerate(trainers) for st in t.state.students]
    out: list[dict[str, float]] = [{} for _ in trainers]
    for key, mean in epoch_means(values).items():
        for m, (i, name) in enumerate(names):
            out[i][f"{name}/{key}"] = mean[m] if isinstance(mean, list) else mean
    return out


# ---------------------------------------------------------------------- the losses


class StepContext:
    """What the objective needs besides the batch: every network's
    :class:`~adni_pu.pu.objective.NetworkInputs` (its strategy's, stacked along the
    network axis), the settings, and the validation batches."""

    def __init__(self, trainers: Sequence[Trainer], phase: int, n_students: int,
                 device: torch.device) -> None:
        cfg = trainers[0].cfg
        self.cfg, self.sp, self.phase = cfg, cfg.selfpu, phase
        self.n_students = n_students
        self.inputs = objective.NetworkInputs.stack(
            [t.strategy.network_inputs(k, phase) for t in trainers
             for k in range(len(t.state.students))], device)

    def meta_batch(self, batches: list[Any]) -> tuple[torch.Tensor, ...] | None:
        """The runs' validation batches of this step as one batch of M x Bv rows, padded to
        the longest: inputs, true labels, and the labelled-positive and unlabelled rows as
        masks (None: no meta step)."""
        if batches[0] is None:
            return None
        width = max(len(b[1]) for b in batches)
        pos, unl = [], []
        for _, s_val, _, n_pos in batches:
            rows = torch.zeros(2, width, device=s_val.device)
            rows[0, :n_pos] = 1.0
            rows[1, n_pos:len(s_val)] = 1.0
            pos.append(rows[0])
            unl.append(rows[1])

        return tuple(per_network(parts, width, self.n_students)
                     for parts in ([b[0] for b in batches], [b[2] for b in batches], pos, unl))

    def loss(self, stack: Stack, logits: torch.Tensor, batch: objective.StepBatch,
             rows: dict[str, torch.Tensor], teachers: Stack | None,
             mixed: torch.Tensor | None = None) -> tuple[torch.Tensor, Stats]:
        """Every network's loss on this batch (M) and its statistics (M-vectors):
        :func:`adni_pu.pu.objective.step_loss` of the stacked inputs with those of this
        step that exist: the meta step (with a validation batch), the other student of
        each run's pair, the teachers' logits, VPU's mixed rows' logits."""
        other = None
        if self.n_students == 2:  # a run's students sit side by side in the stack
            other = logits.view(-1, 2, logits.shape[-1]).flip(1).reshape(logits.shape)
        inputs = self.inputs.at(batch, rows, logits, stack, self.sp, other=other,
                                teacher=teachers, mixed=mixed)
        return objective.step_loss(inputs, self.cfg, self.phase)

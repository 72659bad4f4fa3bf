"""The common ground of every method's strategy: :class:`Baseline` (naive PN, uPU or nnPU,
one model throughout), which :class:`~adni_pu.pu.strategies.vpu.VPU` and
:class:`~adni_pu.pu.strategies.selfpu.SelfPU` extend, and what a training batch is to a
strategy (:class:`Layout`, :class:`MixPlan`, :class:`Batch`).

A strategy feeds the objective (:func:`adni_pu.pu.objective.step_loss`) through one typed
value: what it knows of each network for the epoch (:meth:`Baseline.network_inputs`, an
:class:`~adni_pu.pu.objective.NetworkInputs` that the population engine stacks) turned into
a step's :class:`~adni_pu.pu.objective.LossInputs` by the engine's forward results.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from adni_pu.errors import ConfigError
from adni_pu.pu import objective
from adni_pu.pu.batching import EpochPlan
from adni_pu.pu.device_data import channels_last
from adni_pu.pu.run import RunView, Student, student_name

Stats = dict[str, Any]
Meta = tuple[Any, torch.Tensor, torch.Tensor, int]
"""A validation batch of the meta step: inputs, PU labels, true labels, number of positives."""


@dataclass
class Layout:
    """Where the rows of one batch sit: each row set (:data:`adni_pu.pu.objective.Rows`)
    as a 0/1 mask over the batch's ``n`` rows, per student, on the device."""

    n: int
    names: list[str]
    masks: torch.Tensor  # names x students x n

    def rows(self, k: int) -> objective.Rows:
        """Student ``k``'s row sets."""
        return dict(zip(self.names, self.masks[:, k].unbind(0)))


@dataclass(frozen=True)
class MixPlan:
    """VPU's MixUp draws of an epoch: each batch's weight lambda ~ Beta(alpha, alpha) and,
    for every row of the epoch (``EpochPlan.order``), the row position within its batch of
    the labelled positive it is mixed with (a batch without one: lambda 1, itself)."""

    lam: np.ndarray  # batches
    partner: np.ndarray  # rows end to end

    def batch(self, plan: EpochPlan, b: int) -> tuple[float, np.ndarray]:
        """Batch ``b``'s weight and partner positions."""
        start = plan.starts[b]
        return float(self.lam[b]), self.partner[start:start + plan.sizes[b]]


@dataclass
class Batch:
    """One training batch as each student's loss sees it: the step's batch that every
    student shares (inputs, labels, indices, epoch progress, validation batch, MixUp
    weight), where its rows sit per student, the phase, and VPU's mixed rows' logits."""

    step: objective.StepBatch
    layout: Layout
    phase: int
    mixed: list[torch.Tensor] | None = None  # VPU: each student's logits of the mixed rows


class Baseline:
    """naive PN, uPU or nnPU: one model, the same loss in every epoch."""

    n_students = 1

    def __init__(self, run: RunView) -> None:
        self.run = run
        self.cfg = run.cfg

    def rate(self, k: int) -> float:
        """Student ``k``'s final trusted share (Self-PU's ``rates``; 0 for a baseline)."""
        return 0.0

    def make_students(self) -> list[Student]:
        """The method's networks from the seed, each with Adam and its learning-rate schedule
        (``lr_schedule``)."""
        e, cfg, n = self.run, self.cfg, self.n_students
        torch.manual_seed(cfg.seed)
        students = []
        for k in range(n):
            model = e.model_factory().to(e.device)
            if cfg.channels_last:
                model = channels_last(model)
            opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                   betas=tuple(cfg.adam_betas))
            sched: torch.optim.lr_scheduler.LRScheduler = (
                torch.optim.lr_scheduler.StepLR(opt, cfg.lr_step_epochs, cfg.lr_step_factor)
                if cfg.lr_schedule == "step" else
                torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs))
            students.append(Student(student_name(k, n), model, opt, sched, self.rate(k),
                                    prior_rest=e.prior_u))
        return students

    def make_teachers(self) -> None:
        """Mean teachers for the students (Self-PU's phase 3; a baseline has none)."""
        raise ConfigError(f"method {self.cfg.method!r} has no mean teachers")

    def phase(self, epoch: int) -> int:
        """The method's phase in ``epoch`` (a baseline has one)."""
        return 1

    def epoch_start(self, epoch: int, row: dict[str, Any]) -> None:
        """Before an epoch is timed as training (Self-PU selects here and adds its trusted
        sets' sizes to the epoch's ``row``)."""

    def training_start(self, epoch: int, phase: int) -> None:
        """At the start of an epoch's training pass, after its random streams are seeded."""

    def validation_batches(self, rng: np.random.Generator, phase: int, n_batches: int
                           ) -> Iterator[Meta | None]:
        """One meta-step validation batch per training batch (None: no meta step)."""
        return iter([None] * n_batches)

    def row_sets(self, plan: EpochPlan, phase: int) -> list[dict[str, np.ndarray]]:
        """Per student, its row sets over the epoch's rows end to end (``plan.order``) as
        boolean masks: "valid", "pos" and "unl", and the method's own (:meth:`row_masks`,
        from phase 2 on; after :meth:`training_start`)."""
        s = self.run.entries.s[plan.order]
        common = {"valid": np.ones(len(s), dtype=bool), "pos": s == 1, "unl": s == 0}
        return [{**common, **dict(self.row_masks(plan, k) if phase >= 2 else [])}
                for k in range(len(self.run.state.students))]

    def row_masks(self, plan: EpochPlan, k: int) -> list[tuple[str, np.ndarray]]:
        """Student ``k``'s own row sets over the epoch's rows (a baseline has none)."""
        return []

    def mixup(self, plan: EpochPlan) -> MixPlan | None:
        """The epoch's MixUp draws (VPU; None: no MixUp), after :meth:`training_start`."""
        return None

    def layouts(self, plan: EpochPlan, phase: int) -> list[Layout]:
        """Each batch's row sets (:meth:`row_sets`) as masks on the device (one transfer)."""
        sets = self.row_sets(plan, phase)
        names = list(sets[0])
        block = np.stack([np.stack([rows[name] for rows in sets]) for name in names])
        masks = torch.from_numpy(block.astype(np.float32)).to(self.run.device)
        return [Layout(n, names, part)
                for n, part in zip(plan.sizes, torch.split(masks, plan.sizes, dim=-1))]

    def network_inputs(self, k: int, phase: int) -> objective.NetworkInputs:
        """What the objective reads of student ``k`` in an epoch of ``phase`` (after
        :meth:`training_start`): the data priors and its nnPU prior on U' (a baseline's:
        the prior of D_U)."""
        e = self.run
        return objective.NetworkInputs(e.prior, e.prior_u, e.state.students[k].prior_rest)

    def loss(self, k: int, logits: list[torch.Tensor], batch: Batch
             ) -> tuple[torch.Tensor, Stats]:
        """Student ``k``'s loss on ``batch`` (``logits``: every student's) and its statistics
        (:func:`adni_pu.pu.objective.step_loss`): its :meth:`network_inputs` with the inputs
        that exist in this step: the meta step (a batch with a validation batch), the other
        student's logits, the mean teacher's and the mixed rows'."""
        st, rows = self.run.state.students[k], batch.layout.rows(k)
        inputs = self.network_inputs(k, batch.phase).at(
            batch.step, rows, logits[k], st.model, self.cfg.selfpu,
            other=logits[1 - k] if len(logits) == 2 else None,
            teacher=None if st.teacher is None else st.teacher.model,
            mixed=None if batch.mixed is None else batch.mixed[k])
        return objective.step_loss(inputs, self.cfg, batch.phase)

    def step_end(self, student: Student) -> None:
        """After one optimiser step of ``student``."""

    def training_end(self) -> None:
        """After the epoch's training pass, before evaluation."""

    def fit_end(self) -> None:
        """After the last epoch, before the selected model is written."""


"""How each method trains, as hooks the engine (:mod:`adni_pu.pu.trainer`) calls.

- :class:`Baseline`: naive PN, uPU or nnPU, one model throughout.
- :class:`SelfPU`: two students (one per rate), and one method per phase of the paper:
  :meth:`SelfPU.warm_up` (phase 1, nnPU), :meth:`SelfPU.select` and
  :meth:`SelfPU.self_paced` (phase 2: the self-paced trusted set and the self-calibrated
  reweighting of the rest), :meth:`SelfPU.distil` (phase 3: the other student and a mean
  teacher, made by :meth:`SelfPU.make_teachers` only).

The loss terms are functions of tensors in :mod:`adni_pu.pu.selfpu_loss`; a strategy
decides which apply to a batch and what they are fed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from adni_pu.errors import ConfigError
from adni_pu.pu import calibration, losses, selection, selfpu_loss
from adni_pu.pu.batching import EpochPlan
from adni_pu.pu.checkpoint import AveragedModel
from adni_pu.pu.device_data import channels_last, scoring_inputs
from adni_pu.pu.metrics import sigmoid
from adni_pu.pu.teacher import MeanTeacher, recompute_batchnorm, teacher_consistency
from adni_pu.pu.trusted_set import (
    TrustedSet,
    band_positives,
    band_prior,
    clip_prior,
    score_band,
    select_trusted_set,
    target_size,
)

Stats = dict[str, Any]
Meta = tuple[Any, torch.Tensor, torch.Tensor, int]
"""A validation batch of the meta step: inputs, PU labels, true labels, number of positives."""


@dataclass
class Student:
    """One network with its optimiser, trusted set and (in phase 3) mean teacher."""

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    rate: float = 0.0
    trusted: TrustedSet = field(default_factory=TrustedSet.empty)
    teacher: MeanTeacher | None = None
    prior_rest: float = 0.5
    # rest_risk="band": training-split indices of the labelled positives inside the trusted
    # set's score band at the last selection (None: every labelled positive)
    band_pos: np.ndarray | None = None


@dataclass
class Layout:
    """Where the rows of one batch sit (slices, or index tensors on the device)."""

    n: int
    pos: Any  # rows with s = 1
    unl: Any  # rows with s = 0
    trusted: list[torch.Tensor] = field(default_factory=list)  # per student: D_U rows trusted
    rest: list[torch.Tensor] = field(default_factory=list)  # per student: D_U rows not trusted
    outside: list[torch.Tensor] = field(default_factory=list)  # per student: rows not trusted
    # per student, with rest_risk="band": labelled-positive rows inside the band
    band_pos: list[torch.Tensor] = field(default_factory=list)


@dataclass
class Batch:
    """One training batch as the losses see it."""

    x: Any
    s: torch.Tensor  # PU labels
    idx: torch.Tensor  # training-split example indices
    layout: Layout
    epoch: float  # epoch + fraction of the epoch done (for ramp-ups)
    phase: int
    meta: Meta | None = None


class Baseline:
    """naive PN, uPU or nnPU: one model, the same loss in every epoch."""

    n_students = 1

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.cfg = engine.cfg

    def rate(self, k: int) -> float:
        """Student ``k``'s final trusted share (Self-PU's ``rates``; 0 for a baseline)."""
        return 0.0

    def make_students(self) -> list[Student]:
        """The method's networks from the seed, each with Adam and a cosine schedule."""
        e, cfg, n = self.engine, self.cfg, self.n_students
        torch.manual_seed(cfg.seed)
        students = []
        for k in range(n):
            model = e.model_factory().to(e.device)
            if cfg.channels_last:
                model = channels_last(model)
            opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs)
            students.append(Student(f"student{k + 1}" if n > 1 else "model", model, opt, sched,
                                    self.rate(k), prior_rest=e.prior_u))
        return students

    def models(self) -> dict[str, nn.Module]:
        """Every network trained now, by name: the students and their teachers."""
        students = self.engine.students
        out = {st.name: st.model for st in students}
        out.update({st.name.replace("student", "teacher"): st.teacher.model
                    for st in students if st.teacher is not None})
        return out

    def candidates(self) -> dict[str, nn.Module]:
        """The models that compete for selection now: teachers once they exist, else students."""
        models = self.models()
        return {n: m for n, m in models.items() if n.startswith("teacher")} or models

    def finalists(self) -> list[str]:
        """The models that compete under ``selection = "final"`` (:func:`selection.finalists`)."""
        return selection.finalists(list(self.candidates()), self.cfg.selfpu.final_model)

    def finalist_models(self) -> dict[str, nn.Module]:
        """The finalists as modules (the average as an :class:`~adni_pu.pu.checkpoint.
        AveragedModel` of the live candidates), in evaluation mode; for diagnostics."""
        pool = self.candidates()
        return {name: (AveragedModel(list(pool.values())) if name == "average"
                       else pool[name]).eval() for name in self.finalists()}

    def phase(self, epoch: int) -> int:
        """The method's phase in ``epoch`` (a baseline has one)."""
        return 1

    def before_epoch(self, epoch: int, row: dict[str, Any]) -> None:
        """Before an epoch is timed as training (Self-PU selects here)."""

    def begin_training(self, epoch: int, phase: int) -> None:
        """At the start of an epoch's training pass, after its random streams are seeded."""

    def validation_batches(self, rng: np.random.Generator, phase: int, n_batches: int
                           ) -> Iterator[Meta | None]:
        """One meta-step validation batch per training batch (None: no meta step)."""
        return iter([None] * n_batches)

    def layouts(self, plan: EpochPlan, phase: int) -> list[Layout]:
        """Where each batch's rows sit, on the device: D_P and D_U, and the method's own
        row sets (after :meth:`begin_training`)."""
        e = self.engine
        layouts = [Layout(n, *(r if isinstance(r, slice) else e.device_data.rows(r)
                               for r in rows))
                   for n, rows in zip(plan.sizes, plan.labelled_rows(e.entries.s))]
        self.add_rows(plan, layouts, phase)
        return layouts

    def add_rows(self, plan: EpochPlan, layouts: list[Layout], phase: int) -> None:
        """Add the method's own row sets to the epoch's layouts."""

    def loss(self, k: int, logits: list[torch.Tensor], batch: Batch
             ) -> tuple[torch.Tensor, Stats]:
        """Student ``k``'s loss on ``batch`` (``logits``: every student's) and its statistics."""
        return self.baseline_loss(logits[k], batch)

    def baseline_loss(self, logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, Stats]:
        e, lay = self.engine, batch.layout
        return selfpu_loss.baseline_loss(self.cfg.method, logits, batch.s, lay.pos, lay.unl,
                                         e.prior, e.prior_u, self.cfg.beta, self.cfg.gamma)

    def after_step(self, student: Student) -> None:
        """After one optimiser step of ``student``."""

    def after_epoch(self) -> None:
        """After the epoch's training pass, before evaluation."""


class SelfPU(Baseline):
    """Self-PU (Chen et al., ICML 2020): self-paced, self-calibrated, self-distilled."""

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self.sp = engine.cfg.selfpu
        self.n_students = len(self.sp.rates)
        self._targets: list[torch.Tensor] = []
        self._members: list[np.ndarray] = []

    def rate(self, k: int) -> float:
        return self.sp.rates[k]

    def make_students(self) -> list[Student]:
        students = super().make_students()
        if self.sp.hypergradient == "jvp" and any(
                isinstance(m, nn.Dropout) and m.p > 0 for m in students[0].model.modules()):
            # its forward-mode pass would draw another dropout mask than the training pass
            raise ConfigError("selfpu.hypergradient = 'jvp' with a dropout layer in the model: "
                              "expected no dropout (or hypergradient = 'double-backward')")
        return students

    # ------------------------------------------------------------------ schedule

    def phase(self, epoch: int) -> int:
        """1 warm-up, 2 self-paced with calibration, 3 self-distillation."""
        if epoch < self.sp.warmup_epochs:
            return 1
        return 2 if epoch < self.sp.self_paced_end else 3

    def selects_at(self, epoch: int) -> bool:
        """Whether the trusted sets are rebuilt at the start of ``epoch``."""
        return (self.phase(epoch) == 2
                and (epoch - self.sp.warmup_epochs) % self.sp.select_every == 0)

    def reweights(self, phase: int) -> bool:
        """Whether the self-calibration (meta) step runs in ``phase``."""
        return self.sp.reweight and (phase == 2 or (phase == 3 and self.sp.reweight_in_phase3))

    def before_epoch(self, epoch: int, row: dict[str, Any]) -> None:
        if self.selects_at(epoch):
            self.select(epoch)
        truth = self.engine.data.train.truth
        for st in self.engine.students:
            row[f"trusted/{st.name}/size"] = len(st.trusted)
            row[f"trusted/{st.name}/label_accuracy"] = st.trusted.label_accuracy(truth)
            row[f"trusted/{st.name}/prior_rest"] = st.prior_rest
            # diagnostic from the hidden labels (like label_accuracy): never used
            row[f"trusted/{st.name}/prior_rest_truth"] = self.prior_rest_truth(st)

    def begin_training(self, epoch: int, phase: int) -> None:
        e = self.engine
        if phase == 3 and self.sp.teachers and e.students[0].teacher is None:
            self.make_teachers()
        n_train = len(e.data.train)
        memberships = [st.trusted.membership(n_train) for st in e.students]
        self._members = [m for m, _ in memberships]
        self._targets = [torch.from_numpy(t).to(e.device) for _, t in memberships]

    @property
    def trusted_targets(self) -> list[torch.Tensor]:
        """Per student, the soft label of every training example (zero outside its trusted
        set), on the device, as :meth:`begin_training` made them for this epoch."""
        return self._targets

    # ------------------------------------------------------------------ phase 2: selection

    def select(self, epoch: int) -> None:
        """Phase 2: each student rebuilds its trusted set from its own scores, and the
        prior of the rest (U') follows (:meth:`prior_rest`)."""
        e, sp = self.engine, self.sp
        for st in e.students:
            size = target_size(epoch, len(e.candidates_u), st.rate, sp.warmup_epochs,
                               sp.self_paced_end, sp.select_every, sp.schedule)
            scores = sigmoid(e.device_data.predict_logits(st.model, scoring_inputs(e.data.train)))
            st.trusted = select_trusted_set(scores, e.candidates_u, size, sp.labels,
                                            st.trusted, sp.replacement, epoch)
            f_band = None
            if sp.rest_risk == "band":
                st.band_pos = band_positives(scores, e.data.train.labelled, st.trusted)
                if sp.band_prior != "count":
                    f_band = self.band_fraction(st.model, scores, st.trusted, st.band_pos)
            st.prior_rest = self.prior_rest(st.trusted, f_band)

    def prior_rest_truth(self, st: Student) -> float:
        """The true positive fraction of D_U minus the student's trusted set, from the
        hidden labels: a diagnostic of the prior correction (recorded, never used)."""
        e = self.engine
        train = e.data.train
        rest = np.setdiff1d(e.entries.base[e.entries.n_p:], st.trusted.indices)
        if self.sp.rest_risk == "band":  # the band risk's U' holds no labelled copies
            rest = rest[~train.labelled[rest]]
        return float(train.truth[rest].mean()) if len(rest) else float("nan")

    def band_fraction(self, model: nn.Module, scores: np.ndarray, trusted: TrustedSet,
                      band_pos: np.ndarray) -> float:
        """f_band: the fraction of labelled positives whose score lies inside the trusted
        set's band, measured on the validation split's labelled positives (out of sample)
        or the training split's (``selfpu.band_prior``)."""
        e = self.engine
        if self.sp.band_prior == "training":
            return len(band_pos) / max(e.n_p, 1)
        val = e.data.val
        t_lo, t_hi = score_band(scores, trusted)
        val_scores = sigmoid(e.device_data.predict_logits(model, scoring_inputs(val)))[val.labelled]
        return float(((val_scores > t_lo) & (val_scores < t_hi)).mean())

    def prior_rest(self, trusted: TrustedSet, f_band: float | None = None) -> float:
        """Positive fraction of D_U once the trusted set is taken out: the prior correction
        (``correct_prior``). With ``rest_risk="band"`` U' also leaves out the labelled
        positives' copies in D_U, and the fraction is counted from the pseudo-labels
        (``band_prior="count"``) or is (pi_u n_u - copies) f_band / |U'|, f_band the fraction
        of labelled positives inside the band (:meth:`band_fraction`)."""
        e = self.engine
        if len(trusted) == 0:
            return e.prior_u
        band = self.sp.rest_risk == "band"
        copies = e.n_copies if band else 0
        if band and f_band is not None:
            return band_prior(e.prior_u, e.n_u, len(trusted), f_band, copies)
        if not band and not self.sp.correct_prior:
            return e.prior_u
        n_pos = int(trusted.pseudo_labels.sum())
        left = max(e.n_u - copies - len(trusted), 1)
        return clip_prior((e.prior_u * e.n_u - copies - n_pos) / left)

    def add_rows(self, plan: EpochPlan, layouts: list[Layout], phase: int) -> None:
        """Per student and batch: the trusted D_U rows, the rest (U'), the rows outside the
        trusted set and (``rest_risk="band"``) the labelled positives inside the band."""
        if phase < 2:
            return
        e = self.engine
        for k in range(len(e.students)):
            for key, mask in self.row_masks(plan, k):
                local, counts = plan.positions(mask)
                parts = torch.split(torch.from_numpy(local).to(e.device), counts)
                for lay, part in zip(layouts, parts):
                    getattr(lay, key).append(part)

    def row_masks(self, plan: EpochPlan, k: int) -> list[tuple[str, np.ndarray]]:
        """Student ``k``'s row sets over the epoch's rows end to end (``plan.order``), as
        masks: "trusted", "rest", "outside" and (``rest_risk="band"``) "band_pos"."""
        e, st = self.engine, self.engine.students[k]
        member = self._members[k]
        rows = e.entries.base[plan.order]
        in_u = e.entries.s[plan.order] == 0
        trusted = in_u & member[rows]
        rest = in_u & ~trusted
        if self.sp.rest_risk == "band":
            # the labelled positives' copies in D_U (case-control) are known positives
            # at every score, not a sample of the band: leave them out of U'
            rest &= ~e.data.train.labelled[rows]
        masks = [("trusted", trusted), ("rest", rest), ("outside", ~trusted)]
        if self.sp.rest_risk == "band":
            in_band = np.zeros(len(member), dtype=bool)
            in_band[slice(None) if st.band_pos is None else st.band_pos] = True
            masks.append(("band_pos", ~in_u & in_band[rows]))
        return masks

    # ------------------------------------------------------------------ phase 2: calibration

    def validation_batches(self, rng: np.random.Generator, phase: int, n_batches: int
                           ) -> Iterator[Meta | None]:
        """The epoch's validation mini-batches for the meta step (half labelled positives,
        half unlabelled each). All are drawn now, in batch order (the random stream stays
        that of one draw per batch); indices and labels go to the device at once, inputs
        are gathered (or loaded) one batch at a time as the iterator is consumed."""
        if not self.reweights(phase):
            return super().validation_batches(rng, phase, n_batches)
        e = self.engine
        val = e.data.val
        half = max(self.cfg.batch_size // 2, 1)
        p_all = val.positive_indices()
        u_all = val.unlabelled_indices(e.data.scheme)
        n_p, n_u = min(half, len(p_all)), min(half, len(u_all))
        draws = []
        for _ in range(n_batches):
            p = rng.choice(p_all, size=n_p, replace=False)
            u = rng.choice(u_all, size=n_u, replace=False)
            draws.append(np.concatenate([p, u]))
        if not draws:
            return iter(())
        idx = np.concatenate(draws)
        s = torch.cat([torch.ones(n_p), torch.zeros(n_u)]).to(e.device)
        truths = torch.as_tensor(val.truth[idx], dtype=torch.float32).to(e.device)
        truths = torch.split(truths, n_p + n_u)
        if isinstance(val.x, torch.Tensor):
            rows = torch.split(e.device_data.rows(idx), n_p + n_u)
            on_device = e.device_data.resident(val.x)
            xs: Iterator[Any] = (on_device[r] for r in rows)
        else:
            xs = e.device_data.iterate(val.x, draws)
        return ((x, s, truth, n_p) for x, truth in zip(xs, truths))

    def meta_objective(self, model: nn.Module, x_val: Any, s_val: torch.Tensor,
                       truth_val: torch.Tensor, n_pos: int | None = None
                       ) -> calibration.ValidationObjective:
        """The validation objective of the meta step; ``n_pos`` says that the first
        ``n_pos`` rows are the labelled positives (sliced, so no host sync)."""
        sp, prior = self.sp, self.engine.prior

        def objective(params: dict[str, torch.Tensor]) -> torch.Tensor:
            logits = calibration.functional_forward(model, params, x_val, sp.meta_bn)
            if sp.meta_objective == "pn_ce":
                return nn.functional.binary_cross_entropy_with_logits(logits, truth_val)
            if n_pos is not None:
                return losses.pu_risk(logits[:n_pos], logits[n_pos:], prior).unbiased
            return losses.pu_risk(logits[s_val == 1], logits[s_val == 0], prior).unbiased

        return objective

    @staticmethod
    def rest_terms(model: nn.Module, x: Any, rest: torch.Tensor) -> calibration.TermsAt:
        """The reweighted terms of the batch's rest-U rows as a function of the parameters
        (entropy, and the sigmoid loss as a negative), for the forward-mode hypergradient;
        BatchNorm normalises by the batch, as in the training forward."""
        def terms_at(params: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            logits = calibration.functional_forward(model, params, x).float()[rest]
            return losses.entropy(logits), losses.sigmoid_loss(logits, -1.0)

        return terms_at

    # ------------------------------------------------------------------ the phases' losses

    def loss(self, k: int, logits: list[torch.Tensor], batch: Batch
             ) -> tuple[torch.Tensor, Stats]:
        if batch.phase == 1:
            return self.warm_up(logits[k], batch)
        if batch.phase == 2:
            loss, _, stats = self.self_paced(k, logits[k], batch)
        else:
            loss, stats = self.distil(k, logits, batch)
        stats["loss"] = loss.detach().double()
        return loss, stats

    def warm_up(self, logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, Stats]:
        """Phase 1: nnPU on D_P and D_U."""
        return self.baseline_loss(logits, batch)

    def self_paced(self, k: int, logits: torch.Tensor, batch: Batch
                   ) -> tuple[torch.Tensor, torch.Tensor, Stats]:
        """Phase 2 (and the base of phase 3): cross entropy on the student's trusted rows
        plus the nnPU risk of the rest, its unlabelled rows reweighted by the
        self-calibration step when there is a validation batch."""
        st, sp, lay = self.engine.students[k], self.sp, batch.layout
        trusted = lay.trusted[k]
        calibrate = None
        if batch.meta is not None:
            objective = self.meta_objective(st.model, *batch.meta)
            terms_at = self.rest_terms(st.model, batch.x, lay.rest[k]) \
                if sp.hypergradient == "jvp" else None

            def calibrate(h: torch.Tensor, l_neg: torch.Tensor) -> Any:
                return calibration.calibration_weights(
                    st.model, h, l_neg, objective, sp.meta_step_size, lay.n, sp.meta_ce_cap,
                    sp.meta_sign_flip, sp.reweight_risk, terms_at)

        target = self._targets[k]
        return selfpu_loss.student_loss(
            logits, pos=lay.pos, trusted=trusted, rest_u=lay.rest[k], n=lay.n,
            phase=batch.phase, pos_neg=lay.band_pos[k] if lay.band_pos else None,
            band_fraction=(len(st.band_pos) / max(self.engine.n_p, 1)
                           if lay.band_pos and st.band_pos is not None else None),
            sp=sp, prior_rest=st.prior_rest, beta=self.cfg.beta, gamma=self.cfg.gamma,
            trusted_target=lambda: target[batch.idx[trusted]], calibrate=calibrate)

    def distil(self, k: int, logits: list[torch.Tensor], batch: Batch
               ) -> tuple[torch.Tensor, Stats]:
        """Phase 3: the phase-2 loss plus consistency with the other student on hard
        examples outside the trusted set and with the student's mean teacher."""
        loss, pu_obj, stats = self.self_paced(k, logits[k], batch)
        st = self.engine.students[k]
        other = logits[1 - k].detach() if len(logits) == 2 else None
        teacher = st.teacher
        teacher_loss = (None if teacher is None else
                        lambda: teacher_consistency(logits[k], teacher.model, batch.x))
        extra = selfpu_loss.distillation(logits[k], other, batch.s, batch.layout.outside[k],
                                         pu_obj, self.sp, batch.epoch, teacher_loss, stats)
        return loss + extra, stats

    # ------------------------------------------------------------------ phase 3: teachers

    def make_teachers(self) -> None:
        """A mean teacher per student, a copy of it now (the start of phase 3, or a
        checkpoint's teachers about to be loaded)."""
        sp = self.sp
        for st in self.engine.students:
            st.teacher = MeanTeacher(st.model, sp.teacher_average, sp.ema_decay, sp.teacher_bn)

    def after_step(self, student: Student) -> None:
        if student.teacher is not None:
            student.teacher.update(student.model)

    def after_epoch(self) -> None:
        """With ``teacher_bn = "recompute"``: each teacher's BatchNorm statistics from one
        pass over the training entries (D_P and D_U once each, in the data's ratio),
        un-augmented (``eval_x`` where the split has one, so the pass is deterministic), so
        evaluation, selection and the next epoch's consistency targets use them."""
        e = self.engine
        teachers = [st.teacher for st in e.students if st.teacher is not None]
        if self.sp.teacher_bn != "recompute" or not teachers:
            return
        x = scoring_inputs(e.data.train)
        dd = e.device_data
        size = dd.eval_batch_size if isinstance(x, torch.Tensor) else dd.batch_size
        base = e.entries.base
        chunks = [base[i:i + size] for i in range(0, len(base), size)]
        for teacher in teachers:
            with dd.autocast():
                recompute_batchnorm(teacher.model, dd.iterate(x, chunks))


def strategy_for(engine: Any) -> Baseline:
    """The strategy of ``engine.cfg.method``."""
    return SelfPU(engine) if engine.cfg.method == "selfpu" else Baseline(engine)

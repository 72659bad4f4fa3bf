"""How each method trains, as the events of a fit (:data:`adni_pu.pu.run.EVENTS`) that the
engine (:mod:`adni_pu.pu.trainer`) tells it of.

A strategy reads the run through :class:`~adni_pu.pu.run.RunView` (the settings, data,
priors and device, and the students in its state); it never sees the trainer.

- :class:`Baseline`: naive PN, uPU or nnPU, one model throughout.
- :class:`VPU`: one model, the variational loss with MixUp (its partners and weights drawn
  here, on the host, so both engines mix alike: :meth:`VPU.mixup`) and the normalised
  decision rule folded into the selected model (:meth:`VPU.fit_end`).
- :class:`SelfPU`: two students (one per rate), their schedule (:meth:`SelfPU.phase`),
  the self-paced trusted sets (:meth:`SelfPU.select`, phase 2), the self-calibration's
  validation batches and objective (:meth:`SelfPU.meta_objective`) and the mean teachers
  (:meth:`SelfPU.make_teachers`, phase 3).

The loss of every phase is :func:`adni_pu.pu.objective.step_loss`, a function of tensors
and settings that the population engine calls too; a strategy feeds it: the batch's row
sets as masks (:meth:`Baseline.layouts`) and what only the method knows
(:meth:`Baseline.loss_inputs`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from adni_pu.errors import ConfigError
from adni_pu.pu import calibration, objective
from adni_pu.pu.batching import EpochPlan
from adni_pu.pu.device_data import channels_last, scoring_inputs
from adni_pu.pu.metrics import sigmoid
from adni_pu.pu.run import RunView, Student, student_name
from adni_pu.pu.teacher import MeanTeacher, recompute_batchnorm, teacher_logits
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
    """One training batch as the losses see it."""

    x: Any
    s: torch.Tensor  # PU labels
    idx: torch.Tensor  # training-split example indices
    layout: Layout
    epoch: float  # epoch + fraction of the epoch done (for ramp-ups)
    phase: int
    meta: Meta | None = None
    mixed: list[torch.Tensor] | None = None  # VPU: each student's logits of the mixed rows
    lam: float = 1.0  # VPU: the batch's MixUp weight


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

    def loss(self, k: int, logits: list[torch.Tensor], batch: Batch
             ) -> tuple[torch.Tensor, Stats]:
        """Student ``k``'s loss on ``batch`` (``logits``: every student's) and its statistics
        (:func:`adni_pu.pu.objective.step_loss`)."""
        e, rows = self.run, batch.layout.rows(k)
        return objective.step_loss(self.cfg, batch.phase, logits[k], batch.s, rows,
                                   prior=e.prior, prior_u=e.prior_u,
                                   prior_rest=e.state.students[k].prior_rest,
                                   **self.loss_inputs(k, logits, batch, rows))

    def loss_inputs(self, k: int, logits: list[torch.Tensor], batch: Batch,
                    rows: objective.Rows) -> dict[str, Any]:
        """What the method adds to student ``k``'s inputs of the objective (a baseline:
        nothing)."""
        return {}

    def step_end(self, student: Student) -> None:
        """After one optimiser step of ``student``."""

    def training_end(self) -> None:
        """After the epoch's training pass, before evaluation."""

    def fit_end(self) -> None:
        """After the last epoch, before the selected model is written."""


class VPU(Baseline):
    """VPU (Chen et al., NeurIPS 2020): one model, the variational loss (no class prior)
    with MixUp; the decision rule phi(x) / max phi > 1/2 over the training distribution."""

    def __init__(self, run: RunView) -> None:
        super().__init__(run)
        self.vp = run.cfg.vpu
        self._epoch = 0

    def training_start(self, epoch: int, phase: int) -> None:
        self._epoch = epoch

    def row_sets(self, plan: EpochPlan, phase: int) -> list[dict[str, np.ndarray]]:
        """The common row sets plus "marginal": the rows drawn from the training
        distribution (D_U under the case-control scheme, every row under censoring)."""
        sets = super().row_sets(plan, phase)
        name = "unl" if self.run.data.scheme == "case-control" else "valid"
        return [{**rows, "marginal": rows[name]} for rows in sets]

    def mixup(self, plan: EpochPlan) -> MixPlan | None:
        """Each batch's lambda and every row's partner among the batch's labelled positives
        (drawn with replacement), from the epoch's own stream (the seed, the epoch)."""
        if not self.vp.mixup:
            return None
        rng = np.random.default_rng([self.cfg.seed, self._epoch, 0x5650])  # "VP"
        lam = rng.beta(self.vp.mix_alpha, self.vp.mix_alpha, size=len(plan.sizes))
        positive = self.run.entries.s[plan.order] == 1
        partner = np.empty(len(plan.order), dtype=np.int64)
        for b, (start, size) in enumerate(zip(plan.starts, plan.sizes)):
            where = np.flatnonzero(positive[start:start + size])
            if len(where) == 0:
                lam[b] = 1.0
                partner[start:start + size] = np.arange(size)
            else:
                partner[start:start + size] = rng.choice(where, size)
        return MixPlan(lam, partner)

    def loss_inputs(self, k: int, logits: list[torch.Tensor], batch: Batch,
                    rows: objective.Rows) -> dict[str, Any]:
        """The mixed rows' logits and the batch's weight, where the batch was mixed."""
        if batch.mixed is None:
            return {}
        return {"mixed": batch.mixed[k], "lam": batch.lam}

    def fit_end(self) -> None:
        """With ``vpu.normalise``: the selected model decides phi(x) / m > 1/2, where m is
        the largest phi over the training split (the training distribution's examples);
        the shift -logit(m / 2) is added to its output bias, so that its logits decide at
        0 wherever the model is used (``best["normaliser"]`` records m)."""
        from adni_pu.pu.candidates import load_selected

        best = self.run.state.best
        if (not self.vp.normalise or best["state"] is None or "normaliser" in best
                or "single" not in best["state"]):
            return
        e = self.run
        model = load_selected(best["state"], e.model_factory, e.device)
        m = float(sigmoid(e.predict_logits(model, e.data.train)).max())
        shifted = shift_output_bias(best["state"]["single"], model,
                                    -math.log((m / 2) / (1 - m / 2)))
        e.state.best = {**best, "state": {"single": shifted}, "normaliser": m}
        e.log(f"VPU: max phi over the training split {m:.4f}; decision threshold phi > "
              f"{m / 2:.4f} folded into the selected model's output bias")


def shift_output_bias(state: dict[str, torch.Tensor], model: nn.Module, shift: float
                      ) -> dict[str, torch.Tensor]:
    """``state`` (``model``'s state dict) with ``shift`` added to the bias of the model's
    output layer, its last module, which must be a Linear with one output and a bias: the
    logits move by ``shift`` and the scores keep their order."""
    name, last = [(n, m) for n, m in model.named_modules()][-1]
    if not isinstance(last, nn.Linear) or last.out_features != 1 or last.bias is None:
        raise ConfigError(f"vpu.normalise: the model's last layer {name!r} is "
                          f"{type(last).__name__}; expected a Linear with one output and a "
                          "bias (or set vpu.normalise = false)")
    key = f"{name}.bias"
    return {**state, key: state[key] + shift}


class SelfPU(Baseline):
    """Self-PU (Chen et al., ICML 2020): self-paced, self-calibrated, self-distilled."""

    def __init__(self, run: RunView) -> None:
        super().__init__(run)
        self.sp = run.cfg.selfpu
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

    def epoch_start(self, epoch: int, row: dict[str, Any]) -> None:
        if self.selects_at(epoch):
            self.select(epoch)
        truth = self.run.data.train.truth
        for st in self.run.state.students:
            row[f"trusted/{st.name}/size"] = len(st.trusted)
            row[f"trusted/{st.name}/label_accuracy"] = st.trusted.label_accuracy(truth)
            row[f"trusted/{st.name}/prior_rest"] = st.prior_rest
            # diagnostic from the hidden labels (like label_accuracy): never used
            row[f"trusted/{st.name}/prior_rest_truth"] = self.prior_rest_truth(st)

    def training_start(self, epoch: int, phase: int) -> None:
        e = self.run
        if phase == 3 and self.sp.teachers and e.state.students[0].teacher is None:
            self.make_teachers()
        n_train = len(e.data.train)
        memberships = [st.trusted.membership(n_train) for st in e.state.students]
        self._members = [m for m, _ in memberships]
        self._targets = [torch.from_numpy(t).to(e.device) for _, t in memberships]

    @property
    def trusted_targets(self) -> list[torch.Tensor]:
        """Per student, the soft label of every training example (zero outside its trusted
        set), on the device, as :meth:`training_start` made them for this epoch."""
        return self._targets

    # ------------------------------------------------------------------ phase 2: selection

    def select(self, epoch: int) -> None:
        """Phase 2: each student rebuilds its trusted set from its own scores, and the
        prior of the rest (U') follows (:meth:`prior_rest`)."""
        e, sp = self.run, self.sp
        for st in e.state.students:
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
        e = self.run
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
        e = self.run
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
        e = self.run
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

    def row_masks(self, plan: EpochPlan, k: int) -> list[tuple[str, np.ndarray]]:
        """Student ``k``'s row sets over the epoch's rows end to end (``plan.order``), as
        masks: "trusted", "rest", "outside" and (``rest_risk="band"``) "band_pos"."""
        e, st = self.run, self.run.state.students[k]
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
        e = self.run
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
        """The validation objective of the meta step on one validation batch
        (:func:`adni_pu.pu.objective.validation_objective`); its labelled positives are the
        rows where ``s_val`` is 1, or the first ``n_pos`` rows."""
        pos = (s_val.float() if n_pos is None else
               (torch.arange(len(s_val), device=s_val.device) < n_pos).float())
        return objective.validation_objective(model, x_val, truth_val, pos, 1.0 - pos,
                                              self.run.prior, self.sp)

    # ------------------------------------------------------------------ the objective's inputs

    def loss_inputs(self, k: int, logits: list[torch.Tensor], batch: Batch,
                    rows: objective.Rows) -> dict[str, Any]:
        """Student ``k``'s inputs of the objective, each where it exists: the soft labels of
        the batch's rows, the band's share of the labelled positives (``rest_risk =
        "band"``), the meta step (in a batch with a validation batch), the other student's
        logits and the mean teacher's (phase 3)."""
        st, sp = self.run.state.students[k], self.sp
        inputs: dict[str, Any] = {"epoch": batch.epoch}
        if sp.labels != "entropy":
            inputs["targets"] = self._targets[k][batch.idx]
        if sp.rest_risk == "band":
            inputs["band_fraction"] = st.band_share(self.run.n_p)
        if batch.meta is not None:
            x_val, s_val, truth_val, _ = batch.meta
            inputs["calibrate"] = objective.calibrator(
                st.model, batch.x, rows, self.meta_objective(st.model, x_val, s_val, truth_val),
                sp)
        if len(logits) == 2:
            inputs["other"] = logits[1 - k]
        if st.teacher is not None:
            inputs["teacher"] = teacher_logits(st.teacher.model, batch.x)
        return inputs

    # ------------------------------------------------------------------ phase 3: teachers

    def make_teachers(self) -> None:
        """A mean teacher per student, a copy of it now (the start of phase 3, or a
        checkpoint's teachers about to be loaded)."""
        sp = self.sp
        for st in self.run.state.students:
            st.teacher = MeanTeacher(st.model, sp.teacher_average, sp.ema_decay, sp.teacher_bn)

    def step_end(self, student: Student) -> None:
        if student.teacher is not None:
            student.teacher.update(student.model)

    def training_end(self) -> None:
        """With ``teacher_bn = "recompute"``: each teacher's BatchNorm statistics from one
        pass over the training entries (D_P and D_U once each, in the data's ratio),
        un-augmented (``eval_x`` where the split has one, so the pass is deterministic), so
        evaluation, selection and the next epoch's consistency targets use them."""
        e = self.run
        teachers = [st.teacher for st in e.state.students if st.teacher is not None]
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


def strategy_for(run: RunView) -> Baseline:
    """The strategy of ``run.cfg.method``."""
    if run.cfg.method == "selfpu":
        return SelfPU(run)
    return VPU(run) if run.cfg.method == "vpu" else Baseline(run)

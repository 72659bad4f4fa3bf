"""Self-PU (Chen et al., ICML 2020): two students (one per rate), their schedule
(:meth:`SelfPU.phase`), the self-paced trusted sets (:meth:`SelfPU.select`, phase 2), the
self-calibration's validation batches (:meth:`SelfPU.validation_batches`) and the mean
teachers (:meth:`SelfPU.make_teachers`, phase 3)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from adni_pu.errors import ConfigError
from adni_pu.pu import objective
from adni_pu.pu.batching import EpochPlan
from adni_pu.pu.device_data import scoring_inputs
from adni_pu.pu.metrics import sigmoid
from adni_pu.pu.run import RunView, Student
from adni_pu.pu.strategies.baseline import Baseline, Meta
from adni_pu.pu.teacher import MeanTeacher, recompute_batchnorm
from adni_pu.pu.trusted_set import (
    TrustedSet,
    band_positives,
    band_prior,
    clip_prior,
    score_band,
    select_trusted_set,
    target_size,
)


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

    def network_inputs(self, k: int, phase: int) -> objective.NetworkInputs:
        """Student ``k``'s priors, the band's share of the labelled positives (``rest_risk =
        "band"``) and, from phase 2 on, the soft label of every training example (zero
        outside its trusted set; none with ``labels = "entropy"``), on the device, as
        :meth:`training_start` made them for this epoch."""
        e, st, sp = self.run, self.run.state.students[k], self.sp
        return objective.NetworkInputs(
            e.prior, e.prior_u, st.prior_rest,
            st.band_share(e.n_p) if sp.rest_risk == "band" else None,
            self._targets[k] if phase >= 2 and sp.labels != "entropy" else None)

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

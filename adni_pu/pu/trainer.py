"""The one PU trainer: naive PN, uPU, nnPU and Self-PU (every ablation) on any data set.

A data set reaches the trainer as :class:`~adni_pu.data.pu.PUData` (training, validation and
test splits, each a tensor of examples or a map-style dataset) plus a model factory. The
algorithm is chosen by :class:`~adni_pu.pu.config.TrainConfig` alone.

Self-PU schedule (``config.selfpu``):

- phase 1, epochs ``[0, warmup)``: nnPU on D_P and D_U;
- phase 2, ``[warmup, self_paced_end)``: every ``select_every`` epochs each student rebuilds
  its trusted set; the hybrid loss is cross entropy on the trusted set plus nnPU on the rest,
  whose unlabelled examples are reweighted by the self-calibration (meta) step;
- phase 3, from ``self_paced_end``: the last trusted sets stay; two students add a
  consistency loss on hard examples and mean teachers (initialised from the students at the
  start of the phase, updated every optimiser step) add a teacher consistency loss.

Model selection uses the validation split only. Every epoch writes a checkpoint; a run
resumed from it gives the same result as one that was never interrupted (the random streams
of an epoch are derived from the seed and the epoch number).
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from adni_pu import config as cfgmod
from adni_pu.data.pu import PUData, PUSplit
from adni_pu.provenance import provenance
from adni_pu.pu import calibration, losses
from adni_pu.pu.config import TrainConfig
from adni_pu.pu.metrics import binary_metrics, roc_auc
from adni_pu.pu.teacher import MeanTeacher, sigmoid_rampup, teacher_consistency
from adni_pu.pu.trusted_set import TrustedSet, select_trusted_set, target_size

ModelFactory = Callable[[], nn.Module]
LOWER_IS_BETTER = {"pu_risk": True, "pu_zero_one": True, "pu_auc": False, "pn_accuracy": False}


class ResumeError(RuntimeError):
    """A checkpoint that does not belong to this run's settings."""


@dataclass
class Student:
    """One student network with its optimiser, trusted set and (later) teacher."""

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    rate: float = 0.0
    trusted: TrustedSet = field(default_factory=TrustedSet.empty)
    teacher: MeanTeacher | None = None
    prior_rest: float = 0.5


@dataclass
class FitResult:
    """What :meth:`Trainer.fit` leaves: the chosen model and the per-epoch history."""

    best_epoch: int
    best_candidate: str
    best_score: float
    history: list[dict[str, Any]]
    run_dir: Path | None


def to_device(x: Any, device: torch.device) -> Any:
    """Move a tensor, or a dict/list/tuple of tensors, to ``device``."""
    if isinstance(x, torch.Tensor):
        return x.to(device, non_blocking=True)
    if isinstance(x, dict):
        return {k: to_device(v, device) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(to_device(v, device) for v in x)
    return x


def _atomic_torch_save(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when available, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Trainer:
    """Train one method on one :class:`PUData` and keep a run folder."""

    def __init__(
        self,
        config: TrainConfig,
        data: PUData,
        run_dir: str | Path | None = None,
        model_factory: ModelFactory | None = None,
        collate: Callable[[list[Any]], Any] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg = config
        self.sp = config.selfpu
        self.data = data
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.collate = collate
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.device = resolve_device(config.device)
        if config.threads > 0:
            torch.set_num_threads(config.threads)
        if config.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
            if self.device.type == "cuda":
                torch.backends.cudnn.benchmark = False
        if config.prior is not None and not math.isclose(config.prior, data.prior):
            # the risks would use one value and the unlabelled prior (and data.json) another
            raise cfgmod.ConfigError(
                f"prior = {config.prior} in the training settings differs from the class prior "
                f"{data.prior} the data were built with; set the prior once")
        self.prior = float(config.prior if config.prior is not None else data.prior)
        self.prior_u = self.prior if data.scheme == "case-control" else data.prior_u
        if model_factory is None:
            from adni_pu.models import build_model

            def model_factory() -> nn.Module:
                return build_model(config.model, **config.model_args)

        self.model_factory = model_factory
        train = data.train
        p_idx = train.positive_indices()
        u_idx = train.unlabelled_indices(data.scheme)
        self.entry_base = np.concatenate([p_idx, u_idx]).astype(np.int64)
        self.entry_s = np.concatenate([np.ones(len(p_idx)), np.zeros(len(u_idx))]).astype(np.int64)
        self.n_p, self.n_u = len(p_idx), len(u_idx)
        self.candidates_u = np.flatnonzero(~train.labelled)  # D_U minus labelled positives
        n_students = len(self.sp.rates) if config.method == "selfpu" else 1
        torch.manual_seed(config.seed)
        self.students: list[Student] = []
        for k in range(n_students):
            model = self.model_factory().to(self.device)
            opt = torch.optim.Adam(model.parameters(), lr=config.lr,
                                   weight_decay=config.weight_decay)
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=config.epochs)
            rate = self.sp.rates[k] if config.method == "selfpu" else 0.0
            self.students.append(Student(f"student{k + 1}" if n_students > 1 else "model",
                                         model, opt, sched, rate, prior_rest=self.prior_u))
        self.history: list[dict[str, Any]] = []
        self.best: dict[str, Any] = {"score": None, "epoch": -1, "candidate": "", "state": None}
        self.start_epoch = 0
        self._writer: Any = None
        # Set by adni_pu.distributed.attach() for multi-process (torchrun) training.
        self.ddp: Any = None

    @property
    def is_main(self) -> bool:
        """Whether this process writes the run folder (always, unless distributed rank > 0)."""
        return self.ddp is None or self.ddp.rank == 0

    # ------------------------------------------------------------------ schedule

    def phase(self, epoch: int) -> int:
        """1 warm-up, 2 self-paced with calibration, 3 self-distillation (Self-PU only)."""
        if self.cfg.method != "selfpu" or epoch < self.sp.warmup_epochs:
            return 1
        return 2 if epoch < self.sp.self_paced_end else 3

    def selects_at(self, epoch: int) -> bool:
        """Whether the trusted sets are rebuilt at the start of ``epoch``."""
        return self.phase(epoch) == 2 and (epoch - self.sp.warmup_epochs) % self.sp.select_every == 0

    # ------------------------------------------------------------------ data

    def _epoch_batches(self, rng: np.random.Generator) -> list[np.ndarray]:
        """Entry indices per batch, each batch holding labelled P and U in the data's ratio."""
        n = len(self.entry_base)
        n_batches = max(1, math.ceil(n / self.cfg.batch_size))
        if self.ddp is not None:  # every rank gets the same number of batches
            n_batches = self.ddp.round_batches(n_batches, n)
        p_perm = rng.permutation(self.n_p)
        u_perm = self.n_p + rng.permutation(self.n_u)
        p_chunks = np.array_split(p_perm, n_batches)
        u_chunks = np.array_split(u_perm, n_batches)
        return [np.concatenate([p, u]) for p, u in zip(p_chunks, u_chunks)]

    def _iterate(self, x: Any, index_batches: list[np.ndarray]) -> Iterator[Any]:
        """Yield the inputs of each batch of example indices of one split."""
        if isinstance(x, torch.Tensor):
            for idx in index_batches:
                yield x[torch.from_numpy(np.asarray(idx, dtype=np.int64))]
            return
        loader = torch.utils.data.DataLoader(
            x, batch_sampler=[list(map(int, b)) for b in index_batches],
            num_workers=self.cfg.num_workers, collate_fn=self.collate,
            pin_memory=self.device.type == "cuda", persistent_workers=False,
        )
        yield from loader

    @torch.no_grad()
    def predict_logits(self, model: nn.Module, split: PUSplit) -> np.ndarray:
        """Logits of ``model`` (eval mode) for every example of ``split``."""
        was_training = model.training
        model.eval()
        n = len(split)
        x = split.eval_x if split.eval_x is not None else split.x
        size = self.cfg.eval_batch_size if isinstance(x, torch.Tensor) else self.cfg.batch_size
        batches = [np.arange(i, min(i + size, n)) for i in range(0, n, size)]
        out = [model(to_device(xb, self.device)).float().cpu() for xb in self._iterate(x, batches)]
        model.train(was_training)
        return torch.cat(out).numpy() if out else np.zeros(0, np.float32)

    # ------------------------------------------------------------------ trusted sets

    def _select(self, epoch: int) -> dict[str, Any]:
        stats: dict[str, Any] = {}
        for st in self.students:
            size = target_size(epoch, len(self.candidates_u), st.rate, self.sp.warmup_epochs,
                               self.sp.self_paced_end, self.sp.select_every, self.sp.schedule)
            scores = 1.0 / (1.0 + np.exp(-self.predict_logits(st.model, self.data.train)))
            st.trusted = select_trusted_set(scores, self.candidates_u, size, self.sp.labels,
                                            st.trusted, self.sp.replacement, epoch)
            st.prior_rest = self._prior_rest(st.trusted)
        return stats

    def _prior_rest(self, trusted: TrustedSet) -> float:
        """Positive fraction of D_U once the trusted set is taken out (optional correction)."""
        if not self.sp.correct_prior or len(trusted) == 0:
            return self.prior_u
        n_pos = int(trusted.pseudo_labels.sum())
        value = (self.prior_u * self.n_u - n_pos) / max(self.n_u - len(trusted), 1)
        return float(min(max(value, 1e-3), 1 - 1e-3))

    # ------------------------------------------------------------------ losses

    def _val_batch(self, rng: np.random.Generator) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """A validation mini-batch for the meta step: half labelled positives, half unlabelled."""
        val = self.data.val
        half = max(self.cfg.batch_size // 2, 1)
        p_all = val.positive_indices()
        u_all = val.unlabelled_indices(self.data.scheme)
        p = rng.choice(p_all, size=min(half, len(p_all)), replace=False)
        u = rng.choice(u_all, size=min(half, len(u_all)), replace=False)
        idx = np.concatenate([p, u])
        (x,) = list(self._iterate(val.x, [idx]))
        s = torch.cat([torch.ones(len(p)), torch.zeros(len(u))]).to(self.device)
        truth = torch.as_tensor(val.truth[idx], dtype=torch.float32, device=self.device)
        return to_device(x, self.device), s, truth

    def _meta_objective(self, model: nn.Module, x_val: Any, s_val: torch.Tensor,
                        truth_val: torch.Tensor) -> calibration.ValidationObjective:
        def objective(params: dict[str, torch.Tensor]) -> torch.Tensor:
            logits = calibration.functional_forward(model, params, x_val)
            if self.sp.meta_objective == "pn_ce":
                return nn.functional.binary_cross_entropy_with_logits(logits, truth_val)
            return losses.pu_risk(logits[s_val == 1], logits[s_val == 0], self.prior).unbiased

        return objective

    def _baseline_loss(self, logits: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, dict]:
        method = self.cfg.method
        if method == "naive":
            loss = losses.naive_pn_loss(logits, s)
            return loss, {"loss": loss.item()}
        risk = losses.pu_risk(logits[s == 1], logits[s == 0], self.prior, self.prior_u)
        if method == "upu":
            return risk.unbiased, {"loss": risk.unbiased.item()}
        objective, fired = losses.nnpu_step_objective(risk, self.cfg.beta, self.cfg.gamma)
        return objective, {"loss": risk.non_negative.item(), "nn_correction": float(fired)}

    def _student_loss(
        self,
        st: Student,
        logits: torch.Tensor,
        other_logits: torch.Tensor | None,
        x: Any,
        s: torch.Tensor,
        idx: np.ndarray,
        epoch: float,
        phase: int,
        meta: tuple[Any, torch.Tensor, torch.Tensor] | None,
        member: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, dict[str, float]]:
        if phase == 1:
            return self._baseline_loss(logits, s)
        sp = self.sp
        n = logits.numel()
        idx_t = torch.from_numpy(idx).to(self.device)
        is_member, target = member[0][idx_t], member[1][idx_t]
        trusted = (s == 0) & is_member
        rest_u = (s == 0) & ~trusted
        pos = s == 1
        stats: dict[str, float] = {}
        n_trusted = int(trusted.sum())
        if n_trusted:
            t_logits = logits[trusted]
            if sp.labels == "entropy":
                ce = losses.entropy(t_logits).mean()
            else:
                ce = losses.soft_cross_entropy(t_logits, target[trusted]).mean()
        else:
            ce = logits.sum() * 0.0
        u_logits = logits[rest_u]
        reweight = sp.reweight and (phase == 2 or sp.reweight_in_phase3) and u_logits.numel() > 0
        entropy_term = logits.sum() * 0.0
        weights_u = None
        if reweight and meta is not None:
            h = losses.entropy(u_logits)
            l_neg = losses.sigmoid_loss(u_logits, -1.0)
            w = calibration.calibration_weights(
                st.model, h, l_neg, self._meta_objective(st.model, *meta), sp.meta_step_size,
                n, sp.meta_ce_cap, sp.meta_sign_flip,
            )
            weights_u = w.pu
            entropy_term = (w.ce * h).sum() / u_logits.numel()
            stats.update(w.stats())
        risk = losses.pu_risk(logits[pos], u_logits, st.prior_rest, weights_u=weights_u)
        pu_obj, fired = losses.nnpu_step_objective(risk, self.cfg.beta, self.cfg.gamma)
        frac = n_trusted / n
        loss = frac * ce + (1.0 - frac) * (pu_obj + entropy_term)
        stats.update({"trusted_ce": ce.item(), "nnpu": risk.non_negative.item(),
                      "nn_correction": float(fired), "trusted_in_batch": frac})
        if phase == 3:
            loss = loss + self._distillation(st, logits, other_logits, x, s, trusted,
                                             pu_obj, epoch, stats)
        stats["loss"] = loss.item()
        return loss, stats

    def _distillation(self, st: Student, logits: torch.Tensor, other: torch.Tensor | None,
                      x: Any, s: torch.Tensor, trusted: torch.Tensor, pu_obj: torch.Tensor,
                      epoch: float, stats: dict[str, float]) -> torch.Tensor:
        sp = self.sp
        extra = logits.sum() * 0.0
        prob = torch.sigmoid(logits)
        if other is not None and sp.student_consistency != "none":
            outside = ~trusted
            mse = (prob[outside] - torch.sigmoid(other[outside]).detach()) ** 2
            if sp.student_consistency == "per_example":
                sign = torch.where(s[outside] == 1, 1.0, -1.0)
                pu_each = losses.sigmoid_loss(logits[outside], sign).detach()
                hard = pu_each > sp.alpha * mse.detach()
                l_st = (mse * hard).sum() / max(int(outside.sum()), 1)
                stats["hard_fraction"] = float(hard.float().mean()) if hard.numel() else 0.0
            else:
                batch_mse = mse.mean() if mse.numel() else extra
                gate = batch_mse.item() < sp.batch_gate * abs(pu_obj.item())
                l_st = batch_mse if gate else extra
                stats["hard_fraction"] = float(gate)
            stats["student_consistency"] = float(l_st.item())
            extra = extra + sp.student_weight * l_st
        if st.teacher is not None:
            l_t = teacher_consistency(logits, st.teacher.model, x)
            weight = sp.teacher_weight * sigmoid_rampup(epoch - sp.self_paced_end,
                                                        sp.teacher_rampup_epochs)
            stats["teacher_consistency"] = float(l_t.item())
            stats["teacher_weight"] = weight
            extra = extra + weight * l_t
        return extra

    # ------------------------------------------------------------------ one epoch

    def train_epoch(self, epoch: int) -> dict[str, Any]:
        """One pass over the training entries; returns the epoch's mean statistics."""
        phase = self.phase(epoch)
        rng = np.random.default_rng([self.cfg.seed, epoch])
        torch.manual_seed(self.cfg.seed * 100_003 + epoch)
        if phase == 3 and self.sp.teachers and self.students[0].teacher is None:
            for st in self.students:
                st.teacher = MeanTeacher(st.model, self.sp.teacher_average, self.sp.ema_decay)
        members = []
        for st in self.students:
            m, t = st.trusted.membership(len(self.data.train))
            members.append((torch.from_numpy(m).to(self.device), torch.from_numpy(t).to(self.device)))
        for st in self.students:
            st.model.train()
        batches = self._epoch_batches(rng)
        if self.ddp is not None:  # this rank's share of the epoch's batches
            batches = self.ddp.shard(batches, epoch)
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        needs_meta = (self.cfg.method == "selfpu" and self.sp.reweight
                      and (phase == 2 or (phase == 3 and self.sp.reweight_in_phase3)))
        progress = _progress(len(batches), f"epoch {epoch + 1}/{self.cfg.epochs}",
                             self.cfg.progress)
        base_batches = [self.entry_base[b] for b in batches]
        for b, (entries, xb) in enumerate(zip(batches, self._iterate(self.data.train.x, base_batches))):
            x = to_device(xb, self.device)
            s = torch.from_numpy(self.entry_s[entries]).to(self.device)
            idx = self.entry_base[entries]
            meta = self._val_batch(rng) if needs_meta else None
            if self.ddp is not None:
                logits = [self.ddp.forward(k, x) for k in range(len(self.students))]
            else:
                logits = [st.model(x) for st in self.students]
            frac_epoch = epoch + b / len(batches)
            for k, st in enumerate(self.students):
                other = logits[1 - k].detach() if len(self.students) == 2 else None
                if self.cfg.method == "selfpu":
                    loss, stats = self._student_loss(st, logits[k], other, x, s, idx, frac_epoch,
                                                     phase, meta, members[k])
                else:
                    loss, stats = self._baseline_loss(logits[k], s)
                st.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                st.optimizer.step()
                if st.teacher is not None:
                    st.teacher.update(st.model)
                for key, value in stats.items():
                    name = f"{st.name}/{key}"
                    sums[name] = sums.get(name, 0.0) + float(value)
                    counts[name] = counts.get(name, 0) + 1
            progress.update(1)
        progress.close()
        if self.ddp is not None:  # BatchNorm statistics: the mean over ranks
            self.ddp.sync_buffers(self)
        for st in self.students:
            st.scheduler.step()
        return {k: sums[k] / counts[k] for k in sums}

    # ------------------------------------------------------------------ evaluation

    def candidates(self) -> dict[str, nn.Module]:
        """The models that compete for selection now: teachers once they exist, else students."""
        teachers = {st.name.replace("student", "teacher"): st.teacher.model
                    for st in self.students if st.teacher is not None}
        return teachers or {st.name: st.model for st in self.students}

    def val_scores(self, logits: np.ndarray) -> dict[str, float]:
        """PU validation criteria (and PN metrics with ``pn_validation``) from logits."""
        val = self.data.val
        t = torch.from_numpy(logits)
        lab = torch.from_numpy(val.labelled)
        u = torch.from_numpy(val.unlabelled_indices(self.data.scheme))
        risk = losses.pu_risk(t[lab], t[u], self.prior, self.prior_u)
        out = {
            "pu_risk": float(risk.unbiased),
            "pu_zero_one": losses.zero_one_pu_risk(t[lab], t[u], self.prior),
            "pu_auc": roc_auc(np.concatenate([logits[val.labelled], logits[u.numpy()]]),
                              np.concatenate([np.ones(int(val.labelled.sum())),
                                              np.zeros(len(u))])),
        }
        if self.cfg.pn_validation:
            out["pn_accuracy"] = binary_metrics(logits, val.truth)["accuracy"]
        return out

    def evaluate_epoch(self, epoch: int) -> dict[str, Any]:
        """Validation criteria of every model (and test accuracy, as a diagnostic only)."""
        row: dict[str, Any] = {}
        models = {st.name: st.model for st in self.students}
        models.update({st.name.replace("student", "teacher"): st.teacher.model
                       for st in self.students if st.teacher is not None})
        val_logits = {name: self.predict_logits(m, self.data.val) for name, m in models.items()}
        pool = list(self.candidates())
        if self.sp.final_model == "average" and len(pool) == 2 and pool[0].startswith("teacher"):
            val_logits["average"] = _average_logits([val_logits[p] for p in pool])
            pool = ["average"]
        for name, logits in val_logits.items():
            for key, value in self.val_scores(logits).items():
                row[f"val/{name}/{key}"] = value
        if len(self.students) == 2:
            a, b = (val_logits[st.name] > 0 for st in self.students)
            row["val/student_agreement"] = float((a == b).mean())
        if self.cfg.track_test:
            for name, m in models.items():
                logits = self.predict_logits(m, self.data.test)
                row[f"test_diagnostic/{name}/accuracy"] = binary_metrics(
                    logits, self.data.test.truth)["accuracy"]
        crit = self.cfg.val_criterion
        lower = LOWER_IS_BETTER[crit]
        scores = {p: row[f"val/{p}/{crit}"] for p in pool}
        choice = (min if lower else max)(scores, key=lambda p: (scores[p], p))
        row["selected/candidate"] = choice
        row["selected/score"] = scores[choice]
        best = self.best["score"]
        score = scores[choice]
        if not math.isnan(score) and (best is None or (score < best if lower else score > best)):
            self.best = {"score": score, "epoch": epoch, "candidate": choice,
                         "state": self._candidate_state(choice)}
        return row

    def _candidate_state(self, name: str) -> dict[str, Any]:
        if name == "average":
            return {"average": [_cpu_state(st.teacher.model) for st in self.students
                                if st.teacher is not None]}
        models = {st.name: st.model for st in self.students}
        models.update(self.candidates())
        return {"single": _cpu_state(models[name])}

    def best_model(self) -> Callable[[Any], torch.Tensor] | nn.Module:
        """The chosen model (a module, or a callable averaging two teachers' probabilities)."""
        state = self.best["state"]
        if state is None:
            raise RuntimeError("no model has been selected yet; call fit() first")
        return load_selected(state, self.model_factory, self.device)

    def evaluate_split(self, split: PUSplit) -> tuple[dict[str, float], np.ndarray]:
        """Metrics of the selected model on ``split`` (call after :meth:`fit`)."""
        model = self.best_model()
        logits = self.predict_logits(model, split)  # type: ignore[arg-type]
        return binary_metrics(logits, split.truth), logits

    # ------------------------------------------------------------------ the loop

    def fit(self) -> FitResult:
        """Train for ``config.epochs`` epochs (resuming from the run folder's checkpoint)."""
        self._maybe_resume()  # first: a refused resume must not rewrite the run's files
        self._prepare_run_dir()
        if self.ddp is not None:
            self.ddp.wrap(self)
        for epoch in range(self.start_epoch, self.cfg.epochs):
            t0 = time.perf_counter()
            row: dict[str, Any] = {"epoch": epoch, "phase": self.phase(epoch),
                                   "lr": self.students[0].optimizer.param_groups[0]["lr"]}
            if self.cfg.method == "selfpu" and self.selects_at(epoch):
                self._select(epoch)
            for st in self.students:
                if self.cfg.method == "selfpu":
                    row[f"trusted/{st.name}/size"] = len(st.trusted)
                    row[f"trusted/{st.name}/label_accuracy"] = st.trusted.label_accuracy(
                        self.data.train.truth)
                    row[f"trusted/{st.name}/prior_rest"] = st.prior_rest
            t_select = time.perf_counter() - t0
            stats = self.train_epoch(epoch)
            t_train = time.perf_counter() - t0
            row.update({f"train/{k}": v for k, v in stats.items()})
            row.update(self.evaluate_epoch(epoch))
            t_total = time.perf_counter() - t0
            row.update({"time/select_seconds": t_select, "time/train_seconds": t_train,
                        "time/epoch_seconds": t_total})
            self.history.append(row)
            self._log_epoch(row)
            self._checkpoint(epoch)
        self._finish()
        return FitResult(self.best["epoch"], self.best["candidate"], self.best["score"] or
                         float("nan"), self.history, self.run_dir)

    # ------------------------------------------------------------------ run folder

    def _prepare_run_dir(self) -> None:
        if self.run_dir is None or not self.is_main:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        cfgmod.save(self.cfg, self.run_dir / "config.toml")
        cfgmod.atomic_write_text(self.run_dir / "provenance.json",
                                 json.dumps(provenance(), indent=2) + "\n")
        info = dict(self.data.info)
        info.update({"prior_used": self.prior, "prior_u": self.prior_u,
                     "n_labelled_entries": self.n_p, "n_unlabelled_entries": self.n_u})
        cfgmod.atomic_write_text(self.run_dir / "data.json", json.dumps(info, indent=2) + "\n")

    def _config_fingerprint(self) -> str:
        settings = cfgmod.to_dict(self.cfg)
        for key in ("epochs", "progress", "num_workers", "threads", "device", "track_test"):
            settings.pop(key, None)
        return json.dumps(settings, sort_keys=True)

    def _checkpoint(self, epoch: int) -> None:
        if self.run_dir is None or not self.is_main:
            return
        state = {
            "epoch": epoch,
            "fingerprint": self._config_fingerprint(),
            "students": [
                {"model": st.model.state_dict(), "optimizer": st.optimizer.state_dict(),
                 "scheduler": st.scheduler.state_dict(), "trusted": st.trusted.state(),
                 "prior_rest": st.prior_rest,
                 "teacher": st.teacher.state_dict() if st.teacher is not None else None}
                for st in self.students
            ],
            "history": self.history,
            "best": self.best,
        }
        _atomic_torch_save(state, self.run_dir / "checkpoints" / "last.pt")

    def check_resume(self) -> dict[str, Any] | None:
        """The run folder's checkpoint (None when there is none).

        Raises :class:`ResumeError` when it was made with other settings. Callers that
        write into the run folder before :meth:`fit` call this first, so a refused rerun
        leaves the folder as it was.
        """
        if self.run_dir is None:
            return None
        path = self.run_dir / "checkpoints" / "last.pt"
        if not path.is_file():
            return None
        state = torch.load(path, map_location=self.device, weights_only=False)
        if state["fingerprint"] != self._config_fingerprint():
            raise ResumeError(
                f"{path}: checkpoint made with other settings; expected the settings in "
                f"{self.run_dir / 'config.toml'}; use a new run folder or delete the checkpoint"
            )
        return state

    def _maybe_resume(self) -> None:
        state = self.check_resume()
        if state is None:
            return
        path = self.run_dir / "checkpoints" / "last.pt"  # type: ignore[operator]
        for st, saved in zip(self.students, state["students"]):
            st.model.load_state_dict(saved["model"])
            st.optimizer.load_state_dict(saved["optimizer"])
            st.scheduler.load_state_dict(saved["scheduler"])
            st.trusted = TrustedSet.from_state(saved["trusted"])
            st.prior_rest = saved["prior_rest"]
            if saved["teacher"] is not None:
                st.teacher = MeanTeacher(st.model, self.sp.teacher_average, self.sp.ema_decay)
                st.teacher.load_state_dict(saved["teacher"])
        self.history = state["history"]
        self.best = state["best"]
        self.start_epoch = state["epoch"] + 1
        self.log(f"resumed from {path} after epoch {state['epoch'] + 1}")

    def _log_epoch(self, row: dict[str, Any]) -> None:
        crit = self.cfg.val_criterion
        parts = [f"epoch {row['epoch'] + 1}/{self.cfg.epochs}", f"phase {row['phase']}"]
        for st in self.students:
            if f"train/{st.name}/loss" in row:
                parts.append(f"{st.name} loss {row[f'train/{st.name}/loss']:.4f}")
        parts.append(f"val {crit} {row['selected/score']:.4f} ({row['selected/candidate']})")
        tests = [v for k, v in row.items() if k.startswith("test_diagnostic/")]
        if tests:
            parts.append(f"test acc (diagnostic) {max(tests):.4f}")
        parts.append(f"{row['time/epoch_seconds']:.1f}s")
        if not self.is_main:
            return
        self.log(" | ".join(parts))
        if self.run_dir is None:
            return
        if self._writer is None:
            with contextlib.suppress(ImportError):
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(str(self.run_dir / "tensorboard"))
        if self._writer is not None:
            for key, value in row.items():
                if isinstance(value, (int, float)) and key != "epoch" and not math.isnan(value):
                    self._writer.add_scalar(key, value, row["epoch"])
            self._writer.flush()
        write_metrics_csv(self.history, self.run_dir / "metrics.csv")

    def _finish(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self.run_dir is None or not self.is_main:
            return
        if self.best["state"] is not None:
            _atomic_torch_save({"state": self.best["state"], "config": cfgmod.to_dict(self.cfg),
                                "epoch": self.best["epoch"], "candidate": self.best["candidate"]},
                               self.run_dir / "best_model.pt")
        summary = {"best_epoch": self.best["epoch"], "best_candidate": self.best["candidate"],
                   "val_criterion": self.cfg.val_criterion, "val_score": self.best["score"],
                   "seconds_per_epoch_by_phase": seconds_by_phase(self.history)}
        cfgmod.atomic_write_text(self.run_dir / "selection.json",
                                 json.dumps(summary, indent=2) + "\n")
        from adni_pu.pu.plots import plot_training

        plot_training(self.history, self.run_dir, self.cfg.val_criterion)


def _average_logits(logits: list[np.ndarray]) -> np.ndarray:
    p = np.mean([1.0 / (1.0 + np.exp(-lg)) for lg in logits], axis=0)
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return np.log(p / (1 - p))


def _cpu_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


class AveragedModel(nn.Module):
    """The average of several models' probabilities, returned as a logit."""

    def __init__(self, models: list[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(models)

    def forward(self, x: Any) -> torch.Tensor:
        p = torch.stack([torch.sigmoid(m(x)) for m in self.members]).mean(0).clamp(1e-7, 1 - 1e-7)
        return torch.log(p / (1 - p))


def load_selected(state: dict[str, Any], factory: ModelFactory, device: torch.device
                  ) -> nn.Module:
    """Rebuild the selected model (single or averaged) from its saved state."""
    if "single" in state:
        model = factory().to(device)
        model.load_state_dict(state["single"])
        return model.eval()
    members = []
    for sd in state["average"]:
        m = factory().to(device)
        m.load_state_dict(sd)
        members.append(m.eval())
    return AveragedModel(members).eval()


def seconds_by_phase(history: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean training seconds per epoch in each phase (selection included, evaluation not)."""
    out: dict[str, dict[str, float]] = {}
    for phase in sorted({int(r["phase"]) for r in history}):
        values = [r["time/train_seconds"] for r in history if r["phase"] == phase]
        out[f"phase{phase}"] = {"mean": float(np.mean(values)), "n": len(values)}
    return out


def write_metrics_csv(history: list[dict[str, Any]], path: Path) -> None:
    """One row per epoch, every key a column (atomic write)."""
    keys: list[str] = []
    for row in history:
        keys += [k for k in row if k not in keys]
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=keys)
    writer.writeheader()
    writer.writerows(history)
    cfgmod.atomic_write_text(path, buffer.getvalue())


class _NoProgress:
    def update(self, n: int) -> None:  # noqa: D401 - trivial
        pass

    def close(self) -> None:
        pass


def _progress(total: int, desc: str, enabled: bool) -> Any:
    if not enabled or not sys.stderr.isatty():
        return _NoProgress()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, leave=False)

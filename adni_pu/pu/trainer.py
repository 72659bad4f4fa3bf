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

Model selection uses the validation split only: ``selection = "best_epoch"`` keeps the best
validation score over every epoch and candidate, ``"final"`` chooses among the finalists
(:meth:`Trainer.finalists`) after the last epoch (docs/selfpu.md, "The final model").
Every epoch writes a checkpoint; a run resumed from it gives the same result as one that was
never interrupted (the random streams of an epoch are derived from the seed and the epoch
number). ``fit(deadline=...)`` stops at an epoch boundary before a time limit (the piecewise
benchmark runner uses it).

Speed: tensor data sets (MNIST, CIFAR-10) live on the training device for the whole run and
batches are gathered by index there; the per-batch layout (which rows are labelled, trusted,
outside the trusted set) is computed on the host once per epoch from host-side indices, so
the training loop never waits for the device: statistics stay on the device and are read
once per epoch, Kiryo's branch is a ``torch.where``.
"""

from __future__ import annotations

import contextlib
import math
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
from adni_pu.progress import progress_bar
from adni_pu.pu import calibration, checkpoint, losses, selfpu_loss
from adni_pu.pu.config import TrainConfig
from adni_pu.pu.metrics import average_logits, binary_metrics, roc_auc, sigmoid
from adni_pu.pu.recorders import Recorder, run_folder_recorders
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

ModelFactory = Callable[[], nn.Module]
LOWER_IS_BETTER = {"pu_risk": True, "pu_zero_one": True, "pu_auc": False, "pn_accuracy": False}


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
    # rest_risk="band": training-split indices of the labelled positives inside the trusted
    # set's score band at the last selection (None: every labelled positive)
    band_pos: np.ndarray | None = None


@dataclass
class FitResult:
    """What :meth:`Trainer.fit` leaves: the chosen model and the per-epoch history."""

    best_epoch: int
    best_candidate: str
    best_score: float
    history: list[dict[str, Any]]
    run_dir: Path | None
    complete: bool = True
    """False when ``fit`` stopped at its deadline before the last epoch."""


def to_device(x: Any, device: torch.device) -> Any:
    """Move a tensor, or a dict/list/tuple of tensors, to ``device``."""
    if isinstance(x, torch.Tensor):
        return x.to(device, non_blocking=True)
    if isinstance(x, dict):
        return {k: to_device(v, device) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(to_device(v, device) for v in x)
    return x



class _OutOfTime(Exception):
    """Raised inside an epoch that passes the deadline; the epoch's work is dropped."""


@dataclass
class _Layout:
    """Where the rows of one batch sit, known on the host (indexing with it never syncs)."""

    n: int
    pos: Any  # rows with s = 1 (a slice, or an index tensor on the device)
    unl: Any  # rows with s = 0
    trusted: list[torch.Tensor] = field(default_factory=list)  # per student: D_U rows trusted
    rest: list[torch.Tensor] = field(default_factory=list)  # per student: D_U rows not trusted
    outside: list[torch.Tensor] = field(default_factory=list)  # per student: rows not trusted
    # per student, with rest_risk="band": labelled-positive rows inside the band
    band_pos: list[torch.Tensor] = field(default_factory=list)


def _rows(mask: np.ndarray) -> slice | np.ndarray:
    """The positions where ``mask`` holds, as a slice when they are a leading run."""
    where = np.flatnonzero(mask)
    if len(where) == 0 or where[-1] == len(where) - 1:
        return slice(0, len(where))
    if where[0] == len(mask) - len(where):
        return slice(int(where[0]), len(mask))
    return where


def _split_positions(masks: np.ndarray, starts: np.ndarray, sizes: list[int],
                     device: torch.device) -> list[torch.Tensor]:
    """Per batch, the in-batch positions where the epoch-long ``masks`` hold (one transfer)."""
    where = np.flatnonzero(masks)
    batch = np.searchsorted(starts, where, side="right") - 1
    counts = np.bincount(batch, minlength=len(sizes)).tolist()
    local = torch.from_numpy(where - starts[batch]).to(device)
    return list(torch.split(local, counts))


def channels_last(model: nn.Module) -> nn.Module:
    """Channels-last layout (3-D or 2-D, by the model's convolution weights)."""
    ranks = {p.dim() for p in model.parameters()}
    if 5 in ranks:
        return model.to(memory_format=torch.channels_last_3d)
    if 4 in ranks:
        return model.to(memory_format=torch.channels_last)
    return model


def to_layout(x: Any, enabled: bool) -> Any:
    """Channels-last copies of the 4-D / 5-D tensors in ``x`` (when ``enabled``)."""
    if not enabled:
        return x
    if isinstance(x, torch.Tensor):
        if x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        if x.dim() == 5:
            return x.contiguous(memory_format=torch.channels_last_3d)
        return x
    if isinstance(x, dict):
        return {k: to_layout(v, enabled) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(to_layout(v, enabled) for v in x)
    return x


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
        distributed: Any = None,
        recorders: list[Recorder] | None = None,
    ) -> None:
        """``distributed``: the :class:`~adni_pu.distributed.DistributedRun` this process is
        one rank of (torchrun), or None for a single process. ``recorders``: what is written
        at fit start, epoch end and fit end (default: the run folder's files,
        :func:`adni_pu.pu.recorders.run_folder_recorders`)."""
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
        # labelled positives that D_U also holds (case-control: all of them; censoring: none)
        self.n_copies = int(train.labelled[u_idx].sum())
        n_students = len(self.sp.rates) if config.method == "selfpu" else 1
        torch.manual_seed(config.seed)
        self.students: list[Student] = []
        for k in range(n_students):
            model = self.model_factory().to(self.device)
            if config.channels_last:
                model = channels_last(model)
            opt = torch.optim.Adam(model.parameters(), lr=config.lr,
                                   weight_decay=config.weight_decay)
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=config.epochs)
            rate = self.sp.rates[k] if config.method == "selfpu" else 0.0
            self.students.append(Student(f"student{k + 1}" if n_students > 1 else "model",
                                         model, opt, sched, rate, prior_rest=self.prior_u))
        # The training forward of each student (compiled with config.compile).
        self._train_forward: list[Callable[[Any], torch.Tensor]] = [
            torch.compile(st.model) if config.compile else st.model for st in self.students]
        self._resident: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.history: list[dict[str, Any]] = []
        self.recorders = run_folder_recorders(self.run_dir) if recorders is None else recorders
        self.best: dict[str, Any] = {"score": None, "epoch": -1, "candidate": "", "state": None}
        # The finalists' validation scores after the last epoch and the one they choose
        # (under either selection rule): {"epoch", "choice", "val_scores"}; None before.
        self.final: dict[str, Any] | None = None
        # The last evaluated epoch's validation logits by model name (for recorders).
        self.last_val_logits: dict[str, np.ndarray] = {}
        self.start_epoch = 0
        # The DistributedRun of multi-process (torchrun) training, passed in; None when single.
        if distributed is not None:
            distributed.check_device(self.device)
        self.ddp: Any = distributed

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
        """Entry indices per batch, each batch holding labelled P and U in the data's ratio
        (or, with ``positive_share``, a fixed number of labelled positives per batch)."""
        if self.cfg.positive_share > 0:
            return self._oversampled_batches(rng)
        n = len(self.entry_base)
        n_batches = max(1, math.ceil(n / self.cfg.batch_size))
        if self.ddp is not None:  # every rank gets the same number of batches
            n_batches = self.ddp.round_batches(n_batches, n)
        p_perm = rng.permutation(self.n_p)
        u_perm = self.n_p + rng.permutation(self.n_u)
        p_chunks = np.array_split(p_perm, n_batches)
        u_chunks = np.array_split(u_perm, n_batches)
        return [np.concatenate([p, u]) for p, u in zip(p_chunks, u_chunks)]

    def _oversampled_batches(self, rng: np.random.Generator) -> list[np.ndarray]:
        """``positive_share``: every batch holds round(share * batch_size) labelled positives
        and the rest unlabelled; the epoch is one pass over D_U, and the positives come from
        successive random permutations of D_P (each used about equally often; a positive can
        appear twice in a batch only where two permutations meet)."""
        n_pos = round(self.cfg.positive_share * self.cfg.batch_size) if self.n_p else 0
        n_batches = max(1, math.ceil(self.n_u / (self.cfg.batch_size - n_pos)))
        if self.ddp is not None:  # every rank gets the same number of batches
            n_batches = self.ddp.round_batches(n_batches, self.n_u + n_batches * n_pos)
        need = n_batches * n_pos
        cycles = [rng.permutation(self.n_p) for _ in range(-(-need // max(self.n_p, 1)))]
        p_all = np.concatenate(cycles)[:need] if cycles else np.zeros(0, np.int64)
        u_perm = self.n_p + rng.permutation(self.n_u)
        p_chunks = np.split(p_all, n_batches)
        u_chunks = np.array_split(u_perm, n_batches)
        return [np.concatenate([p, u]) for p, u in zip(p_chunks, u_chunks)]

    def autocast(self) -> contextlib.AbstractContextManager:
        """bfloat16 autocast on the training device when ``config.amp`` is on."""
        if not self.cfg.amp:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def resident(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` on the training device (moved, in the configured layout, once per run)."""
        key = id(x)
        if key not in self._resident:
            self._resident[key] = (x, to_layout(x.to(self.device), self.cfg.channels_last))
        return self._resident[key][1]

    def _iterate(self, x: Any, index_batches: list[np.ndarray]) -> Iterator[Any]:
        """Yield the inputs of each batch of example indices of one split (on the device)."""
        if isinstance(x, torch.Tensor):
            on_device = self.resident(x)
            for idx in index_batches:
                yield on_device[torch.from_numpy(np.asarray(idx, dtype=np.int64)).to(self.device)]
            return
        loader = torch.utils.data.DataLoader(
            x, batch_sampler=[list(map(int, b)) for b in index_batches],
            num_workers=self.cfg.num_workers, collate_fn=self.collate,
            pin_memory=self.device.type == "cuda", persistent_workers=False,
        )
        for xb in loader:
            yield to_layout(to_device(xb, self.device), self.cfg.channels_last)

    @torch.no_grad()
    def predict_logits(self, model: nn.Module, split: PUSplit) -> np.ndarray:
        """Logits of ``model`` (eval mode) for every example of ``split``."""
        was_training = model.training
        model.eval()
        n = len(split)
        x = split.eval_x if split.eval_x is not None else split.x
        out = []
        with self.autocast():
            if isinstance(x, torch.Tensor):  # slices of the resident tensor: no copies
                on_device = self.resident(x)
                size = self.cfg.eval_batch_size
                out = [model(on_device[i:i + size]).float() for i in range(0, n, size)]
            else:
                size = self.cfg.batch_size
                batches = [np.arange(i, min(i + size, n)) for i in range(0, n, size)]
                out = [model(xb).float() for xb in self._iterate(x, batches)]
        model.train(was_training)
        return torch.cat(out).cpu().numpy() if out else np.zeros(0, np.float32)

    # ------------------------------------------------------------------ trusted sets

    def _select(self, epoch: int) -> dict[str, Any]:
        stats: dict[str, Any] = {}
        for st in self.students:
            size = target_size(epoch, len(self.candidates_u), st.rate, self.sp.warmup_epochs,
                               self.sp.self_paced_end, self.sp.select_every, self.sp.schedule)
            scores = sigmoid(self.predict_logits(st.model, self.data.train))
            st.trusted = select_trusted_set(scores, self.candidates_u, size, self.sp.labels,
                                            st.trusted, self.sp.replacement, epoch)
            f_band = None
            if self.sp.rest_risk == "band":
                st.band_pos = band_positives(scores, self.data.train.labelled, st.trusted)
                if self.sp.band_prior != "count":
                    f_band = self._band_fraction(st.model, scores, st.trusted, st.band_pos)
            st.prior_rest = self._prior_rest(st.trusted, f_band)
        return stats

    def _prior_rest_truth(self, st: Student) -> float:
        """The true positive fraction of D_U minus the student's trusted set, from the
        hidden labels: a diagnostic of the prior correction (recorded, never used)."""
        train = self.data.train
        rest = np.setdiff1d(self.entry_base[self.n_p:], st.trusted.indices)
        if self.sp.rest_risk == "band":  # the band risk's U' holds no labelled copies
            rest = rest[~train.labelled[rest]]
        return float(train.truth[rest].mean()) if len(rest) else float("nan")

    def _band_fraction(self, model: nn.Module, scores: np.ndarray, trusted: TrustedSet,
                       band_pos: np.ndarray) -> float:
        """f_band: the fraction of labelled positives whose score lies inside the trusted
        set's band, measured on the validation split's labelled positives (out of sample)
        or the training split's (``selfpu.band_prior``)."""
        if self.sp.band_prior == "training":
            return len(band_pos) / max(self.n_p, 1)
        val = self.data.val
        t_lo, t_hi = score_band(scores, trusted)
        val_scores = sigmoid(self.predict_logits(model, val))[val.labelled]
        return float(((val_scores > t_lo) & (val_scores < t_hi)).mean())

    def _prior_rest(self, trusted: TrustedSet, f_band: float | None = None) -> float:
        """Positive fraction of D_U once the trusted set is taken out: the prior correction
        (``correct_prior``). With ``rest_risk="band"`` U' also leaves out the labelled
        positives' copies in D_U, and the fraction is counted from the pseudo-labels
        (``band_prior="count"``) or is (pi_u n_u - copies) f_band / |U'|, f_band the fraction
        of labelled positives inside the band (:meth:`_band_fraction`)."""
        if len(trusted) == 0:
            return self.prior_u
        band = self.sp.rest_risk == "band"
        # the band risk's U' also leaves out the labelled positives' copies
        copies = self.n_copies if band else 0
        if band and f_band is not None:
            return band_prior(self.prior_u, self.n_u, len(trusted), f_band, copies)
        if not band and not self.sp.correct_prior:
            return self.prior_u
        n_pos = int(trusted.pseudo_labels.sum())
        left = max(self.n_u - copies - len(trusted), 1)
        return clip_prior((self.prior_u * self.n_u - copies - n_pos) / left)

    # ------------------------------------------------------------------ losses

    def _val_batches(self, rng: np.random.Generator, n_batches: int
                     ) -> Iterator[tuple[Any, torch.Tensor, torch.Tensor, int]]:
        """The epoch's validation mini-batches for the meta step (half labelled positives,
        half unlabelled each: inputs, PU labels, true labels, number of positives).

        All are drawn now, in batch order (the random stream stays that of one draw per
        batch); indices and labels go to the device at once, inputs are gathered (or
        loaded) one batch at a time as the iterator is consumed."""
        val = self.data.val
        half = max(self.cfg.batch_size // 2, 1)
        p_all = val.positive_indices()
        u_all = val.unlabelled_indices(self.data.scheme)
        n_p, n_u = min(half, len(p_all)), min(half, len(u_all))
        draws = []
        for _ in range(n_batches):
            p = rng.choice(p_all, size=n_p, replace=False)
            u = rng.choice(u_all, size=n_u, replace=False)
            draws.append(np.concatenate([p, u]))
        if not draws:
            return iter(())
        idx = np.concatenate(draws)
        s = torch.cat([torch.ones(n_p), torch.zeros(n_u)]).to(self.device)
        truths = torch.as_tensor(val.truth[idx], dtype=torch.float32).to(self.device)
        truths = torch.split(truths, n_p + n_u)
        if isinstance(val.x, torch.Tensor):
            rows = torch.split(torch.from_numpy(idx).to(self.device), n_p + n_u)
            on_device = self.resident(val.x)
            xs: Iterator[Any] = (on_device[r] for r in rows)
        else:
            xs = self._iterate(val.x, draws)
        return ((x, s, truth, n_p) for x, truth in zip(xs, truths))

    def _meta_objective(self, model: nn.Module, x_val: Any, s_val: torch.Tensor,
                        truth_val: torch.Tensor, n_pos: int | None = None
                        ) -> calibration.ValidationObjective:
        """The validation objective of the meta step; ``n_pos`` says that the first
        ``n_pos`` rows are the labelled positives (sliced, so no host sync)."""
        def objective(params: dict[str, torch.Tensor]) -> torch.Tensor:
            logits = calibration.functional_forward(model, params, x_val, self.sp.meta_bn)
            if self.sp.meta_objective == "pn_ce":
                return nn.functional.binary_cross_entropy_with_logits(logits, truth_val)
            if n_pos is not None:
                return losses.pu_risk(logits[:n_pos], logits[n_pos:], self.prior).unbiased
            return losses.pu_risk(logits[s_val == 1], logits[s_val == 0], self.prior).unbiased

        return objective

    def _baseline_loss(self, logits: torch.Tensor, s: torch.Tensor, lay: _Layout
                       ) -> tuple[torch.Tensor, dict[str, Any]]:
        return selfpu_loss.baseline_loss(self.cfg.method, logits, s, lay.pos, lay.unl,
                                         self.prior, self.prior_u, self.cfg.beta, self.cfg.gamma)

    def _student_loss(
        self,
        k: int,
        logits: torch.Tensor,
        other_logits: torch.Tensor | None,
        x: Any,
        s: torch.Tensor,
        idx: torch.Tensor,
        lay: _Layout,
        epoch: float,
        phase: int,
        meta: tuple[Any, torch.Tensor, torch.Tensor, int] | None,
        member_target: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Self-PU loss of student ``k`` (:mod:`adni_pu.pu.selfpu_loss`) on this batch."""
        if phase == 1:
            return self._baseline_loss(logits, s, lay)
        st = self.students[k]
        sp = self.sp
        trusted = lay.trusted[k]
        calibrate = None
        if meta is not None:
            def calibrate(h: torch.Tensor, l_neg: torch.Tensor) -> Any:
                return calibration.calibration_weights(
                    st.model, h, l_neg, self._meta_objective(st.model, *meta),
                    sp.meta_step_size, lay.n, sp.meta_ce_cap, sp.meta_sign_flip,
                    sp.reweight_risk)

        loss, pu_obj, stats = selfpu_loss.student_loss(
            logits, pos=lay.pos, trusted=trusted, rest_u=lay.rest[k], n=lay.n, phase=phase,
            pos_neg=lay.band_pos[k] if lay.band_pos else None,
            band_fraction=(len(st.band_pos) / max(self.n_p, 1)
                           if lay.band_pos and st.band_pos is not None else None),
            sp=sp, prior_rest=st.prior_rest, beta=self.cfg.beta, gamma=self.cfg.gamma,
            trusted_target=lambda: member_target[idx[trusted]], calibrate=calibrate)
        if phase == 3:
            teacher = st.teacher
            teacher_loss = (None if teacher is None else
                            lambda: teacher_consistency(logits, teacher.model, x))
            loss = loss + selfpu_loss.distillation(logits, other_logits, s, lay.outside[k],
                                                   pu_obj, sp, epoch, teacher_loss, stats)
        stats["loss"] = loss.detach().double()
        return loss, stats

    # ------------------------------------------------------------------ one epoch

    def _layouts(self, batches: list[np.ndarray], members: list[np.ndarray], phase: int
                 ) -> list[_Layout]:
        """Row layout of every batch of the epoch, built on the host from the entry indices."""
        sizes = [len(b) for b in batches]
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        order = np.concatenate(batches) if batches else np.zeros(0, np.int64)
        s_all = self.entry_s[order]
        layouts = []
        for b, start in enumerate(starts):
            s_b = s_all[start:start + sizes[b]]
            pos, unl = _rows(s_b == 1), _rows(s_b == 0)
            layouts.append(_Layout(sizes[b], *(
                r if isinstance(r, slice) else torch.from_numpy(r).to(self.device)
                for r in (pos, unl))))
        if phase >= 2:
            in_u = s_all == 0
            for member, st in zip(members, self.students):
                trusted = in_u & member[self.entry_base[order]]
                rest = in_u & ~trusted
                if self.sp.rest_risk == "band":
                    # the labelled positives' copies in D_U (case-control) are known positives
                    # at every score, not a sample of the band: leave them out of U'
                    rest &= ~self.data.train.labelled[self.entry_base[order]]
                masks = [("trusted", trusted), ("rest", rest), ("outside", ~trusted)]
                if self.sp.rest_risk == "band":
                    in_band = np.zeros(len(member), dtype=bool)
                    in_band[slice(None) if st.band_pos is None else st.band_pos] = True
                    masks.append(("band_pos", ~in_u & in_band[self.entry_base[order]]))
                for key, mask in masks:
                    parts = _split_positions(mask, starts, sizes, self.device)
                    for lay, part in zip(layouts, parts):
                        getattr(lay, key).append(part)
        return layouts

    def _train_batches(self, batches: list[np.ndarray], epoch: int
                       ) -> Iterator[tuple[Any, torch.Tensor, torch.Tensor]]:
        """Inputs, PU labels and example indices of each batch, gathered on the device."""
        x = self.data.train.x
        sizes = [len(b) for b in batches]
        order = np.concatenate(batches) if batches else np.zeros(0, np.int64)
        s_all = torch.split(torch.from_numpy(self.entry_s[order]).to(self.device), sizes)
        idx_all = torch.split(torch.from_numpy(self.entry_base[order]).to(self.device), sizes)
        if not isinstance(x, torch.Tensor):
            inputs: Iterator[Any] = self._iterate(x, [self.entry_base[b] for b in batches])
            yield from zip(inputs, s_all, idx_all)
            return
        on_device = self.resident(x)
        augment = self.cfg.augment == "crop-flip"
        if augment:
            from adni_pu.data.benchmarks import crop_flip

            gen = torch.Generator(device=self.device)
            gen.manual_seed(self.cfg.seed * 1_000_003 + epoch)
        for s, idx in zip(s_all, idx_all):
            xb = on_device[idx]
            if augment:
                xb = to_layout(crop_flip(xb, self.cfg.crop_padding, gen),
                                self.cfg.channels_last)
            yield xb, s, idx

    def train_epoch(self, epoch: int, deadline: float | None = None) -> dict[str, Any]:
        """One pass over the training entries; returns the epoch's mean statistics.

        With a ``deadline`` (``time.monotonic()`` seconds) the epoch stops with
        :class:`_OutOfTime` once the deadline passes; the run folder keeps the last epoch.
        """
        phase = self.phase(epoch)
        rng = np.random.default_rng([self.cfg.seed, epoch])
        torch.manual_seed(self.cfg.seed * 100_003 + epoch)
        if phase == 3 and self.sp.teachers and self.students[0].teacher is None:
            for st in self.students:
                st.teacher = MeanTeacher(st.model, self.sp.teacher_average, self.sp.ema_decay,
                                         self.sp.teacher_bn)
        n_train = len(self.data.train)
        memberships = [st.trusted.membership(n_train) for st in self.students]
        targets = [torch.from_numpy(t).to(self.device) for _, t in memberships]
        for st in self.students:
            st.model.train()
        batches = self._epoch_batches(rng)
        if self.ddp is not None:  # this rank's share of the epoch's batches
            batches = self.ddp.shard(batches, epoch)
        needs_meta = (self.cfg.method == "selfpu" and self.sp.reweight
                      and (phase == 2 or (phase == 3 and self.sp.reweight_in_phase3)))
        metas = (self._val_batches(rng, len(batches)) if needs_meta
                 else iter([None] * len(batches)))
        layouts = self._layouts(batches, [m for m, _ in memberships], phase)
        values: dict[str, list[Any]] = {}
        progress = progress_bar(len(batches), f"epoch {epoch + 1}/{self.cfg.epochs}",
                                self.cfg.progress, leave=False, terminal_only=True)
        data = self._train_batches(batches, epoch)
        for b, ((x, s, idx), lay, meta) in enumerate(zip(data, layouts, metas)):
            if deadline is not None and time.monotonic() > deadline:
                progress.close()
                raise _OutOfTime
            with self.autocast():
                if self.ddp is not None:
                    logits = [self.ddp.forward(k, x).float() for k in range(len(self.students))]
                else:
                    logits = [fwd(x).float() for fwd in self._train_forward]
            frac_epoch = epoch + b / len(batches)
            for k, st in enumerate(self.students):
                other = logits[1 - k].detach() if len(self.students) == 2 else None
                with self.autocast():
                    if self.cfg.method == "selfpu":
                        loss, stats = self._student_loss(k, logits[k], other, x, s, idx, lay,
                                                         frac_epoch, phase, meta, targets[k])
                    else:
                        loss, stats = self._baseline_loss(logits[k], s, lay)
                st.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                st.optimizer.step()
                if st.teacher is not None:
                    st.teacher.update(st.model)
                for key, value in stats.items():
                    values.setdefault(f"{st.name}/{key}", []).append(value)
            progress.update(1)
        progress.close()
        if self.ddp is not None:  # BatchNorm statistics: the mean over ranks
            self.ddp.sync_buffers([st.model for st in self.students])
        for st in self.students:
            st.scheduler.step()
        return _epoch_means(values)

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

    def finalists(self) -> list[str]:
        """The models that compete under ``selection = "final"``: the candidates and, when
        there are two, their average (only the teachers' average with ``final_model =
        "average"``)."""
        pool = list(self.candidates())
        if len(pool) != 2:
            return pool
        if self.sp.final_model == "average" and pool[0].startswith("teacher"):
            return ["average"]
        return [*pool, "average"]

    def finalist_models(self) -> dict[str, nn.Module]:
        """The finalists as modules (the average as an :class:`~adni_pu.pu.checkpoint.
        AveragedModel` of the live candidates), in evaluation mode; for diagnostics."""
        pool = self.candidates()
        out = {}
        for name in self.finalists():
            model = (checkpoint.AveragedModel(list(pool.values())) if name == "average"
                     else pool[name])
            out[name] = model.eval()
        return out

    def evaluate_epoch(self, epoch: int) -> dict[str, Any]:
        """Validation criteria of every model (and test accuracy, as a diagnostic only).

        Updates the selection: under ``"best_epoch"`` when this epoch's choice beats the best
        so far; under ``"final"`` after the last epoch, with the finalists' choice.
        """
        row: dict[str, Any] = {}
        models = {st.name: st.model for st in self.students}
        models.update({st.name.replace("student", "teacher"): st.teacher.model
                       for st in self.students if st.teacher is not None})
        val_logits = {name: self.predict_logits(m, self.data.val) for name, m in models.items()}
        final_rule = self.cfg.selection == "final"
        last = epoch == self.cfg.epochs - 1
        finalists = self.finalists()
        pool = list(self.candidates())
        if self.sp.final_model == "average" and len(pool) == 2 and pool[0].startswith("teacher"):
            pool = ["average"]
        if final_rule:
            pool = finalists
        average = (average_logits([val_logits[p] for p in self.candidates()])
                   if "average" in pool or (last and "average" in finalists) else None)
        if "average" in pool:  # a column of metrics.csv only where it competes every epoch
            val_logits["average"] = average
        self.last_val_logits = val_logits
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
        choice = _choose(scores, lower)
        row["selected/candidate"] = choice
        row["selected/score"] = scores[choice]
        if last:
            final_scores = {p: row[f"val/{p}/{crit}"] if p in val_logits
                            else self.val_scores(average)[crit] for p in finalists}
            self.final = {"epoch": epoch, "choice": _choose(final_scores, lower),
                          "val_scores": final_scores}
        if final_rule:
            if last:
                self.best = {"score": scores[choice], "epoch": epoch, "candidate": choice,
                             "state": self._candidate_state(choice)}
            return row
        best = self.best["score"]
        score = scores[choice]
        if not math.isnan(score) and (best is None or (score < best if lower else score > best)):
            self.best = {"score": score, "epoch": epoch, "candidate": choice,
                         "state": self._candidate_state(choice)}
        return row

    def _candidate_state(self, name: str) -> dict[str, Any]:
        if name == "average":  # of the current candidates (the teachers once they exist)
            return {"average": [checkpoint.cpu_state(m) for m in self.candidates().values()]}
        models = {st.name: st.model for st in self.students}
        models.update(self.candidates())
        return {"single": checkpoint.cpu_state(models[name])}

    def best_model(self) -> Callable[[Any], torch.Tensor] | nn.Module:
        """The chosen model (a module, or a callable averaging two teachers' probabilities)."""
        state = self.best["state"]
        if state is None:
            raise RuntimeError("no model has been selected yet; call fit() first")
        return checkpoint.load_selected(state, self.model_factory, self.device)

    def evaluate_split(self, split: PUSplit) -> tuple[dict[str, float], np.ndarray]:
        """Metrics of the selected model on ``split`` (call after :meth:`fit`)."""
        model = self.best_model()
        logits = self.predict_logits(model, split)  # type: ignore[arg-type]
        return binary_metrics(logits, split.truth), logits

    # ------------------------------------------------------------------ the loop

    def fit(self, deadline: float | None = None, finish_first_epoch: bool = True) -> FitResult:
        """Train for ``config.epochs`` epochs (resuming from the run folder's checkpoint).

        ``deadline`` (a ``time.monotonic()`` value) makes this a piece of a longer run: an
        epoch starts only if the longest earlier epoch of its phase fits before the
        deadline, and an epoch that passes it is dropped. With ``finish_first_epoch`` the
        first epoch of this call is exempt, so every piece makes progress. The checkpoint
        then holds the last finished epoch and the result says ``complete=False``; fitting
        again resumes. Not with distributed training (ranks could stop at different
        batches).
        """
        if deadline is not None and self.ddp is not None:
            raise ValueError("fit(deadline=...) is not supported with distributed training")
        self._maybe_resume()  # first: a refused resume must not rewrite the run's files
        for recorder in self.recorders:
            recorder.fit_start(self)
        if self.ddp is not None:
            self.ddp.wrap([st.model for st in self.students], self.device)
        first = self.start_epoch
        complete = True
        for epoch in range(self.start_epoch, self.cfg.epochs):
            exempt = finish_first_epoch and epoch == first
            if deadline is not None and not exempt and not self._fits(epoch, deadline):
                complete = False
                break
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
                    # diagnostic from the hidden labels (like label_accuracy): never used
                    row[f"trusted/{st.name}/prior_rest_truth"] = self._prior_rest_truth(st)
            t_select = time.perf_counter() - t0
            try:
                stats = self.train_epoch(epoch, None if exempt else deadline)
            except _OutOfTime:
                complete = False
                break
            self._recompute_teacher_batchnorm()
            t_train = time.perf_counter() - t0
            row.update({f"train/{k}": v for k, v in stats.items()})
            row.update(self.evaluate_epoch(epoch))
            t_total = time.perf_counter() - t0
            row.update({"time/select_seconds": t_select, "time/train_seconds": t_train,
                        "time/epoch_seconds": t_total})
            self.history.append(row)
            for recorder in self.recorders:
                recorder.epoch_end(self, row)
        if complete:
            for recorder in self.recorders:
                recorder.fit_end(self)
        else:
            self.log(f"stopped at the time limit after epoch {len(self.history)}/"
                     f"{self.cfg.epochs}; fit again to continue from the checkpoint")
        return FitResult(self.best["epoch"], self.best["candidate"], self.best["score"] or
                         float("nan"), self.history, self.run_dir, complete)

    def _recompute_teacher_batchnorm(self) -> None:
        """With ``teacher_bn = "recompute"``: each teacher's BatchNorm statistics from one
        pass over the training entries (D_P and D_U once each, in the data's ratio),
        un-augmented (``eval_x`` where the split has one, so the pass is deterministic), so
        evaluation, selection and the next epoch's consistency targets use them."""
        teachers = [st.teacher for st in self.students if st.teacher is not None]
        if self.sp.teacher_bn != "recompute" or not teachers:
            return
        train = self.data.train
        x = train.eval_x if train.eval_x is not None else train.x
        size = self.cfg.eval_batch_size if isinstance(x, torch.Tensor) else self.cfg.batch_size
        chunks = [self.entry_base[i:i + size] for i in range(0, len(self.entry_base), size)]
        for teacher in teachers:
            with self.autocast():
                recompute_batchnorm(teacher.model, self._iterate(x, chunks))

    def _fits(self, epoch: int, deadline: float) -> bool:
        """Whether the next epoch is expected to end before ``deadline``: the longest epoch
        of the same phase so far (with selection and evaluation) must fit."""
        phase = self.phase(epoch)
        seen = [r["time/epoch_seconds"] for r in self.history if r["phase"] == phase]
        if not seen:
            return time.monotonic() < deadline
        return time.monotonic() + max(seen) < deadline

    # ------------------------------------------------------------------ checkpoint

    def check_resume(self) -> dict[str, Any] | None:
        """The run folder's checkpoint (None when there is none).

        Raises :class:`ResumeError` when it was made with other settings. Callers that
        write into the run folder before :meth:`fit` call this first, so a refused rerun
        leaves the folder as it was.
        """
        if self.run_dir is None:
            return None
        return checkpoint.read_last(self.run_dir / checkpoint.LAST, self.cfg, self.device,
                                    self.run_dir / "config.toml")

    def _maybe_resume(self) -> None:
        state = self.check_resume()
        if state is None:
            return
        checkpoint.restore(self, state)
        self.log(f"resumed from {self.run_dir / checkpoint.LAST} after epoch {state['epoch'] + 1}")


def _epoch_means(values: dict[str, list[Any]]) -> dict[str, float]:
    """Mean of each statistic over the epoch's batches, read from the device in one go.

    Values are summed in batch order in float64 on the host, exactly as the per-batch reads
    of earlier versions did, so metrics.csv keeps its numbers.
    """
    tensors = [v for vals in values.values() for v in vals if isinstance(v, torch.Tensor)]
    read = iter(torch.stack(tensors).cpu().tolist()) if tensors else iter(())
    means = {}
    for key, vals in values.items():
        total = 0.0
        for v in vals:
            total += next(read) if isinstance(v, torch.Tensor) else float(v)
        means[key] = total / len(vals)
    return means


def _choose(scores: dict[str, float], lower: bool) -> str:
    """The best-scoring name (ties broken by name; a NaN score only when all are NaN)."""
    finite = [p for p in scores if not math.isnan(scores[p])] or list(scores)
    return (min if lower else max)(finite, key=lambda p: (scores[p], p))

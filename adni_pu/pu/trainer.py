"""The one PU trainer: naive PN, uPU, nnPU and Self-PU (every ablation) on any data set.

A data set reaches the trainer as :class:`~adni_pu.data.pu.PUData` (training, validation and
test splits, each a tensor of examples or a map-style dataset) plus a model factory. The
algorithm is chosen by :class:`~adni_pu.pu.config.TrainConfig` alone.

This module is one run: its state, the pieces of an epoch (the strategy's work before it,
the training pass, evaluation and recording after it), resume and the time limit; the loop
over epochs is :func:`adni_pu.pu.loop.run_epochs`, which also trains a population of runs
(:mod:`adni_pu.pu.population`). What a method
does in an epoch is its strategy (:mod:`adni_pu.pu.strategies`), its loss in every phase
the objective both engines share (:mod:`adni_pu.pu.objective`); batches are planned in
:mod:`adni_pu.pu.batching` and placed on the device by
:mod:`adni_pu.pu.device_data`; :mod:`adni_pu.pu.selection` chooses the model on validation.
A run resumed from its checkpoint equals one never interrupted (each epoch's random streams
come from the seed and the epoch number).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from adni_pu.data.pu import PUData, PUSplit
from adni_pu.errors import ConfigError
from adni_pu.models import build_model
from adni_pu.progress import progress_bar
from adni_pu.pu import candidates, checkpoint, objective, selection
from adni_pu.pu.batching import Entries, EpochPlan, epoch_batches
from adni_pu.pu.config import TrainConfig
from adni_pu.pu.device_data import (
    DeviceData,
    configure_torch,
    epoch_means,
    resolve_device,
)
from adni_pu.pu.loop import FitResult, OutOfTime, run_epochs
from adni_pu.pu.metrics import binary_metrics
from adni_pu.pu.recorders import Recorder, run_folder_recorders
from adni_pu.pu.run import RunState, RunView
from adni_pu.pu.strategies import Batch, strategy_for

if TYPE_CHECKING:
    from adni_pu.distributed import DistributedRun

ModelFactory = Callable[[], nn.Module]


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
        distributed: DistributedRun | None = None,
        recorders: list[Recorder] | None = None,
    ) -> None:
        """``distributed``: the :class:`~adni_pu.distributed.DistributedRun` this process is
        one rank of (torchrun), or None for a single process. ``recorders``: what is written
        at fit start, epoch end and fit end (default: the run folder's files,
        :func:`adni_pu.pu.recorders.run_folder_recorders`)."""
        self.cfg = config
        self.data = data
        self.device = resolve_device(config.device)
        configure_torch(self.device, config.threads, config.deterministic)
        prior, prior_u = data.training_priors(config.prior)
        if distributed is not None:
            distributed.check_device(self.device)
            if config.method == "vpu":  # two forwards per step through one DDP wrapper
                raise ConfigError("method 'vpu' under torchrun: its MixUp needs a second "
                                  "forward per step, which DDP does not sync; expected one "
                                  "process (plain `adni-pu train`)")
        self.ddp: DistributedRun | None = distributed
        self.state = RunState()
        self.run = RunView(
            cfg=config, data=data, entries=Entries.of(data.train, data.scheme),
            prior=prior, prior_u=prior_u, device=self.device,
            device_data=DeviceData(
                self.device, batch_size=config.batch_size,
                eval_batch_size=config.eval_batch_size, amp=config.amp,
                layout=config.channels_last, collate=collate, num_workers=config.num_workers),
            model_factory=model_factory or partial(build_model, config.model,
                                                   **config.model_args),
            state=self.state, run_dir=Path(run_dir) if run_dir is not None else None,
            is_main=distributed is None or distributed.rank == 0,
            log=log or (lambda msg: print(msg, file=sys.stderr, flush=True)))
        self.strategy = strategy_for(self.run)
        self.state.students = self.strategy.make_students()
        # The training forward of each student (compiled with config.compile).
        self._train_forward: list[Callable[[Any], torch.Tensor]] = [
            torch.compile(st.model) if config.compile else st.model for st in self.students]
        self.recorders = (run_folder_recorders(self.run.run_dir) if recorders is None
                          else recorders)

    # The run's facts and state, read by the population engine, workflows and tests.
    run_dir = property(lambda self: self.run.run_dir)
    log = property(lambda self: self.run.log)
    prior = property(lambda self: self.run.prior)
    prior_u = property(lambda self: self.run.prior_u)
    entries = property(lambda self: self.run.entries)
    n_p = property(lambda self: self.run.n_p)
    n_u = property(lambda self: self.run.n_u)
    device_data = property(lambda self: self.run.device_data)
    model_factory = property(lambda self: self.run.model_factory)
    is_main = property(lambda self: self.run.is_main)
    students = property(lambda self: self.state.students)
    history = property(lambda self: self.state.history)
    best = property(lambda self: self.state.best)
    final = property(lambda self: self.state.final)
    start_epoch = property(lambda self: self.state.start_epoch)
    val_scores = property(lambda self: self.run.val_scores)

    def predict_logits(self, model: nn.Module, split: PUSplit) -> np.ndarray:
        """Logits of ``model`` (eval mode) for every example of ``split``."""
        return self.run.predict_logits(model, split)

    # ------------------------------------------------------------------ one epoch

    def epoch_batches(self, rng: np.random.Generator) -> list[np.ndarray]:
        """The epoch's batches of training entries (:func:`batching.epoch_batches`)."""
        return epoch_batches(self.entries, rng, self.cfg.batch_size, self.cfg.positive_share,
                             None if self.ddp is None else self.ddp.round_batches)

    def plan_epoch(self, epoch: int, phase: int) -> tuple[EpochPlan, Iterator[Any],
                                                          Iterator[Any]]:
        """The strategy's start of the epoch's training pass, then its batch plan, the meta
        step's validation batches and the training inputs, all from the epoch's random
        streams (the seed and the epoch number)."""
        rng = np.random.default_rng([self.cfg.seed, epoch])
        self.strategy.training_start(epoch, phase)
        batches = self.epoch_batches(rng)
        if self.ddp is not None:  # this rank's share of the epoch's batches
            batches = self.ddp.shard(batches, epoch)
        metas = self.strategy.validation_batches(rng, phase, len(batches))
        plan = EpochPlan.of(batches)
        inputs = self.device_data.training_batches(
            self.data.train.x, plan, self.entries, self.cfg.augment, self.cfg.crop_padding,
            self.cfg.seed * 1_000_003 + epoch)
        return plan, metas, inputs

    def train_epoch(self, epoch: int, deadline: float | None = None) -> dict[str, Any]:
        """One pass over the training entries; returns the epoch's mean statistics.

        With a ``deadline`` (``time.monotonic()`` seconds) the epoch stops with
        :class:`OutOfTime` once the deadline passes; the run folder keeps the last epoch.
        """
        strategy = self.strategy
        phase = strategy.phase(epoch)
        torch.manual_seed(self.cfg.seed * 100_003 + epoch)
        plan, metas, inputs = self.plan_epoch(epoch, phase)
        for st in self.students:
            st.model.train()
        layouts = strategy.layouts(plan, phase)
        mix = strategy.mixup(plan)
        values: dict[str, list[Any]] = {}
        batches = plan.batches
        progress = progress_bar(len(batches), f"epoch {epoch + 1}/{self.cfg.epochs}",
                                self.cfg.progress, leave=False, terminal_only=True)
        for b, ((x, s, idx), lay, meta) in enumerate(zip(inputs, layouts, metas)):
            if deadline is not None and time.monotonic() > deadline:
                progress.close()
                raise OutOfTime
            with self.device_data.autocast():
                if self.ddp is not None:
                    logits = [self.ddp.forward(k, x).float() for k in range(len(self.students))]
                else:
                    logits = [fwd(x).float() for fwd in self._train_forward]
            batch = Batch(x, s, idx, lay, epoch + b / len(batches), phase, meta)
            if mix is not None:
                batch.lam, partner = mix.batch(plan, b)
                x_mix = objective.mix_inputs(
                    x, torch.from_numpy(partner).to(self.device), batch.lam)
                with self.device_data.autocast():
                    batch.mixed = [fwd(x_mix).float() for fwd in self._train_forward]
            for k, st in enumerate(self.students):
                with self.device_data.autocast():
                    loss, stats = strategy.loss(k, logits, batch)
                st.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                st.optimizer.step()
                strategy.step_end(st)
                for key, value in stats.items():
                    values.setdefault(f"{st.name}/{key}", []).append(value)
            progress.update(1)
        progress.close()
        if self.ddp is not None:  # BatchNorm statistics: the mean over ranks
            self.ddp.sync_buffers([st.model for st in self.students])
        for st in self.students:
            st.scheduler.step()
        return epoch_means(values)

    # ------------------------------------------------------------------ evaluation

    def best_model(self) -> Callable[[Any], torch.Tensor] | nn.Module:
        """The chosen model (a module, or a callable averaging two teachers' probabilities)."""
        state = self.state.best["state"]
        if state is None:
            raise RuntimeError("no model has been selected yet; call fit() first")
        return candidates.load_selected(state, self.model_factory, self.device)

    def evaluate_split(self, split: PUSplit) -> tuple[dict[str, float], np.ndarray]:
        """Metrics of the selected model on ``split`` (call after :meth:`fit`)."""
        logits = self.predict_logits(self.best_model(), split)  # type: ignore[arg-type]
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
        return run_epochs([self], lambda epoch, limit: [self.train_epoch(epoch, limit)],
                          deadline, finish_first_epoch)[0]

    def fit_start(self) -> None:
        """Resume from the run folder's checkpoint, tell the recorders, wrap for DDP."""
        # first: a refused resume must not rewrite the run's files
        checkpoint.resume(self.run, self.strategy.make_teachers)
        for recorder in self.recorders:
            recorder.fit_start(self.run)
        if self.ddp is not None:
            self.ddp.wrap([st.model for st in self.students], self.device)

    def epoch_start(self, epoch: int) -> dict[str, Any]:
        """The epoch's row, after the strategy's work before training (Self-PU selects)."""
        row: dict[str, Any] = {"epoch": epoch, "phase": self.strategy.phase(epoch),
                               "lr": self.students[0].optimizer.param_groups[0]["lr"]}
        self.strategy.epoch_start(epoch, row)
        return row

    def epoch_end(self, row: dict[str, Any], stats: dict[str, Any], t0: float,
                  t_select: float) -> None:
        """After an epoch's training: the strategy's training end, evaluation and
        selection, then the row goes to the history and the recorders."""
        self.strategy.training_end()
        t_train = time.perf_counter() - t0
        row.update({f"train/{k}": v for k, v in stats.items()})
        row.update(selection.evaluate_epoch(self.run, row["epoch"]))
        row.update({"time/select_seconds": t_select, "time/train_seconds": t_train,
                    "time/epoch_seconds": time.perf_counter() - t0})
        self.state.history.append(row)
        for recorder in self.recorders:
            recorder.epoch_end(self.run, row)

    def fit_end(self, complete: bool, paused: bool) -> FitResult:
        """Tell the recorders how the fit ended (``paused``: at the deadline, between
        epochs) and return its result."""
        if complete:
            self.strategy.fit_end()
            for recorder in self.recorders:
                recorder.fit_end(self.run)
        else:
            for recorder in self.recorders if paused else ():
                recorder.fit_paused(self.run)
            self.log(f"stopped at the time limit after epoch {len(self.history)}/"
                     f"{self.cfg.epochs}; fit again to continue from the checkpoint")
        return FitResult(self.best["epoch"], self.best["candidate"], self.best["score"] or
                         float("nan"), self.history, self.run_dir, complete)

    def fits_before(self, epoch: int, deadline: float) -> bool:
        """Whether the next epoch is expected to end before ``deadline``: the longest epoch
        of the same phase so far (with selection and evaluation) must fit."""
        phase = self.strategy.phase(epoch)
        seen = [r["time/epoch_seconds"] for r in self.history if r["phase"] == phase]
        if not seen:
            return time.monotonic() < deadline
        return time.monotonic() + max(seen) < deadline

    def check_resume(self) -> dict[str, Any] | None:
        """The run folder's checkpoint, or None (:func:`checkpoint.check_resume`)."""
        return checkpoint.check_resume(self.run)

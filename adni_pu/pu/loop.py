"""The epochs of a fit, for one run or a population of runs trained together.

:func:`run_epochs` is the loop of :meth:`adni_pu.pu.trainer.Trainer.fit` (one run) and of
:func:`adni_pu.pu.population.fit_population` (several): per epoch each run's strategy works
before training (Self-PU selects), one call trains the epoch of every run, then each run is
evaluated and recorded, through the runs' events (:data:`adni_pu.pu.run.EVENTS`). The
deadline of a run in pieces is kept here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from adni_pu.errors import ConfigError


@dataclass
class FitResult:
    """What :meth:`adni_pu.pu.trainer.Trainer.fit` leaves: the chosen model and the per-epoch history."""

    best_epoch: int
    best_candidate: str
    best_score: float
    history: list[dict[str, Any]]
    run_dir: Path | None
    complete: bool = True  # False when ``fit`` stopped at its deadline before the last epoch


class OutOfTime(Exception):
    """Raised inside an epoch that passes the deadline (its work is dropped)."""


class EpochRun(Protocol):
    """What the loop needs of one run (:class:`adni_pu.pu.trainer.Trainer` is one): its
    settings, the epoch it resumes from, and its hooks around each epoch."""

    @property
    def cfg(self) -> Any: ...

    @property
    def start_epoch(self) -> int: ...

    def fit_start(self) -> None: ...

    def fits_before(self, epoch: int, deadline: float) -> bool: ...

    def epoch_start(self, epoch: int) -> dict[str, Any]: ...

    def epoch_end(self, row: dict[str, Any], stats: dict[str, Any], t0: float,
                  t_select: float) -> None: ...

    def fit_end(self, complete: bool, paused: bool) -> FitResult: ...


EpochTrainer = Callable[[int, "float | None"], list[dict[str, Any]]]
"""(epoch, deadline) -> the statistics of each run's training pass in that epoch."""


def run_epochs(trainers: list[EpochRun], train: EpochTrainer, deadline: float | None = None,
               finish_first_epoch: bool = True) -> list[FitResult]:
    """The epochs of :meth:`Trainer.fit` for one run, or for a population trained together
    (:mod:`adni_pu.pu.population`): per epoch each run's strategy works before training,
    ``train`` trains every run, and each run is evaluated and recorded."""
    for t in trainers:
        t.fit_start()
    starts = sorted({t.start_epoch for t in trainers})
    if len(starts) > 1:
        raise ConfigError(f"population runs resume from different epochs {starts}: expected "
                          "all at the same epoch (train the late ones alone first)")
    complete, paused = True, False
    for epoch in range(starts[0], trainers[0].cfg.epochs):
        exempt = finish_first_epoch and epoch == starts[0]
        if deadline is not None and not exempt and not all(t.fits_before(epoch, deadline)
                                                           for t in trainers):
            complete, paused = False, True
            break
        t0 = time.perf_counter()
        rows, selects = [], []
        for t in trainers:
            rows.append(t.epoch_start(epoch))
            selects.append(time.perf_counter() - t0 - sum(selects))
        try:
            stats = train(epoch, None if exempt else deadline)
        except OutOfTime:
            complete = False
            break
        for t, row, st, t_select in zip(trainers, rows, stats, selects):
            t.epoch_end(row, st, t0, t_select)
    return [t.fit_end(complete, paused) for t in trainers]

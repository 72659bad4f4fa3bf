"""What a fit leaves behind, as recorders the trainer calls; the loop itself writes nothing.

Like MONAI's engine handlers: :class:`~adni_pu.pu.trainer.Trainer` calls every recorder's
``fit_start`` once before the first epoch, ``epoch_end`` after each finished epoch (with the
epoch's row of metrics) and ``fit_end`` when the last epoch is done (not when a deadline
stopped the fit early). :func:`run_folder_recorders` is the standard set for a run folder;
add a recorder (or pass your own list as ``Trainer(recorders=...)``) to record more.

Only the main process records (rank 0 under torchrun); recorders check ``trainer.is_main``.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from adni_pu import config as cfgmod
from adni_pu.fileio import atomic_write_text
from adni_pu.provenance import provenance
from adni_pu.pu import checkpoint


class Recorder:
    """Base recorder: every hook does nothing."""

    def fit_start(self, trainer: Any) -> None:
        """Before the first epoch of this fit (after a resume)."""

    def epoch_end(self, trainer: Any, row: dict[str, Any]) -> None:
        """After an epoch, with its row (already appended to ``trainer.history``)."""

    def fit_end(self, trainer: Any) -> None:
        """After the last epoch."""


class FolderRecorder(Recorder):
    """A recorder that writes into the run folder ``run_dir``."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir


class EpochLog(Recorder):
    """One line per epoch through ``trainer.log``: losses, validation score, time."""

    def epoch_end(self, trainer: Any, row: dict[str, Any]) -> None:
        if not trainer.is_main:
            return
        crit = trainer.cfg.val_criterion
        parts = [f"epoch {row['epoch'] + 1}/{trainer.cfg.epochs}", f"phase {row['phase']}"]
        for st in trainer.students:
            if f"train/{st.name}/loss" in row:
                parts.append(f"{st.name} loss {row[f'train/{st.name}/loss']:.4f}")
        parts.append(f"val {crit} {row['selected/score']:.4f} ({row['selected/candidate']})")
        tests = [v for k, v in row.items() if k.startswith("test_diagnostic/")]
        if tests:
            parts.append(f"test acc (diagnostic) {max(tests):.4f}")
        parts.append(f"{row['time/epoch_seconds']:.1f}s")
        trainer.log(" | ".join(parts))


class RunSettings(FolderRecorder):
    """``config.toml``, ``provenance.json`` and ``data.json`` at the start of the fit."""

    def fit_start(self, trainer: Any) -> None:
        if not trainer.is_main:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        cfgmod.save(trainer.cfg, self.run_dir / "config.toml")
        atomic_write_text(self.run_dir / "provenance.json",
                          json.dumps(provenance(), indent=2) + "\n")
        info = dict(trainer.data.info)
        info.update({"prior_used": trainer.prior, "prior_u": trainer.prior_u,
                     "n_labelled_entries": trainer.n_p, "n_unlabelled_entries": trainer.n_u})
        atomic_write_text(self.run_dir / "data.json", json.dumps(info, indent=2) + "\n")


class TensorBoard(FolderRecorder):
    """Every numeric value of each epoch's row as a scalar (``tensorboard/``), if installed."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.writer: Any = None

    def epoch_end(self, trainer: Any, row: dict[str, Any]) -> None:
        if not trainer.is_main:
            return
        if self.writer is None:
            with contextlib.suppress(ImportError):
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(self.run_dir / "tensorboard"))
        if self.writer is not None:
            for key, value in row.items():
                if isinstance(value, (int, float)) and key != "epoch" and not math.isnan(value):
                    self.writer.add_scalar(key, value, row["epoch"])
            self.writer.flush()

    def fit_end(self, trainer: Any) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class MetricsCsv(FolderRecorder):
    """``metrics.csv``: the whole history, rewritten after every epoch."""

    def epoch_end(self, trainer: Any, row: dict[str, Any]) -> None:
        if trainer.is_main:
            write_metrics_csv(trainer.history, self.run_dir / "metrics.csv")


class CheckpointSaver(FolderRecorder):
    """``checkpoints/last.pt`` after every epoch (resume) and ``best_model.pt`` at the end."""

    def epoch_end(self, trainer: Any, row: dict[str, Any]) -> None:
        if trainer.is_main:
            checkpoint.save_last(trainer, row["epoch"], self.run_dir / checkpoint.LAST)

    def fit_end(self, trainer: Any) -> None:
        if trainer.is_main and trainer.best["state"] is not None:
            checkpoint.save_selected(trainer, self.run_dir / checkpoint.SELECTED)


class SelectionSummary(FolderRecorder):
    """``selection.json``: the selection rule, the selected epoch and candidate, its score,
    the finalists' validation scores after the last epoch and their choice, seconds per
    phase."""

    def fit_end(self, trainer: Any) -> None:
        if not trainer.is_main:
            return
        best = trainer.best
        summary = {"selection": trainer.cfg.selection,
                   "best_epoch": best["epoch"], "best_candidate": best["candidate"],
                   "val_criterion": trainer.cfg.val_criterion, "val_score": best["score"],
                   "finalists": trainer.final,
                   "seconds_per_epoch_by_phase": seconds_by_phase(trainer.history)}
        atomic_write_text(self.run_dir / "selection.json", json.dumps(summary, indent=2) + "\n")


class TrainingPlots(FolderRecorder):
    """``curves.png`` and the trusted-set pictures (:func:`adni_pu.pu.plots.plot_training`)."""

    def fit_end(self, trainer: Any) -> None:
        if not trainer.is_main:
            return
        from adni_pu.pu.plots import plot_training

        plot_training(trainer.history, self.run_dir, trainer.cfg.val_criterion)


def run_folder_recorders(run_dir: Path | None) -> list[Recorder]:
    """The standard recorders: the epoch line, and with a run folder its files, in order."""
    if run_dir is None:
        return [EpochLog()]
    return [RunSettings(run_dir), EpochLog(), TensorBoard(run_dir), MetricsCsv(run_dir),
            CheckpointSaver(run_dir), SelectionSummary(run_dir), TrainingPlots(run_dir)]


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
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=keys)
    writer.writeheader()
    writer.writerows(history)
    atomic_write_text(path, buffer.getvalue())

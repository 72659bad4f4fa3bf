"""What a fit leaves behind, as recorders the trainer calls; the loop itself writes nothing.

Like MONAI's engine handlers: :class:`~adni_pu.pu.run.Trainer` calls every recorder's
``fit_start`` once before the first epoch, ``epoch_end`` after each finished epoch (with the
epoch's row of metrics), ``fit_end`` when the last epoch is done and ``fit_paused`` when a
deadline stopped the fit between two epochs. :func:`run_folder_recorders` is the standard
set for a run folder; add a recorder (or pass your own list as ``Trainer(recorders=...)``)
to record more.

Only the main process records (rank 0 under torchrun); recorders check ``run.is_main``.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from adni_pu import config as cfgmod
from adni_pu.fileio import atomic_write, atomic_write_text
from adni_pu.provenance import run_provenance
from adni_pu.pu import checkpoint
from adni_pu.pu.run import RunView


class Recorder:
    """Base recorder: every hook does nothing."""

    def fit_start(self, run: RunView) -> None:
        """Before the first epoch of this fit (after a resume)."""

    def epoch_end(self, run: RunView, row: dict[str, Any]) -> None:
        """After an epoch, with its row (already appended to ``run.state.history``)."""

    def fit_end(self, run: RunView) -> None:
        """After the last epoch."""

    def fit_paused(self, run: RunView) -> None:
        """When a time limit stopped the fit between two epochs (the state is the last
        finished epoch's; not called when an epoch was dropped midway)."""


class FolderRecorder(Recorder):
    """A recorder that writes into the run folder ``run_dir``."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir


class EpochLog(Recorder):
    """One line per epoch through ``run.log``: losses, validation score, time."""

    def epoch_end(self, run: RunView, row: dict[str, Any]) -> None:
        if not run.is_main:
            return
        crit = run.cfg.val_criterion
        parts = [f"epoch {row['epoch'] + 1}/{run.cfg.epochs}", f"phase {row['phase']}"]
        for st in run.state.students:
            if f"train/{st.name}/loss" in row:
                parts.append(f"{st.name} loss {row[f'train/{st.name}/loss']:.4f}")
        parts.append(f"val {crit} {row['selected/score']:.4f} ({row['selected/candidate']})")
        tests = [v for k, v in row.items() if k.startswith("test_diagnostic/")]
        if tests:
            parts.append(f"test acc (diagnostic) {max(tests):.4f}")
        parts.append(f"{row['time/epoch_seconds']:.1f}s")
        run.log(" | ".join(parts))


class RunSettings(FolderRecorder):
    """``config.toml``, ``provenance.json`` and ``data.json`` at the start of the fit
    (``provenance.json`` lists every piece of a resumed run with its machine:
    :func:`~adni_pu.provenance.run_provenance`)."""

    def fit_start(self, run: RunView) -> None:
        if not run.is_main:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        cfgmod.save(run.cfg, self.run_dir / "config.toml")
        path = self.run_dir / "provenance.json"
        previous = None
        if path.is_file():
            with contextlib.suppress(OSError, ValueError):
                previous = json.loads(path.read_text())
        record = run_provenance(previous, run.state.start_epoch)
        atomic_write_text(path, json.dumps(record, indent=2) + "\n")
        info = dict(run.data.info)
        info.update({"prior_used": run.prior, "prior_u": run.prior_u,
                     "n_labelled_entries": run.n_p, "n_unlabelled_entries": run.n_u})
        atomic_write_text(self.run_dir / "data.json", json.dumps(info, indent=2) + "\n")


class TensorBoard(FolderRecorder):
    """Every numeric value of each epoch's row as a scalar (``tensorboard/``), if installed."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.writer: Any = None

    def epoch_end(self, run: RunView, row: dict[str, Any]) -> None:
        if not run.is_main:
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

    def fit_end(self, run: RunView) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class MetricsCsv(FolderRecorder):
    """``metrics.csv``: one row appended per epoch.

    The file is written whole (atomically) at the first epoch of each fit and whenever a row
    brings a column the header lacks (a new phase's metrics). The first write of a resumed
    fit therefore drops the rows an interrupted run wrote after its last checkpoint, and a
    row torn by a crash in mid-append. The file always equals :func:`write_metrics_csv` of
    the history. A row is appended with one ``write()``, so a killed process leaves it
    whole or absent.
    """

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.columns: list[str] | None = None

    def fit_start(self, run: RunView) -> None:
        self.columns = None

    def epoch_end(self, run: RunView, row: dict[str, Any]) -> None:
        if not run.is_main:
            return
        path = self.run_dir / "metrics.csv"
        if self.columns is not None and set(row) <= set(self.columns) and path.is_file():
            line = io.StringIO()
            csv.DictWriter(line, fieldnames=self.columns).writerow(row)
            data = line.getvalue().encode()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            try:  # one write() call: a killed process leaves the row whole or absent
                whole = os.write(fd, data) == len(data)
            finally:
                os.close(fd)
            if whole:
                return
        self.columns = write_metrics_csv(run.state.history, path)  # also mends a short write


class CheckpointSaver(FolderRecorder):
    """``checkpoints/last.pt`` after every ``checkpoint_every``-th epoch, the last one and a
    pause at a time limit (resume), and ``best_model.pt`` at the end."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.saved_epoch: int | None = None

    def _save(self, run: RunView, epoch: int) -> None:
        if run.is_main and epoch != self.saved_epoch:
            checkpoint.save_last(run, epoch, self.run_dir / checkpoint.LAST)
            self.saved_epoch = epoch

    def epoch_end(self, run: RunView, row: dict[str, Any]) -> None:
        epoch = row["epoch"]
        if (epoch + 1) % run.cfg.checkpoint_every == 0 or epoch == run.cfg.epochs - 1:
            self._save(run, epoch)

    def fit_paused(self, run: RunView) -> None:
        if run.state.history:
            self._save(run, run.state.history[-1]["epoch"])

    def fit_end(self, run: RunView) -> None:
        if run.is_main and run.state.best["state"] is not None:
            checkpoint.save_selected(run, self.run_dir / checkpoint.SELECTED)


class ValidationLogits(FolderRecorder):
    """With ``record_val_logits``: ``val_logits/split.npz`` (the validation split's labelled
    mask, its unlabelled indices and the priors) once, and ``val_logits/epoch-NNNN.npz``
    (float32 logits of every evaluated model) after every epoch. With them a selection rule
    can be judged on one half of the validation split after choosing on the other
    (benchmarks/selection_rules.py, in git at d825906)."""

    def fit_start(self, run: RunView) -> None:
        if not (run.is_main and run.cfg.record_val_logits):
            return
        folder = self.run_dir / "val_logits"
        folder.mkdir(parents=True, exist_ok=True)
        val = run.data.val
        arrays = {"labelled": val.labelled,
                  "unlabelled": val.unlabelled_indices(run.data.scheme),
                  "prior": np.float64(run.prior), "prior_u": np.float64(run.prior_u)}
        atomic_write(folder / "split.npz", lambda tmp: _save_npz(tmp, arrays))

    def epoch_end(self, run: RunView, row: dict[str, Any]) -> None:
        if not (run.is_main and run.cfg.record_val_logits):
            return
        arrays = {name: np.asarray(v, dtype=np.float32)
                  for name, v in run.state.last_val_logits.items()}
        path = self.run_dir / "val_logits" / f"epoch-{row['epoch']:04d}.npz"
        atomic_write(path, lambda tmp: _save_npz(tmp, arrays))


def _save_npz(path: Path, arrays: dict[str, Any]) -> None:
    with path.open("wb") as fh:  # a file object: np.savez would append ".npz" to the name
        np.savez(fh, **arrays)


class SelectionSummary(FolderRecorder):
    """``selection.json``: the selection rule, the selected epoch and candidate, its score,
    the finalists' validation scores after the last epoch and their choice, seconds per
    phase."""

    def fit_end(self, run: RunView) -> None:
        if not run.is_main:
            return
        best = run.state.best
        summary = {"selection": run.cfg.selection,
                   "best_epoch": best["epoch"], "best_candidate": best["candidate"],
                   "val_criterion": run.cfg.val_criterion, "val_score": best["score"],
                   "finalists": run.state.final,
                   "seconds_per_epoch_by_phase": seconds_by_phase(run.state.history)}
        atomic_write_text(self.run_dir / "selection.json", json.dumps(summary, indent=2) + "\n")


class TrainingPlots(FolderRecorder):
    """``curves.png`` and the trusted-set pictures (:func:`adni_pu.pu.plots.plot_training`)."""

    def fit_end(self, run: RunView) -> None:
        if not run.is_main:
            return
        from adni_pu.pu.plots import plot_training

        plot_training(run.state.history, self.run_dir, run.cfg.val_criterion)


def run_folder_recorders(run_dir: Path | None) -> list[Recorder]:
    """The standard recorders: the epoch line, and with a run folder its files, in order."""
    if run_dir is None:
        return [EpochLog()]
    return [RunSettings(run_dir), EpochLog(), TensorBoard(run_dir), MetricsCsv(run_dir),
            ValidationLogits(run_dir), CheckpointSaver(run_dir), SelectionSummary(run_dir),
            TrainingPlots(run_dir)]


def seconds_by_phase(history: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean training seconds per epoch in each phase (selection included, evaluation not)."""
    out: dict[str, dict[str, float]] = {}
    for phase in sorted({int(r["phase"]) for r in history}):
        values = [r["time/train_seconds"] for r in history if r["phase"] == phase]
        out[f"phase{phase}"] = {"mean": float(np.mean(values)), "n": len(values)}
    return out


def write_metrics_csv(history: list[dict[str, Any]], path: Path) -> list[str]:
    """One row per epoch, every key a column in order of first appearance (atomic write).
    Returns the columns."""
    keys: list[str] = []
    for row in history:
        keys += [k for k in row if k not in keys]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=keys)
    writer.writeheader()
    writer.writerows(history)
    atomic_write_text(path, buffer.getvalue())
    return keys


NN_CORRECTION_SUFFIX = "/nn_correction"


def read_metrics_csv(path: Path) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.csv`` (values as written: strings; empty for missing)."""
    with Path(path).open(newline="") as handle:
        return list(csv.DictReader(handle))


def nn_correction_summary(history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Share of training batches where Kiryo's non-negative correction fired, from a history.

    ``history``: ``run.state.history`` or :func:`read_metrics_csv` rows; each epoch's
    ``train/<model>/nn_correction`` value is that epoch's share of batches. Returns the share
    over the whole run (mean over epochs and models: every epoch has the same number of
    batches), per phase, in the first and the last epoch, and the columns read; None when the
    loss has no correction (naive, uPU: no such column). Used by the evaluation report, the
    train command, the demo and the benchmark records.
    """
    columns = sorted({k for row in history for k in row if k.endswith(NN_CORRECTION_SUFFIX)})
    if not columns:
        return None
    per_epoch: list[tuple[int, float]] = []
    for row in history:
        values = [_number(row.get(c)) for c in columns]
        values = [v for v in values if not math.isnan(v)]
        if values:
            per_epoch.append((int(_number(row.get("phase", 1))), float(np.mean(values))))
    if not per_epoch:
        return None
    shares = [s for _, s in per_epoch]
    by_phase = {f"phase{p}": float(np.mean([s for q, s in per_epoch if q == p]))
                for p in sorted({p for p, _ in per_epoch})}
    return {"share": float(np.mean(shares)), "by_phase": by_phase, "first_epoch": shares[0],
            "last_epoch": shares[-1], "epochs": len(shares), "columns": columns}


def nn_correction_text(summary: dict[str, Any] | None, method: str | None = None) -> str:
    """One paragraph on :func:`nn_correction_summary`: the shares and what they mean
    (``method``: the run's, which names why a loss without the correction has none)."""
    if summary is None and method == "vpu":
        return ("Not applicable: VPU's variational loss reads no class prior and has no "
                "non-negative correction (no `train/<model>/nn_correction` column in "
                "metrics.csv).")
    if summary is None:
        return ("Not applicable: this run's loss has no non-negative correction (naive PN or "
                "uPU; no `train/<model>/nn_correction` column in metrics.csv).")

    def pct(v: float) -> str:
        return f"{100 * v:.1f} %"

    text = (f"The non-negative correction fired in {pct(summary['share'])} of training "
            f"batches over {summary['epochs']} epochs (first epoch {pct(summary['first_epoch'])}"
            f", last epoch {pct(summary['last_epoch'])}")
    if len(summary["by_phase"]) > 1:
        text += "; by phase: " + ", ".join(f"{p} {pct(v)}" for p, v in summary["by_phase"].items())
    text += f"; columns {', '.join(f'`{c}`' for c in summary['columns'])} of metrics.csv). "
    if summary["share"] == 0.0:
        return text + ("It never fired: the estimated negative risk never went below zero, so "
                       "the nnPU risk equalled the uPU risk throughout (uPU and nnPU with equal "
                       "settings give the same model).")
    return text + ("It fires when the estimated negative risk of a batch goes below zero; a "
                   "high share late in training means that happened often, i.e. the model was "
                   "overfitting the unlabelled set (fitting it as negatives), which the "
                   "correction then pushes back.")


def _number(value: Any) -> float:
    """A metrics value as a float (nan for empty or missing cells)."""
    if value is None or value == "":
        return float("nan")
    return float(value)

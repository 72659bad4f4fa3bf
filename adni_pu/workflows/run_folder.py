"""A training run's folder: its layout, and reading it back (settings, selected model, records).

``adni-pu train`` (:func:`adni_pu.workflows.train.train_volumes`) writes the folder;
``adni-pu evaluate``, ``predict`` and ``interpret`` read it through this module::

    RUN/
      volume_config.toml        resolved settings (rerun with --config RUN/volume_config.toml)
      run.json                  manifest path and sha256, prior and its source, counts, boxes
      splits.csv                subject_id, split, n_scans, pu_label, truth_known
      scans.csv                 the train and val scans: canonical subject id, resolved file,
                                sha256 (evaluate's leakage guard, adni_pu.cohort.leakage)
      hippocampus_boxes.json    the hippocampus boxes used by the data pipeline
      preprocess_config.toml    copy of the preprocessing settings of the volumes (if found)
      val_predictions.csv       the selected model on the validation scans
      config.toml, provenance.json, data.json, metrics.csv, tensorboard/, curves.png,
      checkpoints/last.pt, best_model.pt, selection.json     (the trainer's files)
      evaluation/<split>/       written by evaluate_run

Also here: the cohort manifest a run names (:func:`manifest_file`, :func:`load_manifest`),
whether a folder holds finished training (:func:`finished_work`) and scoring a volume
dataset with the selected model (:func:`score_dataset`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from adni_pu import config as cfgmod
from adni_pu.errors import VolumeRunError
from adni_pu.pu.config import TrainConfig
from adni_pu.workflows.volume_settings import VolumeTrainConfig, with_derived_values

#: The run folder's resolved settings (a :class:`VolumeTrainConfig` as TOML).
VOLUME_CONFIG_NAME = "volume_config.toml"


def manifest_file(manifest: str | Path) -> Path:
    """The manifest file that ``manifest`` names (resolved): the file itself, or a cohort
    folder's manifest.parquet or manifest.csv."""
    path = Path(manifest)
    if path.is_dir():
        for name in ("manifest.parquet", "manifest.csv"):
            if (path / name).is_file():
                return (path / name).resolve()
        raise VolumeRunError(f"{path}: no manifest.csv or manifest.parquet in this folder")
    if not path.is_file():
        raise VolumeRunError(f"manifest {path} not found")
    return path.resolve()


def load_manifest(path: Path) -> Any:
    """The cohort manifest at ``path`` (:func:`adni_pu.cohort.read_manifest`) with subject,
    session and split as text and a missing ``session_id`` as empty text."""
    from adni_pu.cohort import read_manifest

    frame = read_manifest(path)
    if "session_id" not in frame.columns:
        frame["session_id"] = ""
    frame["subject_id"] = frame["subject_id"].astype(str)
    frame["session_id"] = frame["session_id"].fillna("").astype(str)
    frame["split"] = frame["split"].astype(str)
    return frame


def finished_work(run_dir: Path) -> str:
    """What a run folder holds of finished training (``""`` when nothing): a checkpoint,
    a selected model or epoch rows in metrics.csv.

    A folder with none of them is the leftover of a run that failed before its first
    epoch ended; any rerun may reuse it (its files are rewritten), whatever its settings.
    """
    from adni_pu.pu.checkpoint import LAST

    found = [str(name) for name in (LAST, "best_model.pt") if (run_dir / name).exists()]
    metrics = run_dir / "metrics.csv"
    if metrics.is_file():
        with open(metrics, "rb") as handle:
            rows = sum(1 for line in handle if line.strip()) - 1
        if rows > 0:
            found.append(f"{rows} epoch row(s) in metrics.csv")
    return ", ".join(found)


def remove_unfinished_run(run_dir: Path) -> None:
    """After a failed train: remove the run folder's files when this command created the
    folder and no epoch finished, so the failure leaves nothing behind and a rerun starts
    clean. A folder that existed before the command is never removed (nor its files), and
    nor is one that holds finished work (:func:`finished_work`)."""
    import shutil

    from adni_pu.locking import LOCK_NAME, created_by_this_command

    if not run_dir.is_dir() or not created_by_this_command(run_dir) or finished_work(run_dir):
        return
    for entry in run_dir.iterdir():
        if entry.name.startswith(LOCK_NAME.removesuffix(".lock")):
            continue  # the lock's own file: released, with the empty folder, by the lock
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def load_run(run_dir: str | Path, device: str = "auto") -> tuple[VolumeTrainConfig, Any, dict]:
    """The run's settings, its selected model (eval mode) and run.json."""
    from adni_pu.models import build_model
    from adni_pu.pu.candidates import load_selected
    from adni_pu.pu.checkpoint import read_selected
    from adni_pu.pu.device_data import resolve_device

    run_dir = Path(run_dir)
    for name in (VOLUME_CONFIG_NAME, "best_model.pt", "run.json"):
        if not (run_dir / name).is_file():
            raise VolumeRunError(f"{run_dir}: not a finished training run ({name} missing); "
                                 "train with `adni-pu train` first")
    cfg = with_derived_values(cfgmod.load(VolumeTrainConfig, run_dir / VOLUME_CONFIG_NAME))
    saved = read_selected(run_dir / "best_model.pt")
    train_cfg = cfgmod.from_dict(TrainConfig, saved["config"])

    def factory() -> Any:
        return build_model(train_cfg.model, **train_cfg.model_args)

    model = load_selected(saved["state"], factory, resolve_device(device))
    info = read_run_json(run_dir / "run.json")
    return cfg, model, info


def read_run_json(path: Path) -> dict[str, Any]:
    """A run folder's JSON file, or a :class:`VolumeRunError` naming it when it is damaged."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise VolumeRunError(f"{path}: not valid JSON ({exc}); use a new run folder") from exc


def score_dataset(model: Any, dataset: Any, batch_size: int = 8) -> np.ndarray:
    """Logits of ``model`` (eval mode) for every item of a volume dataset, in order, through
    the trainer's one inference function (:meth:`DeviceData.predict_logits`)."""
    from adni_pu.data.volumes import collate_volumes
    from adni_pu.pu.device_data import DeviceData

    device = next(model.parameters()).device
    loader = DeviceData(device, batch_size=batch_size, collate=collate_volumes)
    return loader.predict_logits(model, dataset)

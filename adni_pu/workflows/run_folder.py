"""A training run's folder: the one owner of its layout, writing and reading it back.

Every name a run folder holds is declared in :data:`RUN_LAYOUT` with the command that
writes it (ClinicaDL's MapsManager is the model). ``adni-pu train``
(:func:`adni_pu.workflows.train.train_volumes`) writes its files through
:func:`write_run_start` and :func:`write_val_predictions`; the trainer's recorders
(:mod:`adni_pu.pu.recorders`, :mod:`adni_pu.pu.checkpoint`) write the training records;
``adni-pu evaluate``, ``predict`` and ``interpret`` read the folder through this module and
write only into their own sub-folders (:func:`evaluation_folder`, ``interpret-*/``,
``predictions/``)::

    RUN/
      volume_config.toml        resolved settings (rerun with --config RUN/volume_config.toml)
      run.json                  manifest path and sha256, prior and its source, counts, boxes
      splits.csv                subject_id, split, n_scans, pu_label, truth_known
      scans.csv                 the train and val scans: canonical subject id, resolved file,
                                sha256, image_key (evaluate's leakage guard,
                                adni_pu.cohort.leakage)
      hippocampus_boxes.json    the hippocampus boxes used by the data pipeline
      preprocess_config.toml    copy of the preprocessing settings of the volumes (if found)
      val_predictions.csv       the selected model on the validation scans
      config.toml, provenance.json, data.json, metrics.csv, tensorboard/, curves.png,
      checkpoints/last.pt, best_model.pt, selection.json     (the trainer's files)
      evaluation/<split>/       written by evaluate (the run's own manifest)
      evaluation/<stem>-<sha8>/<split>/   evaluate --manifest OTHER
      interpret-<split>-<method>/         interpret (its default output folder)
      predictions/preprocessed/           predict (raw scans preprocessed for the model)

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
from adni_pu import outputs
from adni_pu.errors import VolumeRunError
from adni_pu.fileio import atomic_write_text, sha256_file
from adni_pu.pu.config import TrainConfig
from adni_pu.workflows.volume_settings import VolumeTrainConfig, with_derived_values

#: The run folder's resolved settings (a :class:`VolumeTrainConfig` as TOML).
VOLUME_CONFIG_NAME = "volume_config.toml"
RUN_JSON = "run.json"
SPLITS = "splits.csv"
#: The train and val scans with their content hashes (:data:`adni_pu.cohort.leakage.RUN_RECORD`).
SCANS_RECORD = "scans.csv"
BOXES = "hippocampus_boxes.json"
PREPROCESS_CONFIG = "preprocess_config.toml"
VAL_PREDICTIONS = "val_predictions.csv"
SELECTED_MODEL = "best_model.pt"
SELECTION = "selection.json"
METRICS_CSV = "metrics.csv"
EVALUATION_DIR = "evaluation"
#: prior = "estimate": the P-vs-U classifier's own run folder inside the run folder.
PRIOR_ESTIMATE_DIR = "prior_estimate"
PREDICTIONS_DIR = "predictions"

_TRAINER = "train (the trainer's recorders, adni_pu.pu.recorders)"
#: Every name a run folder holds, with the command that writes it.
RUN_LAYOUT = outputs.Layout("train", "RUN", RUN_JSON, (
    outputs.Output(VOLUME_CONFIG_NAME, "train", "resolved settings"),
    outputs.Output(RUN_JSON, "train", "manifest and its sha256, prior, counts (the record)"),
    outputs.Output(SPLITS, "train", "per subject: split, scans, PU label, truth known"),
    outputs.Output(SCANS_RECORD, "train", "train and val scans with content hashes"),
    outputs.Output(BOXES, "train", "the hippocampus boxes of the data pipeline"),
    outputs.Output(PREPROCESS_CONFIG, "train", "the volumes' preprocessing settings"),
    outputs.Output(VAL_PREDICTIONS, "train", "the selected model on the validation scans"),
    outputs.Output(f"{PRIOR_ESTIMATE_DIR}/", "train", "prior = 'estimate': the P-vs-U classifier"),
    outputs.Output("prior_estimate.json", "train", "prior = 'estimate': the estimate"),
    *(outputs.Output(name, _TRAINER, what) for name, what in (
        ("config.toml", "the trainer's settings"),
        ("provenance.json", "machines and versions of every piece of the run"),
        ("data.json", "the PU data's counts"), (METRICS_CSV, "one row per epoch"),
        ("tensorboard/", "TensorBoard events"), ("curves.png", "training curves"),
        ("trusted_set.png", "Self-PU's trusted set"),
        ("checkpoints/", "last.pt: the last finished epoch (resume)"),
        (SELECTED_MODEL, "the selected model"), (SELECTION, "what chose it"),
        ("val_logits/", "per-epoch validation logits (record_val_logits)"))),
    outputs.Output(f"{EVALUATION_DIR}/", "evaluate", "one folder per split and manifest"),
    outputs.Output("interpret-*/", "interpret", "default output folders of interpret"),
    outputs.Output(f"{PREDICTIONS_DIR}/", "predict", "raw scans preprocessed for the model"),
))

#: The layouts whose record marks a folder as a training command's own, run folder first
#: (every command's: :mod:`adni_pu.workflows.output_registry`).
LAYOUTS: tuple[outputs.Layout, ...] = (RUN_LAYOUT, *outputs.FOLDER_LAYOUTS)


def claim_folder(folder: Path, command: str) -> None:
    """Refuse an output folder that holds another command's record (a run folder, an
    evaluation, interpret maps, a prior estimate, benchmark results): the one check of
    every command that writes an OUTPUT folder (:func:`adni_pu.outputs.claim_folder`)."""
    outputs.claim_folder(folder, command, LAYOUTS)


def write_run_start(out: Path, config: VolumeTrainConfig, per_subject: Any, seen: Any,
                    prep: Path | None, info: dict[str, Any]) -> None:
    """train's files before the fit: settings, boxes, ``splits.csv`` (``per_subject``), the
    leakage guard's record ``scans.csv`` (``seen``: the train and val scans), the volumes'
    preprocessing settings (``prep``, when found) and ``run.json`` (``info``), last, so a
    folder with a run.json has all of them."""
    from adni_pu.data.volume_boxes import save_hippocampus_boxes

    out.mkdir(parents=True, exist_ok=True)
    cfgmod.save(config, out / VOLUME_CONFIG_NAME)
    save_hippocampus_boxes(config.data, out / BOXES)
    atomic_write_text(out / SPLITS, per_subject.to_csv(index=False))
    atomic_write_text(out / SCANS_RECORD, seen.to_csv(index=False))
    if prep is not None:
        atomic_write_text(out / PREPROCESS_CONFIG, prep.read_text())
    atomic_write_text(out / RUN_JSON, json.dumps(info, indent=2) + "\n")


def write_val_predictions(out: Path, table: Any) -> Path:
    """``val_predictions.csv``: the selected model on the validation scans."""
    return atomic_write_text(out / VAL_PREDICTIONS, table.to_csv(index=False))


def evaluation_folder(run_dir: Path, split: str, manifest: Path, own_manifest: bool,
                      out: Path | None = None) -> Path:
    """Where evaluate writes: ``out`` when given; ``RUN/evaluation/<split>/`` for the run's
    own manifest (``own_manifest``: the same sha256); else
    ``RUN/evaluation/<manifest stem>-<sha256[:8]>/<split>/``, so evaluating another
    manifest never replaces the run's own test evaluation."""
    if out is not None:
        return Path(out)
    base = run_dir / EVALUATION_DIR
    if own_manifest:
        return base / split
    stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in manifest.stem)[:40]
    return base / f"{stem or 'manifest'}-{sha256_file(manifest)[:8]}" / split


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


PRIOR_ESTIMATE_DIR = "prior_estimate"
"""The class prior estimate's P-vs-U classifier: its own run folder inside the run folder
(:mod:`adni_pu.workflows.prior`)."""


def finished_work(run_dir: Path) -> str:
    """What a run folder holds of finished training (``""`` when nothing): a checkpoint
    (the run's, or its prior classifier's), a selected model or epoch rows in metrics.csv.

    A folder with none of them is the leftover of a run that failed before its first
    epoch ended; any rerun may reuse it (its files are rewritten), whatever its settings.
    """
    from adni_pu.pu.checkpoint import LAST

    found = [str(name) for name in (LAST, SELECTED_MODEL, f"{PRIOR_ESTIMATE_DIR}/{LAST}")
             if (run_dir / name).exists()]
    metrics = run_dir / METRICS_CSV
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
    for name in (VOLUME_CONFIG_NAME, SELECTED_MODEL, RUN_JSON):
        if not (run_dir / name).is_file():
            raise VolumeRunError(f"{run_dir}: not a finished training run ({name} missing); "
                                 "train with `adni-pu train` first")
    cfg = with_derived_values(cfgmod.load(VolumeTrainConfig, run_dir / VOLUME_CONFIG_NAME))
    saved = read_selected(run_dir / SELECTED_MODEL)
    train_cfg = cfgmod.from_dict(TrainConfig, saved["config"])

    def factory() -> Any:
        return build_model(train_cfg.model, **train_cfg.model_args)

    model = load_selected(saved["state"], factory, resolve_device(device))
    info = read_run_json(run_dir / RUN_JSON)
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


def read_scans_record(run_dir: Path) -> Any:
    """What the run trained and selected on, for the leakage guard: ``RUN/scans.csv``
    (split, ids, content hashes), or the subject ids of ``RUN/splits.csv`` for a run made
    before that record existed."""
    import pandas as pd

    if (run_dir / SCANS_RECORD).is_file():
        return pd.read_csv(run_dir / SCANS_RECORD, dtype=str, keep_default_na=False)
    splits = pd.read_csv(run_dir / SPLITS, dtype={"subject_id": str})
    return splits[["subject_id", "split"]]

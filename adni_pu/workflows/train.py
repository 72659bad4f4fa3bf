"""``adni-pu train``: train the Self-PU engine (or a baseline) on a cohort's MRI volumes.

:func:`train_volumes` reads a cohort manifest (``docs/cohort.md``), checks every scan and
the splits for leakage, builds the PU splits (:func:`build_pu_data`: labelled positives vs
unlabelled subjects, the ``censoring`` scheme: U holds the unlabelled subjects only),
trains with the one trainer (``adni_pu.pu.trainer``) and writes a run folder in the spirit
of ClinicaDL's (its layout: :mod:`adni_pu.workflows.run_folder`). The settings are a
:class:`~adni_pu.workflows.volume_settings.VolumeTrainConfig`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from adni_pu import config as cfgmod
from adni_pu.cohort.ids import scans_by_subject
from adni_pu.errors import ResumeError, VolumeRunError
from adni_pu.fileio import check_out_dir, sha256_file
from adni_pu.locking import holding_output_lock
from adni_pu.pu.metrics import sigmoid
from adni_pu.workflows.prior import volume_prior
from adni_pu.workflows.run_folder import (
    RUN_JSON,
    finished_work,
    read_run_json,
    remove_unfinished_run,
    write_run_start,
    write_val_predictions,
)
from adni_pu.workflows.volume_data import (
    build_pu_data,
    checked_manifest,
    find_preprocess_config,
    scan_paths,
)
from adni_pu.workflows.volume_settings import VolumeTrainConfig, with_derived_values


def _fingerprint(cfg: VolumeTrainConfig) -> dict[str, Any]:
    data = cfgmod.to_dict(cfg)
    for key in ("cache", "cache_dir", "cache_workers"):
        data["data"].pop(key, None)
    data.pop("bootstrap", None)
    data.pop("train", None)  # the trainer checks its own settings when resuming
    return data


@holding_output_lock("train", "out")  # one process per run folder (adni_pu.locking)
def train_volumes(manifest: str | Path, config: VolumeTrainConfig, out: str | Path,
                  log: Any = None) -> Any:
    """Train on the manifest's train split, select on val; write the run folder ``out``.

    Rerunning with the same settings resumes from ``out/checkpoints/last.pt``. A run that
    fails before its first epoch ends leaves no run folder (when it made the folder), and
    a folder with no finished epoch is reused by any rerun (:func:`finished_work`). Under
    torchrun (``WORLD_SIZE > 1``) every process trains its share and rank 0 writes.
    Returns the trainer's :class:`~adni_pu.pu.trainer.FitResult`.
    """
    from adni_pu import distributed

    config = with_derived_values(config)
    from adni_pu.pu.device_data import resolve_device

    resolve_device(config.train.device, "train.device")  # no GPU: one line, before any work

    if config.train.threads > 0:
        import torch

        torch.set_num_threads(config.train.threads)
    out = check_out_dir(out, "the run folder")
    mpath, frame, scans = checked_manifest(manifest, config)
    sha = sha256_file(mpath)
    previous = out / RUN_JSON
    if previous.is_file():
        old = read_run_json(previous)
        done = finished_work(out)
        if done and (old.get("manifest_sha256") != sha
                     or old.get("settings") != _fingerprint(config)):
            raise ResumeError(
                f"{out} holds a run of another manifest or other settings ({done}); use a new "
                "run folder (or delete this one). A run folder with no finished epoch (no "
                "checkpoint, no best_model.pt, no row in metrics.csv) is reused by any rerun")
    run = None
    if distributed.is_distributed_env():
        from adni_pu.pu.device_data import resolve_device

        cuda = resolve_device(config.train.device).type == "cuda"
        run = distributed.init_from_env("nccl" if cuda else "gloo")
    is_main = run is None or run.rank == 0
    try:
        return _train(frame, mpath, sha, scans, config, out, run, log)
    except BaseException:
        if is_main:
            remove_unfinished_run(out)
        raise


def _train(frame: Any, mpath: Path, sha: str, scans: Any, config: VolumeTrainConfig,
           out: Path, run: Any, log: Any) -> Any:
    """:func:`train_volumes` once its inputs are checked: write the run folder and fit."""
    import pandas as pd

    from adni_pu.cohort.files import positive_class_of
    from adni_pu.cohort.leakage import RECORD_COLUMNS
    from adni_pu.data.volumes import collate_volumes
    from adni_pu.pu.trainer import Trainer

    is_main = run is None or run.rank == 0
    if config.prior == "estimate" and run is not None:
        raise VolumeRunError("prior = 'estimate' under torchrun: expected one process "
                             "(estimate it first with `adni-pu prior`, then train with "
                             "--set prior=VALUE)")
    prior = volume_prior((mpath, frame, scans), config, out, log=log)
    if is_main and prior.note:
        (log or (lambda msg: print(msg, file=sys.stderr, flush=True)))(prior.note)
    data = build_pu_data(frame, mpath.parent, config, prior.value)
    trainer = Trainer(config.train, data, out, collate=collate_volumes, log=log,
                      distributed=run)
    trainer.check_resume()  # refuse other training settings before rewriting any file
    if is_main:
        per = scans_by_subject(frame).groupby("subject_id").agg(
            split=("split", "first"), n_scans=("scan_path", "size"),
            pu_label=("pu_label", "max"), truth_known=("truth", lambda t: bool(t.notna().any())))
        seen = scans[scans["split"].isin(["train", "val"])]  # for evaluate's leakage guard
        prep = find_preprocess_config(scan_paths(frame, mpath.parent))
        info = {"manifest": str(mpath), "manifest_sha256": sha, "preset": config.preset,
                "positive_class": positive_class_of(mpath),
                "prior": prior.record, "prior_estimate": prior.estimate,
                "settings": _fingerprint(config),
                "preprocess_config": str(prep) if prep is not None else None,
                "counts": {s: {"subjects": int(frame.loc[frame["split"] == s, "subject_id"]
                                              .nunique()),
                               "scans": int((frame["split"] == s).sum())}
                           for s in sorted(set(frame["split"]))}}
        write_run_start(out, config, per.reset_index(), seen[list(RECORD_COLUMNS)], prep,
                        info)
    fit = trainer.fit()
    if is_main:
        model = trainer.best_model()
        logits = trainer.predict_logits(model, data.val)  # type: ignore[arg-type]
        rows = frame[frame["split"] == "val"].reset_index(drop=True)
        write_val_predictions(out, pd.DataFrame({
            "subject_id": rows["subject_id"], "session_id": rows["session_id"],
            "scan_path": rows["scan_path"], "pu_label": rows["pu_label"],
            "truth": rows["truth"], "logit": logits,
            "probability": sigmoid(np.asarray(logits, dtype=np.float64)),
        }))
    if run is not None:
        run.barrier()
    return fit

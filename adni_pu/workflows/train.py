"""``adni-pu train``: train the Self-PU engine (or a baseline) on a cohort's MRI volumes.

:func:`train_volumes` reads a cohort manifest (``docs/cohort.md``), checks every scan and
the splits for leakage, builds the PU splits (:func:`build_pu_data`: labelled positives vs
unlabelled subjects, the ``censoring`` scheme: U holds the unlabelled subjects only),
trains with the one trainer (``adni_pu.pu.trainer``) and writes a run folder in the spirit
of ClinicaDL's (its layout: :mod:`adni_pu.workflows.run_folder`). The settings are a
:class:`~adni_pu.workflows.volume_settings.VolumeTrainConfig`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from adni_pu import config as cfgmod
from adni_pu.errors import ResumeError, VolumeRunError
from adni_pu.fileio import atomic_write_text, check_out_dir, sha256_file
from adni_pu.locking import holding_output_lock
from adni_pu.pu.metrics import sigmoid
from adni_pu.workflows.run_folder import (
    VOLUME_CONFIG_NAME,
    finished_work,
    load_manifest,
    manifest_file,
    read_run_json,
    remove_unfinished_run,
)
from adni_pu.workflows.volume_settings import VolumeTrainConfig, with_derived_values


def cohort_prior(manifest: Any) -> tuple[float, int, int]:
    """Amyloid-positive fraction among training subjects with known truth.

    Returns (prior, subjects with truth, subjects without truth) of the ``train`` split.
    """
    import pandas as pd

    train = manifest[manifest["split"] == "train"]
    per_subject = train.groupby("subject_id")["truth"].first()
    known = per_subject.dropna()
    n_unknown = int(per_subject.isna().sum())
    if known.empty:
        raise VolumeRunError("no training subject has a known truth, so the class prior "
                             "cannot come from the cohort; set it with --set prior=0.5")
    prior = float(pd.to_numeric(known).mean())
    return prior, int(len(known)), n_unknown


#: Methods whose loss reads no class prior, and selection criteria that read none.
PRIOR_FREE_METHODS = ("naive", "vpu")
PRIOR_FREE_CRITERIA = ("pu_auc", "variational", "pn_accuracy")


def reads_no_prior(cfg: VolumeTrainConfig) -> bool:
    """Whether neither the run's loss nor its model selection reads the class prior (then a
    cohort without truth trains with a placeholder prior, recorded as such)."""
    return (cfg.train.method in PRIOR_FREE_METHODS
            and cfg.train.val_criterion in PRIOR_FREE_CRITERIA)


def _has_truth(manifest: Any) -> bool:
    return bool(manifest.loc[manifest["split"] == "train", "truth"].notna().any())


def find_preprocess_config(scans: list[Path]) -> Path | None:
    """The preprocess_config.toml of the preprocessing run that wrote these volumes (beside
    one of the first scans or up to four folders above it), or None."""
    for scan in scans[:20]:
        for parent in list(scan.parents)[:4]:
            candidate = parent / "preprocess_config.toml"
            if candidate.is_file():
                return candidate
    return None


def scan_paths(frame: Any, base: Path) -> list[Path]:
    """The manifest rows' ``scan_path`` values as paths, relative ones taken from ``base``."""
    out = []
    for value in frame["scan_path"].astype(str):
        p = Path(value)
        out.append(p if p.is_absolute() else base / p)
    return out


# --------------------------------------------------------------------------- datasets


def _datasets(frame: Any, base: Path, cfg: VolumeTrainConfig, splits: tuple[str, ...]
              ) -> dict[str, Any]:
    from adni_pu.data.volumes import VolumeDataset, build_volume_dataset, check_all_items

    out: dict[str, Any] = {}
    for split in splits:
        augmented = split == "train"
        ds = build_volume_dataset(frame, split, cfg.data, train=augmented, base_dir=base)
        check_all_items(ds)  # every volume's input check before the run folder is made
        out[split] = ds
        if augmented:  # the same cached items, without augmentation, for scoring
            out["train_eval"] = VolumeDataset(ds.base, ds.frame, cfg.data, train=False)
    return out


def split_arrays(frame: Any, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The truth (nan where unknown) and the labelled mask of one split's scans, in order."""
    import pandas as pd

    rows = frame[frame["split"] == split].reset_index(drop=True)
    truth = pd.to_numeric(rows["truth"], errors="coerce").astype(float).to_numpy()
    labelled = pd.to_numeric(rows["pu_label"], errors="coerce").fillna(0).to_numpy() == 1
    return truth, labelled


def build_pu_data(frame: Any, base: Path, cfg: VolumeTrainConfig) -> tuple[Any, dict[str, Any]]:
    """PUData of the manifest's train and val splits (the test split is not loaded).

    Returns the data and a dict describing the prior (value, source, counts).
    """
    from adni_pu.data.pu import PUConstructionError, PUData, PUSplit, unlabelled_prior

    present = set(frame["split"])
    for split in ("train", "val"):
        if split not in present:
            raise VolumeRunError(f"manifest has no {split!r} rows; splits found: "
                                 f"{sorted(present)}")
    prior_info: dict[str, Any] = {}
    truth, labelled = split_arrays(frame, "train")
    prior_free = reads_no_prior(cfg)
    if cfg.prior == "cohort" and prior_free and not _has_truth(frame):
        from adni_pu.workflows.prior import placeholder_prior

        prior = placeholder_prior(cfg.scheme, int(labelled.sum()), len(labelled))
        prior_info = {"prior": prior, "source": "placeholder (the cohort has no truth; the "
                      "method and its model selection read no class prior)"}
    elif cfg.prior == "cohort":
        prior, n_known, n_unknown = cohort_prior(frame)
        prior_info = {"prior": prior, "source": "cohort: positive fraction (by the truth) of the "
                      "training subjects with known truth", "subjects_with_truth": n_known,
                      "subjects_without_truth": n_unknown}
    else:
        prior = float(cfg.prior)
        prior_info = {"prior": prior, "source": "setting"}
    if prior_free:
        prior_info["read_by_method"] = False
    if not 0.0 < prior < 1.0:
        raise VolumeRunError(f"class prior {prior:.3f} from the cohort: expected a value in "
                             "(0, 1); set it with --set prior=...")
    truth_v, labelled_v = split_arrays(frame, "val")
    if cfg.scheme == "censoring":
        try:
            unlabelled_prior(prior, len(truth), int(labelled.sum()), "censoring")
        except PUConstructionError as exc:
            raise VolumeRunError(
                f"{exc}. The class prior must exceed the labelled fraction of the training "
                f"scans ({labelled.mean():.3f}); set it with --set prior=...") from exc
    ds = _datasets(frame, base, cfg, ("train", "val"))
    train = PUSplit(ds["train"], truth, labelled, "train", eval_x=ds["train_eval"])
    val = PUSplit(ds["val"], truth_v, labelled_v, "val")
    info = {"n_train": len(train), "n_val": len(val), "n_labelled_train": int(labelled.sum()),
            "n_labelled_val": int(labelled_v.sum()), "prior": prior, "scheme": cfg.scheme,
            "test_loaded": False}
    try:
        # The test split is never read while training: the validation split stands in.
        data = PUData(train, val, val, prior, cfg.scheme, "volumes", info)  # type: ignore[arg-type]
    except PUConstructionError as exc:
        raise VolumeRunError(str(exc)) from exc
    return data, prior_info


# --------------------------------------------------------------------------- training


def _fingerprint(cfg: VolumeTrainConfig) -> dict[str, Any]:
    data = cfgmod.to_dict(cfg)
    for key in ("cache", "cache_dir", "cache_workers"):
        data["data"].pop(key, None)
    data.pop("bootstrap", None)
    data.pop("train", None)  # the trainer checks its own settings when resuming
    return data


def checked_manifest(manifest: str | Path, config: VolumeTrainConfig) -> tuple[Path, Any, Any]:
    """The manifest's path, its rows and its scan table (canonical ids, resolved files,
    hashes), once the train and val scans pass the checks made before any output is
    written: every scan's header (missing, a folder, not NIfTI, truncated, not 3D, not the
    grid; intensities are checked when the datasets are built) and the leakage guard (each
    subject, by canonical id, and each scan's content in one split)."""
    from adni_pu.cohort.leakage import check_manifest_leakage
    from adni_pu.data.integrity import check_volume_files

    mpath = manifest_file(manifest)
    frame = load_manifest(mpath)
    used = frame[frame["split"].isin(["train", "val"])]
    check_volume_files(scan_paths(used, mpath.parent), mpath,
                       config.data.grid_shape if config.data.check_grid else None)
    return mpath, frame, check_manifest_leakage(frame, mpath.parent, mpath)


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
    previous = out / "run.json"
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
        return _train(frame, mpath, sha, scans, config, out, run, log, previous)
    except BaseException:
        if is_main:
            remove_unfinished_run(out)
        raise


def _train(frame: Any, mpath: Path, sha: str, scans: Any, config: VolumeTrainConfig,
           out: Path, run: Any, log: Any, previous: Path) -> Any:
    """:func:`train_volumes` once its inputs are checked: write the run folder and fit."""
    import pandas as pd

    from adni_pu.cohort.leakage import RECORD_COLUMNS, RUN_RECORD
    from adni_pu.data.volume_boxes import save_hippocampus_boxes
    from adni_pu.data.volumes import collate_volumes
    from adni_pu.pu.trainer import Trainer

    is_main = run is None or run.rank == 0
    estimate = None
    if config.prior == "estimate":
        from adni_pu.workflows.prior import estimate_volume_prior

        if run is not None:
            raise VolumeRunError("prior = 'estimate' under torchrun: expected one process "
                                 "(estimate it first with `adni-pu prior`, then train with "
                                 "--set prior=VALUE)")
        estimate = estimate_volume_prior(frame, mpath.parent, config, out, log=log)
        config = dataclasses.replace(config, prior=estimate["value"])
    data, prior_info = build_pu_data(frame, mpath.parent, config)
    if estimate is not None:
        config = dataclasses.replace(config, prior="estimate")  # the setting, as given
        prior_info = {"prior": estimate["value"], "source": "estimate (prior_estimate.json)"}
    trainer = Trainer(config.train, data, out, collate=collate_volumes, log=log,
                      distributed=run)
    trainer.check_resume()  # refuse other training settings before rewriting any file
    if is_main:
        out.mkdir(parents=True, exist_ok=True)
        cfgmod.save(config, out / VOLUME_CONFIG_NAME)
        save_hippocampus_boxes(config.data, out / "hippocampus_boxes.json")
        per = frame.groupby("subject_id").agg(
            split=("split", "first"), n_scans=("scan_path", "size"),
            pu_label=("pu_label", "max"), truth_known=("truth", lambda t: bool(t.notna().any())))
        atomic_write_text(out / "splits.csv", per.reset_index().to_csv(index=False))
        seen = scans[scans["split"].isin(["train", "val"])]  # for evaluate's leakage guard
        atomic_write_text(out / RUN_RECORD, seen[list(RECORD_COLUMNS)].to_csv(index=False))
        prep = find_preprocess_config(scan_paths(frame, mpath.parent))
        if prep is not None:
            atomic_write_text(out / "preprocess_config.toml", prep.read_text())
        info = {"manifest": str(mpath), "manifest_sha256": sha, "preset": config.preset,
                "prior": prior_info, "prior_estimate": estimate,
                "settings": _fingerprint(config),
                "preprocess_config": str(prep) if prep is not None else None,
                "counts": {s: {"subjects": int(frame.loc[frame["split"] == s, "subject_id"]
                                              .nunique()),
                               "scans": int((frame["split"] == s).sum())}
                           for s in sorted(set(frame["split"]))}}
        atomic_write_text(previous, json.dumps(info, indent=2) + "\n")
    fit = trainer.fit()
    if is_main:
        model = trainer.best_model()
        logits = trainer.predict_logits(model, data.val)  # type: ignore[arg-type]
        rows = frame[frame["split"] == "val"].reset_index(drop=True)
        preds = pd.DataFrame({
            "subject_id": rows["subject_id"], "session_id": rows["session_id"],
            "scan_path": rows["scan_path"], "pu_label": rows["pu_label"],
            "truth": rows["truth"], "logit": logits,
            "probability": sigmoid(np.asarray(logits, dtype=np.float64)),
        })
        atomic_write_text(out / "val_predictions.csv", preds.to_csv(index=False))
    if run is not None:
        run.barrier()
    return fit

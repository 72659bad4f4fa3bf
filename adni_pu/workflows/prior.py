"""The class prior of a cohort without PET: estimated from its positive and unlabelled scans.

``prior = "estimate"`` (``adni-pu train --set prior='"estimate"'``) and ``adni-pu prior``
call :func:`estimate_volume_prior`:

1. a P-vs-U classifier, the run's own network and settings with ``method = "naive"`` (the
   labelled positives against every unlabelled scan), is trained on the training split and
   chosen by the P-vs-U AUC on validation, which needs no prior (``val_criterion =
   "pu_auc"``); its run folder is ``prior_estimate/`` inside the run folder, resumable;
2. it scores the validation split's labelled positives and unlabelled scans;
3. best-bin estimation (:mod:`adni_pu.pu.prior_estimate`) turns the scores into the
   positive fraction of the unlabelled scans and the class prior of the training split,
   with a bootstrap interval.

The test split is never read. Where the cohort has truth (amyloid PET), the positive
fraction it gives is recorded beside the estimate, for comparison only.

:func:`estimate_tensor_prior` does the same for tensor PU data (``adni-pu benchmark
--prior estimate`` on MNIST / CIFAR-10): the row's network and protocol settings as a naive
P-vs-U classifier trained for a short, fixed number of epochs (:data:`PRIOR_EPOCHS`), its
run folder ``prior_estimate/`` inside the seed's run folder. Both paths share
:func:`estimate_with_classifier` (fit, score validation, BBE, record).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from adni_pu.errors import ConfigError, ResumeError, VolumeRunError
from adni_pu.fileio import atomic_write_text, check_out_dir, sha256_file
from adni_pu.locking import holding_output_lock
from adni_pu.workflows.class_prior import (
    ClassPrior,
    check_estimable_counts,
    cohort_prior,
    placeholder_prior,
    reads_no_prior,
    resolve_prior,
)
from adni_pu.workflows.run_folder import PRIOR_ESTIMATE_DIR

if TYPE_CHECKING:  # torch and the volume pipeline load only when an estimate is made
    from adni_pu.data.pu import PUData
    from adni_pu.pu.config import TrainConfig
    from adni_pu.workflows.volume_settings import VolumeTrainConfig

ESTIMATE_DIR = PRIOR_ESTIMATE_DIR
"""The P-vs-U classifier's run folder inside the run folder."""
RECORD_NAME = "prior_estimate.json"
INPUTS_NAME = "inputs.json"
"""The classifier's inputs (manifest, scans, settings) in its run folder: a rerun resumes
only from a classifier of the same inputs (:func:`check_classifier_inputs`)."""
PRIOR_EPOCHS: dict[str, int] = {"mnist": 5, "cifar10": 3}
"""Epochs of the benchmark's P-vs-U classifier per data set (``--prior-epochs``): the fewest
reaching the smallest mean error of the estimate against the validation split's truth, on
tuning seeds that no reported result uses (MNIST: the whole training split; CIFAR-10: a CPU
subset of 1,500 images, not tuned on the whole split; benchmarks/results/
prior-estimation-tuning-log.md). The classifier keeps its best validation P-vs-U AUC
within these epochs, so a longer run mainly costs time."""


def naive_pu_auc(train: TrainConfig) -> TrainConfig:
    """``train`` as the P-vs-U classifier: naive PN chosen by the P-vs-U AUC on validation
    (which needs no prior), the data's placeholder prior
    (:func:`adni_pu.workflows.class_prior.placeholder_prior`)."""
    return dataclasses.replace(train, method="naive", val_criterion="pu_auc",
                               selection="best_epoch", prior=None)


def classifier_settings(config: VolumeTrainConfig) -> VolumeTrainConfig:
    """The P-vs-U classifier's settings: the run's, as naive PN chosen by the P-vs-U AUC."""
    return dataclasses.replace(config, preset="naive", train=naive_pu_auc(config.train))


def tensor_classifier_config(train: TrainConfig, epochs: int) -> TrainConfig:
    """The benchmark's P-vs-U classifier: the row's network, optimiser, batches and
    augmentation (:func:`naive_pu_auc`) for ``epochs`` epochs, blind to every truth (no
    test tracking, no PN validation) and with the Self-PU / VPU settings at their defaults
    (a naive run ignores them), so every row of a seed trains the same classifier."""
    from adni_pu.pu.config import SelfPUConfig, VPUConfig

    if epochs < 1:
        raise ConfigError(f"prior estimate epochs {epochs}: expected at least 1")
    blind = dataclasses.replace(train, epochs=epochs, track_test=False, pn_validation=False,
                                record_val_logits=False, selfpu=SelfPUConfig(),
                                vpu=VPUConfig())
    return naive_pu_auc(blind)


def _split_prior_free(frame: Any, base: Path, config: VolumeTrainConfig) -> Any:
    """PU data of the train and val splits for the naive classifier (which uses no prior):
    built with alpha = 1/2 as a placeholder prior of the unlabelled scans."""
    from adni_pu.workflows.volume_data import build_pu_data, split_arrays

    _, labelled = split_arrays(frame, "train")
    placeholder = placeholder_prior(config.scheme, int(labelled.sum()), len(labelled))
    return build_pu_data(frame, base, config, placeholder)


def prior_free_data(data: PUData) -> PUData:
    """The train and val splits of tensor PU data for the P-vs-U classifier: the
    placeholder prior, the validation split standing in for the test split (so nothing
    reads the test split), and none of the construction's truth in ``info``."""
    from adni_pu.data.pu import PUData

    train = data.train
    prior = placeholder_prior(data.scheme, int(train.labelled.sum()), len(train))
    keep = ("n_labelled", "n_labelled_train", "n_labelled_val", "n_train", "n_val",
            "scheme", "val_fraction", "seed", "source", "train_limit", "positive_classes")
    info = {k: data.info[k] for k in keep if k in data.info}
    info.update(prior=prior, prior_source="placeholder: naive training uses no prior",
                test_loaded=False)
    return PUData(train, data.val, data.val, prior, data.scheme, data.name, info)


def estimate_with_classifier(trainer: Any, out: Path, truth: dict[str, Any],
                             n_bootstrap: int = 1000, deadline: float | None = None,
                             finish_first_epoch: bool = True) -> dict[str, Any] | None:
    """Fit ``trainer`` (a naive P-vs-U classifier whose run folder is ``out /
    ESTIMATE_DIR``; resumes from its checkpoint), score its validation split's labelled
    positives and unlabelled examples with the chosen model, and turn them into the class
    prior of its training split by BBE. Writes and returns the record (``truth``: fields
    recorded beside the estimate for comparison only, e.g. ``true_prior``); None when
    ``deadline`` stopped the fit first (fit again to continue)."""
    from adni_pu import config as cfgmod
    from adni_pu.pu.metrics import roc_auc
    from adni_pu.pu.prior_estimate import estimate_prior

    data = trainer.data
    val = data.val
    u = val.unlabelled_indices(data.scheme)
    check_estimable_counts(int(val.labelled.sum()), len(u),
                           "scans" if data.name == "volumes" else "examples")
    fit = trainer.fit(deadline, finish_first_epoch)
    if not fit.complete:
        return None
    logits = trainer.predict_logits(trainer.best_model(), val)
    train = data.train
    estimate = estimate_prior(logits[val.labelled], logits[u], data.scheme,
                              int(train.labelled.sum()), len(train), n_bootstrap,
                              seed=trainer.cfg.seed)
    record: dict[str, Any] = {
        **estimate.record(),
        "classifier": {"run": ESTIMATE_DIR, "method": "naive",
                       "val_pu_auc": roc_auc(
                           np.concatenate([logits[val.labelled], logits[u]]),
                           np.r_[np.ones(int(val.labelled.sum())), np.zeros(len(u))]),
                       "epochs": trainer.cfg.epochs, "selected_epoch": fit.best_epoch,
                       "config": cfgmod.to_dict(trainer.cfg)},
        "scheme": data.scheme, "split": "val", **truth}
    atomic_write_text(out / RECORD_NAME, json.dumps(record, indent=2) + "\n")
    return record


def classifier_inputs(manifest: Path, scans: Any, config: VolumeTrainConfig) -> dict[str, Any]:
    """What a volume prior estimate's classifier is trained on, by content: the manifest's
    SHA-256, a SHA-256 over its train and val scans (split, canonical subject, file
    SHA-256, from the leakage guard's scan table) and the classifier's settings (without
    the cache's, which change no number)."""
    import hashlib

    from adni_pu import config as cfgmod

    used = scans[scans["split"].isin(["train", "val"])]
    rows = sorted(f"{r.split},{r.canonical_id},{r.sha256}" for r in used.itertuples())
    settings = cfgmod.to_dict(classifier_settings(config))
    for key in ("cache", "cache_dir", "cache_workers"):
        settings["data"].pop(key, None)
    settings.pop("bootstrap", None)
    return {"manifest_sha256": sha256_file(manifest),
            "scans_sha256": hashlib.sha256("\n".join(rows).encode()).hexdigest(),
            "n_scans": len(rows), "settings": settings}


def check_classifier_inputs(run_dir: Path, inputs: dict[str, Any]) -> None:
    """Refuse, in one line, to resume a prior estimate's classifier (``run_dir``) trained on
    other inputs (:func:`classifier_inputs`), or whose inputs were not recorded; then
    record ``inputs`` there. A folder without a finished epoch is reused.

    Refused rather than retrained: the folder may hold the classifier the user meant to
    keep (another cohort's estimate), and only they can say it may be deleted."""
    from adni_pu.workflows.run_folder import finished_work

    path = run_dir / INPUTS_NAME
    done = finished_work(run_dir) if run_dir.is_dir() else ""
    if done:
        old = json.loads(path.read_text()) if path.is_file() else None
        if old != inputs:
            what = ("another manifest" if old and old.get("manifest_sha256")
                    != inputs["manifest_sha256"] else "other scans" if old and
                    old.get("scans_sha256") != inputs["scans_sha256"] else
                    "other settings" if old else "unrecorded inputs")
            raise ResumeError(
                f"{run_dir} holds a prior estimate's classifier trained on {what} ({done}); "
                "use a new output folder (or delete that folder to retrain)")
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(inputs, indent=2) + "\n")


def estimate_volume_prior(frame: Any, base: Path, config: VolumeTrainConfig, out: Path,
                          inputs: dict[str, Any], log: Any = None, n_bootstrap: int = 1000
                          ) -> dict[str, Any]:
    """Estimate the class prior of the manifest ``frame``'s training split (module
    docstring); the classifier's run folder is ``out / "prior_estimate"`` (resumed only
    from the same ``inputs``, :func:`classifier_inputs`) and the record ``out /
    "prior_estimate.json"``. Its epoch lines start "prior classifier:". Returns the record:
    ``value``, ``ci_low``, ``ci_high``, ``method``, the counts, and ``true_prior`` where
    the cohort has truth."""
    import sys

    from adni_pu.data.volumes import collate_volumes
    from adni_pu.pu.trainer import Trainer
    from adni_pu.workflows.volume_data import split_arrays

    settings = classifier_settings(config)
    _, labelled_v = split_arrays(frame, "val")  # refuse too few before any training
    n_u = len(labelled_v) - int(labelled_v.sum()) if config.scheme == "censoring" \
        else len(labelled_v)
    check_estimable_counts(int(labelled_v.sum()), n_u)
    data = _split_prior_free(frame, base, settings)
    try:
        truth: dict[str, Any] = {"true_prior": cohort_prior(frame)[0]}
    except VolumeRunError:
        truth = {"true_prior": None}  # no truth in this cohort: nothing to compare with
    check_classifier_inputs(out / ESTIMATE_DIR, inputs)
    base_log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    trainer = Trainer(settings.train, data, out / ESTIMATE_DIR, collate=collate_volumes,
                      log=lambda msg: base_log(f"prior classifier: {msg}"))
    record = estimate_with_classifier(trainer, out, truth, n_bootstrap)
    assert record is not None  # no deadline: the fit always completes
    return record


def volume_prior(checked: tuple[Path, Any, Any], config: VolumeTrainConfig, out: Path,
                 log: Any = None) -> ClassPrior:
    """The class prior of a run on the checked manifest ``checked`` (its path, rows and
    scan table: :func:`adni_pu.workflows.volume_data.checked_manifest`) with ``config``
    (:func:`adni_pu.workflows.class_prior.resolve_prior`; an estimate in ``out``)."""
    from adni_pu.workflows.volume_data import split_arrays

    mpath, frame, scans = checked

    def truth() -> tuple[float, dict[str, Any]]:
        value, known, unknown = cohort_prior(frame)
        return value, {"subjects_with_truth": known, "subjects_without_truth": unknown}

    def placeholder() -> float:
        _, labelled = split_arrays(frame, "train")
        return placeholder_prior(config.scheme, int(labelled.sum()), len(labelled))

    def estimate() -> dict[str, Any]:
        return estimate_volume_prior(frame, mpath.parent, config, out,
                                     classifier_inputs(mpath, scans, config), log=log,
                                     n_bootstrap=max(config.bootstrap, 1))

    resolved = resolve_prior(config.prior, truth=truth, estimate=estimate,
                             placeholder=placeholder,
                             reads_prior=not reads_no_prior(config.train.method,
                                                            config.train.val_criterion))
    assert resolved is not None  # no deadline: an estimate always completes
    return resolved


def estimate_tensor_prior(data: PUData, train: TrainConfig, out: Path, epochs: int,
                          truth: dict[str, Any], log: Any = None, n_bootstrap: int = 1000,
                          deadline: float | None = None, finish_first_epoch: bool = True
                          ) -> tuple[dict[str, Any] | None, bool]:
    """Estimate the class prior of tensor PU data's training split (``adni-pu benchmark
    --prior estimate``): :func:`tensor_classifier_config` of ``train`` for ``epochs``
    epochs on :func:`prior_free_data`, run folder ``out / "prior_estimate"``, record
    ``out / "prior_estimate.json"``. Returns (the record, or None when ``deadline`` stopped
    the classifier first; whether this call trained any of its epochs)."""
    from adni_pu.pu.trainer import Trainer

    settings = tensor_classifier_config(train, epochs)
    trainer = Trainer(settings, prior_free_data(data), out / ESTIMATE_DIR, log=log)
    record = estimate_with_classifier(trainer, out, truth, n_bootstrap, deadline,
                                      finish_first_epoch)
    # resumed at start_epoch; each epoch trained in this call added a history row
    return record, len(trainer.state.history) > trainer.state.start_epoch


@holding_output_lock("prior", "out")  # one process per output folder (adni_pu.locking)
def estimate_manifest_prior(manifest: str | Path, config: VolumeTrainConfig, out: str | Path,
                            log: Any = None) -> dict[str, Any]:
    """``adni-pu prior``: check the manifest's train and val scans as ``adni-pu train``
    does, then :func:`estimate_volume_prior` into the folder ``out`` (rerun: the classifier
    resumes from its checkpoint when it was trained on the same inputs). Returns the
    record, which :func:`~adni_pu.workflows.class_prior.collapse_reason` may call not
    estimable. Holds the lock of ``out`` and refuses a folder that holds another command's
    outputs (a run folder, an evaluation)."""
    from adni_pu.workflows.run_folder import claim_folder
    from adni_pu.workflows.volume_data import checked_manifest
    from adni_pu.workflows.volume_settings import with_derived_values

    config = with_derived_values(config)
    out = check_out_dir(out, "the output folder")
    claim_folder(out, "prior")
    mpath, frame, scans = checked_manifest(manifest, config)
    out.mkdir(parents=True, exist_ok=True)
    return estimate_volume_prior(frame, mpath.parent, config, out,
                                 classifier_inputs(mpath, scans, config), log=log,
                                 n_bootstrap=max(config.bootstrap, 1))

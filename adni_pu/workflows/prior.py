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

from adni_pu.errors import ConfigError, VolumeRunError
from adni_pu.fileio import atomic_write_text, check_out_dir
from adni_pu.locking import holding_output_lock

if TYPE_CHECKING:  # torch and the volume pipeline load only when an estimate is made
    from adni_pu.data.pu import PUData
    from adni_pu.pu.config import TrainConfig
    from adni_pu.workflows.volume_settings import VolumeTrainConfig

ESTIMATE_DIR = "prior_estimate"
"""The P-vs-U classifier's run folder inside the run folder."""
RECORD_NAME = "prior_estimate.json"
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
    (:func:`adni_pu.workflows.volume_data.placeholder_prior`)."""
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
    from adni_pu.workflows.volume_data import build_pu_data, placeholder_prior, split_arrays

    _, labelled = split_arrays(frame, "train")
    placeholder = placeholder_prior(config.scheme, int(labelled.sum()), len(labelled))
    data, _ = build_pu_data(frame, base, dataclasses.replace(config, prior=placeholder))
    return data


def prior_free_data(data: PUData) -> PUData:
    """The train and val splits of tensor PU data for the P-vs-U classifier: the
    placeholder prior, the validation split standing in for the test split (so nothing
    reads the test split), and none of the construction's truth in ``info``."""
    from adni_pu.data.pu import PUData
    from adni_pu.workflows.volume_data import placeholder_prior

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
    if not val.labelled.any() or len(u) == 0:
        raise VolumeRunError(
            f"the validation split holds {int(val.labelled.sum())} labelled positive and "
            f"{len(u)} unlabelled examples: estimating the prior needs both")
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


def estimate_volume_prior(frame: Any, base: Path, config: VolumeTrainConfig, out: Path,
                          log: Any = None, n_bootstrap: int = 1000) -> dict[str, Any]:
    """Estimate the class prior of the manifest ``frame``'s training split (module
    docstring); the classifier's run folder is ``out / "prior_estimate"`` and the record
    ``out / "prior_estimate.json"``. Returns the record: ``value``, ``ci_low``,
    ``ci_high``, ``method``, the counts, and ``true_prior`` where the cohort has truth."""
    from adni_pu.data.volumes import collate_volumes
    from adni_pu.pu.trainer import Trainer
    from adni_pu.workflows.volume_data import cohort_prior

    settings = classifier_settings(config)
    data = _split_prior_free(frame, base, settings)
    try:
        truth: dict[str, Any] = {"true_prior": cohort_prior(frame)[0]}
    except VolumeRunError:
        truth = {"true_prior": None}  # no truth in this cohort: nothing to compare with
    trainer = Trainer(settings.train, data, out / ESTIMATE_DIR, collate=collate_volumes,
                      log=log)
    record = estimate_with_classifier(trainer, out, truth, n_bootstrap)
    assert record is not None  # no deadline: the fit always completes
    return record


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
    return record, len(trainer.history) > trainer.start_epoch


@holding_output_lock("prior", "out")  # one process per output folder (adni_pu.locking)
def estimate_manifest_prior(manifest: str | Path, config: VolumeTrainConfig, out: str | Path,
                            log: Any = None) -> dict[str, Any]:
    """``adni-pu prior``: check the manifest's train and val scans as ``adni-pu train``
    does, then :func:`estimate_volume_prior` into the folder ``out`` (rerun: the classifier
    resumes from its checkpoint). Returns the record. Holds the lock of ``out`` and refuses
    a folder that holds another command's outputs (a run folder, an evaluation)."""
    from adni_pu.workflows.run_folder import claim_folder
    from adni_pu.workflows.volume_data import checked_manifest
    from adni_pu.workflows.volume_settings import with_derived_values

    config = with_derived_values(config)
    out = check_out_dir(out, "the output folder")
    claim_folder(out, "prior")
    mpath, frame, _ = checked_manifest(manifest, config)
    out.mkdir(parents=True, exist_ok=True)
    return estimate_volume_prior(frame, mpath.parent, config, out, log=log,
                                 n_bootstrap=max(config.bootstrap, 1))


def summary_line(record: dict[str, Any]) -> str:
    """The estimate in one line, beside the cohort's truth where it has one."""
    text = (f"class prior estimate {record['value']:.3f} [95 % CI {record['ci_low']:.3f}, "
            f"{record['ci_high']:.3f}] ({record['method']}, from {record['n_positive']} "
            f"labelled and {record['n_unlabelled']} unlabelled validation scans")
    truth = record.get("true_prior")
    return text + ("); " + (f"positive fraction by the cohort's truth: {truth:.3f}"
                            if truth is not None else "the cohort has no truth to compare"))

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
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from adni_pu.errors import VolumeRunError
from adni_pu.fileio import atomic_write_text, check_out_dir
from adni_pu.locking import holding_output_lock
from adni_pu.workflows.volume_settings import VolumeTrainConfig

ESTIMATE_DIR = "prior_estimate"
"""The P-vs-U classifier's run folder inside the run folder."""
RECORD_NAME = "prior_estimate.json"


def classifier_settings(config: VolumeTrainConfig) -> VolumeTrainConfig:
    """The P-vs-U classifier's settings: the run's, as naive PN chosen by the P-vs-U AUC."""
    train = dataclasses.replace(config.train, method="naive", val_criterion="pu_auc",
                                selection="best_epoch", prior=None)
    return dataclasses.replace(config, preset="naive", train=train)


def _split_prior_free(frame: Any, base: Path, config: VolumeTrainConfig) -> Any:
    """PU data of the train and val splits for the naive classifier (which uses no prior):
    built with alpha = 1/2 as a placeholder prior of the unlabelled scans."""
    from adni_pu.pu.prior_estimate import prior_from_alpha
    from adni_pu.workflows.train import build_pu_data, split_arrays

    _, labelled = split_arrays(frame, "train")
    placeholder = prior_from_alpha(0.5, config.scheme,  # type: ignore[arg-type]
                                   int(labelled.sum()), len(labelled))
    data, _ = build_pu_data(frame, base, dataclasses.replace(config, prior=placeholder))
    return data


def estimate_volume_prior(frame: Any, base: Path, config: VolumeTrainConfig, out: Path,
                          log: Any = None, n_bootstrap: int = 1000) -> dict[str, Any]:
    """Estimate the class prior of the manifest ``frame``'s training split (module
    docstring); the classifier's run folder is ``out / "prior_estimate"`` and the record
    ``out / "prior_estimate.json"``. Returns the record: ``value``, ``ci_low``,
    ``ci_high``, ``method``, the counts, and ``true_prior`` where the cohort has truth."""
    from adni_pu.data.volumes import collate_volumes
    from adni_pu.pu.metrics import roc_auc
    from adni_pu.pu.prior_estimate import estimate_prior
    from adni_pu.pu.trainer import Trainer
    from adni_pu.workflows.train import cohort_prior

    settings = classifier_settings(config)
    data = _split_prior_free(frame, base, settings)
    val = data.val
    u = val.unlabelled_indices(data.scheme)
    if not val.labelled.any() or len(u) == 0:
        raise VolumeRunError(
            f"the validation split holds {int(val.labelled.sum())} labelled positive and "
            f"{len(u)} unlabelled scans: estimating the prior needs both")
    trainer = Trainer(settings.train, data, out / ESTIMATE_DIR, collate=collate_volumes,
                      log=log)
    trainer.fit()
    logits = trainer.predict_logits(trainer.best_model(), val)  # type: ignore[arg-type]
    train = data.train
    estimate = estimate_prior(logits[val.labelled], logits[u], data.scheme,  # type: ignore[arg-type]
                              int(train.labelled.sum()), len(train), n_bootstrap,
                              seed=settings.train.seed)
    record: dict[str, Any] = {
        **estimate.record(),
        "classifier": {"run": ESTIMATE_DIR, "method": "naive",
                       "val_pu_auc": roc_auc(
                           np.concatenate([logits[val.labelled], logits[u]]),
                           np.r_[np.ones(int(val.labelled.sum())), np.zeros(len(u))])},
        "scheme": data.scheme, "split": "val"}
    try:
        record["true_prior"] = cohort_prior(frame)[0]
    except VolumeRunError:
        record["true_prior"] = None  # no truth in this cohort: nothing to compare with
    atomic_write_text(out / RECORD_NAME, json.dumps(record, indent=2) + "\n")
    return record


@holding_output_lock("prior", "out")  # one process per output folder (adni_pu.locking)
def estimate_manifest_prior(manifest: str | Path, config: VolumeTrainConfig, out: str | Path,
                            log: Any = None) -> dict[str, Any]:
    """``adni-pu prior``: check the manifest's train and val scans as ``adni-pu train``
    does, then :func:`estimate_volume_prior` into the folder ``out`` (rerun: the classifier
    resumes from its checkpoint). Returns the record."""
    from adni_pu.workflows.train import checked_manifest
    from adni_pu.workflows.volume_settings import with_derived_values

    config = with_derived_values(config)
    out = check_out_dir(out, "the output folder")
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

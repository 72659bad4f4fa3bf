"""``adni-pu evaluate``: the run's selected model on a split it never saw, with 95 % CIs.

:func:`evaluate_run` scores every scan of the split, averages each subject's probabilities,
bootstraps subjects for 95 % CIs, draws the ROC curve and writes ``RUN/evaluation/<split>/``
(metrics.json, predictions_scans.csv, predictions_subjects.csv, roc.png, report.md). It
refuses any subject (by canonical id) of the run's training or validation split, and any
scan whose content was there under another id (``LeakageError``, from the run's record
``RUN/scans.csv``; :mod:`adni_pu.cohort.leakage`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from adni_pu import config as cfgmod
from adni_pu.cohort.ids import scans_by_subject
from adni_pu.errors import VolumeRunError
from adni_pu.fileio import atomic_write_text, check_out_dir, sha256_file
from adni_pu.pu.metrics import METRIC_LABELS, PU_METRICS, format_ci, logit, sigmoid
from adni_pu.pu.plots import roc_plot
from adni_pu.workflows.run_folder import (
    METRICS_CSV,
    SCANS_RECORD,
    SELECTION,
    SPLITS,
    VAL_PREDICTIONS,
    claim_folder,
    evaluation_folder,
    load_manifest,
    load_run,
    manifest_file,
    read_scans_record,
    score_dataset,
)
from adni_pu.workflows.volume_settings import VolumeTrainConfig

METRICS = ("accuracy", "balanced_accuracy", "auc", "sensitivity", "specificity")
METRIC_NAMES = {**METRIC_LABELS,
                "hidden_auc": "hidden AUC (hidden positives vs unlabelled negatives)",
                "all_negative_accuracy": "reference: all-negative accuracy",
                "all_positive_accuracy": "reference: all-positive accuracy"}
#: What a report shows: accuracy (the paper's number) first, then the PU task's metrics
#: (hidden-positive recall and AUC, the all-negative and all-positive accuracies).
REPORT_METRICS = METRICS + PU_METRICS


def evaluate_run(run_dir: str | Path, split: str = "test", manifest: str | Path | None = None,
                 device: str = "auto", n_boot: int | None = None,
                 out: str | Path | None = None) -> dict[str, Any]:
    """Metrics of the run's selected model on ``split`` with subject-bootstrap 95 % CIs.

    ``manifest`` defaults to the one the run was trained on. Refuses (``LeakageError``)
    when a subject of the split (by canonical id), or a scan's content under any id, was in
    the run's training split or in its validation split (which chose the model, so metrics
    on it would be optimistic: ``--split val`` of the training manifest is always refused;
    RUN/val_predictions.csv holds those). ``n_boot`` (``--bootstrap``) must be >= 0. Writes
    metrics.json, predictions_scans.csv, predictions_subjects.csv, roc.png and report.md
    into ``out``, by default ``RUN/evaluation/<split>/`` for the run's own manifest and
    ``RUN/evaluation/<manifest stem>-<sha8>/<split>/`` for another
    (:func:`~adni_pu.workflows.run_folder.evaluation_folder`: another manifest never
    replaces the run's own evaluation), holding that folder's lock; returns the metrics
    dict. The report also says how often nnPU's non-negative correction fired in training.
    """
    from adni_pu.locking import output_lock

    if n_boot is not None:  # refused before any work, as the setting it replaces would be
        n_boot = cfgmod.check_setting(VolumeTrainConfig, "bootstrap", n_boot, "--bootstrap")
    run_dir = Path(run_dir)
    cfg, model, info = load_run(run_dir, device)
    boots = cfg.bootstrap if n_boot is None else n_boot
    mpath = manifest_file(manifest if manifest is not None else info["manifest"])
    sha = sha256_file(mpath)
    own = manifest is None or sha == info.get("manifest_sha256")
    out_dir = check_out_dir(evaluation_folder(run_dir, split, mpath, own,
                                              Path(out) if out is not None else None),
                            "the evaluation")
    claim_folder(out_dir, "evaluate")
    with output_lock(out_dir, "evaluate"):
        return _evaluate(run_dir, split, (mpath, sha, manifest is not None), cfg, model,
                         info, boots, out_dir)


def _evaluate(run_dir: Path, split: str, source: tuple[Path, str, bool], cfg: Any, model: Any,
              info: dict[str, Any], boots: int | None, out: Path) -> dict[str, Any]:
    """:func:`evaluate_run` once its output folder is locked; ``source``: the manifest, its
    sha256 and whether it was given."""
    import pandas as pd

    from adni_pu.cohort.leakage import assert_no_leakage, refuse_repeated_images, scan_table
    from adni_pu.data.volumes import build_volume_dataset
    from adni_pu.pu.metrics import bootstrap_ci

    mpath, sha, given = source
    frame = load_manifest(mpath)
    rows = frame[frame["split"] == split].reset_index(drop=True)
    if rows.empty:
        raise VolumeRunError(f"{mpath}: no rows in split {split!r}; splits found: "
                             f"{sorted(set(frame['split']))}")
    # the run's record of its train and val scans (ids and image keys; file hashes for
    # runs made before image keys, ids alone before the record), against the scored rows:
    # by canonical id and by image; and each scored image once
    seen = read_scans_record(run_dir)
    scored = scan_table(frame[frame["split"] == split], mpath.parent, source=mpath)
    scored["where"] = mpath.name + " " + scored["where"]
    refuse_repeated_images(scored.assign(group=split), mpath)
    for used, seen_in, advice in (
            ("train", "the run's training split", "Evaluate on subjects the run never saw "
             "(splits must be by subject)."),
            ("val", "the run's validation split, which chose the model (model selection)",
             "Metrics on them would not be an honest estimate; the selected model's "
             f"validation predictions are in {run_dir / VAL_PREDICTIONS}.")):
        assert_no_leakage(seen[seen["split"] == used], scored, what=f"{split!r}",
                          seen_in=seen_in, advice=advice)
    dataset = build_volume_dataset(frame, split, cfg.data, train=False, base_dir=mpath.parent)
    logits = score_dataset(model, dataset, max(cfg.train.batch_size, 2))
    truth = pd.to_numeric(rows["truth"], errors="coerce").astype(float).to_numpy()
    pu_label = pd.to_numeric(rows["pu_label"], errors="coerce").fillna(0).astype(int).to_numpy()
    # one subject, whatever the spelling of its id (002_S_0004 = ADNI_002_S_0004)
    canonical = scans_by_subject(rows)["subject_id"]
    scans = pd.DataFrame({"subject_id": canonical, "session_id": rows["session_id"],
                          "scan_path": rows["scan_path"], "pu_label": pu_label, "truth": truth,
                          "logit": logits,
                          "probability": sigmoid(np.asarray(logits, dtype=np.float64))})
    subjects = scans.groupby("subject_id", sort=True).agg(
        n_scans=("probability", "size"), probability=("probability", "mean"),
        pu_label=("pu_label", "max"), truth=("truth", "first")).reset_index()
    subjects["logit"] = logit(subjects["probability"])
    known_sub = subjects["truth"].notna()
    result: dict[str, Any] = {
        "run": str(run_dir), "split": split, "manifest": str(mpath),
        "manifest_is_training_manifest": sha == info.get("manifest_sha256"),
        "n_scans": len(scans), "n_subjects": len(subjects),
        "n_scans_scored": int(scans["truth"].notna().sum()),
        "n_subjects_scored": int(known_sub.sum()),
        "n_subjects_unknown_truth": int((~known_sub).sum()),
        "n_scans_unknown_truth": int(scans["truth"].isna().sum()),
        "bootstrap": {"resamples": boots, "level": 0.95, "unit": "subject"},
        "scan_level": bootstrap_ci(scans["logit"].to_numpy(), truth, REPORT_METRICS,
                                   n_boot=boots, groups=scans["subject_id"].to_numpy(),
                                   pu_label=pu_label),
        "subject_level": bootstrap_ci(subjects["logit"].to_numpy(),
                                      subjects["truth"].to_numpy(), REPORT_METRICS,
                                      n_boot=boots, pu_label=subjects["pu_label"].to_numpy()),
        "n_hidden_positive_subjects": int(((subjects["pu_label"] == 0)
                                           & (subjects["truth"] == 1)).sum()),
    }
    result["model_selection"] = run_selection(run_dir, cfg.train)
    result["nn_correction"] = run_nn_correction(run_dir)
    result["method"] = cfg.train.method  # names why a loss has no nnPU correction
    result["prior"] = info.get("prior")
    result["prior_estimate"] = info.get("prior_estimate")
    result["warnings"] = []
    if "sha256" in seen.columns and "image_key" not in seen.columns:
        result["warnings"].append(
            f"{run_dir / SCANS_RECORD} was written before image keys were recorded: the "
            f"{split!r} scans are compared with the run's by file hash (SHA-256) and "
            "canonical subject id only, so a re-saved copy of a training image (gunzipped, "
            "re-gzipped) is not caught; train the run again to record them")
    if not given and info.get("manifest_sha256") not in (None, sha):
        result["warnings"].append(
            f"{mpath} changed since the run was trained on it (sha256 "
            f"{info['manifest_sha256'][:12]} then, {sha[:12]} now): its {split!r} split may "
            f"not be the one planned; the subjects the run trained and selected on "
            f"({run_dir / SPLITS}) are still kept out")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "predictions_scans.csv", scans.to_csv(index=False))
    atomic_write_text(out / "predictions_subjects.csv", subjects.to_csv(index=False))
    roc_plot(scans["logit"].to_numpy(), truth, out / "roc.png",
             title=f"{run_dir.name}: {split} ({result['n_scans_scored']} scans)",
             auc=result["scan_level"]["auc"])
    result["files"] = {k: str(out / v) for k, v in (
        ("metrics", "metrics.json"), ("predictions_scans", "predictions_scans.csv"),
        ("predictions_subjects", "predictions_subjects.csv"), ("roc", "roc.png"),
        ("report", "report.md"))}
    atomic_write_text(out / "metrics.json", json.dumps(_jsonable(result), indent=2) + "\n")
    from adni_pu.workflows.interpret import report_section  # links `adni-pu interpret` maps

    atomic_write_text(out / "report.md", metrics_markdown(result)
                      + report_section(run_dir, split, out))
    return result


#: What the run trained and selected on (kept for callers of the old name).
run_record = read_scans_record


def run_selection(run_dir: Path, train: Any) -> dict[str, Any]:
    """Which rule and validation criterion chose the run's model, and what it chose:
    ``RUN/selection.json`` where present, else the settings alone (``train``)."""
    path = run_dir / SELECTION
    try:
        saved = json.loads(path.read_text()) if path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise VolumeRunError(f"{path}: not JSON ({err}); expected the trainer's record of "
                             "the model selection") from None
    return {"selection": saved.get("selection", train.selection),
            "val_criterion": saved.get("val_criterion", train.val_criterion),
            "epoch": saved.get("best_epoch"), "candidate": saved.get("best_candidate"),
            "val_score": saved.get("val_score")}


def selection_markdown(chosen: dict[str, Any]) -> list[str]:
    """The report's "Model selection" part: the criterion that chose the model."""
    from adni_pu.pu.criteria import criterion_sentence

    crit = chosen["val_criterion"]
    text = "Chosen " + criterion_sentence(crit, chosen["selection"])
    if chosen.get("epoch") is not None:
        text += (f": {chosen['candidate']} after epoch {chosen['epoch'] + 1} "
                 f"(validation {crit} {chosen['val_score']:.4f})")
    return ["## Model selection", "", text + ".", ""]


def run_nn_correction(run_dir: Path) -> dict[str, Any] | None:
    """:func:`~adni_pu.pu.recorders.nn_correction_summary` of the run folder's metrics.csv
    (``{"recorded": False}`` when the run folder has no metrics.csv)."""
    from adni_pu.pu.recorders import nn_correction_summary, read_metrics_csv

    path = run_dir / METRICS_CSV
    if not path.is_file():
        return {"recorded": False}
    return nn_correction_summary(read_metrics_csv(path))


def nn_correction_markdown(summary: dict[str, Any] | None, method: str | None = None
                           ) -> list[str]:
    """The report's "nnPU correction" part (:func:`run_nn_correction`'s summary of a run
    of ``method``)."""
    from adni_pu.pu.recorders import nn_correction_text

    if summary is not None and summary.get("recorded") is False:
        return ["## nnPU correction", "", "Not recorded: the run folder has no metrics.csv.", ""]
    return ["## nnPU correction", "", nn_correction_text(summary, method), ""]


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, (np.floating, np.integer)):
        return _jsonable(obj.item())
    return obj


def prior_markdown(prior: dict[str, Any] | None, estimate: dict[str, Any] | None
                   ) -> list[str]:
    """The class prior the run trained with and where it came from; an estimated one with
    its interval, beside the cohort's truth where it has one."""
    if not prior:
        return []
    text = f"Class prior used in training: {prior['prior']:.3f} ({prior['source']})."
    if prior.get("read_by_method") is False:
        text = (f"Class prior: not read by this method or its model selection; the PU data "
                f"carry {prior['prior']:.3f} ({prior['source']}).")
    if estimate:
        truth = estimate.get("true_prior")
        text += (f" Estimated from the PU data alone ({estimate['method']}, 95 % CI "
                 f"[{estimate['ci_low']:.3f}, {estimate['ci_high']:.3f}]); "
                 + (f"the cohort's truth gives {truth:.3f}." if truth is not None else
                    "the cohort has no truth to compare it with."))
    return ["## Class prior", "", text, ""]


def metrics_markdown(result: dict[str, Any]) -> str:
    """A short Markdown report of one evaluation."""
    lines = [f"# Evaluation of {result['run']} on split `{result['split']}`", "",
             f"Manifest: `{result['manifest']}`"
             + ("" if result["manifest_is_training_manifest"] else " (not the training manifest)"),
             "", *(f"**Warning:** {w}\n" for w in result.get("warnings", [])),
             f"{result['n_subjects']} subjects, {result['n_scans']} scans; "
             f"{result['n_subjects_unknown_truth']} subject(s) "
             f"({result['n_scans_unknown_truth']} scans) left out for unknown truth.", "",
             "95 % CIs: percentile bootstrap over subjects "
             f"({result['bootstrap']['resamples']} resamples).", "",
             f"Truth: the positive class of the cohort's preset; "
             f"{result.get('n_hidden_positive_subjects', 'n/a')} scored subject(s) are hidden "
             "positives (unlabelled, positive by the truth). Hidden-positive recall: their "
             "share called positive; hidden AUC: the hidden positives ranked against the "
             "unlabelled negatives; all-negative / all-positive accuracy: what calling every "
             "subject negative / positive scores (the reference lines of accuracy).", "",
             "| metric | per scan | per subject (mean probability) |", "|---|---|---|"]
    for m in REPORT_METRICS:
        if m not in result["scan_level"]:
            continue
        lines.append(f"| {METRIC_NAMES.get(m, m.replace('_', ' '))} | "
                     f"{format_ci(result['scan_level'][m])} | "
                     f"{format_ci(result['subject_level'][m])} |")
    lines += ["", "![ROC](roc.png)", ""]
    lines += prior_markdown(result.get("prior"), result.get("prior_estimate"))
    if "model_selection" in result:
        lines += selection_markdown(result["model_selection"])
    if "nn_correction" in result:
        lines += nn_correction_markdown(result["nn_correction"], result.get("method"))
    return "\n".join(lines)

"""The demo's modelling policy: training settings, class prior, reference lines and pooling.

What ``adni-pu demo`` (:mod:`adni_pu.workflows.demo`) trains and how it scores, as values and
functions the stages call, beside the cross-validation they use
(:mod:`adni_pu.workflows.crossval`):

- :data:`DEMO_TRAINING` and :func:`method_settings`: every run's settings on the small
  budget (a slim 3D CNN, Self-PU's phases scaled to the epochs); why these values:
  docs/training.md, "Demo";
- :func:`demo_prior`: the class prior of a fold, from its cohort, raised above the labelled
  fraction where a small cohort puts it at or below; :func:`estimated_demo_prior` (``adni-pu
  demo --prior estimate``): estimated from the fold's PU data alone instead;
- :func:`reference_scores`: the reference lines on the same folds (a logistic regression on
  two measured volumes, the generator's true hippocampal loss);
- :func:`pool_method`: one method's held-out predictions of all folds, pooled and scored.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from adni_pu import config as cfgmod
from adni_pu import fileio

# Training settings of the small budget, as values (the user's --set overrides come after):
# a slim CNN whose three branches end in a global average pool (3 x 16 features into the
# head), batch 8, the whole brain at 40^3, and the hippocampus branches averaging their
# features inside the atlas hippocampus (``data.hipp_mask``); no evaluation bootstrap per
# fold (the pooled predictions get one).
DEMO_TRAINING: dict[str, Any] = {
    "train": {"batch_size": 8, "eval_batch_size": 16, "lr": 0.001, "progress": False,
              "model_args": {"channels": [8, 16], "hidden": 64, "global_pool": True}},
    "data": {"brain_size": [40, 40, 40], "hipp_mask": True},
    "bootstrap": 0,
}


def _selfpu_schedule(epochs: int) -> dict[str, int]:
    """Self-PU phases scaled to a short run: warm-up 1/4, self-paced to 2/3, then distillation."""
    warmup = max(1, epochs // 4)
    end = max(warmup + 1, (2 * epochs) // 3)
    return {"warmup_epochs": warmup, "self_paced_end": end, "select_every": 1,
            "teacher_rampup_epochs": max(1, (epochs - end) // 2)}


def demo_prior(manifest_frame: Any) -> tuple[dict[str, Any], str, float]:
    """The class prior from the cohort, raised above the labelled fraction when a small
    cohort puts it at or below (PU risks need prior > labelled fraction).

    Returns (the settings to add, as values, a note for the report, the prior).
    """
    from adni_pu.workflows.class_prior import cohort_prior, resolve_prior

    frame = manifest_frame.copy()
    frame["split"] = frame["split"].astype(str)
    resolved = resolve_prior("cohort", truth=lambda: (cohort_prior(frame)[0], {}))
    assert resolved is not None  # the cohort's value: never a deadline
    prior = resolved.value
    train_rows = frame[frame["split"] == "train"]
    labelled_fraction = float((train_rows["pu_label"] == 1).mean())
    note = f"{prior:.3f} (cohort: positive fraction of the training subjects with a truth)"
    if prior > labelled_fraction + 0.02:
        return {}, note, prior
    prior = min(labelled_fraction + 0.05, 0.95)
    return ({"prior": float(f"{prior:.4f}")}, f"{prior:.3f} (set: the cohort's value was not above "
            f"the labelled fraction {labelled_fraction:.3f} of the training scans)", prior)


def estimated_demo_prior(manifest: Path, values: dict[str, Any], overrides: tuple[str, ...],
                         out: Path, log: Any = None, n_bootstrap: int = 1000
                         ) -> tuple[dict[str, Any], str, float, dict[str, Any]]:
    """The class prior of a fold estimated from its PU data alone (``adni-pu prior`` on the
    fold's manifest: a naive P-vs-U classifier on the demo budget, ``values`` and the
    user's ``overrides``, in ``out``; best-bin estimation on the fold's validation split,
    its interval from ``n_bootstrap`` resamples: the demo's, not the runs' ``bootstrap``,
    which the demo sets to 0).

    Returns (the settings to add, as values, a note for the report with the estimate, its
    CI and the truth beside it, the prior, the estimate's record). Under the demo's
    censoring scheme an estimate always exceeds the labelled fraction, so it is used as is.
    """
    from adni_pu.workflows.class_prior import resolve_prior
    from adni_pu.workflows.prior import estimate_manifest_prior
    from adni_pu.workflows.volume_settings import load_volume_config

    cfg = load_volume_config(None, list(overrides), preset="naive", values=values)
    cfg = dataclasses.replace(cfg, bootstrap=max(n_bootstrap, 1))
    resolved = resolve_prior("estimate", estimate=lambda: estimate_manifest_prior(
        manifest, cfg, out, log=log))
    assert resolved is not None and resolved.estimate is not None  # no deadline
    record = resolved.estimate
    value, truth = resolved.value, record.get("true_prior")
    note = (f"{value:.3f} [95 % CI {record['ci_low']:.3f}, {record['ci_high']:.3f}] "
            f"(estimated from the fold's PU data alone, {record['method']} on the "
            f"{record['n_positive']} labelled and {record['n_unlabelled']} unlabelled scans of "
            "its validation split; the truth of its training subjects gives "
            + (f"{truth:.3f})" if truth is not None else "nothing to compare)"))
    return {"prior": value}, note, value, record


def method_settings(epochs: int, seed: int, threads: int, cache_dir: Path,
                    extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings (values, not ``--set`` text) of a run on the demo budget; ``extra``
    (e.g. from :func:`demo_prior`) is merged last. The preset goes to :func:`train_method`."""
    values = copy.deepcopy(DEMO_TRAINING)
    cfgmod.deep_update(values, {
        "train": {"epochs": epochs, "threads": threads, "seed": seed,
                  "selfpu": _selfpu_schedule(epochs)},
        "data": {"cache": "disk", "cache_dir": cache_dir.resolve()},
    })
    cfgmod.deep_update(values, copy.deepcopy(extra or {}))
    return values


def reference_scores(out: Path, synth_dir: Path, fold_paths: list[Path], scored: Any,
                     n_boot: int) -> dict[str, dict[str, Any]]:
    """The reference lines on the same folds: logistic regression on two volumes measured
    on the preprocessed scans, and the generator's true hippocampal loss."""
    import pandas as pd

    from adni_pu.cohort import read_manifest
    from adni_pu.workflows.compare.references import logistic_reference, volume_features
    from adni_pu.workflows.crossval import pooled_metrics

    frames = [read_manifest(p) for p in fold_paths]
    cache = out / "volume_features.csv"
    paths = sorted(set(frames[0]["scan_path"].astype(str)))
    features = pd.read_csv(cache) if cache.is_file() else None
    if features is None or sorted(features["scan_path"]) != paths:
        features = volume_features(paths)
        fileio.atomic_write_text(cache, features.to_csv(index=False))
    for frame in frames:
        frame["scan_path"] = frame["scan_path"].astype(str)
    logistic = pd.concat([logistic_reference(f, features) for f in frames], ignore_index=True)
    truth = pd.read_csv(synth_dir / "truth_scans.csv", dtype={"subject_id": str})
    signal = truth.groupby("subject_id")["hippocampal_loss"].mean().rename("logit")
    keep = [c for c in ("subject_id", "pu_label", "truth") if c in scored]
    true = scored[keep].merge(signal.reset_index(), on="subject_id")
    if "pu_label" in scored:
        logistic = logistic.merge(scored[["subject_id", "pu_label"]], on="subject_id")
    return {name: {"pooled": pooled_metrics(preds, n_boot), "predictions":
                   preds[[*keep[:-1], "logit", "truth"]].to_dict("records")}
            for name, preds in (("logistic regression on 2 volumes", logistic),
                                ("generator truth: hippocampal loss", true))}


def pool_method(folds: list[dict[str, Any]], n_boot: int) -> dict[str, Any]:
    """One method's fold records -> pooled held-out metrics and summaries."""
    import numpy as np
    import pandas as pd

    from adni_pu.workflows.crossval import pooled_metrics

    preds = pd.DataFrame([p for f in folds for p in f["predictions"]])
    shares = [f["nn_correction"] for f in folds if f["nn_correction"] is not None]
    val = [f["val_auc"] for f in folds if not np.isnan(f["val_auc"])]
    return {"pooled": pooled_metrics(preds, n_boot), "folds": folds,
            "seconds": sum(f["seconds"] for f in folds),
            "val_auc": float(np.mean(val)) if val else float("nan"),
            "nn_correction": float(np.mean(shares)) if shares else None,
            "nn_correction_column": folds[0]["nn_correction_column"],
            "nn_correction_by_phase": _pooled_phases(folds),
            "predictions": preds.to_dict("records")}


def _pooled_phases(folds: list[dict[str, Any]]) -> dict[str, float] | None:
    """Mean over folds of each phase's nn_correction share (None without a correction)."""
    summaries = [f["nn_correction_summary"] for f in folds if f.get("nn_correction_summary")]
    if not summaries:
        return None
    phases = sorted({p for s in summaries for p in s["by_phase"]})
    return {p: sum(s["by_phase"][p] for s in summaries if p in s["by_phase"])
            / sum(p in s["by_phase"] for s in summaries) for p in phases}

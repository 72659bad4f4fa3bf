"""The demo's modelling policy and what its report reads from the comparison it runs.

``adni-pu demo`` (:mod:`adni_pu.workflows.demo`) trains through the product's comparison
(:mod:`adni_pu.workflows.compare`, ``adni-pu benchmark cohort``); this module holds what is
the demo's own:

- :data:`DEMO_TRAINING` and :func:`method_settings`: every run's settings on the small
  budget (a slim 3D CNN, Self-PU's phases scaled to the epochs), written once as the
  comparison's settings file; why these values: docs/training.md, "Demo";
- :func:`method_results`: one method's pieces of the comparison, as the report shows them
  (pooled held-out metrics, the validation AUC that chose each fold's model, how often
  nnPU's correction fired);
- :func:`truth_reference`: the generator's true hippocampal loss on the same subjects, the
  reference line only a synthetic cohort has.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from adni_pu import config as cfgmod

# Training settings of the small budget, as values (the user's --set overrides come after):
# a slim CNN whose three branches end in a global average pool (3 x 16 features into the
# head), batch 8, the whole brain at 40^3, and the hippocampus branches averaging their
# features inside the atlas hippocampus (``data.hipp_mask``); no evaluation bootstrap per
# piece (the pooled predictions get one).
DEMO_TRAINING: dict[str, Any] = {
    "train": {"batch_size": 8, "eval_batch_size": 16, "lr": 0.001, "progress": False,
              "model_args": {"channels": [8, 16], "hidden": 64, "global_pool": True}},
    "data": {"brain_size": [40, 40, 40], "hipp_mask": True},
    "bootstrap": 0,
}
#: The reference line that needs the generator's truth.
TRUTH_LINE = "generator truth: hippocampal loss"


def _selfpu_schedule(epochs: int) -> dict[str, int]:
    """Self-PU phases scaled to a short run: warm-up 1/4, self-paced to 2/3, then distillation."""
    warmup = max(1, epochs // 4)
    end = max(warmup + 1, (2 * epochs) // 3)
    return {"warmup_epochs": warmup, "self_paced_end": end, "select_every": 1,
            "teacher_rampup_epochs": max(1, (epochs - end) // 2)}


def method_settings(epochs: int, threads: int, cache_dir: Path) -> dict[str, Any]:
    """The settings (values, not ``--set`` text) of every run on the demo budget; the
    comparison adds each piece's method, seed and class prior."""
    values = copy.deepcopy(DEMO_TRAINING)
    cfgmod.deep_update(values, {
        "train": {"epochs": epochs, "threads": threads, "selfpu": _selfpu_schedule(epochs)},
        "data": {"cache": "disk", "cache_dir": str(Path(cache_dir).resolve())},
    })
    return values


def method_results(spec: Any, report: dict[str, Any], method: str) -> dict[str, Any]:
    """One method of the comparison as the demo reports it: the pooled held-out scores
    (``report.json``'s), the per-subject predictions, and per fold the selected epoch, the
    validation AUC of the selected model (what chose it), the prior and, for nnPU-type
    losses, the share of batches where the non-negative correction fired."""
    import numpy as np
    import pandas as pd

    from adni_pu.pu.metrics import binary_metrics
    from adni_pu.pu.recorders import nn_correction_summary, read_metrics_csv
    from adni_pu.workflows.compare.pieces import Piece, piece_dir, read_piece
    from adni_pu.workflows.run_folder import METRICS_CSV, VAL_PREDICTIONS

    folds, predictions = [], []
    for k in range(spec.folds):
        piece = Piece(method, k, spec.first_seed)
        record = read_piece(Path(spec.out), piece)
        if record is None:
            raise ValueError(f"{piece_dir(Path(spec.out), piece)}: piece not finished")
        run = piece_dir(Path(spec.out), piece)
        val = pd.read_csv(run / VAL_PREDICTIONS, dtype={"subject_id": str})
        val = val.groupby("subject_id").agg(logit=("logit", "mean"), truth=("truth", "first"))
        fired = nn_correction_summary(read_metrics_csv(run / METRICS_CSV))
        folds.append({"fold": k, "selected_epoch": record["selected_epoch"],
                      "selected_model": record["selected_model"],
                      "seconds": record["train_seconds"] + record["score_seconds"],
                      "val_auc": binary_metrics(val["logit"].to_numpy(),
                                                val["truth"].to_numpy())["auc"],
                      "prior": record.get("prior"), "prior_estimate": record.get("prior_estimate"),
                      "nn_correction_summary": fired})
        predictions += [{**p, "fold": k} for p in record["held_out"]]
    scores = report["methods"][method]
    truth = np.asarray([np.nan if p["truth"] is None else p["truth"] for p in predictions], float)
    shares = [f["nn_correction_summary"]["share"] for f in folds if f["nn_correction_summary"]]
    val = [f["val_auc"] for f in folds if not np.isnan(f["val_auc"])]
    return {"pooled": {**scores, "n_positive": int(np.nansum(truth))},
            "folds": folds, "predictions": predictions,
            "seconds": sum(f["seconds"] for f in folds),
            "val_auc": float(np.mean(val)) if val else float("nan"),
            "nn_correction": float(np.mean(shares)) if shares else None,
            "nn_correction_column": (folds[0]["nn_correction_summary"] or {}).get(
                "columns", [None])[0],
            "nn_correction_by_phase": _pooled_phases(folds)}


def _pooled_phases(folds: list[dict[str, Any]]) -> dict[str, float] | None:
    """Mean over folds of each phase's nn_correction share (None without a correction)."""
    summaries = [f["nn_correction_summary"] for f in folds if f.get("nn_correction_summary")]
    if not summaries:
        return None
    phases = sorted({p for s in summaries for p in s["by_phase"]})
    return {p: sum(s["by_phase"][p] for s in summaries if p in s["by_phase"])
            / sum(p in s["by_phase"] for s in summaries) for p in phases}


def truth_reference(synth_dir: Path, scored: list[dict[str, Any]], n_boot: int
                    ) -> dict[str, Any]:
    """The generator's true hippocampal loss of each subject (mean over its scans), scored
    on the subjects the methods were scored on, as the comparison scores a method."""
    import pandas as pd

    from adni_pu.cohort.ids import normalise_subject_id
    from adni_pu.workflows.compare.scores import method_scores

    truth = pd.read_csv(synth_dir / "truth_scans.csv", dtype={"subject_id": str})
    truth["subject_id"] = [normalise_subject_id(s) or s for s in truth["subject_id"]]
    signal = truth.groupby("subject_id")["hippocampal_loss"].mean().rename("logit")
    frame = pd.DataFrame(scored)[["subject_id", "pu_label", "truth"]]
    frame = frame.merge(signal.reset_index(), on="subject_id").astype({"truth": float})
    return {"pooled": method_scores(frame.assign(seed=0), n_boot),
            "predictions": frame.to_dict("records")}

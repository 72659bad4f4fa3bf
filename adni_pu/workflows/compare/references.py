"""Reference lines of a comparison, on the same folds as the CNNs: what two volumes measured
on the scans give, so that a method's numbers have something to stand beside.

- :func:`volume_features` measures two volumes on each preprocessed (model-grid) scan: the
  hippocampal tissue (voxels of the AAL hippocampi brighter than CSF) and the central CSF
  (dark voxels in a box around the lateral ventricles);
- :func:`logistic_reference` fits a logistic regression on them per fold, on the training
  subjects' PU labels only, and scores the held-out subjects.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from adni_pu.atlas import VENTRICLE_BOX_MM

#: The reference line's name in the reports.
LOGISTIC = "logistic regression on 2 volumes"
# Intensity (relative to the scan's brain median) below which a voxel counts as CSF.
CSF_LEVEL = 0.55


def volume_features(paths: Iterable[str | Path], threads: int = 2) -> Any:
    """Per scan: ``hippocampus_ml`` (hippocampal tissue) and ``central_csf_ml`` (CSF around
    the lateral ventricles), measured on model-grid volumes (``adni-pu preprocess`` output).

    Tissue and CSF are told apart by intensity relative to the scan's brain median
    (``CSF_LEVEL``), so no segmentation is needed; the numbers are proxies, good for
    ranking subjects, not calibrated volumes. ``threads`` scans are read at once (the
    decompression and the array work release the GIL); the rows keep the order of
    ``paths``.
    """
    from concurrent.futures import ThreadPoolExecutor

    import pandas as pd

    from adni_pu import atlas
    from adni_pu.data.grid_check import read_model_grid

    affine = atlas.model_grid_affine()
    shape = atlas.MODEL_GRID_SHAPE
    hippocampus = atlas.region_mask(atlas.HIPPOCAMPUS_LEFT + atlas.HIPPOCAMPUS_RIGHT)
    box = atlas.mm_box_mask(VENTRICLE_BOX_MM, affine, shape)
    voxel_ml = abs(float(np.linalg.det(affine[:3, :3]))) / 1000.0

    def measure(path: str | Path) -> dict[str, Any]:
        vol = read_model_grid(path, shape)  # the model-grid input check (ManifestError)
        brain = vol > 0
        level = CSF_LEVEL * float(np.median(vol[brain])) if brain.any() else 0.0
        return {"scan_path": str(path),
                "hippocampus_ml": float((hippocampus & (vol > level)).sum()) * voxel_ml,
                "central_csf_ml": float((box & brain & (vol <= level)).sum()) * voxel_ml}

    with ThreadPoolExecutor(max(1, threads)) as pool:
        rows = list(pool.map(measure, paths))
    return pd.DataFrame(rows, columns=["scan_path", "hippocampus_ml", "central_csf_ml"])

FEATURES: tuple[str, ...] = ("hippocampus_ml", "central_csf_ml")


def logistic_reference(frame: Any, features: Any) -> Any:
    """Held-out logits of a logistic regression on :data:`FEATURES`, one fold.

    ``frame``: the fold's manifest (``subject_id, scan_path, pu_label, truth, split``);
    ``features``: :func:`volume_features` rows keyed by ``scan_path``. Fitted on the
    training subjects' PU labels (labelled vs unlabelled, what the naive method learns
    from; no truth), standardised on them; returns ``subject_id, logit, truth`` of the
    test subjects (scan logits averaged per subject).
    """
    import pandas as pd
    from sklearn.linear_model import LogisticRegression

    rows = frame.merge(features, on="scan_path", how="left")
    if rows[list(FEATURES)].isna().any().any():
        missing = rows.loc[rows[list(FEATURES)].isna().any(axis=1), "scan_path"].iloc[0]
        raise ValueError(f"{missing}: no volume features")
    train = rows[rows["split"] == "train"]
    test = rows[rows["split"] == "test"]
    mean = train[list(FEATURES)].mean()
    std = train[list(FEATURES)].std(ddof=0).replace(0.0, 1.0)
    model = LogisticRegression(class_weight="balanced")
    model.fit(((train[list(FEATURES)] - mean) / std).to_numpy(),
              train["pu_label"].astype(int).to_numpy())
    logits = model.decision_function(((test[list(FEATURES)] - mean) / std).to_numpy())
    scans = pd.DataFrame({"subject_id": test["subject_id"].to_numpy(), "logit": logits,
                          "truth": test["truth"].astype(float).to_numpy()})
    return scans.groupby("subject_id", sort=True).agg(
        logit=("logit", "mean"), truth=("truth", "first")).reset_index()

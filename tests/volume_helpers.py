"""A tiny cohort of model-grid volumes for the training, evaluation and CLI tests.

The MNI template on the model grid, with noise; amyloid-positive subjects lose intensity
in both hippocampi (a signal the network can pick up in a few steps).
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd

# (split, pu_label, truth) per subject; "" = unknown truth. Two subjects have two scans.
SUBJECTS: list[tuple[str, int, object]] = [
    ("train", 1, 1), ("train", 1, 1), ("train", 1, 1), ("train", 0, 1), ("train", 0, 1),
    ("train", 0, 0), ("train", 0, 0), ("train", 0, 0), ("train", 0, 0), ("train", 0, ""),
    ("val", 1, 1), ("val", 0, 0), ("val", 0, 1), ("val", 0, 0),
    ("test", 0, 1), ("test", 0, 0), ("test", 1, 1), ("test", 0, ""), ("test", 0, 0),
]
TWO_SCANS = {0, 14}

TINY_DATA = {"brain_size": [24, 24, 24], "hipp_size": [16, 16, 16], "hipp_margin": 2,
             "cache_workers": 1}
TINY_MODEL = {"preset": "paper", "channels": [4, 8], "hidden": 16}


def grid_volume(seed: int, positive: bool) -> tuple[np.ndarray, np.ndarray]:
    """One model-grid T1-like volume (int16) and the grid affine."""
    from adni_pu import atlas

    affine = atlas.model_grid_affine()
    t1 = _template()
    rng = np.random.default_rng(seed)
    data = t1 * (1.0 + 0.05 * rng.normal()) + rng.normal(0, 3, t1.shape) * (t1 > 0)
    if positive:
        data = data * np.where(_hippocampi(), 0.4, 1.0)
    return data.astype(np.int16), affine


_CACHE: dict[str, np.ndarray] = {}


def _template() -> np.ndarray:
    from adni_pu import atlas

    if "t1" not in _CACHE:
        _CACHE["t1"] = atlas.resample_to(atlas.load_template("t1"), atlas.model_grid_affine(),
                                         atlas.MODEL_GRID_SHAPE).astype(np.float32)
    return _CACHE["t1"]


def _hippocampi() -> np.ndarray:
    from adni_pu import atlas

    if "hipp" not in _CACHE:
        affine = atlas.model_grid_affine()
        mask = np.zeros(atlas.MODEL_GRID_SHAPE, bool)
        for pattern in (atlas.HIPPOCAMPUS_LEFT, atlas.HIPPOCAMPUS_RIGHT):
            mask |= atlas.region_mask(pattern, affine, atlas.MODEL_GRID_SHAPE) > 0
        from scipy.ndimage import binary_dilation

        _CACHE["hipp"] = binary_dilation(mask, iterations=2)
    return _CACHE["hipp"]


def make_volume_cohort(root: Path) -> Path:
    """Write the volumes and a manifest (relative scan paths) under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (split, pu, truth) in enumerate(SUBJECTS):
        subject = f"{100 + i:03d}_S_{i:04d}"
        for session in (("bl", "m12") if i in TWO_SCANS else ("bl",)):
            data, affine = grid_volume(i * 10 + len(session), truth == 1)
            name = f"vol/sub-{i}_ses-{session}_desc-preproc_T1w.nii"
            (root / "vol").mkdir(exist_ok=True)
            nib.save(nib.Nifti1Image(data, affine), root / name)
            rows.append({"subject_id": subject, "session_id": session, "scan_path": name,
                         "pu_label": pu, "truth": truth, "split": split})
    path = root / "manifest.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def tiny_overrides(epochs: int = 2, cache_dir: Path | None = None) -> list[str]:
    """--set overrides that make a run take seconds on one CPU thread.

    ``cache_dir`` keeps the pipeline's deterministic stage on disk, shared between runs.
    """
    out = [f"train.epochs={epochs}", "train.batch_size=6", "train.eval_batch_size=8",
           "train.lr=0.01", 'train.device="cpu"', "train.threads=1", "train.progress=false",
           "bootstrap=200"]
    out += [f"data.{k}={v}" for k, v in TINY_DATA.items()]
    if cache_dir is not None:
        out += ['data.cache="disk"', f'data.cache_dir="{cache_dir}"']
    out += [f'train.model_args.preset="{TINY_MODEL["preset"]}"',
            "train.model_args.channels=[4, 8]", "train.model_args.hidden=16"]
    return out


NO_AUGMENTATION = ["data.flip_prob=0", "data.affine_prob=0", "data.intensity_prob=0",
                   "data.translate=false"]

"""A cohort manifest as PU data: its checked rows, its splits' arrays and datasets, and the
class prior read from it.

``train`` and ``prior`` both turn a manifest into the train and validation
:class:`~adni_pu.data.pu.PUData` a trainer reads (the test split is never loaded here);
this module is that step, so neither command imports the other for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from adni_pu.errors import VolumeRunError
from adni_pu.workflows.run_folder import load_manifest, manifest_file
from adni_pu.workflows.volume_settings import VolumeTrainConfig


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


def checked_manifest(manifest: str | Path, config: VolumeTrainConfig) -> tuple[Path, Any, Any]:
    """The manifest's path, its rows and its scan table (canonical ids, resolved files,
    hashes), once the train and val scans pass the checks made before any output is
    written: every scan's header (missing, a folder, not NIfTI, truncated, not 3D, not the
    grid; intensities are checked when the datasets are built) and the leakage guard (each
    subject, by canonical id, and each scan's content in one split)."""
    from adni_pu.cohort.leakage import check_manifest_leakage
    from adni_pu.data.grid_check import check_volume_files

    mpath = manifest_file(manifest)
    frame = load_manifest(mpath)
    used = frame[frame["split"].isin(["train", "val"])]
    check_volume_files(scan_paths(used, mpath.parent), mpath,
                       config.data.grid_shape if config.data.check_grid else None)
    return mpath, frame, check_manifest_leakage(frame, mpath.parent, mpath)


def placeholder_prior(scheme: str, n_labelled: int, n_total: int) -> float:
    """The class prior the classifier's PU data are built with: alpha = 1/2 as a stand-in
    (naive training and the P-vs-U AUC use no prior; PUData needs one)."""
    from adni_pu.pu.prior_estimate import prior_from_alpha

    return prior_from_alpha(0.5, scheme, n_labelled, n_total)  # type: ignore[arg-type]

"""Numbers of attribution maps: groups, region tables, the hippocampal share with its
bootstrap CI, and the model-randomisation rank correlation (numpy and scipy only).

Map *mass* is ``|map|`` summed over voxels; a group's mass map is the mean of its subjects'
``|map|`` (for the non-negative gradient maps, the group-mean map). A
region's share is its mass over the mass in the analysis mask (the brain voxels the model
sees), set beside the region's share of the analysis mask's volume. A map that ignores anatomy puts
about the volume share in every region; a share well above it means the map concentrates
there.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

#: The four groups of a split, named as ``adni-pu evaluate`` names them.
GROUPS: dict[str, str] = {
    "labelled_positive": "labelled positives",
    "hidden_positive": "hidden positives (unlabelled, positive by the truth)",
    "unlabelled_negative": "unlabelled negatives",
    "unknown_truth": "unlabelled, unknown truth",
}


def subject_group(pu_label: int, truth: float) -> str:
    """The group of one subject: labelled (``pu_label`` 1) or, if unlabelled, by its truth
    (1 hidden positive, 0 unlabelled negative, missing unknown)."""
    if int(pu_label) == 1:
        return "labelled_positive"
    if truth is None or (isinstance(truth, float) and math.isnan(truth)):
        return "unknown_truth"
    return "hidden_positive" if float(truth) == 1.0 else "unlabelled_negative"


def rank_correlation(a: np.ndarray, b: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Spearman rank correlation of ``|a|`` and ``|b|`` over the voxels of ``mask`` (all
    voxels by default): the model-randomisation check of Adebayo et al. (NeurIPS 2018)
    compares a trained model's map with the map of the same network re-initialised; a
    value near 1 means the map does not depend on what the model learnt. NaN when either
    map is constant there."""
    from scipy.stats import spearmanr

    a, b = np.abs(np.asarray(a, dtype=np.float64)), np.abs(np.asarray(b, dtype=np.float64))
    if mask is not None:
        a, b = a[mask], b[mask]
    else:
        a, b = a.ravel(), b.ravel()
    if a.size < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def region_share(maps: np.ndarray, region: np.ndarray, n_boot: int = 1000, seed: int = 0,
                 level: float = 0.95) -> dict[str, Any]:
    """Share of a group's map mass inside ``region``, with a percentile bootstrap CI over
    subjects, beside the region's volume share.

    ``maps``: one row per subject (the subject's map over the analysis mask's voxels);
    ``region``: bool over the same voxels. The group's mass is the mean over subjects of
    ``|map|`` (for non-negative maps, the group-mean map itself), so the share is a ratio of
    subject sums and each bootstrap resample (subjects drawn with replacement) recomputes it
    without bias. (The mass of a signed group mean would not do: resampling with
    replacement adds noise to it, so the resampled shares would sit below the estimate.)
    """
    maps = np.asarray(maps, dtype=np.float32)
    region = np.asarray(region, dtype=bool)
    if maps.ndim != 2 or maps.shape[1] != region.size:
        raise ValueError(f"maps: expected subjects x {region.size} voxels, found {maps.shape}")
    n = maps.shape[0]
    volume_share = float(region.mean()) if region.size else float("nan")
    out: dict[str, Any] = {"n_subjects": n, "volume_share": volume_share,
                           "region_voxels": int(region.sum()), "mask_voxels": int(region.size),
                           "bootstrap": {"resamples": n_boot, "level": level,
                                         "unit": "subject", "method": "percentile"}}
    if n == 0:
        return {**out, "share": float("nan"), "ci": [float("nan"), float("nan")],
                "ratio": float("nan")}
    absolute = np.abs(maps, dtype=np.float64)
    inside, total = absolute[:, region].sum(axis=1), absolute.sum(axis=1)
    share = float(inside.sum() / total.sum()) if total.sum() > 0 else float("nan")
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    num, den = inside[idx].sum(axis=1), total[idx].sum(axis=1)
    shares = num[den > 0] / den[den > 0]
    alpha = (1.0 - level) / 2.0
    ci = ([float(np.quantile(shares, alpha)), float(np.quantile(shares, 1.0 - alpha))]
          if shares.size else [float("nan"), float("nan")])
    ratio = share / volume_share if volume_share > 0 else float("nan")
    return {**out, "share": share, "ci": ci, "ratio": ratio}


# --------------------------------------------------------------------------- AAL regions


@functools.lru_cache(maxsize=4)
def _aal(affine_key: tuple[float, ...], shape: tuple[int, int, int]) -> np.ndarray:
    from adni_pu import atlas

    affine = np.asarray(affine_key, dtype=float).reshape(4, 4)
    return atlas.resample_to(atlas.load_template("aal"), affine, shape, order=0).astype(np.int32)


def aal_labels_on(affine: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
    """AAL label values on the grid (affine, shape); 0 outside every region."""
    return _aal(tuple(float(v) for v in np.asarray(affine).ravel()), tuple(shape))


def region_table(group_map: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> Any:
    """One row per AAL region (and one for the voxels outside every region): share of
    ``|group_map|`` (a group's mass map), volume share and their ratio inside ``mask``,
    largest mass share first (a DataFrame)."""
    import pandas as pd

    from adni_pu import atlas

    names = {v: k for k, v in atlas.aal_labels().items()}
    values = labels[mask]
    mass = np.abs(np.asarray(group_map, dtype=np.float64)[mask])
    total = mass.sum()
    n = values.size
    uniq, inverse = np.unique(values, return_inverse=True)
    per_mass = np.bincount(inverse, weights=mass, minlength=uniq.size)
    per_vox = np.bincount(inverse, minlength=uniq.size)
    rows = []
    for value, m, v in zip(uniq, per_mass, per_vox):
        name = "(outside AAL regions)" if value == 0 else names.get(int(value), f"AAL {value}")
        share = m / total if total > 0 else float("nan")
        vshare = v / n if n else float("nan")
        rows.append({"region": name, "mass_share": share, "volume_share": vshare,
                     "ratio": share / vshare if vshare > 0 else float("nan"),
                     "voxels": int(v)})
    table = pd.DataFrame(rows).sort_values("mass_share", ascending=False, kind="stable")
    return table.reset_index(drop=True)

"""Amyloid SUVR from PET volumes, for cohorts without precomputed SUVR tables.

A cortical-composite SUVR with a whole-cerebellum reference, from AAL regions (chosen by
name, see :mod:`adni_pu.atlas`) in MNI template space, following the shape of the
UC Berkeley / ADNI florbetapir summary: four cortical regions (frontal, anterior and
posterior cingulate, lateral parietal, lateral temporal) over the whole cerebellum (grey
and white matter). The PET volume must either be in template space already or come with
the affine transform from its own world space to template space (e.g. PET registered to
the subject's T1, and the T1's native-to-template affine from preprocessing).

This is an atlas-based approximation (no FreeSurfer parcellation, no partial-volume
correction): its values are close to, not equal to, the UC Berkeley tables, and cut-offs
published for those tables should be checked against it before use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from adni_pu import atlas
from adni_pu.errors import SuvrError

#: Target regions of the cortical composite (AAL names, glob patterns; AAL1 and AAL2).
CORTICAL_COMPOSITE: dict[str, tuple[str, ...]] = {
    "frontal": ("Frontal_*", "Rectus_*", "OFC*"),
    "cingulate": ("Cingul*_Ant_*", "Cingul*_Post_*"),
    "parietal": ("Parietal_Sup_*", "Parietal_Inf_*", "SupraMarginal_*", "Angular_*",
                 "Precuneus_*"),
    "temporal": ("Temporal_Sup_[LR]", "Temporal_Mid_[LR]", "Temporal_Inf_[LR]"),
}
#: Reference region: the whole cerebellum (every Cerebelum_* and Vermis_* label).
WHOLE_CEREBELLUM: tuple[str, ...] = atlas.CEREBELLUM_REGIONS


@dataclass
class SuvrResult:
    """The composite SUVR, each region's SUVR, and how much of each region was measured."""

    suvr: float
    regional: dict[str, float]
    reference_mean: float
    coverage: dict[str, float] = field(default_factory=dict)
    n_voxels: dict[str, int] = field(default_factory=dict)


def _atlas_labels_on(affine: np.ndarray, shape: tuple[int, int, int],
                     native_to_template: np.ndarray | None) -> np.ndarray:
    """AAL labels sampled (nearest neighbour) at every voxel of the PET grid."""
    img = atlas.load_template("aal")
    grid = affine if native_to_template is None else np.asarray(native_to_template) @ affine
    return atlas.resample_to(img, grid, shape, order=0)


def _atlas_volume_mm3(values: list[int]) -> float:
    img = atlas.load_template("aal")
    data = np.asarray(img.dataobj)
    return float(np.isin(data, values).sum() * abs(np.linalg.det(img.affine[:3, :3])))


def compute_suvr(
    pet: Any,
    affine: np.ndarray | None = None,
    native_to_template: np.ndarray | None = None,
    target: dict[str, tuple[str, ...]] | None = None,
    reference: tuple[str, ...] = WHOLE_CEREBELLUM,
    composite: Literal["region-mean", "voxel-mean"] = "region-mean",
    min_coverage: float = 0.5,
) -> SuvrResult:
    """Cortical-composite SUVR of one PET volume.

    ``pet``: a nibabel image, a path, or an array with ``affine`` (voxel -> world, mm).
    ``native_to_template``: 4x4 matrix taking the PET's world coordinates to MNI template
    coordinates (RAS, mm); ``None`` when the PET is in template space already.
    ``composite``: ``region-mean`` averages the regional SUVRs with equal weight (as the
    UC Berkeley summary averages its four regions); ``voxel-mean`` pools all target voxels.
    Raises :class:`SuvrError` when a region is covered by less than ``min_coverage`` of
    its atlas volume (PET field of view or registration is off) or the reference is not
    positive.
    """
    data, affine = _load_pet(pet, affine)
    target = target or CORTICAL_COMPOSITE
    labels = _atlas_labels_on(affine, data.shape, native_to_template)
    voxel_mm3 = abs(float(np.linalg.det(affine[:3, :3])))
    finite = np.isfinite(data)

    def region(name: str, patterns: tuple[str, ...]) -> tuple[np.ndarray, float]:
        values = atlas.region_values(patterns)
        mask = np.isin(labels, values) & finite
        coverage = mask.sum() * voxel_mm3 / max(_atlas_volume_mm3(values), 1e-9)
        if coverage < min_coverage:
            raise SuvrError(
                f"region {name} ({list(patterns)}): only {coverage:.0%} of its atlas volume "
                f"lies inside the PET volume (needs {min_coverage:.0%}); is the PET in "
                "template space, or is native_to_template right?")
        return mask, float(coverage)

    ref_mask, ref_cov = region("reference", tuple(reference))
    ref_mean = float(data[ref_mask].mean())
    if not ref_mean > 0:
        raise SuvrError(f"reference region mean is {ref_mean:g}; expected a positive uptake")
    regional, coverage, counts = {}, {"reference": ref_cov}, {"reference": int(ref_mask.sum())}
    pooled = np.zeros(data.shape, dtype=bool)
    for name, patterns in target.items():
        mask, cov = region(name, tuple(patterns))
        regional[name] = float(data[mask].mean()) / ref_mean
        coverage[name] = cov
        counts[name] = int(mask.sum())
        pooled |= mask
    if composite == "region-mean":
        suvr = float(np.mean(list(regional.values())))
    elif composite == "voxel-mean":
        suvr = float(data[pooled].mean()) / ref_mean
    else:
        raise ValueError(f"composite={composite!r}: expected region-mean or voxel-mean")
    return SuvrResult(suvr, regional, ref_mean, coverage, counts)


def _load_pet(pet: Any, affine: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(pet, (str, Path)):
        import nibabel as nib

        try:
            pet = nib.load(str(pet))
        except Exception as exc:  # noqa: BLE001 - report the file
            raise SuvrError(f"{pet}: cannot read PET volume ({exc})") from exc
    if hasattr(pet, "dataobj"):
        data = np.asarray(pet.dataobj, dtype=np.float64)
        affine = np.asarray(pet.affine, dtype=float) if affine is None else affine
    else:
        data = np.asarray(pet, dtype=np.float64)
    if affine is None:
        raise SuvrError("an array PET volume needs its affine (voxel -> world, mm)")
    if data.ndim == 4:
        data = data.mean(axis=3)  # frames of a static acquisition are averaged
    if data.ndim != 3:
        raise SuvrError(f"PET volume has shape {data.shape}; expected 3-D (or 4-D frames)")
    return data, np.asarray(affine, dtype=float)


def read_transform(path: str | Path) -> np.ndarray:
    """A 4x4 world-to-world affine from a text file (4 rows of 4 numbers) or ``.npy``."""
    path = Path(path)
    try:
        matrix = np.load(path) if path.suffix == ".npy" else np.loadtxt(path)
    except Exception as exc:  # noqa: BLE001 - report the file
        raise SuvrError(f"{path}: cannot read a 4x4 affine ({exc})") from exc
    matrix = np.asarray(matrix, dtype=float)
    if matrix.shape != (4, 4):
        raise SuvrError(f"{path}: expected a 4x4 matrix, found shape {matrix.shape}")
    return matrix


def suvr_table(pets: Any, base: str | Path | None = None, **kwargs: Any):
    """SUVRs of many PET volumes, as an amyloid table for ``build_cohort(amyloid=...)``.

    ``pets``: a DataFrame or CSV with ``subject, date, tracer, pet_path`` and optionally
    ``transform_path`` (a 4x4 PET-world -> template-world affine, see
    :func:`read_transform`). Relative paths are read from ``base`` (default: the CSV's
    folder). Returns ``subject, date, tracer, suvr, error``; a volume that fails gets an
    empty SUVR and its error, and ``build_cohort`` reports it (never silently dropped).
    """
    import pandas as pd

    if not isinstance(pets, pd.DataFrame):
        base = Path(pets).parent if base is None else base
        pets = pd.read_csv(pets, dtype=str)
    base = Path(base) if base is not None else Path.cwd()
    missing = [c for c in ("subject", "date", "tracer", "pet_path") if c not in pets.columns]
    if missing:
        raise SuvrError(f"PET table: missing column(s) {missing}; found {list(pets.columns)}")
    rows = []
    for rec in pets.to_dict("records"):
        def resolve(p: str) -> Path:
            return Path(p) if Path(p).is_absolute() else base / p
        suvr, error = np.nan, ""
        try:
            transform = None
            tpath = rec.get("transform_path")
            if isinstance(tpath, str) and tpath.strip():
                transform = read_transform(resolve(tpath))
            suvr = compute_suvr(resolve(rec["pet_path"]), native_to_template=transform,
                                **kwargs).suvr
        except (SuvrError, atlas.AtlasError) as exc:
            error = str(exc)
        rows.append({"subject": rec["subject"], "date": rec["date"], "tracer": rec["tracer"],
                     "suvr": suvr, "error": error})
    return pd.DataFrame(rows, columns=["subject", "date", "tracer", "suvr", "error"])

"""SUVR from PET volumes: synthetic PET with a known cortex / cerebellum ratio."""

from __future__ import annotations

import numpy as np
import pytest

from adni_pu import atlas
from adni_pu.cohort.suvr import (
    CORTICAL_COMPOSITE,
    WHOLE_CEREBELLUM,
    SuvrError,
    compute_suvr,
    suvr_table,
)

SHAPE = (61, 73, 61)
REGION_VALUES = {"frontal": 1.2, "cingulate": 1.4, "parietal": 1.3, "temporal": 1.5}


def synthetic_pet(affine: np.ndarray, shape, native_to_template=None) -> np.ndarray:
    """Background 0.3, whole cerebellum 2.0, composite regions 2.0 x REGION_VALUES."""
    grid = affine if native_to_template is None else native_to_template @ affine
    pet = np.full(shape, 0.3, dtype=np.float32)
    pet[atlas.region_mask(WHOLE_CEREBELLUM, grid, shape)] = 2.0
    for name, patterns in CORTICAL_COMPOSITE.items():
        pet[atlas.region_mask(patterns, grid, shape)] = 2.0 * REGION_VALUES[name]
    return pet


def test_composite_regions_exist_and_do_not_overlap_the_reference():
    ref = set(atlas.region_values(WHOLE_CEREBELLUM))
    seen: set[int] = set()
    for patterns in CORTICAL_COMPOSITE.values():
        values = set(atlas.region_values(patterns))
        assert values and not values & ref and not values & seen
        seen |= values
    names = {n for n, v in atlas.aal_labels().items() if v in seen}
    assert "Precuneus_L" in names and "Temporal_Pole_Sup_L" not in names
    assert "Hippocampus_L" not in names


def test_known_ratio_in_template_space():
    affine = atlas.model_grid_affine(spacing=3.0, shape=SHAPE)
    pet = synthetic_pet(affine, SHAPE)
    result = compute_suvr(pet, affine)
    assert result.regional["frontal"] == pytest.approx(1.2, abs=1e-6)
    assert result.suvr == pytest.approx(np.mean(list(REGION_VALUES.values())), abs=1e-6)
    assert result.reference_mean == pytest.approx(2.0)
    pooled = compute_suvr(pet, affine, composite="voxel-mean").suvr
    assert 1.2 < pooled < 1.5 and pooled != pytest.approx(result.suvr, abs=1e-4)


def test_known_ratio_in_native_space_with_transform(tmp_path):
    import nibabel as nib

    native = np.diag([2.5, 2.5, 2.5, 1.0])
    native[:3, 3] = (-70.0, -95.0, -40.0)
    angle = np.deg2rad(15.0)
    to_template = np.eye(4)
    to_template[:2, :2] = [[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]
    to_template[:3, 3] = (-20.0, -25.0, -30.0)
    shape = (64, 80, 68)
    pet = synthetic_pet(native, shape, to_template)
    path = tmp_path / "pet.nii.gz"
    nib.save(nib.Nifti1Image(pet, native), str(path))
    result = compute_suvr(path, native_to_template=to_template)
    assert result.suvr == pytest.approx(1.35, abs=1e-6)
    # The inverse transform (a wrong direction) must not give the same answer.
    with pytest.raises(SuvrError):
        compute_suvr(path, native_to_template=np.linalg.inv(to_template), min_coverage=0.9)
    wrong = compute_suvr(path, native_to_template=np.linalg.inv(to_template), min_coverage=0.0)
    assert wrong.suvr != pytest.approx(1.35, abs=0.05)


def test_pet_that_misses_the_cerebellum_is_refused():
    affine = atlas.model_grid_affine(spacing=3.0, shape=SHAPE)
    pet = synthetic_pet(affine, SHAPE)
    top = affine.copy()
    top[2, 3] += 3.0 * 30  # keep only the upper half of the head
    with pytest.raises(SuvrError, match="reference"):
        compute_suvr(pet[:, :, 30:], top)
    with pytest.raises(SuvrError, match="affine"):
        compute_suvr(pet)


def test_suvr_table_feeds_the_cohort_builder(tmp_path):
    import nibabel as nib

    from adni_pu.cohort import build_cohort, load_cohort_config

    affine = atlas.model_grid_affine(spacing=3.0, shape=SHAPE)
    nib.save(nib.Nifti1Image(synthetic_pet(affine, SHAPE), affine), str(tmp_path / "good.nii.gz"))
    (tmp_path / "bad.nii.gz").write_bytes(b"not a nifti")
    (tmp_path / "pets.csv").write_text("subject,date,tracer,pet_path\n"
                                       "011_S_0001,2010-01-05,AV45,good.nii.gz\n"
                                       "011_S_0002,2010-01-05,AV45,bad.nii.gz\n")
    table = suvr_table(tmp_path / "pets.csv")
    assert table["suvr"].iloc[0] == pytest.approx(1.35, abs=1e-6)
    assert np.isnan(table["suvr"].iloc[1]) and "cannot read" in table["error"].iloc[1]
    (tmp_path / "c.csv").write_text(
        "PTID,VISCODE,EXAMDATE,DX\n011_S_0001,bl,2010-01-01,CN\n011_S_0002,bl,2010-01-01,CN\n")
    (tmp_path / "s.csv").write_text("subject,session,path\n011_S_0001,bl,a\n011_S_0002,bl,b\n")
    cohort = build_cohort(tmp_path / "c.csv", tmp_path / "s.csv",
                          load_cohort_config(overrides=["check_scan_files=false"]), amyloid=table)
    m = cohort.manifest.set_index("subject_id")
    assert m.at["011_S_0001", "suvr"] == pytest.approx(1.35) and m.at["011_S_0001", "truth"] == 1
    assert m.at["011_S_0001", "pu_label"] == 0 and m.at["011_S_0001", "hidden_positive"] == 1
    assert m.at["011_S_0001", "suvr_gap_days"] == 4
    assert np.isnan(m.at["011_S_0002", "suvr"])
    assert cohort.quality.count("amyloid_missing_value") == 1

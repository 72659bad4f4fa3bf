"""Synthetic cohort files: BIDS NIfTI scans, ADNIMERGE-style table, truth, determinism."""

from __future__ import annotations

import re

import nibabel as nib
import numpy as np
import pandas as pd
import pytest

from adni_pu.synth import SynthConfig, generate_cohort

FAST = dict(voxel_size=3.0, pet=True, pet_fraction=0.6, visit_probabilities=(0.2, 0.4, 0.4))


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    return generate_cohort(out, n_subjects=5, seed=3, config=SynthConfig(**FAST))


def test_bids_layout_and_valid_nifti(cohort):
    assert (cohort.bids_dir / "dataset_description.json").is_file()
    assert (cohort.bids_dir / "participants.tsv").is_file()
    pattern = re.compile(
        r"sub-ADNI(\d{3})S(\d{4})/ses-M(\d{3})/anat/sub-ADNI\1S\2_ses-M\3_T1w\.nii\.gz$")
    assert cohort.scan_paths
    for path in cohort.scan_paths:
        rel = path.relative_to(cohort.bids_dir).as_posix()
        assert pattern.match(rel), rel
        img = nib.load(path)
        data = np.asanyarray(img.dataobj)
        assert data.ndim == 3 and np.isfinite(data).all() and data.max() > 0
        assert np.allclose(img.header.get_zooms(), 3.0)
        assert int(img.header["sform_code"]) > 0 and int(img.header["qform_code"]) > 0
        # plausible head: 12-26 cm across in every world direction
        canon = nib.as_closest_canonical(img)
        nz = np.argwhere(np.asanyarray(canon.dataobj) > 0.05 * data.max())
        extent = (nz.max(0) - nz.min(0) + 1) * 3.0
        assert ((extent > 120) & (extent < 260)).all(), extent


def test_skull_around_brain_and_true_mask(cohort):
    scans = pd.read_csv(cohort.truth_scans_path)
    row = scans.iloc[0]
    img = nib.load(cohort.root / row["t1_path"])
    mask_img = nib.load(cohort.root / row["brain_mask_path"])
    assert np.allclose(img.affine, mask_img.affine)
    t1 = np.asanyarray(img.dataobj).astype(float)
    mask = np.asanyarray(mask_img.dataobj) > 0
    # adult brain sizes, inside preprocessing's QC range (400-2500 ml) with room to spare
    for other in scans.itertuples():
        other_mask = np.asanyarray(nib.load(cohort.root / other.brain_mask_path).dataobj)
        assert 1100 < (other_mask > 0).sum() * 27 / 1000 < 2200
    head = t1 > 0.1 * np.percentile(t1[mask], 50)
    outside = head & ~mask
    assert outside.sum() > 0.3 * mask.sum()  # skull and scalp for skull stripping to remove
    assert t1[mask].mean() > 0.3 * t1[outside].mean()


def test_table_columns_visits_and_pet(cohort):
    table = pd.read_csv(cohort.table_path, dtype={"PTID": str})
    for col in ("RID", "PTID", "VISCODE", "EXAMDATE", "DX_bl", "DX", "AV45", "AGE",
                "PTGENDER"):
        assert col in table.columns
    assert table["PTID"].str.fullmatch(r"\d{3}_S_\d{4}").all()
    assert set(table["DX_bl"]) <= {"CN", "SMC", "EMCI", "LMCI", "AD"}
    assert set(table["DX"].dropna()) <= {"CN", "MCI", "Dementia"}
    visits = table.groupby("RID").size()
    assert (visits > 1).any()
    assert table["VISCODE"].iloc[0] == "bl" and {"m12"} <= set(table["VISCODE"])
    assert table["AV45"].isna().any()
    pd.to_datetime(table["EXAMDATE"])  # parseable dates
    truth = pd.read_csv(cohort.truth_path, dtype={"subject_id": str})
    assert set(truth["subject_id"]) == set(table["PTID"])
    assert ((truth["latent_amyloid"] >= 0.25) == (truth["amyloid_positive"] == 1)).all()
    scans = pd.read_csv(cohort.truth_scans_path)
    assert len(scans) == len(cohort.scan_paths)
    pet = scans["pet_path"].dropna()
    assert len(pet) > 0
    pet_img = nib.load(cohort.root / pet.iloc[0])
    assert pet_img.ndim == 3 and np.isfinite(pet_img.get_fdata()).all()


def test_same_seed_same_files(cohort, tmp_path):
    again = generate_cohort(tmp_path / "again", n_subjects=1, seed=3,
                            config=SynthConfig(**FAST, write_brain_masks=False))
    first = {p.relative_to(cohort.bids_dir) for p in cohort.scan_paths}
    for path in again.scan_paths:
        rel = path.relative_to(again.bids_dir)
        assert rel in first
        a = nib.load(path)
        b = nib.load(cohort.bids_dir / rel)
        assert np.array_equal(np.asanyarray(a.dataobj), np.asanyarray(b.dataobj))
        assert np.allclose(a.affine, b.affine)
    other = generate_cohort(tmp_path / "other", n_subjects=1, seed=4,
                            config=SynthConfig(**FAST, write_brain_masks=False))
    a = np.asanyarray(nib.load(other.scan_paths[0]).dataobj)
    b = np.asanyarray(nib.load(again.scan_paths[0]).dataobj)
    assert a.shape != b.shape or not np.array_equal(a, b)


def test_atrophy_is_rendered():
    """Hippocampal loss lowers the template-space T1 in the hippocampus."""
    from adni_pu.synth.anatomy import build_anatomy
    from adni_pu.synth.render import SubjectAnatomy, template_t1
    from adni_pu.synth.subjects import make_subjects

    cfg = SynthConfig(skull=False)
    anatomy = build_anatomy(3.0)
    subject = make_subjects(1, seed=0, cfg=cfg)[0]
    sub = SubjectAnatomy(anatomy, subject, cfg)
    visit = subject.visits[0]
    region = anatomy.hippocampus > 0.5
    means = []
    for loss in (0.0, 0.6):
        visit.hippocampal_loss, visit.cortical_loss, visit.ventricle_mm = loss, 0.0, 0.0
        image = template_t1(sub, visit, np.random.default_rng(1), cfg)
        means.append(image[region].mean())
    assert means[1] < 0.85 * means[0]

"""QC metrics (mask edge offset and contrast, registration metrics) and the QC checks.

Unit tests use tiny synthetic volumes made here; the integration tests use the real
Colin27 head in ../shared/data and skip when it is absent.
"""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from conftest import shared_path

from adni_pu.preprocessing import (
    PreprocessConfig,
    Scan,
    load_config,
    output_paths,
    preprocess_scan,
)
from adni_pu.preprocessing.config import QCSettings
from adni_pu.preprocessing.intensity import intensity_floor, normalise
from adni_pu.preprocessing.phantom import synthetic_head
from adni_pu.preprocessing.qc import (
    brain_noise,
    edge_profile,
    mask_edge_contrast,
    mask_edge_offset_mm,
    qc_checks,
    registration_metrics,
)


def _layered_head(spacing: tuple[float, float, float] = (1.0, 1.0, 1.0)):
    """A T1-like ball: brain (100) inside CSF (10), skull (5) and bright scalp fat (90)."""
    n = [int(round(80 / s)) for s in spacing]
    grid = np.meshgrid(*[(np.arange(k) - (k - 1) / 2) * s for k, s in zip(n, spacing)],
                       indexing="ij")
    r = np.sqrt(sum(g**2 for g in grid))
    data = np.where(r < 25, 100.0, 0.0)
    data[(r >= 25) & (r < 28)] = 10.0
    data[(r >= 28) & (r < 32)] = 5.0
    data[(r >= 32) & (r < 37)] = 90.0
    return data.astype(np.float32), r


@pytest.mark.parametrize("spacing", [(1.0, 1.0, 1.0), (2.0, 1.0, 1.5)])
def test_mask_edge_contrast_separates_good_eroded_and_dilated_masks(spacing) -> None:
    data, r = _layered_head(spacing)
    good = mask_edge_contrast(data, r < 25, spacing)
    eroded = mask_edge_contrast(data, r < 19, spacing)
    dilated = mask_edge_contrast(data, r < 31, spacing)  # through CSF into the skull
    assert good < 0.3
    assert eroded > 0.9
    assert dilated > 0.9


def test_mask_edge_contrast_of_empty_and_full_masks_is_zero() -> None:
    data, r = _layered_head()
    assert mask_edge_contrast(data, np.zeros_like(r, bool), (1.0,) * 3) == 0.0
    assert mask_edge_contrast(data, np.ones_like(r, bool), (1.0,) * 3) == 0.0


def _cortex_head(spacing: tuple[float, float, float], blur_mm: float = 0.0):
    """A T1-like ball with a cortex: white matter (100, r < 20 mm) in grey matter (60), a
    thin CSF layer (15, to 27 mm), bone (5, to 31 mm) and bright scalp (90, to 37 mm);
    optionally blurred (Gaussian, sigma in mm) like a resampled scan or a mean of heads."""
    from scipy import ndimage

    n = [int(round(84 / s)) for s in spacing]
    grid = np.meshgrid(*[(np.arange(k) - (k - 1) / 2) * s for k, s in zip(n, spacing)],
                       indexing="ij")
    r = np.sqrt(sum(g**2 for g in grid))
    data = np.select([r < 20, r < 25, r < 27, r < 31, r < 37], [100.0, 60.0, 15.0, 5.0, 90.0])
    if blur_mm:
        data = ndimage.gaussian_filter(data, [blur_mm / s for s in spacing])
    return data.astype(np.float32), r


@pytest.mark.parametrize("spacing", [(1.0, 1.0, 1.0), (2.0, 1.0, 1.5), (3.0, 3.0, 3.0)])
@pytest.mark.parametrize("blur_mm", [0.0, 2.5])
def test_mask_edge_offset_accepts_a_good_mask_sharp_or_blurred_and_refuses_bad_ones(
        spacing, blur_mm) -> None:
    """The brain's edge sits at a good mask's edge whatever the blur; a mask eroded by
    6 mm leaves brain outside it, one dilated into the bone or holding the skull has the
    dark gap inside it. Anisotropic voxels are measured in mm."""
    data, r = _cortex_head(spacing, blur_mm)
    qc = QCSettings()
    good = mask_edge_offset_mm(data, r < 25, spacing)
    assert qc.min_mask_edge_offset_mm + 1 < good < qc.max_mask_edge_offset_mm, good
    eroded = mask_edge_offset_mm(data, r < 19, spacing)
    dilated = mask_edge_offset_mm(data, r < 31, spacing)
    skull = mask_edge_offset_mm(data, r < 34, spacing)  # brain, CSF, bone and some scalp
    assert eroded > qc.max_mask_edge_offset_mm + 2, eroded
    assert dilated < qc.min_mask_edge_offset_mm - 1, dilated
    assert skull < qc.min_mask_edge_offset_mm - 1, skull
    assert any("outside the brain mask" in p
               for p in qc_checks({"brain_volume_ml": 1300.0, "mask_edge_offset_mm": eroded}, qc))
    assert any("inside the brain mask" in p
               for p in qc_checks({"brain_volume_ml": 1300.0, "mask_edge_offset_mm": dilated}, qc))


def test_blur_raises_the_band_contrast_of_a_good_mask_but_keeps_its_edge_offset() -> None:
    """Why the offset replaced the band contrast as the check: on a smooth head the band
    contrast of a good mask climbs towards that of an eroded mask on a sharp head, while
    the offset stays about 5 mm away from the eroded mask's."""
    spacing = (1.0, 1.0, 1.0)
    sharp, r = _cortex_head(spacing)
    smooth, _ = _cortex_head(spacing, 3.0)
    eroded_contrast = mask_edge_contrast(sharp, r < 19, spacing)
    assert mask_edge_contrast(sharp, r < 25, spacing) < 0.3 * eroded_contrast
    assert mask_edge_contrast(smooth, r < 25, spacing) > 0.85 * eroded_contrast
    offset_sharp = mask_edge_offset_mm(sharp, r < 25, spacing)
    offset_smooth = mask_edge_offset_mm(smooth, r < 25, spacing)
    assert abs(offset_smooth - offset_sharp) < 2.5
    assert mask_edge_offset_mm(sharp, r < 19, spacing) > offset_smooth + 5


def test_edge_profile_is_in_mm_and_falls_from_the_brain_to_the_gap() -> None:
    """Shells by signed distance from the mask's edge: the same head on isotropic and
    anisotropic voxels gives the same profile in mm."""
    iso, r_iso = _cortex_head((1.0, 1.0, 1.0))
    aniso, r_aniso = _cortex_head((2.0, 1.0, 1.5))
    d1, p1 = edge_profile(iso, r_iso < 25, (1.0, 1.0, 1.0))
    d2, p2 = edge_profile(aniso, r_aniso < 25, (2.0, 1.0, 1.5))
    assert np.all(np.diff(d1) > 0) and d1[0] < -8 and d1[-1] > 6
    for d, p in ((d1, p1), (d2, p2)):
        assert p[d < -6].min() > 0.95  # white matter, the median inside the mask
        assert p[(d > 3) & (d < 5)].max() < 0.2  # CSF and bone
    assert abs(np.interp(-3.0, d1, p1) - np.interp(-3.0, d2, p2)) < 0.15


def test_mask_edge_offset_of_empty_and_full_masks_is_zero() -> None:
    data, r = _cortex_head((2.0, 2.0, 2.0))
    assert mask_edge_offset_mm(data, np.zeros_like(r, bool), (2.0,) * 3) == 0.0
    assert mask_edge_offset_mm(data, np.ones_like(r, bool), (2.0,) * 3) == 0.0


def _shift(mm: tuple[float, float, float]) -> np.ndarray:
    out = np.eye(4)
    out[:3, 3] = mm
    return out


def test_registration_metrics_are_perfect_for_the_template_itself_and_drop_when_moved() -> None:
    from adni_pu.preprocessing.registration import template_at

    tdata, tmask, taffine = template_at(4.0)
    same = registration_metrics(tdata, tmask, taffine, np.eye(4), 4.0)
    assert same["registration_similarity"] > 0.999
    assert same["template_mask_dice"] > 0.999
    # the scan's brain sits 12 mm further right than the transform says
    moved = registration_metrics(tdata, tmask, taffine, _shift((12.0, 0.0, 0.0)), 4.0)
    assert moved["template_mask_dice"] < 0.92
    assert moved["registration_similarity"] < same["registration_similarity"] - 0.2
    # a native grid in another voxel order and spacing gives the same numbers
    from scipy import ndimage

    native_aff = np.array([[0, 0, -2.0, 90], [3.0, 0, 0, -130], [0, 2.5, 0, -80], [0, 0, 0, 1]])
    m = np.linalg.inv(taffine) @ native_aff
    shape = (80, 70, 95)
    nd = ndimage.affine_transform(tdata, m[:3, :3], offset=m[:3, 3], output_shape=shape, order=1)
    nm = ndimage.affine_transform(tmask.astype(np.float32), m[:3, :3], offset=m[:3, 3],
                                  output_shape=shape, order=1) > 0.5
    other = registration_metrics(nd, nm, native_aff, np.eye(4), 4.0)
    assert other["template_mask_dice"] > 0.95
    assert other["registration_similarity"] > 0.9


def test_registration_gain_ignores_noise_and_contrast_but_sees_a_shift() -> None:
    """A noisy scan whose correlation with the template is low (0.46) but which is well
    aligned has no gain; the same scan 6 mm off has a clear one."""
    from adni_pu.preprocessing.registration import template_at

    tdata, tmask, taffine = template_at(4.0)
    rng = np.random.default_rng(0)
    noisy = (tdata / np.percentile(tdata[tmask], 99)
             + rng.normal(0, 0.3, tdata.shape)).astype(np.float32)
    aligned = registration_metrics(noisy, tmask, taffine, np.eye(4), 4.0)
    assert aligned["registration_similarity"] < 0.5
    assert aligned["registration_gain"] < 0.0
    assert qc_checks({"brain_volume_ml": 1500.0, **aligned}, QCSettings()) == []
    off = registration_metrics(noisy, tmask, taffine, _shift((6.0, 0.0, 0.0)), 4.0)
    assert off["registration_gain"] > 0.05


def test_template_end_coverage_finds_a_missing_end_of_the_brain() -> None:
    from adni_pu.preprocessing.registration import template_at

    tdata, tmask, taffine = template_at(4.0)
    full = registration_metrics(tdata, tmask, taffine, np.eye(4), 4.0)
    assert full["template_end_coverage"] > 0.99
    # the top of the brain missing from the mask: overall Dice stays high
    top = np.flatnonzero(tmask.any(axis=(0, 1)))[-1]
    cut = tmask.copy()
    cut[:, :, top - 5:] = False  # 24 mm
    m = registration_metrics(tdata, cut, taffine, np.eye(4), 4.0)
    assert m["template_end_coverage"] < 0.05
    assert m["template_mask_dice"] > 0.9


def test_qc_checks_name_each_new_problem() -> None:
    good = {"brain_volume_ml": 1300, "brain_fraction_of_head": 0.5, "mask_edge_contrast": 0.55,
            "mask_edge_offset_mm": -1.0, "brain_noise": 0.05, "registration_similarity": 0.6,
            "template_mask_dice": 0.95, "template_end_coverage": 0.85, "registration_gain": 0.0}
    s = QCSettings()
    assert qc_checks(good, s) == []
    edge = qc_checks({**good, "mask_edge_contrast": s.max_mask_edge_contrast + 0.05}, s)
    assert len(edge) == 1 and "edge contrast" in edge[0] and "skull stripping" in edge[0]
    out = qc_checks({**good, "mask_edge_offset_mm": s.max_mask_edge_offset_mm + 0.1}, s)
    assert len(out) == 1 and "outside the brain mask" in out[0] and "cut into" in out[0]
    into = qc_checks({**good, "mask_edge_offset_mm": s.min_mask_edge_offset_mm - 0.1}, s)
    assert len(into) == 1 and "inside the brain mask" in into[0] and "skull" in into[0]
    dice = qc_checks({**good, "template_mask_dice": s.min_template_mask_dice - 0.02}, s)
    assert len(dice) == 1 and "Dice" in dice[0] and "misregistration" in dice[0]
    noise = qc_checks({**good, "brain_noise": s.max_brain_noise + 0.01}, s)
    assert len(noise) == 1 and "noisy" in noise[0]
    end = qc_checks({**good, "template_end_coverage": s.min_template_end_coverage - 0.1}, s)
    assert len(end) == 1 and "part of the brain is missing" in end[0]
    gain = qc_checks({**good, "registration_gain": s.max_registration_gain + 0.01}, s)
    assert len(gain) == 1 and "off its optimum" in gain[0]
    # metrics that were not computed (before registration) are not checked
    early = {k: v for k, v in good.items()
             if k not in ("registration_similarity", "template_mask_dice",
                          "template_end_coverage", "registration_gain")}
    assert qc_checks(early, s) == []


# ----------------------------------------------------------------------------- Colin27


def _colin27_2mm():
    """Colin27 (ch2) and its reference brain (ch2bet > 0), resampled to 2 mm."""
    import nibabel as nib

    from adni_pu.preprocessing.registration import grid_affine

    folder = shared_path("mri", "colin27")
    img = nib.load(str(folder / "ch2.nii.gz"))
    ref = nib.load(str(folder / "ch2bet.nii.gz"))
    from adni_pu.atlas import resample_to

    affine, shape = grid_affine(2.0, img.shape, img.affine, img.shape)
    data = resample_to(img, affine, shape, order=1)
    brain = resample_to(ref, affine, shape, order=1) > 0
    return data.astype(np.float32), brain, affine


def _all_metrics(data, brain, affine, template_to_native, cfg) -> dict:
    from adni_pu.preprocessing.qc import brain_noise

    spacing = tuple(float(s) for s in np.sqrt((affine[:3, :3] ** 2).sum(axis=0)))
    return {"brain_volume_ml": float(brain.sum()) * float(np.prod(spacing)) / 1000,
            "mask_edge_contrast": mask_edge_contrast(data, brain, spacing),
            "mask_edge_offset_mm": mask_edge_offset_mm(data, brain, spacing),
            "brain_noise": brain_noise(data, brain, spacing),
            **registration_metrics(data, brain, affine, template_to_native,
                                   cfg.registration.resolution_mm)}


@pytest.mark.integration
def test_colin27_passes_qc_and_a_perturbed_transform_or_bad_mask_fails() -> None:
    """Colin27 lies in MNI space: the identity is its registration (ANTs' affine fit to the
    ICBM template differs from it by about 1.5 mm and 1-2% scale)."""
    from scipy import ndimage

    data, brain, affine = _colin27_2mm()
    cfg = PreprocessConfig()
    good = _all_metrics(data, brain, affine, np.eye(4), cfg)
    assert qc_checks(good, cfg.qc) == [], good
    # the transform off by 6 degrees about z and 6 mm along x
    t = np.radians(6.0)
    nudge = np.eye(4)
    nudge[:2, :2] = [[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]]
    nudge[0, 3] = 6.0
    off = _all_metrics(data, brain, affine, nudge, cfg)
    assert any("optimum" in p for p in qc_checks(off, cfg.qc)), off
    # a brain mask eroded by 6 mm (a failed skull strip)
    eroded = ndimage.distance_transform_edt(brain, sampling=(2.0,) * 3) > 6.0
    bad = _all_metrics(data, eroded, affine, np.eye(4), cfg)
    assert any("skull stripping" in p for p in qc_checks(bad, cfg.qc)), bad


@pytest.mark.integration
@pytest.mark.slow
def test_colin27_with_a_header_flipped_front_to_back_fails_qc(tmp_path) -> None:
    import nibabel as nib

    from adni_pu.preprocessing import preprocess_scan

    img = nib.load(str(shared_path("mri", "colin27", "ch2.nii.gz")))
    affine = img.affine.copy()
    affine[:3, 3] += affine[:3, 1] * (img.shape[1] - 1)
    affine[:3, 1] = -affine[:3, 1]  # the data stay, the header says front is back
    path = tmp_path / "ch2flipped.nii.gz"
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj), affine), str(path))
    row = preprocess_scan(path, tmp_path / "out", PreprocessConfig())
    assert row["status"] == "failed-qc", row
    side = next((tmp_path / "out").glob("sub-*/ses-*/anat/*_desc-preproc_T1w.json"))
    assert "template_end_coverage" in side.read_text()


# ------------------------------------------------------------ a scan stored with an intensity offset


def _mask_metrics(data: np.ndarray, brain: np.ndarray, spacing: tuple[float, ...]) -> dict:
    return {"brain_volume_ml": 1500.0,
            "mask_edge_contrast": mask_edge_contrast(data, brain, spacing),
            "mask_edge_offset_mm": mask_edge_offset_mm(data, brain, spacing),
            "brain_noise": brain_noise(data, brain, spacing)}


@pytest.mark.parametrize("noise", [0.02, 0.15])
def test_qc_of_a_head_stored_with_an_offset_is_that_of_the_head(noise) -> None:
    """The issue's int16 ``x * 10 - 1000``: the noise and edge checks read 0 (and passed)
    whatever the head; now they read what the head reads, and decide alike."""
    head = synthetic_head(noise=noise, seed=3)
    spacing = (3.0, 3.0, 3.0)
    plain = _mask_metrics(head.data, head.brain, spacing)
    for stored in (np.round(head.data * 10 - 1000).astype(np.int16), head.data + 500.0):
        shifted = _mask_metrics(stored, head.brain, spacing)
        for name, value in plain.items():
            assert shifted[name] == pytest.approx(value, rel=2e-3, abs=2e-3), name
        assert qc_checks(shifted, QCSettings()) == qc_checks(plain, QCSettings())
    refused = qc_checks(plain, QCSettings())
    assert (noise > 0.1) == any("too noisy" in p for p in refused), (plain, refused)
    # the registration check's correlation with the template does not move either
    t2n = np.linalg.inv(head.native_to_template)
    a = registration_metrics(head.data, head.brain, head.affine, t2n, 4.0)
    b = registration_metrics(head.data * 10 - 1000, head.brain, head.affine, t2n, 4.0)
    assert a == pytest.approx(b, abs=2e-4)


def test_a_brain_mask_no_brighter_than_the_air_fails_the_checks() -> None:
    """A 0 used to mean "fine" when the brain read <= 0; a mask on the air now fails."""
    head = synthetic_head(noise=0.02)
    spacing = (3.0, 3.0, 3.0)
    air = np.zeros_like(head.brain)
    air[:14, :14, :14] = True  # a corner of the field of view: air only
    noise = brain_noise(head.data, air, spacing)
    assert noise == float("inf")
    problems = qc_checks({"brain_volume_ml": 1500.0, "brain_noise": noise}, QCSettings())
    assert problems == ["the brain is no brighter than the air: no usable signal"]
    # an offset that makes the air negative changes nothing
    assert brain_noise(head.data - 50, air, spacing) == float("inf")


def test_intensity_floor_is_the_air_and_follows_an_offset() -> None:
    head = synthetic_head(noise=0.02)
    assert intensity_floor(head.data) == 0.0  # the phantom's air is clipped at 0
    assert intensity_floor(head.data * 3 - 70) == pytest.approx(-70, abs=1e-3)
    mask = head.brain
    x = head.data.astype(np.float64)
    settings = PreprocessConfig().intensity
    assert np.allclose(normalise(x * 7 - 300, mask, settings), normalise(x, mask, settings),
                       atol=1e-6)


FAST = ['skullstrip.method="template"', "registration.resolution_mm=4.0",
        "registration.iterations=[30, 10]", "registration.shrink_factors=[2, 1]",
        "registration.smoothing_sigmas=[1.0, 0.0]", "grid.spacing_mm=3.0",
        "grid.shape=[61, 73, 61]", "qc.min_brain_ml=100"]


def test_model_input_of_a_scan_stored_with_an_offset_is_that_of_the_scan(
        tmp_path: Path, monkeypatch) -> None:
    """N4 (on), the fill around the brain before resampling and the normalisation: the
    same head stored as ``x * 10 - 1000`` gives the same model input and QC. The brain
    mask and the registration are held fixed (the true mask and the true transform, the
    identity), since ANTs itself answers a scaled image with a transform a few hundredths
    of a mm away."""
    import ants

    from adni_pu.preprocessing import registration as R
    from adni_pu.preprocessing import skullstrip

    head = synthetic_head(spacing=4.0, shape=(48, 57, 48), bias_strength=0.3, seed=1)
    assert np.allclose(head.native_to_template, np.eye(4))
    mat = tmp_path / "identity.mat"
    ants.write_transform(ants.create_ants_transform(transform_type="AffineTransform",
                                                    dimension=3), str(mat))
    fit = R.Registration(fwd=[str(mat)], inv=[str(mat)], inv_invert=[True],
                         template_to_native=np.eye(4), similarity=1.0, workdir=str(tmp_path),
                         files={"affine.mat": mat.read_bytes()})
    monkeypatch.setattr(R, "register_to_template", lambda *args, **kwargs: fit)
    monkeypatch.setattr(R, "cleanup", lambda reg: None)
    monkeypatch.setattr(skullstrip, "skull_strip", lambda data, *a, **k: head.brain.copy())
    # the true mask of a 4 mm head ends a voxel short of where the check wants it
    cfg = load_config(None, [*FAST, "qc.max_mask_edge_offset_mm=3.0"])
    out: dict[str, tuple[np.ndarray, dict]] = {}
    for name, data in (("plain", head.data), ("shifted", head.data * 10 - 1000)):
        path = tmp_path / f"{name}.nii.gz"
        nib.save(nib.Nifti1Image(data.astype(np.float32), head.affine), str(path))
        row = preprocess_scan(path, tmp_path / "out", cfg)
        assert row["status"] == "done", row["error"]
        side = json.loads(output_paths(Scan(name, "01", path), tmp_path / "out")
                          ["sidecar"].read_text())
        out[name] = (nib.load(row["preprocessed_path"]).get_fdata(), side)
    (a, side_a), (b, side_b) = out["plain"], out["shifted"]
    assert np.abs(a - b).max() < 1e-3
    assert side_b["input"]["intensity_floor"] == pytest.approx(-1000, abs=1e-2)
    for name in ("mask_edge_contrast", "mask_edge_offset_mm", "brain_noise",
                 "registration_similarity"):
        assert side_b["qc"][name] == pytest.approx(side_a["qc"][name], abs=2e-3), name


def _rician(data: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Rician noise of sigma = ``fraction`` of the 99th intensity percentile."""
    rng = np.random.default_rng(seed)
    sigma = fraction * float(np.percentile(data, 99))
    real = data + rng.normal(0, sigma, data.shape)
    return np.sqrt(real**2 + rng.normal(0, sigma, data.shape) ** 2).astype(np.float32)


@pytest.mark.integration
def test_colin27_stored_with_an_offset_is_judged_as_colin27() -> None:
    """The issue's reproduction: Colin27 at 2 mm, clean and with 15 % Rician noise, as
    int16 ``x * 10 - 1000``."""
    from test_preprocessing_qc import _colin27_2mm

    shared_path("mri", "colin27")
    data, brain, _affine = _colin27_2mm()
    spacing = (2.0, 2.0, 2.0)
    for image in (data, _rician(data, 0.15, 3)):
        plain = _mask_metrics(image, brain, spacing)
        shifted = _mask_metrics(np.round(image * 10 - 1000).astype(np.int16), brain, spacing)
        for name, value in plain.items():
            assert shifted[name] == pytest.approx(value, rel=2e-3, abs=2e-3), name
        assert qc_checks(shifted, QCSettings()) == qc_checks(plain, QCSettings())
    assert plain["brain_noise"] > QCSettings().max_brain_noise  # the noisy one is refused

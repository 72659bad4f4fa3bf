"""Each preprocessing step on small synthetic heads (3 mm, ~64^3 voxels)."""

from __future__ import annotations

import numpy as np
import pytest

from adni_pu.preprocessing.config import (
    CerebellumSettings,
    IntensitySettings,
    N4Settings,
    PreprocessConfig,
    QCSettings,
    RegistrationSettings,
    SkullStripSettings,
    load_config,
    settings_hash,
)
from adni_pu.preprocessing.phantom import synthetic_head

FAST_REG = RegistrationSettings(resolution_mm=4.0, iterations=(50, 20), shrink_factors=(2, 1),
                                smoothing_sigmas=(1.0, 0.0))


def _dice(a: np.ndarray, b: np.ndarray) -> float:
    return float(2 * (a & b).sum() / (a.sum() + b.sum()))


@pytest.fixture(scope="module")
def head():
    return synthetic_head(rotation_deg=(6.0, -4.0, 8.0), translation_mm=(5.0, -7.0, 4.0), seed=1)


def test_n4_removes_a_smooth_bias_field() -> None:
    from adni_pu.preprocessing.n4 import n4_correct

    clean = synthetic_head(noise=0.0)
    biased = synthetic_head(noise=0.0, bias_strength=0.4)
    wm = clean.brain & (clean.data > np.percentile(clean.data[clean.brain], 75))
    ratio_before = biased.data[wm] / clean.data[wm]
    corrected, field = n4_correct(biased.data, (3.0, 3.0, 3.0), N4Settings())
    ratio_after = corrected[wm] / clean.data[wm]
    cv = lambda r: float(np.std(r) / np.mean(r))  # noqa: E731
    assert cv(ratio_before) > 0.08
    assert cv(ratio_after) < 0.5 * cv(ratio_before)
    assert field.shape == biased.data.shape and np.all(field > 0)


def test_head_mask_and_rough_brain(head) -> None:
    from adni_pu.preprocessing.n4 import head_mask
    from adni_pu.preprocessing.skullstrip import rough_brain

    hm = head_mask(head.data)
    assert hm[head.brain].mean() > 0.99  # the head contains the brain
    assert hm.sum() > 1.4 * head.brain.sum()  # and the skull and scalp around it
    rb = rough_brain(head.data, (3.0, 3.0, 3.0))
    assert _dice(rb, head.brain) > 0.8


def test_template_skull_strip_on_synthetic_head(head) -> None:
    from adni_pu.preprocessing.skullstrip import skull_strip

    mask = skull_strip(head.data, head.affine, SkullStripSettings(method="template"), FAST_REG)
    assert _dice(mask, head.brain) > 0.93


def test_registration_recovers_the_known_motion(head) -> None:
    from adni_pu.preprocessing import registration as R

    reg = R.register_to_template(head.data, head.affine, FAST_REG, mask=head.brain)
    try:
        n2t = np.linalg.inv(reg.template_to_native)
        assert np.abs(n2t[:3, 3] - head.native_to_template[:3, 3]).max() < 2.0  # mm
        assert np.abs(n2t[:3, :3] - head.native_to_template[:3, :3]).max() < 0.04
        assert reg.similarity > 0.8
        assert reg.files["affine.mat"]
        # warping the true brain mask to the template lands on the template's brain
        _, tmask, taff = R.template_at(4.0)
        warped = R.warp_to_template(head.brain.astype(np.float32), head.affine, reg, taff,
                                    tmask.shape) > 0.5
        assert _dice(warped, tmask) > 0.9
    finally:
        R.cleanup(reg)


_REPRO_SCRIPT = """
import dataclasses, sys
from adni_pu.preprocessing import registration as R
from adni_pu.preprocessing.config import RegistrationSettings
from adni_pu.preprocessing.phantom import synthetic_head
fast = RegistrationSettings(resolution_mm=4.0, iterations=(50, 20), shrink_factors=(2, 1),
                            smoothing_sigmas=(1.0, 0.0))
h = synthetic_head(rotation_deg=(6.0, -4.0, 8.0), translation_mm=(5.0, -7.0, 4.0), seed=1)
mats = []
for seed in (1, 1, 2):
    reg = R.register_to_template(h.data, h.affine, dataclasses.replace(fast, random_seed=seed),
                                 mask=h.brain)
    mats.append(reg.files["affine.mat"])
    R.cleanup(reg)
print(mats[0] == mats[1], mats[0] == mats[2])
"""


def test_registration_is_reproducible_with_one_thread() -> None:
    """The same seed gives the same transform, another seed another one (antspyx ignores its
    own ``random_seed`` argument; ANTS_RANDOM_SEED carries it). ITK reads its thread count
    once per process, so this runs in a fresh single-threaded process, as a worker does."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _REPRO_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]


def test_cerebellum_mask_in_template_space() -> None:
    from adni_pu import atlas
    from adni_pu.preprocessing.cerebellum import cerebellum_mask

    grid = atlas.model_grid_affine()
    mask = cerebellum_mask(grid, atlas.MODEL_GRID_SHAPE, CerebellumSettings(dilate_mm=0.0))
    ml = mask.sum() * 1.5**3 / 1000
    assert 100 < ml < 250, ml
    centre = grid @ np.append(np.argwhere(mask).mean(axis=0), 1.0)
    assert centre[1] < -40 and centre[2] < -20  # posterior and inferior (MNI mm)
    dilated = cerebellum_mask(grid, atlas.MODEL_GRID_SHAPE, CerebellumSettings(dilate_mm=3.0))
    assert dilated.sum() > mask.sum() and (dilated | mask).sum() == dilated.sum()


def test_intensity_normalisation() -> None:
    from adni_pu.preprocessing.intensity import normalise

    rng = np.random.default_rng(0)
    data = rng.normal(100, 20, (20, 20, 20)).astype(np.float32)
    mask = np.zeros(data.shape, bool)
    mask[5:15, 5:15, 5:15] = True
    p = normalise(data, mask, IntensitySettings())
    assert p[~mask].max() == 0 and p.min() >= 0 and p.max() == 1.0
    z = normalise(data, mask, IntensitySettings(method="zscore"))
    assert abs(z[mask].mean()) < 1e-5 and abs(z[mask].std() - 1) < 1e-4 and z[~mask].max() == 0


def test_qc_checks_and_outlier_ranking() -> None:
    from adni_pu.preprocessing.qc import qc_checks, rank_outliers

    good = {"brain_volume_ml": 1300, "brain_fraction_of_head": 0.5,
            "registration_similarity": 0.8, "cerebellum_fraction_of_brain": 0.1}
    assert qc_checks(good, QCSettings()) == []
    assert "empty" in qc_checks({**good, "brain_volume_ml": 0}, QCSettings())[0]
    assert "skull" in qc_checks({**good, "brain_fraction_of_head": 0.97}, QCSettings())[0]
    assert "similarity" in qc_checks({**good, "registration_similarity": 0.1}, QCSettings())[0]
    records = [{"scan_label": f"s{i}", "status": "done",
                "qc": {**good, "brain_volume_ml": 1300 + 10 * i}} for i in range(6)]
    records.append({"scan_label": "huge", "status": "done", "qc": {**good, "brain_volume_ml": 2400}})
    records.append({"scan_label": "broken", "status": "failed", "error": "x", "qc": {}})
    ranked = rank_outliers(records)
    assert [r["scan_label"] for r in ranked[:2]] == ["broken", "huge"]
    assert "brain_volume_ml" in ranked[1]["outlier_reason"]


def test_config_validation_and_hash() -> None:
    from adni_pu.config import ConfigError

    base = PreprocessConfig()
    assert settings_hash(base) == settings_hash(load_config(None, ["runner.workers=4"]))
    assert settings_hash(base) != settings_hash(load_config(None, ["n4.shrink_factor=2"]))
    with pytest.raises(ConfigError, match="skullstrip.method"):
        load_config(None, ['skullstrip.method="magic"'])
    with pytest.raises(ConfigError, match="same length"):
        load_config(None, ["registration.iterations=[10]"])
    with pytest.raises(ConfigError, match="unknown setting"):
        load_config(None, ["n4.speed=3"])

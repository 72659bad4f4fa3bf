"""deepbet (bundled weights, no download) on a synthetic head, once."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import shared_path

from adni_pu.preprocessing.config import SkullStripSettings
from adni_pu.preprocessing.phantom import synthetic_head

pytest.importorskip("deepbet")


def test_deepbet_finds_the_brain_of_a_synthetic_head() -> None:
    from adni_pu.preprocessing.skullstrip import skull_strip

    head = synthetic_head(spacing=2.0, shape=(90, 110, 90), rotation_deg=(0, 0, 5), seed=3)
    mask = skull_strip(head.data, head.affine, SkullStripSettings(method="deepbet"))
    dice = 2 * (mask & head.brain).sum() / (mask.sum() + head.brain.sum())
    assert dice > 0.85, dice
    assert not mask[~np.asarray(head.data > 0)].all()


def test_deepbet_at_192_agrees_with_its_own_256() -> None:
    from adni_pu.preprocessing.skullstrip import skull_strip

    head = synthetic_head(spacing=3.0, shape=(60, 72, 60), seed=5)
    full = skull_strip(head.data, head.affine, SkullStripSettings(method="deepbet"))
    small = skull_strip(head.data, head.affine,
                        SkullStripSettings(method="deepbet", deepbet_size=192))
    assert 2 * (full & small).sum() / (full.sum() + small.sum()) > 0.97


@pytest.mark.parametrize("size", [64, 200, 352])
def test_deepbet_size_out_of_range_is_refused(size: int) -> None:
    from adni_pu.errors import ConfigError

    with pytest.raises(ConfigError, match="deepbet_size"):
        SkullStripSettings(deepbet_size=size)


def test_deepbet_at_192_on_colin27_matches_the_reference_mask() -> None:
    """Real head (skips without ../shared/data): Dice vs ch2bet > 0 as at deepbet's 256."""
    import nibabel as nib

    from adni_pu.preprocessing.skullstrip import skull_strip

    root = shared_path("mri", "colin27")
    img = nib.as_closest_canonical(nib.load(root / "ch2.nii.gz"))
    ref = np.asarray(nib.as_closest_canonical(nib.load(root / "ch2bet.nii.gz")).dataobj) > 0
    mask = skull_strip(np.asarray(img.dataobj, np.float32), img.affine,
                       SkullStripSettings(method="deepbet", deepbet_size=192))
    assert 2 * (mask & ref).sum() / (mask.sum() + ref.sum()) >= 0.93


def test_deepbet_size_at_its_default_keeps_earlier_settings_hashes() -> None:
    """Folders preprocessed before the setting existed still resume (the same hash)."""
    from adni_pu.preprocessing.config import load_config, settings_hash

    default = load_config()
    assert settings_hash(default) == settings_hash(load_config(None, ["skullstrip.deepbet_size=256"]))
    # the hash before deepbet_size existed, with the QC settings of that time (issue 25
    # moved two limits and added the edge offset check: a changed check rightly changes
    # the hash, so earlier outputs are judged again)
    import hashlib
    import json

    from adni_pu import config as cfgmod
    from adni_pu.preprocessing.config import ADDED_LATER, PIPELINE_VERSION

    def recipe(cfg, drop_qc: tuple[str, ...] = (), version: str = PIPELINE_VERSION) -> str:
        # settings_hash, step by step
        data = cfgmod.to_dict(cfg)
        for key in ("runner", "discovery"):
            data.pop(key)
        for key in drop_qc:
            data["qc"].pop(key)
        cfgmod.drop_added_later(data, ADDED_LATER)
        data["pipeline_version"] = version
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    assert recipe(default) == settings_hash(default)
    before = load_config(None, ["qc.max_mask_edge_contrast=0.72", "qc.max_registration_gain=0.02"])
    # (pipeline version 1: issue 37 measured intensities from the air's level, version 2)
    assert recipe(before, ("min_mask_edge_offset_mm", "max_mask_edge_offset_mm"), "1") == \
        "dbe33973b7e3f41c"
    assert settings_hash(default) != "dbe33973b7e3f41c"
    assert settings_hash(load_config(None, ["skullstrip.deepbet_size=192"])) != settings_hash(default)

"""deepbet (bundled weights, no download) on a synthetic head, once."""

from __future__ import annotations

import numpy as np
import pytest

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

"""Integration checks on the real Colin27 head in ../shared/data (skipped when absent)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).resolve().parents[2] / "shared/data/mri/colin27"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not (DATA / "ch2.nii.gz").is_file(), reason=f"{DATA} not available"),
]


def test_colin27_reads_and_validates() -> None:
    from adni_pu.preprocessing import load_scan
    from adni_pu.preprocessing.n4 import head_mask

    data, affine = load_scan(DATA / "ch2.nii.gz")
    assert data.shape == (181, 217, 181)
    head = head_mask(data)
    assert 2500 < head.sum() / 1000 < 5000  # ml at 1 mm


def test_colin27_full_pipeline_meets_the_targets(tmp_path: Path) -> None:
    """Preprocessing accuracy on a real head (brain mask Dice against ch2bet, cerebellum
    against AAL). By default where ../shared/data is: about 25 s on the 2-core machine."""
    import nibabel as nib

    from adni_pu.preprocessing import PreprocessConfig, run_preprocessing

    summary = run_preprocessing([DATA / "ch2.nii.gz"], tmp_path, PreprocessConfig(),
                                progress=False)
    assert list(summary.status) == ["done"], summary.error.tolist()
    from adni_pu.preprocessing import Scan, output_paths

    paths = output_paths(Scan("ch2", "01", DATA / "ch2.nii.gz"), tmp_path)
    brain = nib.load(str(paths["brainmask_native"])).get_fdata() > 0
    cer = nib.load(str(paths["cerebellum_native"])).get_fdata() > 0
    ref = nib.load(str(DATA / "ch2bet.nii.gz")).get_fdata() > 0
    aal = np.asarray(nib.load(str(DATA / "aal.nii.gz")).dataobj)
    dice = 2 * (brain & ref).sum() / (brain.sum() + ref.sum())
    assert dice >= 0.93, dice
    cer_ref = (aal >= 91) & (aal <= 116) & ref
    rest = ref & ~cer_ref
    assert (cer & cer_ref).sum() / cer_ref.sum() >= 0.90
    assert (cer & rest).sum() / rest.sum() <= 0.03

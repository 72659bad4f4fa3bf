"""The positive class in words: what a cohort's label settings make positive, recorded by
``cohort build`` and ``train`` and printed by ``predict``, so that a probability is never read
as amyloid status alone where the cohort's class is "a diagnosis or amyloid"."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from adni_pu import config as cfgmod
from adni_pu.cli.app import app
from adni_pu.cohort.config import load_cohort_config, positive_class_text
from adni_pu.workflows import predict as predict_mod


@pytest.mark.parametrize(("preset", "overrides", "text"), [
    ("paper", [], "a positive clinical diagnosis (AD, Dementia) or amyloid SUVR >= 1.08 "
                  "(AV45, FBB, PIB)"),
    ("tracer-cutoffs", [], "a positive clinical diagnosis (AD, Dementia) or amyloid SUVR >= "
                           "1.08 (FBB) or amyloid SUVR >= 1.11 (AV45) or amyloid SUVR >= 1.5 "
                           "(PIB)"),
    ("centiloid", [], "a positive clinical diagnosis (AD, Dementia) or amyloid >= 20 "
                      "Centiloids"),
    ("paper", ["labels.truth_from_diagnosis=false"], "amyloid SUVR >= 1.08 (AV45, FBB, PIB)"),
    ("paper", ["labels.diagnosis_only=true"], "a positive clinical diagnosis (AD, Dementia)"),
])
def test_each_preset_names_its_class(preset, overrides, text):
    cfg = load_cohort_config(preset=preset, overrides=overrides)
    assert positive_class_text(cfg.labels) == text


def _run_beside_a_cohort(tmp_path, record: bool):
    """A run folder whose run.json names a manifest in a cohort folder with its settings;
    ``record``: run.json also holds the class (as train writes it now)."""
    cohort = tmp_path / "cohort"
    cohort.mkdir(parents=True)
    cfgmod.save(load_cohort_config(preset="centiloid"), cohort / "cohort_config.toml")
    (cohort / "manifest.csv").write_text("subject_id\n")
    run = tmp_path / "run"
    run.mkdir()
    info = {"manifest": str(cohort / "manifest.csv")}
    if record:
        info["positive_class"] = "the recorded class"
    (run / "run.json").write_text(json.dumps(info))
    return run


def test_the_run_record_names_the_class_else_the_cohort_settings_do(tmp_path):
    assert predict_mod.positive_class(_run_beside_a_cohort(tmp_path / "a", True)) == (
        "the recorded class")
    assert predict_mod.positive_class(_run_beside_a_cohort(tmp_path / "b", False)) == (
        "a positive clinical diagnosis (AD, Dementia) or amyloid >= 20 Centiloids")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "run.json").write_text(json.dumps({"manifest": str(tmp_path / "m.csv")}))
    assert predict_mod.positive_class(tmp_path / "c") is None


def test_predict_prints_the_class_and_calls_scans_positive_or_negative(tmp_path, monkeypatch):
    run = _run_beside_a_cohort(tmp_path, False)
    table = pd.DataFrame([{"scan": "a.nii.gz", "status": "model-grid", "probability": 0.7,
                           "logit": 0.85, "prediction": "positive", "error": ""}])
    monkeypatch.setattr(predict_mod, "predict_scans", lambda *a, **k: table)
    result = CliRunner().invoke(app, ["predict", str(run), "a.nii.gz"])
    assert result.exit_code == 0, result.output
    assert ("positive class: a positive clinical diagnosis (AD, Dementia) or amyloid >= 20 "
            "Centiloids (the run's cohort)") in result.output
    assert "a.nii.gz\t0.7000\tpositive\t(model-grid)" in result.output
    assert "amyloid-positive" not in result.output


def test_train_records_the_cohort_class_in_run_json(tmp_path):
    from volume_helpers import make_volume_cohort, tiny_overrides

    from adni_pu.workflows.train import train_volumes
    from adni_pu.workflows.volume_settings import load_volume_config

    manifest = make_volume_cohort(tmp_path / "cohort")
    cfgmod.save(load_cohort_config(preset="paper"), manifest.parent / "cohort_config.toml")
    train_volumes(manifest, load_volume_config(None, tiny_overrides(1), preset="naive"),
                  tmp_path / "run")
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["positive_class"].startswith("a positive clinical diagnosis (AD, Dementia)")

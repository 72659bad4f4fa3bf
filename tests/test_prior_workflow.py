"""The class prior estimated from the PU data alone, in training and as `adni-pu prior`."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner
from volume_helpers import make_volume_cohort, tiny_overrides

from adni_pu.cli.app import app
from adni_pu.config import ConfigError
from adni_pu.errors import VolumeRunError
from adni_pu.workflows.evaluate import evaluate_run
from adni_pu.workflows.prior import estimate_manifest_prior
from adni_pu.workflows.train import train_volumes
from adni_pu.workflows.volume_settings import load_volume_config

pytestmark = pytest.mark.usefixtures("tiny_prior_estimates")


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    root = tmp_path_factory.mktemp("prior")
    return {"root": root, "manifest": make_volume_cohort(root / "cohort"),
            "cache": root / "cache"}


def test_training_with_an_estimated_prior_records_it_and_trains_with_it(cohort):
    cfg = load_volume_config(None, ['prior="estimate"', *tiny_overrides(1, cohort["cache"])],
                             preset="nnpu")
    run = cohort["root"] / "run"
    train_volumes(cohort["manifest"], cfg, run, log=lambda m: None)
    info = json.loads((run / "run.json").read_text())
    est = info["prior_estimate"]
    assert {"value", "ci_low", "ci_high", "method"} <= set(est) and est["method"] == "bbe"
    assert 0 < est["ci_low"] <= est["value"] <= est["ci_high"] < 1
    assert est["true_prior"] == pytest.approx(5 / 9)  # the cohort's truth, for comparison
    assert info["prior"]["prior"] == est["value"]
    assert json.loads((run / "data.json").read_text())["prior_used"] == est["value"]
    assert json.loads((run / "prior_estimate.json").read_text()) == est
    classifier = run / "prior_estimate"
    assert (classifier / "best_model.pt").is_file()
    assert json.loads((classifier / "selection.json").read_text())["val_criterion"] == "pu_auc"
    # the setting is kept as given, so a rerun resumes instead of refusing other settings
    assert load_volume_config(run / "volume_config.toml").prior == "estimate"
    train_volumes(cohort["manifest"], cfg, run, log=lambda m: None)
    assert json.loads((run / "run.json").read_text())["prior_estimate"] == est
    evaluate_run(run, "test")
    report = (run / "evaluation" / "test" / "report.md").read_text()
    assert f"Class prior used in training: {est['value']:.3f}" in report
    assert f"[{est['ci_low']:.3f}, {est['ci_high']:.3f}]" in report
    assert "the cohort's truth gives 0.556" in report


def test_the_prior_command_prints_the_estimate_beside_the_truth(cohort):
    out = cohort["root"] / "estimate"
    sets = [arg for o in tiny_overrides(1, cohort["cache"]) for arg in ("--set", o)]
    result = CliRunner().invoke(app, ["prior", str(cohort["manifest"]), str(out), *sets])
    assert result.exit_code == 0, result.output
    record = json.loads((out / "prior_estimate.json").read_text())
    assert f"class prior estimate {record['value']:.3f}" in result.output
    assert "positive fraction by the cohort's truth: 0.556" in result.output
    assert f"--set prior={record['value']:.4f}" in result.output


def test_no_labelled_positive_in_validation_is_refused_by_name(cohort, tmp_path):
    frame = pd.read_csv(cohort["manifest"])
    frame.loc[frame["split"] == "val", "pu_label"] = 0
    manifest = cohort["manifest"].parent / "no-val-positive.csv"
    frame.to_csv(manifest, index=False)
    cfg = load_volume_config(None, tiny_overrides(1, cohort["cache"]), preset="naive")
    with pytest.raises(VolumeRunError, match="holds 0 labelled positive"):
        estimate_manifest_prior(manifest, cfg, tmp_path / "out")


def test_an_unknown_prior_word_is_a_settings_error():
    with pytest.raises(ConfigError, match="'cohort' or 'estimate'"):
        load_volume_config(None, ['prior="guess"'])

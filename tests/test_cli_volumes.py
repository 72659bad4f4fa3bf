"""``adni-pu train|evaluate|predict`` end to end on a tiny cohort of model-grid volumes."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner
from volume_helpers import make_volume_cohort, tiny_overrides


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    from adni_pu.cli.app import app  # the real app: it turns library errors into exit 2

    return app


@pytest.fixture(scope="module")
def trained(app, tmp_path_factory):
    root = tmp_path_factory.mktemp("clivol")
    manifest = make_volume_cohort(root / "cohort")
    run = root / "run"
    args = ["train", str(manifest), str(run), "--preset", "nnpu"]
    for item in tiny_overrides(2, root / "cache"):
        args += ["--set", item]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return {"root": root, "manifest": manifest, "run": run, "output": result.output}


def test_train_writes_run_and_rerun_resumes(app, trained):
    assert "selected:" in trained["output"]
    assert "nnPU correction: The non-negative correction fired in " in trained["output"]
    assert "over 2 epochs" in trained["output"]
    cfg = (trained["run"] / "volume_config.toml").read_text()
    assert 'preset = "nnpu"' in cfg and 'method = "nnpu"' in cfg
    # rerunning with the resolved settings file resumes (nothing left to train)
    args = ["train", str(trained["manifest"]), str(trained["run"]),
            "--config", str(trained["run"] / "volume_config.toml")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "nnPU correction: The non-negative correction fired in " in result.output


def test_evaluate_prints_table_with_cis(app, trained):
    result = CliRunner().invoke(app, ["evaluate", str(trained["run"]), "--split", "test",
                                      "--bootstrap", "100"])
    assert result.exit_code == 0, result.output
    assert "balanced_accuracy" in result.output and "[" in result.output
    assert "hidden_positive_recall" in result.output and "hidden positives scored:" in result.output
    assert "nnPU correction: The non-negative correction fired in " in result.output
    metrics = json.loads((trained["run"] / "evaluation" / "test" / "metrics.json").read_text())
    assert metrics["n_subjects_unknown_truth"] == 1


def test_evaluate_refuses_validation_subjects(app, trained):
    result = CliRunner().invoke(app, ["evaluate", str(trained["run"]), "--split", "val"])
    assert result.exit_code == 2
    assert "leakage" in result.output and "110_S_0010" in result.output
    assert "validation split, which chose the model" in result.output
    assert "in training" not in result.output


def test_predict_writes_csv(app, trained, tmp_path):
    scan = trained["manifest"].parent / "vol" / "sub-16_ses-bl_desc-preproc_T1w.nii"
    out = tmp_path / "pred.csv"
    result = CliRunner().invoke(app, ["predict", str(trained["run"]), str(scan), "--out",
                                      str(out)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out)
    assert len(table) == 1 and 0 < table.loc[0, "probability"] < 1


def test_errors_exit_2_with_a_message(app, tmp_path):
    result = CliRunner().invoke(app, ["train", str(tmp_path / "none.csv"), str(tmp_path / "r")])
    assert result.exit_code == 2 and "not found" in result.output
    assert not (tmp_path / "r").exists()  # a refused run creates no folder
    result = CliRunner().invoke(app, ["evaluate", str(tmp_path)])
    assert result.exit_code == 2 and "not a finished training run" in result.output


def test_cli_module_imports_nothing_heavy():
    code = ("import sys, adni_pu.cli.train, adni_pu.cli.evaluate, adni_pu.cli.predict, "
            "adni_pu.cli.demo; "
            "print(any(m in sys.modules for m in ('torch', 'monai', 'pandas')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"

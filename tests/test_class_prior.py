"""The class prior's one owner (:mod:`adni_pu.workflows.class_prior`) and an honest estimate:
where it comes from, when it is refused, what a run and ``adni-pu prior`` say about it,
and what an interrupt or another manifest does to its classifier."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import allow_tiny_prior_estimates
from typer.testing import CliRunner
from volume_helpers import make_volume_cohort, tiny_overrides

from adni_pu.cli.app import app
from adni_pu.config import ConfigError
from adni_pu.errors import ResumeError, VolumeRunError
from adni_pu.pu.checkpoint import LAST
from adni_pu.pu.recorders import nn_correction_text
from adni_pu.workflows import class_prior
from adni_pu.workflows.class_prior import (
    MIN_LABELLED_VAL,
    MIN_UNLABELLED_VAL,
    check_estimable_counts,
    collapse_reason,
    estimate_line,
    reads_no_prior,
    resolve_prior,
)
from adni_pu.workflows.prior import estimate_manifest_prior
from adni_pu.workflows.volume_settings import load_volume_config

runner = CliRunner()


def _record(value=0.4, low=0.3, high=0.5, n_p=20, n_u=40, truth=None):
    return {"value": value, "ci_low": low, "ci_high": high, "method": "bbe",
            "n_positive": n_p, "n_unlabelled": n_u, "true_prior": truth}


def _fail():
    raise AssertionError("this source must not be read")


# --------------------------------------------------------------------------- resolving


def test_a_given_value_is_the_prior_and_nothing_else_is_read():
    got = resolve_prior(0.3, truth=_fail, estimate=_fail, placeholder=_fail)
    assert (got.value, got.source, got.read_by_method) == (0.3, "given", True)
    assert got.record == {"prior": 0.3, "source": "setting"} and got.estimate is None


def test_the_cohort_value_comes_with_its_counts():
    got = resolve_prior("cohort", truth=lambda: (0.46, {"subjects_with_truth": 9}),
                        estimate=_fail)
    assert (got.value, got.source) == (0.46, "cohort")
    assert got.record["prior"] == 0.46 and got.record["subjects_with_truth"] == 9
    assert got.record["source"].startswith("cohort: positive fraction")


def test_an_estimate_is_trained_with_and_said_in_one_line():
    got = resolve_prior("estimate", estimate=lambda: _record(truth=0.45))
    assert (got.value, got.source, got.estimate["ci_low"]) == (0.4, "estimate", 0.3)
    assert got.record == {"prior": 0.4, "source": "estimate (prior_estimate.json)"}
    assert got.note == ("training with the class prior estimate 0.400 [95 % CI 0.300, 0.500] "
                        "(bbe, from 20 labelled and 40 unlabelled validation scans); "
                        "positive fraction by the cohort's truth: 0.450")


def test_a_deadline_before_the_estimate_gives_nothing_yet():
    assert resolve_prior("estimate", estimate=lambda: None) is None


@pytest.mark.parametrize(("method", "criterion", "free"), [
    ("vpu", "variational", True), ("naive", "pu_auc", True), ("vpu", "pu_risk", False),
    ("nnpu", "pu_auc", False), ("selfpu", "pn_accuracy", False)])
def test_which_runs_read_no_prior(method, criterion, free):
    assert reads_no_prior(method, criterion) is free


def test_a_method_reading_no_prior_skips_the_estimate_and_says_so():
    got = resolve_prior("estimate", truth=lambda: (0.46, {}), estimate=_fail,
                        reads_prior=False)
    assert (got.value, got.source, got.read_by_method) == (0.46, "cohort", False)
    assert got.record["read_by_method"] is False and "estimate_skipped" in got.record
    assert got.note.startswith("class prior: not estimated: this method and its model "
                               "selection read no class prior")

    def no_truth():
        raise VolumeRunError("no truth")

    blind = resolve_prior("cohort", truth=no_truth, placeholder=lambda: 0.6,
                          reads_prior=False)
    assert (blind.value, blind.source) == (0.6, "placeholder") and blind.note == ""


# --------------------------------------------------------------------------- the rules


def test_the_minimum_counts_are_refused_with_what_is_needed():
    assert (MIN_LABELLED_VAL, MIN_UNLABELLED_VAL) == (10, 10)
    check_estimable_counts(10, 10)  # enough
    for n_p, n_u in ((1, 9), (9, 100), (100, 9)):
        with pytest.raises(VolumeRunError, match=f"holds {n_p} labelled positive and {n_u} "
                           "unlabelled scans: estimating the class prior needs at least 10 "
                           "labelled positive and 10 unlabelled validation scans"):
            check_estimable_counts(n_p, n_u)


@pytest.mark.parametrize(("low", "high", "why"), [
    (0.999, 0.999, "zero width"), (0.542, 0.542, "zero width"),
    (0.542, 0.999, "reaches the cap 0.999"), (0.548, 0.999, "reaches the cap")])
def test_a_collapsed_interval_is_not_estimable(low, high, why):
    record = _record(low, low, high)
    assert why in collapse_reason(record)
    line = estimate_line(record)
    assert line.startswith("class prior not estimable (bbe, from 20 labelled") and "CI" not in line
    with pytest.raises(VolumeRunError, match="not estimable"):
        resolve_prior("estimate", estimate=lambda: record)


def test_an_informative_interval_is_an_estimate():
    assert collapse_reason(_record(0.4, 0.3, 0.5)) is None
    assert estimate_line(_record(0.4, 0.3, 0.5)).startswith(
        "class prior estimate 0.400 [95 % CI 0.300, 0.500]")


# --------------------------------------------------------------------------- nnPU line


def test_a_vpu_run_gets_its_own_nn_correction_line():
    text = nn_correction_text(None, "vpu")
    assert text.startswith("Not applicable: VPU's variational loss") and "uPU" not in text
    assert "naive PN or uPU" in nn_correction_text(None, "nnpu")


# --------------------------------------------------------------------------- workflows


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    root = tmp_path_factory.mktemp("class_prior")
    manifest = make_volume_cohort(root / "cohort")
    other = pd.read_csv(manifest, dtype={"subject_id": str})
    other.loc[other["split"] == "train", "pu_label"] = (
        other.loc[other["split"] == "train", "truth"].fillna(0).astype(int))  # another cohort
    other_path = manifest.with_name("other.csv")
    other.to_csv(other_path, index=False)
    return {"root": root, "manifest": manifest, "other": other_path, "cache": root / "cache"}


def _sets(cohort, *extra: str) -> list[str]:
    return [a for o in (*tiny_overrides(1, cohort["cache"]), *extra) for a in ("--set", o)]


def test_too_few_validation_scans_are_refused_before_any_training(cohort, tmp_path):
    out = tmp_path / "few"
    result = runner.invoke(app, ["prior", str(cohort["manifest"]), str(out), *_sets(cohort)])
    assert result.exit_code == 2, result.output
    assert ("the validation split holds 1 labelled positive and 3 unlabelled scans: "
            "estimating the class prior needs at least 10") in result.output
    assert not out.exists()  # refused before the folder is made, or with it removed


def test_a_collapsed_estimate_is_reported_not_estimable(cohort, tmp_path, monkeypatch):
    from adni_pu.pu import prior_estimate

    monkeypatch.setattr(class_prior, "MIN_LABELLED_VAL", 1)
    monkeypatch.setattr(class_prior, "MIN_UNLABELLED_VAL", 1)
    real = prior_estimate.estimate_prior
    monkeypatch.setattr(prior_estimate, "estimate_prior", lambda *a, **k: real(
        [5.0], [0.0, 0.0, 0.0], "censoring", 3, 11, 50))  # one positive: [0.999, 0.999]
    out = tmp_path / "one"
    result = runner.invoke(app, ["prior", str(cohort["manifest"]), str(out), *_sets(cohort)])
    assert result.exit_code == 2, result.output
    assert "class prior not estimable" in result.output and "95 % CI" not in result.output
    assert "use it: adni-pu train" not in result.output


def test_the_prior_classifier_of_another_manifest_is_never_reused(cohort, tmp_path,
                                                                  monkeypatch):
    allow_tiny_prior_estimates(monkeypatch)
    out = tmp_path / "shared"
    first = runner.invoke(app, ["prior", str(cohort["manifest"]), str(out), *_sets(cohort)])
    assert first.exit_code == 0, first.output
    inputs = json.loads((out / "prior_estimate" / "inputs.json").read_text())
    assert len(inputs["manifest_sha256"]) == 64 and inputs["n_scans"] == 15
    again = runner.invoke(app, ["prior", str(cohort["manifest"]), str(out), *_sets(cohort)])
    assert again.exit_code == 0 and "resumed from" in again.output  # same inputs: resumed
    record = json.loads((out / "prior_estimate.json").read_text())
    other = runner.invoke(app, ["prior", str(cohort["other"]), str(out), *_sets(cohort)])
    assert other.exit_code == 2, other.output
    assert "holds a prior estimate's classifier trained on another manifest" in other.output
    assert json.loads((out / "prior_estimate.json").read_text()) == record  # untouched
    # train with an estimate shares the path: a run folder of another manifest's classifier
    from adni_pu.workflows.train import train_volumes
    from adni_pu.workflows.volume_settings import load_volume_config

    cfg = load_volume_config(None, ['prior="estimate"', *tiny_overrides(1, cohort["cache"])],
                             preset="nnpu")
    with pytest.raises(ResumeError, match="trained on another manifest"):
        train_volumes(cohort["other"], cfg, out, log=lambda m: None)
    # other classifier settings are refused too
    changed = runner.invoke(app, ["prior", str(cohort["manifest"]), str(out),
                                  *_sets(cohort, "data.flip_prob=0.25")])
    assert changed.exit_code == 2 and "trained on other settings" in changed.output


def test_training_with_an_estimated_prior_records_it_and_trains_with_it(cohort, tmp_path,
                                                                       monkeypatch):
    """One training with ``prior = "estimate"``: the estimate is recorded, trained with, said
    once in one line between the classifier's and the model's epochs, kept on a rerun and
    reported by evaluate beside the cohort's truth."""
    from adni_pu.workflows.evaluate import evaluate_run
    from adni_pu.workflows.train import train_volumes
    from adni_pu.workflows.volume_settings import load_volume_config

    allow_tiny_prior_estimates(monkeypatch)
    lines: list[str] = []
    cfg = load_volume_config(None, ['prior="estimate"', *tiny_overrides(1, cohort["cache"])],
                             preset="nnpu")
    run = tmp_path / "run"
    train_volumes(cohort["manifest"], cfg, run, log=lines.append)
    info = json.loads((run / "run.json").read_text())
    est = info["prior_estimate"]
    said = [i for i, line in enumerate(lines) if line.startswith(
        f"training with the class prior estimate {est['value']:.3f} [95 % CI "
        f"{est['ci_low']:.3f}, {est['ci_high']:.3f}]")]
    classifier = [i for i, line in enumerate(lines) if line.startswith(
        "prior classifier: epoch 1/1")]
    model = [i for i, line in enumerate(lines) if line.startswith("epoch 1/1")]
    assert len(said) == 1 and len(classifier) == 1 and len(model) == 1
    assert classifier[0] < said[0] < model[0]  # said once, before the model trains
    assert {"value", "ci_low", "ci_high", "method"} <= set(est) and est["method"] == "bbe"
    assert 0 < est["ci_low"] <= est["value"] <= est["ci_high"] < 1
    assert est["true_prior"] == pytest.approx(5 / 9)  # the cohort's truth, for comparison
    assert info["prior"]["prior"] == est["value"]
    assert json.loads((run / "data.json").read_text())["prior_used"] == est["value"]
    assert json.loads((run / "prior_estimate.json").read_text()) == est
    estimator = run / "prior_estimate"
    assert (estimator / "best_model.pt").is_file()
    assert json.loads((estimator / "selection.json").read_text())["val_criterion"] == "pu_auc"
    # the setting is kept as given, so a rerun resumes instead of refusing other settings
    assert load_volume_config(run / "volume_config.toml").prior == "estimate"
    train_volumes(cohort["manifest"], cfg, run, log=lambda m: None)
    assert json.loads((run / "run.json").read_text())["prior_estimate"] == est
    evaluate_run(run, "test")
    report = (run / "evaluation" / "test" / "report.md").read_text()
    assert f"Class prior used in training: {est['value']:.3f}" in report
    assert f"[{est['ci_low']:.3f}, {est['ci_high']:.3f}]" in report
    assert "the cohort's truth gives 0.556" in report


def test_a_method_reading_no_prior_trains_no_classifier(cohort, tmp_path):
    from adni_pu.workflows.train import train_volumes
    from adni_pu.workflows.volume_settings import load_volume_config

    lines: list[str] = []
    cfg = load_volume_config(None, ['prior="estimate"', *tiny_overrides(1, cohort["cache"])],
                             preset="vpu")
    run = tmp_path / "vpu"
    train_volumes(cohort["manifest"], cfg, run, log=lines.append)
    assert not (run / "prior_estimate").exists() and not (run / "prior_estimate.json").exists()
    prior = json.loads((run / "run.json").read_text())["prior"]
    assert prior["read_by_method"] is False and "estimate_skipped" in prior
    assert any(line.startswith("class prior: not estimated") for line in lines)
    assert not any(line.startswith("prior classifier:") for line in lines)


def test_ctrl_c_keeps_the_prior_classifier_checkpoints(cohort, tmp_path, monkeypatch):
    from adni_pu.pu import prior_estimate
    from adni_pu.workflows.train import train_volumes
    from adni_pu.workflows.volume_settings import load_volume_config

    allow_tiny_prior_estimates(monkeypatch)
    real = prior_estimate.estimate_prior

    def interrupted(*args, **kwargs):  # after the classifier's first (and only) epoch
        raise KeyboardInterrupt

    monkeypatch.setattr(prior_estimate, "estimate_prior", interrupted)
    cfg = load_volume_config(None, ['prior="estimate"', *tiny_overrides(1, cohort["cache"])],
                             preset="nnpu")
    run = tmp_path / "runs" / "est_int"
    with pytest.raises(KeyboardInterrupt):
        train_volumes(cohort["manifest"], cfg, run, log=lambda m: None)
    assert (run / "prior_estimate" / LAST).is_file()
    monkeypatch.setattr(prior_estimate, "estimate_prior", real)
    lines: list[str] = []
    train_volumes(cohort["manifest"], cfg, run, log=lines.append)  # the rerun resumes it
    assert any(line.startswith("prior classifier: resumed from") for line in lines)
    assert (run / "best_model.pt").is_file()


def test_the_evaluation_report_names_vpu_too():
    from adni_pu.workflows.evaluate import nn_correction_markdown

    assert nn_correction_markdown(None, "vpu")[2].startswith("Not applicable: VPU's")


# --------------------------------------------------------------------------- adni-pu prior


def test_the_prior_command_prints_the_estimate_beside_the_truth(cohort,
                                                                tiny_prior_estimates):
    out = cohort["root"] / "estimate"
    sets = [arg for o in tiny_overrides(1, cohort["cache"]) for arg in ("--set", o)]
    result = CliRunner().invoke(app, ["prior", str(cohort["manifest"]), str(out), *sets])
    assert result.exit_code == 0, result.output
    record = json.loads((out / "prior_estimate.json").read_text())
    assert f"class prior estimate {record['value']:.3f}" in result.output
    assert "positive fraction by the cohort's truth: 0.556" in result.output
    assert f"--set prior={record['value']:.4f}" in result.output


def test_no_labelled_positive_in_validation_is_refused_by_name(cohort, tmp_path,
                                                               tiny_prior_estimates):
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

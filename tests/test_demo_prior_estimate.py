"""``adni-pu demo --prior estimate``: each fold's PU methods train with a class prior
estimated from the fold's PU data alone, and the report shows it beside the truth."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_demo_report import NO_COMPARISON, _result
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.errors import ConfigError
from adni_pu.workflows.demo import DemoSettings
from adni_pu.workflows.demo_report import render_report

COHORT_TEXT = ("PU risks need the prior of the positive class; here it is the positive share "
               "of the fold's training subjects with a truth (in a study of your own, a "
               "published prevalence or a PET subsample gives it). Naive training uses no "
               "prior.")


pytestmark = pytest.mark.usefixtures("tiny_prior_estimates")


@pytest.mark.parametrize("kwargs, message", [
    ({"prior": "guess"}, "prior: expected 'cohort' or 'estimate', found 'guess'"),
    ({"prior": "estimate", "overrides": ("prior=0.3",)},
     "--prior estimate and --set prior=0.3: set the class prior once"),
    ({"prior": "estimate", "overrides": ("train.prior=0.3",)},
     "--prior estimate and --set train.prior=0.3"),
])
def test_the_prior_switch_is_checked_before_any_work(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DemoSettings(**kwargs)
    assert DemoSettings(overrides=("prior=0.3",)).prior == "cohort"  # the default: as before


def test_the_command_line_refuses_an_unknown_prior(tmp_path):
    result = CliRunner().invoke(app, ["demo", "--prior", "pet", "--out", str(tmp_path / "d")])
    assert result.exit_code == 2 and "expected 'cohort' or 'estimate'" in result.output
    assert not (tmp_path / "d").exists()


def test_the_report_shows_each_estimate_beside_the_truth():
    truth = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    results = {"naive": _result([2.0, -1.0, 1.0, -2.0, 0.5, 0.2], truth),
               "nnpu": _result([2.0, -1.0, 1.0, -2.0, 0.5, 0.2], truth)}
    source = "estimated from the PU data (bbe; the truth of the training subjects gives 0.450)"
    results["nnpu"]["folds"] = [
        {"prior": {"prior": 0.41, "source": source},
         "prior_estimate": {"ci_low": 0.30, "ci_high": 0.52}},
        {"prior": {"prior": 0.39, "source": source},
         "prior_estimate": {"ci_low": 0.28, "ci_high": 0.50}}]
    results["naive"]["folds"] = [{"prior": {"prior": 0.5, "source": "placeholder",
                                            "read_by_method": False}}] * 2
    settings = DemoSettings(subjects=24, folds=2, prior="estimate")
    report = render_report(settings, results, {}, {"total": 1.0}, "6 of 6 scans", "counts",
                           NO_COMPARISON)
    assert (f"per fold: fold 1: 0.410 [95 % CI 0.300, 0.520] ({source}); fold 2: 0.390 "
            f"[95 % CI 0.280, 0.500] ({source}).") in report
    assert "here it is estimated from each fold's PU data alone (`--prior estimate`" in report
    default = render_report(DemoSettings(subjects=24, folds=2), results, {}, {"total": 1.0},
                            "6 of 6 scans", "counts", NO_COMPARISON)
    assert COHORT_TEXT in default and "--prior estimate" not in default
    assert default.endswith("predictions\n")


@pytest.mark.slow  # about a CPU-minute: the whole demo path (the pieces are tested above)
def test_the_demo_trains_its_pu_methods_with_the_estimates(tmp_path):
    """The reduced demo's cohort on the generator's ideal volumes, one method, one epoch."""
    out = tmp_path / "demo"
    result = CliRunner().invoke(app, [
        "demo", "--subjects", "12", "--out", str(out), "--epochs", "1", "--folds", "2",
        "--set", "synth.dx_proportions=[0.4, 0.05, 0.05, 0.1, 0.4]", "--methods", "nnpu",
        "--threads", "1", "--workers", "1", "--preprocessing", "ideal", "--prior", "estimate"])
    assert result.exit_code == 0, result.output
    assert "nnpu after a prior estimate each" in result.output
    assert "epoch 4/4" in result.output  # 2 runs and their 2 estimates, one epoch each
    record = json.loads((out / "demo.json").read_text())
    assert record["settings"]["prior"] == "estimate"
    report = (out / "report.md").read_text()
    for k, fold in enumerate(record["results"]["nnpu"]["folds"]):
        est = fold["prior_estimate"]
        run = json.loads((out / "comparison" / "pieces" / "nnpu" / f"fold-{k}" / "seed-0"
                          / "run.json").read_text())
        assert run["prior"]["prior"] == est["value"] == fold["prior"]["prior"]
        assert f"fold {k + 1}: {est['value']:.3f} [95 % CI {est['ci_low']:.3f}, " in report
        assert np.isfinite(est["value"])


def test_folds_too_small_for_an_estimate_are_refused_before_any_scan():
    """The default demo's folds hold 1 labelled validation positive: an estimate from it is
    not informative, so ``--prior estimate`` is refused before any image is made, where the
    same cohort trains with the cohort's prior."""
    from adni_pu.workflows import class_prior
    from adni_pu.workflows.demo import check_composition

    with pytest.MonkeyPatch.context() as patch:  # undo the module's tiny-estimate fixture
        patch.setattr(class_prior, "MIN_LABELLED_VAL", 10)
        patch.setattr(class_prior, "MIN_UNLABELLED_VAL", 10)
        with pytest.raises(ConfigError, match=(
                "fold 0: the validation split holds 1 labelled positive and 9 unlabelled "
                "scans: estimating the class prior needs at least 10 .*, so the class prior "
                "cannot be estimated on this demo's folds; use --prior cohort")):
            check_composition(DemoSettings(prior="estimate"))  # no search: refused at once
    check_composition(DemoSettings(), search=2)  # the cohort's prior: accepted

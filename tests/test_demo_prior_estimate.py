"""``adni-pu demo --prior estimate``: each fold's PU methods train with a class prior
estimated from the fold's PU data alone, and the report shows it beside the truth."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_demo_report import _result
from typer.testing import CliRunner
from volume_helpers import make_volume_cohort, tiny_overrides

from adni_pu.cli.app import app
from adni_pu.errors import ConfigError
from adni_pu.workflows.demo import DemoSettings
from adni_pu.workflows.demo_policy import estimated_demo_prior
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
    results = {"nnpu": _result([2.0, -1.0, 1.0, -2.0, 0.5, 0.2], truth)}
    settings = DemoSettings(subjects=24, folds=2)
    notes = [(0.41, "0.410 [95 % CI 0.300, 0.520] (estimated ...; the truth of its training "
                    "subjects gives 0.450)"), (0.39, "0.390 [...]")]
    report = render_report(settings, results, {}, {"total": 1.0}, "6 of 6 scans", notes,
                           "counts", prior_source="estimate")
    assert ("per fold: fold 1: 0.410 [95 % CI 0.300, 0.520] (estimated ...; the truth of its "
            "training subjects gives 0.450); fold 2: 0.390 [...]") in report
    assert "here it is estimated from each fold's PU data alone (`--prior estimate`" in report
    assert "- `prior/fold<k>/`: each fold's prior estimate" in report
    default = render_report(settings, results, {}, {"total": 1.0}, "6 of 6 scans",
                            [(0.45, "0.450 (cohort)")], "counts")
    assert COHORT_TEXT in default and "prior/fold" not in default
    assert default.endswith("predictions\n")


def test_a_fold_prior_is_estimated_from_its_pu_data_alone(tmp_path):
    manifest = make_volume_cohort(tmp_path / "cohort")
    lines: list[str] = []
    extra, note, prior, record = estimated_demo_prior(
        manifest, {}, tuple(tiny_overrides(1, tmp_path / "cache")), tmp_path / "prior",
        lines.append, n_bootstrap=300)
    assert extra == {"prior": prior} and prior == record["value"]
    assert record["n_bootstrap"] == 300  # the demo's resamples, not the runs' bootstrap
    assert note.startswith(f"{prior:.3f} [95 % CI {record['ci_low']:.3f}, "
                           f"{record['ci_high']:.3f}] (estimated from the fold's PU data alone")
    assert "bbe on the 1 labelled and 3 unlabelled scans of its validation split" in note
    assert note.endswith("the truth of its training subjects gives 0.556)")
    assert json.loads((tmp_path / "prior" / "prior_estimate.json").read_text()) == record
    assert any(line.startswith("prior classifier: epoch 1/1") for line in lines)


@pytest.mark.slow  # about a CPU-minute: the whole demo path (the pieces are tested above)
def test_the_demo_trains_its_pu_methods_with_the_estimates(tmp_path):
    """The reduced demo's cohort on the generator's ideal volumes, one method, one epoch."""
    out = tmp_path / "demo"
    result = CliRunner().invoke(app, [
        "demo", "--subjects", "12", "--out", str(out), "--epochs", "1", "--folds", "2",
        "--set", "synth.dx_proportions=[0.4, 0.05, 0.05, 0.1, 0.4]", "--methods", "nnpu",
        "--threads", "1", "--workers", "1", "--preprocessing", "ideal", "--prior", "estimate"])
    assert result.exit_code == 0, result.output
    assert "prior estimate fold 2/2" in result.output and "epoch 4/4" in result.output
    record = json.loads((out / "demo.json").read_text())
    estimates = record["prior_estimates"]
    assert len(estimates) == 2 and record["settings"]["prior"] == "estimate"
    assert {est["n_bootstrap"] for est in estimates} == {1000}  # a real interval
    report = (out / "report.md").read_text()
    for k, est in enumerate(estimates):
        assert (out / "prior" / f"fold{k}" / "prior_estimate.json").is_file()
        run = json.loads((out / "runs" / "nnpu" / f"fold{k}" / "run.json").read_text())
        assert run["settings"]["prior"] == est["value"]
        assert f"fold {k + 1}: {est['value']:.3f} [95 % CI {est['ci_low']:.3f}, " in report
        assert np.isfinite(est["true_prior"])


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
                "fold 1's validation split holds 1 labelled positive and 9 unlabelled scans, "
                "and --prior estimate needs at least 10 and 10 .*, so the class prior cannot be "
                "estimated on this demo's folds; use --prior cohort")):
            check_composition(DemoSettings(prior="estimate"))  # no search: refused at once
    check_composition(DemoSettings(), search=2)  # the cohort's prior: accepted

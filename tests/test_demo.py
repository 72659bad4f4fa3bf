"""A reduced ``adni-pu demo`` through the real CLI: the end-to-end integration test.

12 synthetic subjects, real preprocessing (deepbet, registration, cerebellum removal), the
cohort builder, 2 cross-validation folds of three methods for 2 epochs each, the pooled
evaluation, the reference lines and the report: about 2 CPU-minutes, most of it
preprocessing. It is also the guard of the committed demo numbers: its held-out logits must
equal the record in benchmarks/results/demo-guard.json (made by ``python -m
benchmarks.demo_guard --record``), which also holds the reduced demo's arguments.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.cohort.ids import normalise_subject_id
from adni_pu.workflows.demo_fingerprint import differences, fingerprint

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
GUARD = RESULTS / "demo-guard.json"


def test_reduced_demo_runs_end_to_end_and_resumes(tmp_path):
    out = tmp_path / "demo"
    # ADNI's composition labels about 14 % of subjects (the AD patients): a 12-subject cohort
    # takes a CN/AD-heavy mix (``--set synth.*`` changes the generator) so that every
    # fold's training and validation splits hold labelled positives
    guard = json.loads(GUARD.read_text())
    args = [str(out) if a == "<tmp>" else a for a in guard["demo_args"]]
    assert args[-6:] == ["--methods", "naive,nnpu,selfpu", "--threads", "1", "--workers", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    # progress: a line per scan and per epoch, each with what is left
    for line in ("scan 12/12", "epoch 12/12 (selfpu fold 2/2, 2/2"):
        assert any(line in x and "left" in x for x in result.output.splitlines()), line
    report = (out / "report.md").read_text()
    for method in ("naive", "nnpu", "selfpu"):
        assert f"| {method} |" in report
        for fold in (0, 1):  # the comparison's pieces: run folders with their results
            run = out / "comparison" / "pieces" / method / f"fold-{fold}" / "seed-0"
            assert (run / "piece.json").is_file() and (run / "best_model.pt").is_file()
    assert "preprocessing: **real**" in report and (out / "roc.png").is_file()
    for part in ("**What a cohort this size can show.** ", "**What these numbers are.**",
                 "**The PU task (the paper's).**",
                 "**What is scored.**", "**The PU effect.** Hidden-positive recall: naive ",
                 "**Reference lines**", "| method | accuracy | AUC | balanced accuracy | "
                 "hidden-positive recall | hidden AUC |",
                 "*reference: call everyone negative*", "*reference: call everyone positive*",
                 "*reference: logistic regression on 2 volumes*",
                 "*reference: generator truth: hippocampal loss*", "nn_correction",
                 "Class prior given to uPU, nnPU and Self-PU per fold"):
        assert part in report, part
    summary = pd.read_csv(out / "preprocessed" / "summary.csv")
    assert len(summary) == 12 and set(summary.status) == {"done"}
    manifest = pd.read_csv(out / "comparison" / "folds" / "fold-0" / "manifest.csv",
                           dtype={"subject_id": str})
    manifest["subject_id"] = manifest["subject_id"].map(normalise_subject_id)
    assert set(manifest.split) == {"train", "val", "test"}
    record = json.loads((out / "demo.json").read_text())
    assert set(record["results"]) == {"naive", "nnpu", "selfpu"}
    for r in record["results"].values():
        # every subject scored once, by the fold that held it out
        assert sorted(p["subject_id"] for p in r["predictions"]) == sorted(
            set(manifest.subject_id))
        assert 0.0 <= r["pooled"]["metrics"]["accuracy"]["value"] <= 1.0
        # scored against the paper's positive class, with the PU labels beside the truth
        assert {p["pu_label"] for p in r["predictions"]} <= {0, 1}
        labelled = [p for p in r["predictions"] if p["pu_label"] == 1]
        assert all(p["truth"] == 1 for p in labelled)
        assert "hidden_positive_recall" in r["pooled"]["metrics"]
    assert record["results"]["nnpu"]["nn_correction"] is not None
    assert list(record["results"]["nnpu"]["nn_correction_by_phase"]) == ["phase1"]
    assert record["results"]["naive"]["nn_correction_by_phase"] is None
    fold = record["results"]["selfpu"]["folds"][0]["nn_correction_summary"]
    assert fold["epochs"] == 2 and 0.0 <= fold["share"] <= 1.0
    # the comparison's own report, with the paired differences and calibration the demo
    # report shows too
    comparison = (out / "comparison" / "report.md").read_text()
    for part in ("## Paired differences (A minus B)", "| nnpu - naive |", "## Calibration"):
        assert part in comparison and part in report, part

    # the committed demo numbers are the code's: the logits equal the recorded ones, and
    # the record vouches for the committed demo tables (made on the same numbers)
    moved = differences(guard["fingerprint"], fingerprint(record))
    assert not moved, (
        "the demo's numbers moved: the committed tables (README, docs/results.md, "
        "benchmarks/results/demo-seeds.*) no longer match what the code gives:\n  "
        + "\n  ".join(moved) + "\nRegenerate them with the commands in docs/results.md, "
        "\"The demo\", then run `python -m benchmarks.demo_guard --record`.")
    seeds = json.loads((RESULTS / "demo-seeds.json").read_text())
    assert guard["demo_seeds_commit"] == seeds["provenance"].get("git_commit"), (
        "benchmarks/results/demo-seeds.json was regenerated without recording the guard "
        "again: run `python -m benchmarks.demo_guard --record`")

    # a second call resumes: nothing is generated, preprocessed or trained again, and the
    # numbers are the same
    again = CliRunner().invoke(app, args)
    assert "scan 12/12 sub-" in again.output and "skipped" in again.output
    assert again.exit_code == 0, again.output
    assert "already in" in again.output and "epoch " not in again.output
    assert set(pd.read_csv(out / "preprocessed" / "summary.csv").status) == {"skipped"}
    assert not differences(fingerprint(record),
                           fingerprint(json.loads((out / "demo.json").read_text())))
    # other methods in the same folder are another comparison: refused, not mixed
    other = CliRunner().invoke(app, [*args[:-6], "--methods", "nnpu", "--threads", "1",
                                     "--workers", "2"])
    assert other.exit_code == 2 and "holds a comparison of other settings" in other.output

    # the same folder with another cohort size is refused, not mixed
    other = CliRunner().invoke(app, ["demo", "--subjects", "13", "--folds", "2",
                                     "--set", args[10], "--out", str(out)])
    assert other.exit_code == 2 and "choose another --out" in other.output


def test_the_default_demo_draws_the_recorded_folds():
    """The full-size demo's folds (100 subjects, from the generator's table alone) are the
    ones its committed numbers were made on: a change to the generator's subjects, the
    cohort builder or the fold rule shows here, not only in the reduced demo."""
    from adni_pu.workflows.demo import DemoSettings, planned_folds

    guard = json.loads(GUARD.read_text())
    assert planned_folds(DemoSettings()) == guard["default_folds"], (
        "the default demo's folds moved: regenerate the demo tables (docs/results.md, "
        "\"The demo\") and record the guard again")


def test_demo_refuses_an_unknown_method_before_any_work(tmp_path):
    result = CliRunner().invoke(app, ["demo", "--methods", "nnpu,selfpuu",
                                      "--out", str(tmp_path / "d")])
    assert result.exit_code == 2 and "selfpuu" in result.output
    assert not (tmp_path / "d").exists()


def test_demo_refuses_a_bad_generator_setting_before_any_work(tmp_path):
    result = CliRunner().invoke(app, ["demo", "--set", "synth.dx_proportions=[0.5, 0.5]",
                                      "--out", str(tmp_path / "d")])
    assert result.exit_code == 2 and "dx_proportions" in result.output
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("args, message", [
    (["--epochs", "0"], "error: epochs=0: expected at least 1"),
    (["--set", "train.lr=abc"], "error: --set train.lr=abc: expected a number, found 'abc'"),
])
def test_demo_refuses_bad_training_settings_before_any_work(tmp_path, args, message):
    result = CliRunner().invoke(app, ["demo", *args, "--out", str(tmp_path / "d")])
    assert result.exit_code == 2 and result.output.strip().splitlines() == [message]
    assert not (tmp_path / "d").exists()


def test_demo_refuses_a_cohort_too_small_to_split(tmp_path):
    result = CliRunner().invoke(app, ["demo", "--subjects", "5", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "subjects=5" in result.output and "at least 12" in result.output
    assert not any(tmp_path.iterdir())  # nothing written

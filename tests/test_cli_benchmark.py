"""The command line: fast help, the benchmark verb end to end, clear errors."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import shared_path
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.workflows.results_format import unpack_bits

runner = CliRunner()


def test_help_imports_no_heavy_library():
    code = ("import sys, adni_pu.cli.app; "
            "print(sorted(m for m in ('torch', 'monai', 'SimpleITK', 'ants', 'nibabel') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_presets_lists_ablation_rows():
    result = runner.invoke(app, ["presets"])
    assert result.exit_code == 0
    for name in ("nnpu", "sp-fixed", "sps-reweight", "selfpu", "published-code"):
        assert name in result.stdout


def test_missing_data_is_a_clear_error(tmp_path):
    result = runner.invoke(app, ["benchmark", "mnist", "--data-dir", str(tmp_path / "nope"),
                                 "--out", str(tmp_path / "out"), "--epochs", "1"])
    assert result.exit_code == 2
    assert "nope: MNIST folder not found" in result.output


def test_bad_method_is_refused(tmp_path):
    result = runner.invoke(app, ["benchmark", "mnist", "--method", "svm",
                                 "--out", str(tmp_path)])
    assert result.exit_code != 0
    assert "expected naive, upu, nnpu, selfpu or vpu" in result.output


def test_the_prior_is_set_once_and_recorded_as_trained(tmp_path, monkeypatch):
    from test_readers import write_mnist

    from adni_pu.data import readers

    monkeypatch.setitem(readers.MNIST_COUNTS, "train", 200)
    monkeypatch.setitem(readers.MNIST_COUNTS, "test", 40)
    write_mnist(tmp_path / "mnist", n_train=200, n_test=40)
    common = ["benchmark", "mnist", "--seeds", "1", "--epochs", "1", "--n-labelled", "60",
              "--data-dir", str(tmp_path / "mnist"), "--set", "progress=false"]
    out = tmp_path / "out"
    result = runner.invoke(app, [*common, "--out", str(out), "--set", "prior=0.45"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "results.json").read_text())["settings"]["prior"] == 0.45
    assert json.loads((out / "seed0" / "data.json").read_text())["prior_used"] == 0.45
    both = runner.invoke(app, [*common, "--out", str(tmp_path / "o2"), "--prior", "0.4",
                               "--set", "prior=0.45"])
    assert both.exit_code == 2 and "disagree" in both.output


def test_non_positive_time_limit_is_refused(tmp_path):
    result = runner.invoke(app, ["benchmark", "mnist", "--out", str(tmp_path),
                                 "--time-limit", "0"])
    assert result.exit_code == 2
    assert "time limit 0.0 minutes: expected a positive number" in result.output


@pytest.mark.integration
def test_mnist_nnpu_three_epochs_writes_results_json(tmp_path):
    data = shared_path("mnist")
    out = tmp_path / "x"
    result = runner.invoke(app, [
        "benchmark", "mnist", "--method", "nnpu", "--seeds", "1", "--epochs", "3",
        "--data-dir", str(data), "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "results.json").read_text())
    for key in ("benchmark", "command", "date", "machine", "data", "settings", "results"):
        assert key in summary
    row = summary["results"]["nnpu"]
    assert row["test_accuracy"]["n"] == 1
    assert 80.0 < row["test_accuracy"]["mean"] <= 100.0
    assert row["test_accuracy_test_selected"]["mean"] >= row["test_accuracy"]["mean"] - 1e-9
    assert summary["settings"]["epochs"] == 3
    assert (out / "seed0" / "metrics.csv").is_file()
    seed = summary["per_seed"][0]
    shares = [float(r["train/model/nn_correction"])
              for r in csv.DictReader((out / "seed0" / "metrics.csv").open())]
    assert seed["nn_correction_share"] == pytest.approx(sum(shares) / 3)
    examples = seed["test_examples"]
    correct = unpack_bits(examples["correct"], examples["n"])
    assert examples["n"] == seed["test"]["n"] and correct.mean() == seed["test"]["accuracy"]
    # a finished seed is not trained again
    again = runner.invoke(app, [
        "benchmark", "mnist", "--method", "nnpu", "--seeds", "1", "--epochs", "3",
        "--data-dir", str(data), "--out", str(out)])
    assert again.exit_code == 0
    assert "already done" in again.output


def _selfpu_subset_args(seeds: int) -> list[str]:
    """A Self-PU benchmark on an MNIST subset, one epoch per phase."""
    return ["benchmark", "mnist", "--method", "selfpu", "--seeds", str(seeds), "--epochs", "3",
            "--data-dir", str(shared_path("mnist")), "--train-limit", "600", "--test-limit",
            "200", "--threads", "1", "--n-labelled", "100", "--set", "selfpu.warmup_epochs=1",
            "--set", "selfpu.self_paced_end=2", "--set", "selfpu.select_every=1"]


@pytest.mark.integration
def test_benchmark_in_timed_pieces_equals_one_run(tmp_path):
    args = _selfpu_subset_args(1)
    whole = runner.invoke(app, [*args, "--out", str(tmp_path / "whole")])
    assert whole.exit_code == 0, whole.output
    codes = []
    for _ in range(6):  # a limit this small leaves time for one epoch per command
        piece = runner.invoke(app, [*args, "--out", str(tmp_path / "pieces"),
                                    "--time-limit", "0.0001"])
        codes.append(piece.exit_code)
        if piece.exit_code == 0:
            break
        assert "run the same command again" in piece.output
        progress = json.loads((tmp_path / "pieces" / "progress.json").read_text())
        assert progress["status"] == "incomplete"
        assert progress["epochs_done"] == len(codes)
    assert codes == [75, 75, 0]
    a, b = (json.loads((tmp_path / p / "results.json").read_text())["per_seed"][0]
            for p in ("whole", "pieces"))
    assert a["test"] == b["test"]
    assert a["selected_epoch"] == b["selected_epoch"]
    assert a["val_score"] == b["val_score"]


def test_benchmark_population_in_pieces_equals_seeds_one_by_one(tmp_path):
    """--population 2 trains both seeds at once, --population 1 one at a time with its
    students stacked; in timed pieces a population stops and resumes at epoch boundaries,
    and every seed's result is close to the seed trained alone. (Exact
    agreement to rounding is tests/test_population.py's; on MNIST, Adam's first steps turn
    rounding in near-zero gradients into differences of about 1e-4 within an epoch.)"""
    args = _selfpu_subset_args(2)
    alone = runner.invoke(app, [*args, "--out", str(tmp_path / "alone")])
    assert alone.exit_code == 0, alone.output
    codes = []
    for _ in range(5):
        piece = runner.invoke(app, [*args, "--out", str(tmp_path / "together"),
                                    "--population", "2", "--time-limit", "0.0001"])
        codes.append(piece.exit_code)
        if piece.exit_code == 0:
            break
    assert codes == [75, 75, 0]
    stacked = runner.invoke(app, [*args, "--out", str(tmp_path / "stacked"), "--population",
                                  "1"])  # one seed at a time, its two students stacked
    assert stacked.exit_code == 0, stacked.output
    a, b, c = (json.loads((tmp_path / p / "results.json").read_text())["per_seed"]
               for p in ("alone", "together", "stacked"))
    for one, both, each in zip(a, b, c):
        assert (one["population"], both["population"], each["population"]) == (None, 2, 1)
        for other in (both, each):
            assert other["val_score"] == pytest.approx(one["val_score"], rel=5e-3)
            assert abs(other["test"]["accuracy"] - one["test"]["accuracy"]) <= 3 / 200
    bad = runner.invoke(app, [*args, "--out", str(tmp_path / "bad"), "--population", "0"])
    assert bad.exit_code != 0 and "--population 0" in bad.output
    assert not (tmp_path / "bad").exists()  # refused before anything is written


def test_benchmark_with_no_seeds_is_a_one_line_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["benchmark", "mnist", "--seeds", "0", "--data-dir",
                                 str(tmp_path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        "error: --seeds: expected at least 1 seed, found 0"]

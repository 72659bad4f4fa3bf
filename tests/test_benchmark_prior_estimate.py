"""``adni-pu benchmark --prior estimate``: each seed's class prior estimated from its PU data
alone (tiny synthetic MNIST files and 2-D blobs; seconds each)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import allow_tiny_prior_estimates, blobs, tiny_config
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.workflows import results_format as fmt

runner = CliRunner()


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
    """200 training and 40 test images in MNIST's files (the official counts patched)."""
    from test_readers import write_mnist

    folder = tmp_path_factory.mktemp("mnist")
    write_mnist(folder, n_train=200, n_test=40)
    return folder


@pytest.fixture(autouse=True)
def small_counts(monkeypatch):
    from adni_pu.data import readers

    monkeypatch.setitem(readers.MNIST_COUNTS, "train", 200)
    monkeypatch.setitem(readers.MNIST_COUNTS, "test", 40)
    allow_tiny_prior_estimates(monkeypatch)


def _args(mnist_dir, out, *extra: str) -> list[str]:
    return ["benchmark", "mnist", "--seeds", "1", "--epochs", "1", "--n-labelled", "60",
            "--data-dir", str(mnist_dir), "--set", "progress=false", "--threads", "1",
            "--out", str(out), *extra]


ESTIMATE = ("--prior", "estimate", "--prior-epochs", "2")


@pytest.fixture(scope="module")
def whole(mnist_dir, tmp_path_factory):
    """One uninterrupted benchmark with an estimated prior: (its folder, the output)."""
    from adni_pu.data import readers

    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(readers.MNIST_COUNTS, "train", 200)
        patch.setitem(readers.MNIST_COUNTS, "test", 40)
        allow_tiny_prior_estimates(patch)
        out = tmp_path_factory.mktemp("bench") / "whole"
        result = runner.invoke(app, _args(mnist_dir, out, *ESTIMATE))
    assert result.exit_code == 0, result.output
    return out, result.output


def test_each_seed_trains_with_its_estimate_recorded_beside_the_true_prior(whole):
    out, output = whole
    seed = json.loads((out / "seed0" / "result.json").read_text())
    est = seed["prior_estimate"]
    assert est["method"] == "bbe" and est["split"] == "val"
    assert est["true_prior"] == 0.49  # the protocol's prior: the data were built with it
    assert 0 < est["value"] < 1 and 0 < est["ci_low"] <= est["ci_high"] < 1
    assert json.loads((out / "seed0" / "prior_estimate.json").read_text()) == est
    # the risks trained with the estimate; the PU data's record keeps how they were built
    assert seed["config"]["prior"] == est["value"]
    data = json.loads((out / "seed0" / "data.json").read_text())
    assert data["prior_used"] == est["value"] and data["prior"] == 0.49
    assert data["prior_source"] == "estimate (prior_estimate.json)"
    # the classifier: naive PN chosen by the P-vs-U AUC, in the seed's run folder, blind
    classifier = out / "seed0" / "prior_estimate"
    assert (classifier / "best_model.pt").is_file()
    assert json.loads((classifier / "selection.json").read_text())["val_criterion"] == "pu_auc"
    assert est["classifier"]["epochs"] == 2 and est["classifier"]["config"]["method"] == "naive"
    assert est["classifier"]["config"]["track_test"] is False
    seen = json.loads((classifier / "data.json").read_text())
    assert seen["test_loaded"] is False and seen["prior_used"] == 0.5  # placeholder
    assert not {"true_prior_train", "n_test", "test_limit"} & set(seen)
    # the results: their own row, the estimate beside the true prior
    summary = json.loads((out / "results.json").read_text())
    assert summary["settings"]["method"] == "nnpu+estimated-prior"
    assert summary["settings"]["prior"] == 0.49 and summary["settings"]["prior_source"] == \
        "estimate"
    row = summary["prior_estimate"]["per_seed"][0]
    assert row["value"] == est["value"] and row["true_prior"] == 0.49
    assert row["abs_error"] == pytest.approx(abs(est["value"] - 0.49))
    assert "config" not in summary["per_seed"][0]["prior_estimate"]["classifier"]
    table = (out / "results.md").read_text()
    assert f"| 0 | {est['value']:.3f} | [{est['ci_low']:.3f}, {est['ci_high']:.3f}] | 0.490 |" \
        in table
    assert table in output


def test_a_finished_seed_is_not_estimated_or_trained_again(whole, mnist_dir):
    out, _ = whole
    again = runner.invoke(app, _args(mnist_dir, out, *ESTIMATE))
    assert again.exit_code == 0 and "seed 0: already done" in again.output
    # the same folder with the prior given is another run: its result is not reused
    other = runner.invoke(app, _args(mnist_dir, out))
    assert "already done" not in other.output and other.exit_code == 2
    assert "other settings" in other.output


def test_timed_pieces_resume_the_estimate_and_equal_one_run(whole, mnist_dir, tmp_path):
    out = tmp_path / "pieces"
    args = _args(mnist_dir, out, *ESTIMATE, "--time-limit", "0.0001")
    first = runner.invoke(app, args)
    assert first.exit_code == 75, first.output
    assert "prior estimate first: 1/2 classifier epochs" in first.output
    progress = json.loads((out / "progress.json").read_text())
    assert progress["prior_estimate"] == {"done": False, "epochs_done": 1, "epochs": 2}
    for _ in range(3):  # the classifier's last epoch, then the run's epoch
        result = runner.invoke(app, args)
        if result.exit_code == 0:
            break
        assert result.exit_code == 75, result.output
    assert result.exit_code == 0, result.output
    got = json.loads((out / "seed0" / "result.json").read_text())
    want = json.loads((whole[0] / "seed0" / "result.json").read_text())
    for key in ("value", "ci_low", "ci_high", "alpha"):
        assert got["prior_estimate"][key] == want["prior_estimate"][key]
    assert got["test"] == want["test"]


def test_a_population_trains_each_seed_with_its_own_estimate(mnist_dir, tmp_path):
    """--population with --prior estimate: the seeds' estimates differ, and each network of
    the stack trains with its own seed's (as the seeds trained one by one do)."""
    def two_seeds(out, *extra):
        args = _args(mnist_dir, out, *ESTIMATE, *extra)
        args[args.index("--seeds") + 1] = "2"
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        return [json.loads((out / f"seed{s}" / "result.json").read_text()) for s in (0, 1)]

    alone = two_seeds(tmp_path / "alone")
    together = two_seeds(tmp_path / "together", "--population", "2")
    assert alone[0]["prior_estimate"]["value"] != alone[1]["prior_estimate"]["value"]
    for one, both in zip(alone, together):
        assert both["population"] == 2 and one["population"] is None
        assert both["prior_estimate"]["value"] == one["prior_estimate"]["value"]
        assert both["config"]["prior"] == one["config"]["prior"] == one["prior_estimate"]["value"]
        assert both["val_score"] == pytest.approx(one["val_score"], rel=1e-3, abs=1e-4)


@pytest.mark.parametrize("extra, message", [
    (["--prior", "guess"], "'guess': expected a number in (0, 1) or 'estimate'"),
    (["--prior-epochs", "3"], "--prior-epochs 3: only with --prior estimate"),
    (["--prior", "estimate", "--prior-epochs", "0"], "--prior-epochs 0: expected at least 1"),
    (["--prior", "estimate", "--set", "prior=0.45"],
     "--prior estimate and the setting prior = 0.45 disagree"),
])
def test_bad_prior_options_are_refused_before_any_work(mnist_dir, tmp_path, extra, message):
    result = runner.invoke(app, _args(mnist_dir, tmp_path / "out", *extra))
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "out" / "seed0").exists()


class _Unreadable(torch.utils.data.Dataset):
    """A test split that fails when anything reads it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        raise AssertionError("the test split was read")


def test_the_tensor_estimator_finds_a_separable_prior_without_reading_the_test_split(tmp_path):
    from adni_pu.data.pu import PUSplit, make_pu_data
    from adni_pu.workflows.prior import estimate_tensor_prior

    x, y = blobs(3000, 0, shift=4.0)
    data = make_pu_data(x, y, x[:10], y[:10], n_labelled=300, prior=0.4, val_fraction=0.3,
                        seed=0, name="blobs")
    data.test = PUSplit(_Unreadable(10), np.zeros(10), np.zeros(10, bool), "test")
    truth = float(data.train.truth.mean())
    record, trained = estimate_tensor_prior(data, tiny_config(track_test=True), tmp_path, 4,
                                            {"true_prior": truth})
    assert trained and record is not None
    assert record["value"] == pytest.approx(truth, abs=0.05)
    assert record["n_positive"] == int(data.val.labelled.sum())
    assert record["n_unlabelled"] == len(data.val)  # case-control: U is the whole split
    again, trained = estimate_tensor_prior(data, tiny_config(), tmp_path, 4,
                                           {"true_prior": truth})
    assert not trained and again == record  # resumed from the finished classifier


def test_results_of_given_and_estimated_priors_are_not_mixed(tmp_path):
    from types import SimpleNamespace

    base = {key: None for key in fmt.SEED_FIELDS}
    base.update(config={"epochs": 1, "batch_size": 8, "lr": 1e-3, "weight_decay": 0.0,
                        "model": "mlp6", "method": "nnpu", "val_criterion": "pu_risk",
                        "pn_validation": False, "selfpu": {}},
                data={"prior": 0.49}, test={"accuracy": 0.9, "balanced_accuracy": 0.9,
                                            "auc": 0.9, "f1": 0.9},
                seconds_per_epoch={})
    estimate = {"value": 0.5, "ci_low": 0.45, "ci_high": 0.55, "method": "bbe", "split": "val",
                "true_prior": 0.49, "classifier": {"epochs": 2, "config": {}}}
    spec = SimpleNamespace(dataset="mnist", data_dir=tmp_path, label="nnpu", n_labelled=10,
                           scheme="case-control", val_fraction=0.1, train_limit=None,
                           test_limit=None)
    with pytest.raises(fmt.ResultsError, match=r"seeds \[1\] trained with a given class prior"):
        fmt.aggregate(spec, [{**base, "seed": 0, "prior_estimate": estimate},
                             {**base, "seed": 1}], "cmd")
    plain = fmt.aggregate(spec, [{**base, "seed": 0}], "cmd")
    assert "prior_estimate" not in plain and plain["settings"]["method"] == "nnpu"
    assert "estimated" not in fmt.markdown_table(plain)


def test_the_estimate_summary_counts_errors_and_ci_coverage():
    rows = [(0, {"value": 0.50, "ci_low": 0.45, "ci_high": 0.55, "method": "bbe",
                 "true_prior": 0.49}),
            (1, {"value": 0.40, "ci_low": 0.38, "ci_high": 0.42, "method": "bbe",
                 "true_prior": 0.49})]
    summary = fmt.estimate_summary(rows)
    assert [r["abs_error"] for r in summary["per_seed"]] == pytest.approx([0.01, 0.09])
    assert summary["abs_error"]["mean"] == pytest.approx(0.05)
    assert summary["ci_coverage"] == {"covered": 1, "n": 2}
    text = fmt.estimate_markdown(summary)
    assert "| 1 | 0.400 | [0.380, 0.420] | 0.490 | 0.090 |" in text
    assert "covers the true prior in 1 of 2 seeds" in text

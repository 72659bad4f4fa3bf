"""Model selection by the P-vs-U AUC (``val_criterion = "pu_auc"``, no class prior) in every
workflow: the ordinary engine (baselines, Self-PU under both rules), a resumed run, the
population engine, the MNIST benchmark command, ``adni-pu train`` on volumes with the
evaluation report, the demo's training step and two gloo processes.

Most tests script the validation scores by epoch (:func:`scripted_val_scores`): the P-vs-U
AUC peaks at epoch 1 and is lowest at epoch 0, every other criterion is best at the last
epoch. A run that ignores the criterion then keeps the last epoch, one that minimises the
AUC keeps epoch 0; only selection by the highest AUC keeps epoch 1.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from conftest import tiny_config
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.pu import criteria
from adni_pu.pu.run import RunView
from adni_pu.pu.trainer import Trainer

AUC_BY_EPOCH = (0.50, 0.90, 0.70, 0.60, 0.55)
PICKED_BY_AUC = 1  # AUC_BY_EPOCH's highest; its lowest is epoch 0, the others' last epoch
_REAL_VAL_SCORES = RunView.val_scores
runner = CliRunner()


def scripted_val_scores(run: RunView, logits):
    """The real validation criteria with the scripted values of the module docstring (the
    epoch being evaluated is the number of epochs already in the history, also on resume)."""
    scores = _REAL_VAL_SCORES(run, logits)
    epoch = len(run.state.history)
    for key in scores:
        lower = criteria.LOWER_IS_BETTER.get(key, True)
        scores[key] = 1.0 - 0.1 * epoch if lower else 0.1 * epoch
    scores["pu_auc"] = AUC_BY_EPOCH[epoch]
    return scores


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setattr(RunView, "val_scores", scripted_val_scores)


def assert_selected_by_pu_auc(run_dir: Path, epoch: int = PICKED_BY_AUC) -> dict:
    """``selection.json`` names pu_auc, the epoch and its score, which is the highest
    recorded validation pu_auc of the chosen model (metrics.csv)."""
    from adni_pu.pu.recorders import read_metrics_csv

    summary = json.loads((run_dir / "selection.json").read_text())
    assert summary["val_criterion"] == "pu_auc"
    assert summary["best_epoch"] == epoch
    rows = read_metrics_csv(run_dir / "metrics.csv")
    column = f"val/{summary['best_candidate']}/pu_auc"
    history = [float(r[column]) if r.get(column) else float("-inf") for r in rows]
    assert summary["val_score"] == pytest.approx(history[epoch]) == pytest.approx(max(history))
    assert torch.load(run_dir / "best_model.pt", weights_only=False)["epoch"] == epoch
    return summary


# ------------------------------------------------------------------- the ordinary engine


@pytest.mark.parametrize("criterion, epoch", [("pu_auc", PICKED_BY_AUC), ("pu_risk", 3)])
def test_a_baseline_keeps_the_epoch_of_highest_pu_auc(tiny_pu, tmp_path, scripted, criterion,
                                                      epoch):
    """The control row (pu_risk keeps the last epoch) shows the scripted scores tell the
    criteria apart."""
    fit = Trainer(tiny_config(method="nnpu", epochs=4, val_criterion=criterion), tiny_pu,
                  tmp_path / "run").fit()
    assert fit.best_epoch == epoch
    if criterion == "pu_auc":
        assert fit.best_score == AUC_BY_EPOCH[PICKED_BY_AUC]
        assert_selected_by_pu_auc(tmp_path / "run")
        assert 'val_criterion = "pu_auc"' in (tmp_path / "run" / "config.toml").read_text()


SCHEDULE = {"warmup_epochs": 1, "self_paced_end": 3, "select_every": 1,
            "teacher_rampup_epochs": 1, "reweight": False}


def test_selfpu_best_epoch_rule_keeps_the_epoch_of_highest_pu_auc(tiny_pu, tmp_path,
                                                                  scripted):
    cfg = tiny_config(method="selfpu", epochs=5, selfpu=SCHEDULE, val_criterion="pu_auc")
    fit = Trainer(cfg, tiny_pu, tmp_path / "run").fit()
    assert fit.best_epoch == PICKED_BY_AUC and fit.best_candidate.startswith("student")
    assert_selected_by_pu_auc(tmp_path / "run")


def test_selfpu_final_rule_keeps_the_finalist_of_highest_pu_auc(tiny_pu, tmp_path):
    """Real scores: the finalists after the last epoch are compared by their recorded
    validation pu_auc, the highest wins."""
    cfg = tiny_config(method="selfpu", epochs=5, selfpu=SCHEDULE, val_criterion="pu_auc",
                      selection="final")
    trainer = Trainer(cfg, tiny_pu, tmp_path / "run")
    fit = trainer.fit()
    last = fit.history[-1]
    scores = {n: last[f"val/{n}/pu_auc"] for n in ("teacher1", "teacher2", "average")}
    assert len(set(scores.values())) > 1, "finalists tie: the direction would not matter"
    assert trainer.state.final["val_scores"] == scores
    assert fit.best_epoch == cfg.epochs - 1
    assert fit.best_candidate == max(scores, key=lambda n: (scores[n], n))
    summary = json.loads((tmp_path / "run" / "selection.json").read_text())
    assert (summary["selection"], summary["val_criterion"]) == ("final", "pu_auc")
    assert summary["finalists"]["choice"] == fit.best_candidate


def _interrupt_after(trainer: Trainer, epochs_done: int) -> None:
    original = trainer.train_epoch

    def train_epoch(epoch: int, *args, **kwargs):
        if epoch == epochs_done:
            raise KeyboardInterrupt
        return original(epoch, *args, **kwargs)

    trainer.train_epoch = train_epoch  # type: ignore[method-assign]


def test_the_best_pu_auc_so_far_survives_a_resume(tiny_pu, tmp_path, scripted):
    """Interrupted after epoch 1 (the best): the resumed epochs score lower, so a resume
    that lost the best so far, or compared the wrong way, would keep a later epoch."""
    cfg = tiny_config(method="nnpu", epochs=4, val_criterion="pu_auc")
    straight = Trainer(cfg, tiny_pu, tmp_path / "straight")
    straight.fit()
    interrupted = Trainer(cfg, tiny_pu, tmp_path / "resumed")
    _interrupt_after(interrupted, 2)
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    resumed = Trainer(cfg, tiny_pu, tmp_path / "resumed")
    fit = resumed.fit()
    assert resumed.state.start_epoch == 2
    assert fit.best_epoch == straight.state.best["epoch"] == PICKED_BY_AUC
    for key, value in straight.state.best["state"]["single"].items():
        torch.testing.assert_close(resumed.state.best["state"]["single"][key], value, msg=key)
    assert_selected_by_pu_auc(tmp_path / "resumed")


def test_a_population_selects_each_run_by_pu_auc(tiny_pu, tmp_path, scripted):
    from adni_pu.pu.population import fit_population

    trainers = [Trainer(tiny_config(method="nnpu", epochs=4, val_criterion="pu_auc", seed=s),
                        tiny_pu, tmp_path / f"seed{s}") for s in (0, 1)]
    fits = fit_population(trainers)
    assert [f.best_epoch for f in fits] == [PICKED_BY_AUC, PICKED_BY_AUC]
    for s in (0, 1):
        assert_selected_by_pu_auc(tmp_path / f"seed{s}")


# ------------------------------------------------------------------- commands


@pytest.mark.parametrize("population", [None, 2])
def test_benchmark_command_selects_and_records_pu_auc(tmp_path, monkeypatch, scripted,
                                                      population):
    from test_readers import write_mnist

    from adni_pu.data import readers

    monkeypatch.setitem(readers.MNIST_COUNTS, "train", 200)
    monkeypatch.setitem(readers.MNIST_COUNTS, "test", 40)
    write_mnist(tmp_path / "mnist", n_train=200, n_test=40)
    out = tmp_path / "out"
    args = ["benchmark", "mnist", "--seeds", "2", "--epochs", "4", "--n-labelled", "60",
            "--data-dir", str(tmp_path / "mnist"), "--out", str(out), "--threads", "1",
            "--set", "progress=false", "--set", 'val_criterion="pu_auc"',
            "--set", "model_args.hidden=16"]
    if population is not None:
        args += ["--population", str(population)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["val_criterion"] == "pu_auc"
    assert ("Model selected on the validation split by `pu_auc`, the AUC of the validation "
            "split's labelled positives") in (out / "results.md").read_text()
    for seed in (0, 1):
        record = json.loads((out / f"seed{seed}" / "result.json").read_text())
        assert record["val_criterion"] == "pu_auc" and record["population"] == population
        assert record["selected_epoch"] == PICKED_BY_AUC
        assert record["val_score"] == AUC_BY_EPOCH[PICKED_BY_AUC]
        assert_selected_by_pu_auc(out / f"seed{seed}")


@pytest.fixture(scope="module")
def volume_cohort(tmp_path_factory):
    from volume_helpers import make_volume_cohort

    root = tmp_path_factory.mktemp("pu_auc_volumes")
    return make_volume_cohort(root / "cohort"), root / "cache"


def test_train_command_on_volumes_selects_by_pu_auc_and_evaluate_says_so(volume_cohort,
                                                                        tmp_path, scripted):
    from volume_helpers import tiny_overrides

    manifest, cache = volume_cohort
    run = tmp_path / "run"
    sets = [*tiny_overrides(3, cache), 'train.val_criterion="pu_auc"']
    result = runner.invoke(app, ["train", str(manifest), str(run), "--preset", "nnpu",
                                 *(a for s in sets for a in ("--set", s))])
    assert result.exit_code == 0, result.output
    assert f"after epoch {PICKED_BY_AUC + 1} (pu_auc 0.9000)" in result.output
    assert_selected_by_pu_auc(run)
    evaluated = runner.invoke(app, ["evaluate", str(run), "--split", "test",
                                    "--bootstrap", "0"])
    assert evaluated.exit_code == 0, evaluated.output
    report = (run / "evaluation" / "test" / "report.md").read_text()
    assert "## Model selection" in report
    assert ("by `pu_auc`, the AUC of the validation split's labelled positives against its "
            "unlabelled examples (needs no class prior") in report
    assert f"after epoch {PICKED_BY_AUC + 1} (validation pu_auc 0.9000)" in report
    metrics = json.loads((run / "evaluation" / "test" / "metrics.json").read_text())
    assert metrics["model_selection"]["val_criterion"] == "pu_auc"
    assert metrics["model_selection"]["epoch"] == PICKED_BY_AUC


def test_the_report_names_the_criterion_from_the_settings_or_refuses_a_broken_record(
        tmp_path):
    from adni_pu.errors import VolumeRunError
    from adni_pu.workflows.evaluate import run_selection, selection_markdown

    train = tiny_config(val_criterion="pu_auc", selection="final")
    chosen = run_selection(tmp_path, train)  # a run folder without selection.json
    assert (chosen["val_criterion"], chosen["selection"], chosen["epoch"]) == (
        "pu_auc", "final", None)
    assert "by `pu_auc`, the AUC" in "\n".join(selection_markdown(chosen))
    (tmp_path / "selection.json").write_text('{"best_epoch": ')
    with pytest.raises(VolumeRunError, match=r"selection.json: not JSON"):
        run_selection(tmp_path, train)


def test_a_comparison_piece_takes_pu_auc_as_an_override(volume_cohort, tmp_path, scripted):
    """The demo's training step is a piece of the comparison: ``--set
    train.val_criterion="pu_auc"`` reaches it, and the piece records the epoch it chose."""
    from volume_helpers import tiny_overrides

    from adni_pu.workflows.compare.pieces import CompareSpec, Piece, piece_dir, prepare, run_piece

    manifest, cache = volume_cohort
    spec = CompareSpec(manifest=str(manifest), out=str(tmp_path / "compare"), methods=("naive",),
                       folds=2, overrides=(*tiny_overrides(3, cache),
                                           'train.val_criterion="pu_auc"'))
    prepare(spec)
    record = run_piece(spec, Piece("naive", 0, 0))
    assert record["selected_epoch"] == PICKED_BY_AUC + 1  # counted from 1
    assert_selected_by_pu_auc(piece_dir(tmp_path / "compare", Piece("naive", 0, 0)))


# ------------------------------------------------------------------- distributed (gloo)


def _ddp_worker(rank: int, world: int, port: int, out: str) -> None:
    from test_distributed import _config, _data

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})
    torch.set_num_threads(1)
    from adni_pu.distributed import init_from_env, shutdown

    RunView.val_scores = scripted_val_scores  # type: ignore[method-assign]
    run = init_from_env("gloo")
    cfg = dataclasses.replace(_config("nnpu"), val_criterion="pu_auc")  # 3 epochs
    fit = Trainer(cfg, _data(), Path(out) / "run", log=lambda m: None, distributed=run).fit()
    torch.save({"best_epoch": fit.best_epoch}, Path(out) / f"rank{rank}.pt")
    shutdown()


def test_two_gloo_processes_select_by_pu_auc(tmp_path):
    from test_distributed import _free_port

    mp.spawn(_ddp_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        saved = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert saved["best_epoch"] == PICKED_BY_AUC
    assert_selected_by_pu_auc(tmp_path / "run")

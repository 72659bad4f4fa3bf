"""VPU (Chen et al., NeurIPS 2020): its loss against the paper's formula on hand-made
numbers, the MixUp draws and inputs, the prior-free selection criterion, the normalised
decision rule folded into the selected model, and a run in each engine and PU scheme."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import blobs, tiny_config

from adni_pu.data.pu import make_pu_data
from adni_pu.errors import ConfigError
from adni_pu.pu import checkpoint, losses, objective
from adni_pu.pu.batching import EpochPlan
from adni_pu.pu.criteria import val_scores
from adni_pu.pu.metrics import sigmoid
from adni_pu.pu.population import fit_population
from adni_pu.pu.strategies import VPU, shift_output_bias
from adni_pu.pu.trainer import Trainer


def _log_sigmoid(z: np.ndarray) -> np.ndarray:
    return -np.log1p(np.exp(-z))


def test_the_loss_is_the_papers_formula_on_hand_made_numbers():
    """log mean_X phi - mean_P log phi, plus 0.03 (log(lam phi + 1 - lam) - log phi(mix))^2
    averaged over the X rows, computed here by hand in float64."""
    z = np.array([2.0, -1.0, 0.5, -3.0, 1.5])  # rows 0-1 labelled, 2-4 unlabelled
    z_mix = np.array([0.3, 0.1, 1.2, -0.4, 0.9])
    lam = 0.7
    pos = np.array([1, 1, 0, 0, 0.0])
    marginal = 1 - pos  # case-control: the X rows are D_U
    phi = 1 / (1 + np.exp(-z))
    var = math.log(phi[2:].mean()) - _log_sigmoid(z[:2]).mean()
    reg = ((np.log(lam * phi[2:] + 1 - lam) - _log_sigmoid(z_mix[2:])) ** 2).mean()
    cfg = tiny_config(method="vpu")
    rows = {"valid": torch.ones(5), "pos": torch.tensor(pos, dtype=torch.float32),
            "unl": torch.tensor(marginal, dtype=torch.float32),
            "marginal": torch.tensor(marginal, dtype=torch.float32)}
    t = torch.tensor(z, dtype=torch.float32)
    loss, stats = objective.step_loss(cfg, 1, t, rows["pos"], rows, prior=0.4, prior_u=0.4,
                                      prior_rest=0.4, mixed=torch.tensor(z_mix).float(),
                                      lam=lam)
    assert float(stats["variational"]) == pytest.approx(var, rel=1e-6)
    assert float(stats["mixup"]) == pytest.approx(reg, rel=1e-5)
    assert float(loss) == pytest.approx(var + 0.03 * reg, rel=1e-6)
    # without MixUp the loss is the variational term alone
    alone, _ = objective.vpu_loss(cfg, t, rows, None, 1.0)
    assert float(alone) == pytest.approx(var, rel=1e-6)


def test_a_stack_gets_each_networks_vpu_loss():
    """Two networks' rows (M x B masks, one padded row) and weights: each network's loss
    is its own, and the gradient of an empty-marginal row set stays finite."""
    torch.manual_seed(0)
    z = torch.randn(2, 6, requires_grad=True)
    mixed = torch.randn(2, 6)
    lam = torch.tensor([0.2, 0.9])
    valid = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0.0]])
    pos = torch.tensor([[1, 0, 0, 1, 0, 0], [0, 1, 0, 0, 0, 0.0]])
    rows = {"valid": valid, "pos": pos, "marginal": valid - pos}
    cfg = tiny_config(method="vpu")
    loss, _ = objective.vpu_loss(cfg, z, rows, mixed, lam)
    for m in range(2):
        one = {k: v[m] for k, v in rows.items()}
        alone, _ = objective.vpu_loss(cfg, z[m], one, mixed[m], float(lam[m]))
        assert float(loss[m].detach()) == pytest.approx(float(alone.detach()), rel=1e-6)
    empty = {**rows, "marginal": torch.zeros_like(valid)}
    objective.vpu_loss(cfg, z, empty, mixed, lam)[0].sum().backward()
    assert torch.isfinite(z.grad).all()


def test_mix_inputs_for_one_model_a_stack_and_branches():
    x = torch.arange(12.0).view(4, 3)
    partner = torch.tensor([1, 1, 0, 1])
    mixed = objective.mix_inputs(x, partner, 0.25)
    assert torch.allclose(mixed, 0.25 * x + 0.75 * x[partner])
    branches = objective.mix_inputs({"a": x, "b": 2 * x}, partner, 0.25)
    assert torch.allclose(branches["b"], 2 * mixed)
    stacked = torch.stack([x, -x])  # M x B x ...
    partners = torch.stack([partner, torch.tensor([3, 2, 1, 0])])
    out = objective.mix_inputs(stacked, partners, torch.tensor([0.25, 0.5]))
    assert torch.allclose(out[0], mixed)
    assert torch.allclose(out[1], objective.mix_inputs(-x, partners[1], 0.5))


def _pu(scheme: str = "case-control", seed: int = 0):
    x, y = blobs(1200, 0)
    xt, yt = blobs(400, 1)
    return make_pu_data(x, y, xt, yt, n_labelled=120, prior=0.4, val_fraction=0.2,
                        seed=seed, name="blobs", scheme=scheme)


def test_mixup_partners_are_labelled_positives_of_the_same_batch():
    trainer = Trainer(tiny_config(method="vpu", batch_size=64), _pu())
    strategy = trainer.strategy
    assert isinstance(strategy, VPU)
    strategy.training_start(3, 1)
    plan = EpochPlan.of(trainer.epoch_batches(np.random.default_rng(0)))
    mix = strategy.mixup(plan)
    s = trainer.entries.s[plan.order]
    for b in range(len(plan.sizes)):
        lam, partner = mix.batch(plan, b)
        batch_s = s[plan.starts[b]:plan.starts[b] + plan.sizes[b]]
        assert 0 < lam < 1 and len(partner) == plan.sizes[b]
        assert (batch_s[partner] == 1).all()
    # the draws are the seed's and the epoch's: again the same, another epoch differs
    again = strategy.mixup(plan)
    assert np.array_equal(again.partner, mix.partner) and np.array_equal(again.lam, mix.lam)
    strategy.training_start(4, 1)
    assert not np.array_equal(strategy.mixup(plan).lam, mix.lam)
    # a batch without a labelled positive is not mixed
    lone = EpochPlan.of([np.array([trainer.entries.n_p, trainer.entries.n_p + 1])])
    lam, partner = strategy.mixup(lone).batch(lone, 0)
    assert lam == 1.0 and partner.tolist() == [0, 1]


def test_marginal_rows_follow_the_pu_scheme():
    """The training distribution's rows: D_U under case-control (where D_U holds every
    example), every row under censoring (where D_U holds only the unlabelled)."""
    for scheme, expect in (("case-control", "unl"), ("censoring", "valid")):
        trainer = Trainer(tiny_config(method="vpu"), _pu(scheme))
        plan = EpochPlan.of(trainer.epoch_batches(np.random.default_rng(0)))
        rows = trainer.strategy.row_sets(plan, 1)[0]
        assert np.array_equal(rows["marginal"], rows[expect]), scheme


def test_the_variational_criterion_needs_no_prior_and_is_lower_is_better():
    data = _pu()
    rng = np.random.default_rng(0)
    good = np.where(data.val.truth == 1, 2.0, -2.0) + rng.normal(0, 0.1, len(data.val))
    scores = [val_scores(v, data.val, data.scheme, p, p) for v, p in
              ((good, 0.4), (good, 0.1), (rng.normal(0, 1, len(good)), 0.4))]
    assert scores[0]["variational"] == scores[1]["variational"]  # the prior is not read
    assert scores[0]["variational"] < scores[2]["variational"]


def test_a_vpu_run_selects_by_the_variational_loss_and_folds_the_normaliser(tmp_path):
    cfg = tiny_config(method="vpu", val_criterion="variational", epochs=3)
    trainer = Trainer(cfg, _pu(), tmp_path / "run")
    fit = trainer.fit()
    best = trainer.best
    history = [row["val/model/variational"] for row in trainer.history]
    assert fit.best_epoch == int(np.argmin(history))
    assert all(f"train/model/{k}" in trainer.history[0] for k in ("variational", "mixup"))
    m = best["normaliser"]
    assert 0 < m <= 1
    saved = checkpoint.read_selected(tmp_path / "run" / checkpoint.SELECTED)
    assert saved["normaliser"] == m
    # the folded model decides phi(x) / m > 1/2 on the raw model's scores
    raw = Trainer(cfg, _pu(), tmp_path / "raw")
    raw.state.best = {**best, "state": {"single": shift_output_bias(
        best["state"]["single"], raw.students[0].model, math.log((m / 2) / (1 - m / 2)))}}
    z_raw = raw.predict_logits(raw.best_model(), trainer.data.test)
    z = trainer.predict_logits(trainer.best_model(), trainer.data.test)
    assert np.array_equal(z > 0, sigmoid(z_raw) / m > 0.5)
    assert m == pytest.approx(float(sigmoid(raw.predict_logits(
        raw.best_model(), trainer.data.train)).max()), rel=1e-5)


def test_the_normaliser_needs_a_linear_output(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(2, 1), torch.nn.ReLU())
    with pytest.raises(ConfigError, match="last layer '1' is ReLU"):
        shift_output_bias(model.state_dict(), model, 1.0)


@pytest.mark.parametrize("scheme", ["case-control", "censoring"])
def test_a_vpu_population_equals_separate_runs(scheme):
    cfgs = [tiny_config(method="vpu", val_criterion="variational", epochs=3, seed=s)
            for s in (0, 1)]
    data = [_pu(scheme, s) for s in (0, 1)]
    alone = [Trainer(c, d) for c, d in zip(cfgs, data)]
    for t in alone:
        t.fit()
    together = [Trainer(c, d) for c, d in zip(cfgs, data)]
    assert all(r.complete for r in fit_population(together))
    for a, b in zip(alone, together):
        for row_a, row_b in zip(a.history, b.history):
            for key in ("train/model/variational", "train/model/mixup",
                        "val/model/variational"):
                assert row_b[key] == pytest.approx(row_a[key], rel=1e-5, abs=1e-6), key
        assert a.best["normaliser"] == pytest.approx(b.best["normaliser"], rel=1e-5)


def test_vpu_is_refused_under_torchrun():
    class OneRank:  # what the trainer reads of a DistributedRun before it refuses
        rank = 0

        def check_device(self, device):
            pass

    with pytest.raises(ConfigError, match="method 'vpu' under torchrun"):
        Trainer(tiny_config(method="vpu"), _pu(), distributed=OneRank())  # type: ignore[arg-type]


def test_the_selection_criterion_is_the_training_loss_on_validation():
    """val_scores' "variational" is :func:`losses.variational_loss` over the whole split
    (every example is drawn from the training distribution) and its labelled positives."""
    data = _pu()
    z = np.random.default_rng(1).normal(size=len(data.val))
    expect = losses.variational_loss(torch.from_numpy(z),
                                     torch.from_numpy(data.val.labelled).double(),
                                     torch.ones(len(z), dtype=torch.float64))
    got = val_scores(z, data.val, data.scheme, 0.4, 0.4)["variational"]
    assert got == pytest.approx(float(expect), rel=1e-12)


# ---------------------------------------------------------------------- every workflow


def test_the_benchmark_runs_vpu_with_its_own_selection(tmp_path, monkeypatch):
    import json

    from test_readers import write_mnist
    from typer.testing import CliRunner

    from adni_pu.cli.app import app
    from adni_pu.data import readers

    monkeypatch.setitem(readers.MNIST_COUNTS, "train", 200)
    monkeypatch.setitem(readers.MNIST_COUNTS, "test", 40)
    write_mnist(tmp_path / "mnist", n_train=200, n_test=40)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [
        "benchmark", "mnist", "--method", "vpu", "--seeds", "1", "--epochs", "2",
        "--n-labelled", "60", "--data-dir", str(tmp_path / "mnist"), "--out", str(out),
        "--set", "progress=false"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "results.json").read_text())
    assert summary["settings"]["method"] == "vpu"
    assert summary["settings"]["val_criterion"] == "variational"
    assert "vpu" in summary["results"]
    assert json.loads((out / "seed0" / "selection.json").read_text())[
        "val_criterion"] == "variational"


def test_a_volume_run_trains_evaluates_and_predicts_with_vpu(tmp_path):
    import json

    from volume_helpers import make_volume_cohort, tiny_overrides

    from adni_pu.pu.checkpoint import SELECTED, read_selected
    from adni_pu.workflows.evaluate import evaluate_run
    from adni_pu.workflows.train import train_volumes
    from adni_pu.workflows.volume_settings import load_volume_config

    manifest = make_volume_cohort(tmp_path / "cohort")
    cfg = load_volume_config(None, tiny_overrides(2, tmp_path / "cache"), preset="vpu")
    assert cfg.train.method == "vpu" and cfg.train.val_criterion == "variational"
    run = tmp_path / "run"
    train_volumes(manifest, cfg, run, log=lambda m: None)
    assert 0 < read_selected(run / SELECTED)["normaliser"] <= 1
    assert json.loads((run / "selection.json").read_text())["val_criterion"] == "variational"
    evaluate_run(run, "test", n_boot=0)
    report = (run / "evaluation" / "test" / "report.md").read_text()
    assert "Class prior: not read by this method or its model selection" in report
    # a cohort without truth (no PET): VPU trains with a placeholder prior, recorded as one,
    # where nnPU needs a prior to be given
    import pandas as pd

    from adni_pu.errors import VolumeRunError

    frame = pd.read_csv(manifest, dtype={"subject_id": str})
    frame["truth"] = float("nan")
    blind = manifest.with_name("no_truth.csv")
    frame.to_csv(blind, index=False)
    train_volumes(blind, load_volume_config(None, tiny_overrides(1, tmp_path / "cache"),
                                            preset="vpu"), tmp_path / "blind", log=lambda m: None)
    prior = json.loads((tmp_path / "blind" / "run.json").read_text())["prior"]
    assert prior["source"].startswith("placeholder") and prior["read_by_method"] is False
    with pytest.raises(VolumeRunError, match="no training subject has a known truth"):
        train_volumes(blind, load_volume_config(None, tiny_overrides(1, tmp_path / "cache"),
                                                preset="nnpu"), tmp_path / "nn",
                      log=lambda m: None)


def test_the_papers_optimiser_preset_halves_the_rate_every_n_epochs():
    from adni_pu import config as cfgmod
    from adni_pu.pu.config import TrainConfig, preset_settings

    values = {**cfgmod.to_dict(tiny_config()), **preset_settings("vpu-paper-optimiser"),
              "epochs": 5, "lr_step_epochs": 2}
    trainer = Trainer(cfgmod.from_dict(TrainConfig, values), _pu())
    trainer.fit()
    opt = trainer.students[0].optimizer
    assert opt.param_groups[0]["betas"] == (0.5, 0.99)
    assert [row["lr"] for row in trainer.history] == pytest.approx(
        [3e-5, 3e-5, 1.5e-5, 1.5e-5, 7.5e-6])


def test_vpu_on_augmented_images_in_both_engines():
    """CIFAR-10's path: CNN-13 on images with random crops and flips, channels-last; the
    MixUp mixes the augmented batch; the population's first epoch follows the runs alone
    to 1 % (grouped and single convolutions round differently, and on 8-pixel noise images
    Adam turns that into visible differences within an epoch; the MLP cases above agree to
    1e-5)."""
    from test_trainer_speed import _tiny_images

    x, y = _tiny_images()
    xt, yt = _tiny_images(64, seed=1)
    datas = [make_pu_data(x, y, xt, yt, n_labelled=24, prior=0.4, val_fraction=0.25, seed=s)
             for s in (0, 1)]
    cfgs = [tiny_config(method="vpu", val_criterion="variational", model="cnn13",
                        model_args={"image_size": 8, "width": 4}, batch_size=32, lr=1e-3,
                        epochs=2, seed=s, augment="crop-flip", channels_last=True)
            for s in (0, 1)]
    alone = [Trainer(c, d) for c, d in zip(cfgs, datas)]
    for t in alone:
        t.fit()
    together = [Trainer(c, d) for c, d in zip(cfgs, datas)]
    fit_population(together)
    for a, b in zip(alone, together):
        for key in ("train/model/variational", "train/model/mixup", "val/model/variational"):
            assert all(math.isfinite(row[key]) for row in a.history + b.history), key
            assert b.history[0][key] == pytest.approx(a.history[0][key], rel=1e-2, abs=1e-3), key
        assert 0 < b.best["normaliser"] <= 1

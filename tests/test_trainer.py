"""The one trainer: baselines learn, Self-PU runs its three phases, resume is exact,
model selection never reads the test split."""

from __future__ import annotations

import copy
import time

import numpy as np
import pytest
import torch
from conftest import tiny_config

from adni_pu.errors import ConfigError, ResumeError
from adni_pu.pu import objective
from adni_pu.pu.candidates import load_selected
from adni_pu.pu.trainer import Trainer


@pytest.mark.parametrize("method", ["naive", "upu", "nnpu"])
def test_baselines_learn_the_blobs(tiny_pu, method):
    trainer = Trainer(tiny_config(method=method, epochs=6), tiny_pu)
    trainer.fit()
    metrics, logits = trainer.evaluate_split(tiny_pu.test)
    assert logits.shape == (len(tiny_pu.test),)
    # PU methods recover the classes; naive PN is biased towards negative but still ranks
    assert metrics["auc"] > 0.9
    if method != "naive":
        assert metrics["accuracy"] > 0.8


def test_run_folder_contents(tiny_pu, tmp_path):
    run = tmp_path / "run"
    Trainer(tiny_config(method="nnpu", epochs=2), tiny_pu, run).fit()
    for name in ("config.toml", "provenance.json", "data.json", "metrics.csv", "best_model.pt",
                 "selection.json", "curves.png", "checkpoints/last.pt"):
        assert (run / name).is_file(), name
    assert any((run / "tensorboard").iterdir())
    assert len((run / "metrics.csv").read_text().strip().splitlines()) == 3
    assert 'method = "nnpu"' in (run / "config.toml").read_text()


def test_selection_never_reads_test_split(tiny_pu):
    a = Trainer(tiny_config(method="nnpu", epochs=3), tiny_pu)
    fit_a = a.fit()
    scrambled = copy.copy(tiny_pu)
    test = copy.copy(tiny_pu.test)
    test.x = torch.randn_like(test.x) * 100
    test.truth = 1 - test.truth
    scrambled.test = test
    b = Trainer(tiny_config(method="nnpu", epochs=3), scrambled)
    fit_b = b.fit()
    assert fit_a.best_epoch == fit_b.best_epoch
    assert fit_a.best_score == fit_b.best_score
    assert not any(k.startswith("test") for k in fit_a.history[0])


def _interrupt_after(trainer: Trainer, epochs_done: int) -> None:
    original = trainer.train_epoch

    def train_epoch(epoch: int, *args, **kwargs):
        if epoch == epochs_done:
            raise KeyboardInterrupt
        return original(epoch, *args, **kwargs)

    trainer.train_epoch = train_epoch  # type: ignore[method-assign]


@pytest.mark.parametrize("method", ["nnpu", "selfpu"])
def test_resume_after_interrupt_equals_uninterrupted(tiny_pu, tmp_path, method):
    sp = {"warmup_epochs": 1, "self_paced_end": 3, "select_every": 1,
          "teacher_rampup_epochs": 1}
    cfg = tiny_config(method=method, epochs=5, selfpu=sp)
    straight = Trainer(cfg, tiny_pu, tmp_path / "straight")
    straight.fit()
    interrupted = Trainer(cfg, tiny_pu, tmp_path / "resumed")
    _interrupt_after(interrupted, 3 if method == "selfpu" else 2)
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    resumed = Trainer(cfg, tiny_pu, tmp_path / "resumed")
    resumed.fit()
    assert resumed.state.start_epoch == (3 if method == "selfpu" else 2)
    for s1, s2 in zip(straight.state.students, resumed.state.students):
        for (k, v1), v2 in zip(s1.model.state_dict().items(), s2.model.state_dict().values()):
            torch.testing.assert_close(v1, v2, msg=k)
    assert straight.state.best["epoch"] == resumed.state.best["epoch"]
    assert straight.state.best["score"] == pytest.approx(resumed.state.best["score"])


def test_a_training_prior_other_than_the_datas_is_refused(tiny_pu):
    from adni_pu.config import ConfigError

    assert Trainer(tiny_config(method="nnpu", prior=0.4), tiny_pu).run.prior == 0.4  # the same
    with pytest.raises(ConfigError, match="differs from the class prior 0.4"):
        Trainer(tiny_config(method="nnpu", prior=0.3), tiny_pu)


def test_resume_refuses_other_settings(tiny_pu, tmp_path):
    Trainer(tiny_config(method="nnpu", epochs=2), tiny_pu, tmp_path).fit()
    with pytest.raises(ResumeError, match="checkpoint made with other settings"):
        Trainer(tiny_config(method="upu", epochs=2), tiny_pu, tmp_path).fit()


def test_selfpu_goes_through_three_phases(tiny_pu, tmp_path):
    sp = {"warmup_epochs": 2, "self_paced_end": 5, "select_every": 1,
          "teacher_rampup_epochs": 1}
    trainer = Trainer(tiny_config(method="selfpu", epochs=8, selfpu=sp), tiny_pu,
                      tmp_path / "run")
    fit = trainer.fit()
    phases = [row["phase"] for row in fit.history]
    assert phases == [1, 1, 2, 2, 2, 3, 3, 3]
    sizes = [row["trusted/student1/size"] for row in fit.history]
    assert sizes[:2] == [0, 0] and sizes[2] < sizes[3] < sizes[4] == sizes[7]
    acc = [row["trusted/student2/label_accuracy"] for row in fit.history[2:]]
    assert min(acc) > 0.75  # well above chance (0.5 on a balanced set)
    row2 = fit.history[3]
    assert 0 <= row2["train/student1/ce_weight_mean"] <= 1
    row3 = fit.history[-1]
    assert row3["train/student1/teacher_consistency"] > 0
    assert "train/student1/hard_fraction" in row3
    assert fit.best_candidate.startswith("teacher") or fit.best_epoch < 5
    assert (tmp_path / "run" / "trusted_set.png").is_file()
    metrics, _ = trainer.evaluate_split(tiny_pu.test)
    assert metrics["accuracy"] > 0.8


def test_teacher_average_final_model(tiny_pu):
    sp = {"warmup_epochs": 1, "self_paced_end": 2, "select_every": 1, "final_model": "average",
          "reweight": False}
    trainer = Trainer(tiny_config(method="selfpu", epochs=4, selfpu=sp), tiny_pu)
    fit = trainer.fit()
    assert fit.history[-1]["selected/candidate"] == "average"
    metrics, logits = trainer.evaluate_split(tiny_pu.test)
    assert np.isfinite(metrics["accuracy"])
    # the selected model averages both teachers' probabilities, not either one's
    saved = trainer.state.best["state"]["average"]
    assert len(saved) == 2
    probs = [1 / (1 + np.exp(-trainer.run.predict_logits(
        load_selected({"single": sd}, trainer.run.model_factory, trainer.device), tiny_pu.test)))
        for sd in saved]
    assert np.abs(probs[0] - probs[1]).max() > 1e-3  # the members differ
    np.testing.assert_allclose(1 / (1 + np.exp(-logits)), (probs[0] + probs[1]) / 2, atol=1e-5)


def test_meta_objective_is_the_pu_risk_of_the_validation_batch(tiny_pu):
    from adni_pu.pu import calibration, losses

    trainer = Trainer(tiny_config(method="selfpu"), tiny_pu)
    model = trainer.state.students[0].model
    rng = np.random.default_rng(0)
    (x_val, s_val, truth, n_pos), = trainer.strategy.validation_batches(rng, 2, 1)
    # half labelled positives (all true positives), half drawn from the validation U set
    assert 0 < int(s_val.sum()) < len(s_val)
    assert (truth[s_val == 1] == 1).all()
    params = dict(model.named_parameters())
    sp, prior = trainer.cfg.selfpu, trainer.run.prior
    value = objective.ValidationBatch.of(x_val, s_val, truth).objective(model, prior, sp)(params)
    # the population's form: the labelled positives are the first n_pos rows
    pos = (torch.arange(len(s_val)) < n_pos).float()
    as_rows = objective.ValidationBatch(x_val, truth, pos, 1.0 - pos)
    assert as_rows.objective(model, prior, sp)(params) == value
    logits = calibration.functional_forward(model, params, x_val)
    expected = losses.pu_risk(logits[s_val == 1], logits[s_val == 0], trainer.run.prior).unbiased
    assert value.item() == pytest.approx(expected.item())


def test_forward_mode_hypergradient_trains_as_the_double_backward_one(tiny_pu):
    """selfpu.hypergradient = "jvp" computes the same meta step: same trusted sets, the
    same statistics to rounding."""
    sp = {"warmup_epochs": 1, "self_paced_end": 3, "select_every": 1}
    runs = {mode: Trainer(tiny_config(method="selfpu", epochs=3,
                                      selfpu={**sp, "hypergradient": mode}),
                          tiny_pu, log=lambda _: None).fit().history
            for mode in ("double-backward", "jvp")}
    for a, b in zip(runs["double-backward"], runs["jvp"]):
        assert a["trusted/student1/size"] == b["trusted/student1/size"]
        for key, value in a.items():
            if key.startswith("train/") and isinstance(value, float):
                assert b[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert runs["jvp"][1]["train/student1/ce_weight_mean"] > 0  # the meta step did run


def test_forward_mode_hypergradient_refuses_dropout(tiny_pu):
    def with_dropout() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Dropout(0.2),
                                   torch.nn.Linear(8, 1), torch.nn.Flatten(0))

    cfg = tiny_config(method="selfpu", selfpu={"hypergradient": "jvp"})
    with pytest.raises(ConfigError, match="dropout"):
        Trainer(cfg, tiny_pu, model_factory=with_dropout)
    Trainer(tiny_config(method="selfpu"), tiny_pu, model_factory=with_dropout)  # accepted


def test_checkpoint_every_n_epochs_resumes_exactly(tiny_pu, tmp_path):
    """checkpoint_every = 3: the checkpoint holds epoch 3 when epoch 5 is interrupted, the
    resumed run repeats epochs 4-5 and ends where an uninterrupted run ends."""
    from adni_pu.pu import checkpoint

    sp = {"warmup_epochs": 1, "self_paced_end": 3, "select_every": 1,
          "teacher_rampup_epochs": 1}
    cfg = tiny_config(method="selfpu", epochs=6, selfpu=sp, checkpoint_every=3)
    straight = Trainer(cfg, tiny_pu, tmp_path / "straight", log=lambda _: None)
    straight.fit()
    interrupted = Trainer(cfg, tiny_pu, tmp_path / "resumed", log=lambda _: None)
    _interrupt_after(interrupted, 5)
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    saved = torch.load(tmp_path / "resumed" / checkpoint.LAST, weights_only=False)
    assert saved["epoch"] == 2 and len(saved["history"]) == 3
    resumed = Trainer(cfg, tiny_pu, tmp_path / "resumed", log=lambda _: None)
    resumed.fit()
    assert resumed.state.start_epoch == 3
    for s1, s2 in zip(straight.state.students, resumed.state.students):
        for v1, v2 in zip(s1.model.state_dict().values(), s2.model.state_dict().values()):
            assert torch.equal(v1, v2)
    assert [r["selected/score"] for r in resumed.state.history] == \
        [r["selected/score"] for r in straight.state.history]
    last = torch.load(tmp_path / "straight" / checkpoint.LAST, weights_only=False)
    assert last["epoch"] == 5  # the last epoch is always saved


def test_a_pause_at_the_time_limit_saves_the_last_finished_epoch(tiny_pu, tmp_path,
                                                                  monkeypatch):
    from adni_pu.pu import checkpoint

    cfg = tiny_config(method="nnpu", epochs=6, checkpoint_every=4)
    trainer = Trainer(cfg, tiny_pu, tmp_path / "run", log=lambda _: None)
    fits = iter([True, False])  # the second epoch fits, the third does not
    monkeypatch.setattr(trainer, "fits_before", lambda epoch, deadline: next(fits))
    assert not trainer.fit(deadline=time.monotonic() + 3600).complete
    saved = torch.load(tmp_path / "run" / checkpoint.LAST, weights_only=False)
    assert saved["epoch"] == 1  # epochs 0-1 done; without the pause nothing was saved yet
    again = Trainer(cfg, tiny_pu, tmp_path / "run", log=lambda _: None)
    assert again.fit().complete and again.state.start_epoch == 2

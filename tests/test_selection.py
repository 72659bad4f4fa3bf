"""The final-model rule, the teachers' BatchNorm recompute in the trainer, and that no decision
of a run reads the test split."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from conftest import tiny_config
from torch.nn.modules.batchnorm import _BatchNorm

from adni_pu.pu import selection
from adni_pu.pu.trainer import Trainer

# phase 1 for one epoch, phase 2 for two, phase 3 (teachers) for the rest
SCHEDULE = {"warmup_epochs": 1, "self_paced_end": 3, "select_every": 1,
            "teacher_rampup_epochs": 1, "reweight": False}


def selfpu(**overrides):
    sp = {**SCHEDULE, **overrides.pop("selfpu", {})}
    return tiny_config(method="selfpu", epochs=5, selfpu=sp, **overrides)


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], list):
            for sa, sb in zip(a[key], b[key]):
                assert_same_state(sa, sb)
        elif isinstance(a[key], dict):
            assert_same_state(a[key], b[key])
        else:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


def chosen_by_validation(row: dict, names: list[str], crit: str = "pu_risk") -> str:
    scores = {n: row[f"val/{n}/{crit}"] for n in names}
    return min(scores, key=lambda n: (scores[n], n))


@pytest.mark.parametrize("teachers, finalists", [
    (True, ["teacher1", "teacher2", "average"]),
    (False, ["student1", "student2", "average"]),
])
def test_final_rule_chooses_among_the_finalists_after_the_last_epoch(tiny_pu, tmp_path,
                                                                     teachers, finalists):
    cfg = selfpu(selection="final", selfpu={"teachers": teachers})
    trainer = Trainer(cfg, tiny_pu, tmp_path / "run")
    fit = trainer.fit()
    last = fit.history[-1]
    assert list(selection.finalist_models(trainer.run)) == finalists
    assert fit.best_epoch == cfg.epochs - 1
    assert fit.best_candidate == chosen_by_validation(last, finalists)
    assert fit.best_score == last[f"val/{fit.best_candidate}/pu_risk"]
    # the selected state is the finalist as it is at the end
    live = {n.name: n.module for n in selection.candidates(trainer.state.networks())}
    if fit.best_candidate == "average":
        expected = {"average": [{k: v.cpu() for k, v in m.state_dict().items()}
                                for m in live.values()]}
    else:
        expected = {"single": {k: v.cpu() for k, v in
                               live[fit.best_candidate].state_dict().items()}}
    assert_same_state(trainer.state.best["state"], expected)
    saved = torch.load(tmp_path / "run" / "best_model.pt", weights_only=False)
    assert saved["candidate"] == fit.best_candidate and saved["epoch"] == cfg.epochs - 1
    summary = json.loads((tmp_path / "run" / "selection.json").read_text())
    assert summary["selection"] == "final"
    assert summary["finalists"]["choice"] == fit.best_candidate
    assert summary["finalists"]["val_scores"] == {n: last[f"val/{n}/pu_risk"] for n in finalists}
    # the per-epoch rows still carry every validation score (the curves)
    assert all("val/student1/pu_risk" in row for row in fit.history)


@pytest.mark.parametrize("selection", ["best_epoch", "final"])
def test_final_rule_keeps_the_end_when_earlier_epochs_score_better(tiny_pu, selection,
                                                                     monkeypatch):
    """Validation scores that worsen with every evaluation: the best-epoch rule keeps the
    first epoch, the final rule the finalists after the last one."""
    from adni_pu.pu.run import RunView

    trainer = Trainer(selfpu(selection=selection), tiny_pu)
    original = RunView.val_scores
    calls = iter(range(10_000))

    def worsening(run, logits):
        scores = original(run, logits)
        scores["pu_risk"] += next(calls)
        return scores

    monkeypatch.setattr(RunView, "val_scores", worsening)
    fit = trainer.fit()
    if selection == "best_epoch":
        assert (fit.best_epoch, fit.best_candidate) == (0, "student1")
    else:
        assert fit.best_epoch == trainer.cfg.epochs - 1
        assert fit.best_candidate == trainer.state.final["choice"] == "teacher1"


def test_final_rule_for_a_single_model_is_the_last_epoch(tiny_pu):
    trainer = Trainer(tiny_config(method="nnpu", epochs=3, selection="final"), tiny_pu)
    fit = trainer.fit()
    assert (fit.best_epoch, fit.best_candidate) == (2, "model")
    assert trainer.state.final["val_scores"].keys() == {"model"}
    assert_same_state(trainer.state.best["state"], {"single": {
        k: v.cpu() for k, v in trainer.state.students[0].model.state_dict().items()}})


def test_best_epoch_rule_also_records_the_finalists(tiny_pu):
    trainer = Trainer(selfpu(), tiny_pu)
    trainer.fit()
    last = trainer.state.history[-1]
    scores = trainer.state.final["val_scores"]
    assert scores.keys() == {"teacher1", "teacher2", "average"}
    assert "val/average/pu_risk" not in last  # metrics.csv keeps its columns under this rule
    assert {n: scores[n] for n in ("teacher1", "teacher2")} == {
        n: last[f"val/{n}/pu_risk"] for n in ("teacher1", "teacher2")}
    average = selection.finalist_models(trainer.run)["average"]
    assert scores["average"] == pytest.approx(trainer.run.val_scores(
        trainer.predict_logits(average, tiny_pu.val))["pu_risk"], rel=1e-5)
    assert trainer.state.final["choice"] == min(scores, key=lambda n: (scores[n], n))
    # the best-epoch rule is unchanged: the best validation score over epochs and teachers
    rows = [(r[f"val/{r['selected/candidate']}/pu_risk"], r["epoch"]) for r in trainer.state.history]
    assert trainer.state.best["epoch"] == min(rows)[1]


EVERY_FIX = {"rest_risk": "band", "band_prior": "validation", "reweight": True,
             "reweight_risk": "mean-one", "meta_bn": "running"}


@pytest.mark.parametrize("selection, fixes", [
    ("best_epoch", {}), ("final", {}), ("final", EVERY_FIX)])
def test_no_decision_reads_the_test_split(tiny_pu, selection, fixes):
    """Same training and validation data, a test split of noise with flipped labels: every
    selection, every kept state and every validation value are the same, with the test
    diagnostic off or on (also with the meta step, the band risk measured on validation
    positives, mean-one weights, the meta step on running BatchNorm statistics and positive
    oversampling)."""
    scrambled = copy.copy(tiny_pu)
    test = copy.copy(tiny_pu.test)
    test.x = torch.randn_like(test.x) * 100
    test.truth = 1 - test.truth
    scrambled.test = test
    sp = {"teacher_average": "uniform", "teacher_bn": "recompute", **fixes}
    share = {"positive_share": 0.25} if fixes else {}
    runs = []
    for data, track in ((tiny_pu, False), (scrambled, False), (scrambled, True)):
        trainer = Trainer(selfpu(selection=selection, track_test=track, selfpu=sp, **share),
                          data)
        runs.append((trainer, trainer.fit()))
    (a, fa), *others = runs
    for b, fb in others:
        assert (fb.best_epoch, fb.best_candidate, fb.best_score) == (
            fa.best_epoch, fa.best_candidate, fa.best_score)
        assert_same_state(b.state.best["state"], a.state.best["state"])
        assert b.state.final == a.state.final
        for ra, rb in zip(fa.history, fb.history):
            val = {k: v for k, v in ra.items() if k.startswith(("val/", "selected/"))}
            assert val == {k: rb[k] for k in val}
    assert not any(k.startswith("test") for row in fa.history for k in row)
    assert any(k.startswith("test_diagnostic/") for k in runs[2][1].history[-1])


def _first_batchnorm_input(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    bn = next(m for m in model.modules() if isinstance(m, _BatchNorm))
    seen = []
    handle = bn.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    model.eval()
    with torch.no_grad():
        model(x)
    handle.remove()
    return seen[0]


def test_trainer_recomputes_teacher_batchnorm_on_the_training_entries(tiny_pu):
    sp = {"teacher_average": "uniform", "teacher_bn": "recompute"}
    trainer = Trainer(selfpu(eval_batch_size=4096, selfpu=sp), tiny_pu)
    trainer.fit()
    x = tiny_pu.train.x[torch.from_numpy(trainer.run.entries.base)]
    for st in trainer.state.students:
        hidden = _first_batchnorm_input(st.teacher.model, x)
        bn = next(m for m in st.teacher.model.modules() if isinstance(m, _BatchNorm))
        torch.testing.assert_close(bn.running_mean, hidden.mean(0))
        torch.testing.assert_close(bn.running_var, hidden.var(0))
        # the uniform average starts with phase 3 and takes every optimiser step
        steps = trainer.state.students[0].optimizer.state_dict()["state"][0]["step"]
        phase3 = trainer.cfg.epochs - SCHEDULE["self_paced_end"]
        assert st.teacher.steps == int(steps) * phase3 // trainer.cfg.epochs


def test_recompute_changes_the_teachers_against_averaged_statistics(tiny_pu):
    averaged = Trainer(selfpu(selfpu={"teacher_average": "uniform"}), tiny_pu)
    averaged.fit()
    recomputed = Trainer(selfpu(selfpu={"teacher_average": "uniform",
                                        "teacher_bn": "recompute"}), tiny_pu)
    recomputed.fit()
    bn_a, bn_r = (next(m for m in t.state.students[0].teacher.model.modules()
                       if isinstance(m, _BatchNorm)) for t in (averaged, recomputed))
    assert not torch.allclose(bn_a.running_var, bn_r.running_var)


def test_final_rule_and_recompute_resume_exactly(tiny_pu, tmp_path):
    from test_trainer import _interrupt_after

    cfg = selfpu(selection="final", selfpu={"teacher_average": "uniform",
                                            "teacher_bn": "recompute"})
    straight = Trainer(cfg, tiny_pu, tmp_path / "straight")
    straight.fit()
    interrupted = Trainer(cfg, tiny_pu, tmp_path / "resumed")
    _interrupt_after(interrupted, 4)  # inside phase 3, teachers recomputed once
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    resumed = Trainer(cfg, tiny_pu, tmp_path / "resumed")
    resumed.fit()
    assert resumed.state.start_epoch == 4
    for s1, s2 in zip(straight.state.students, resumed.state.students):
        assert_same_state(s1.teacher.model.state_dict(), s2.teacher.model.state_dict())
    assert (straight.state.best["epoch"], straight.state.best["candidate"]) == (
        resumed.state.best["epoch"], resumed.state.best["candidate"])
    assert_same_state(straight.state.best["state"], resumed.state.best["state"])
    assert straight.state.final == resumed.state.final
    # a run stopped after its last epoch but before the end of the fit selects the same
    again = Trainer(cfg, tiny_pu, tmp_path / "resumed")
    again.fit()
    assert again.state.best["candidate"] == straight.state.best["candidate"]


def test_selfpu_swa_preset():
    from adni_pu import config as cfgmod
    from adni_pu.pu.config import TrainConfig, preset_settings

    cfg = cfgmod.from_dict(TrainConfig, preset_settings("selfpu-swa"))
    assert (cfg.selfpu.teacher_average, cfg.selfpu.teacher_bn) == ("uniform", "recompute")
    assert cfg.selfpu.teachers and cfg.method == "selfpu"


def test_benchmark_result_carries_the_finalists_diagnostics(tmp_path, monkeypatch):
    from test_readers import write_mnist

    from adni_pu.data import readers
    from adni_pu.workflows.benchmark import BenchmarkSpec, run_seed
    from adni_pu.workflows.results_format import aggregate, markdown_table

    monkeypatch.setitem(readers.MNIST_COUNTS, "train", 200)
    monkeypatch.setitem(readers.MNIST_COUNTS, "test", 40)
    write_mnist(tmp_path / "mnist", n_train=200, n_test=40)
    spec = BenchmarkSpec("mnist", preset="selfpu-swa", seeds=[0], data_dir=tmp_path / "mnist",
                         out=tmp_path / "out", n_labelled=60,
                         settings={"epochs": 3, "progress": False, "device": "cpu",
                                   "batch_size": 64, "selfpu": {
                                       "warmup_epochs": 1, "self_paced_end": 2,
                                       "select_every": 1, "reweight": False}})
    result = run_seed(spec, 0)
    assert result["finalist_choice_diagnostic"] in ("teacher1", "teacher2", "average")
    accuracy = result["test_accuracy_finalists_diagnostic"]
    assert accuracy.keys() == result["finalists_val_score_diagnostic"].keys() == {
        "teacher1", "teacher2", "average"}
    assert all(0.0 <= a <= 1.0 for a in accuracy.values())
    assert result["test_accuracy_final_rule_diagnostic"] == accuracy[
        result["finalist_choice_diagnostic"]]
    summary = aggregate(spec, [result], "test")
    row = summary["results"]["selfpu-swa"]
    assert row["test_accuracy_final_rule_diagnostic"]["mean"] == pytest.approx(
        100 * result["test_accuracy_final_rule_diagnostic"])
    assert summary["per_seed"][0]["test_accuracy_finalists_diagnostic"] == accuracy
    assert np.isfinite(summary["results"]["selfpu-swa"]["test_accuracy"]["mean"])
    table = markdown_table(summary)
    assert "final-rule % (diagnostic)" in table
    assert (f"Model selected on the validation split by `{summary['settings']['val_criterion']}`"
            in table and f"rule `{summary['settings']['selection']}`." in table)
    assert f"{100 * result['test_accuracy_final_rule_diagnostic']:.2f} (one seed)" in table


def test_volume_run_recomputes_teacher_batchnorm_and_keeps_a_finalist(tmp_path):
    """The map-style (3-D volume) path: dict batches through the loader, un-augmented view."""
    from volume_helpers import make_volume_cohort, tiny_overrides

    from adni_pu.workflows.train import train_volumes
    from adni_pu.workflows.volume_settings import load_volume_config

    manifest = make_volume_cohort(tmp_path / "cohort")
    sp = ["train.selfpu.warmup_epochs=1", "train.selfpu.self_paced_end=2",
          "train.selfpu.select_every=1", "train.selfpu.teacher_rampup_epochs=1",
          "train.selfpu.rates=[0.6, 0.6]", 'train.selfpu.schedule="fixed"',
          'train.selection="final"']
    cfg = load_volume_config(None, tiny_overrides(3, tmp_path / "cache") + sp,
                             preset="selfpu-swa")
    fit = train_volumes(manifest, cfg, tmp_path / "run", log=lambda m: None)
    assert fit.best_epoch == 2 and fit.best_candidate in ("teacher1", "teacher2", "average")
    last = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=False)
    info = json.loads((tmp_path / "run" / "data.json").read_text())
    n_entries = info["n_labelled_entries"] + info["n_unlabelled_entries"]
    chunks = -(-n_entries // cfg.train.batch_size)
    for student in last["students"]:
        counters = [v for k, v in student["teacher"]["model"].items()
                    if k.endswith("num_batches_tracked")]
        # reset by the recompute, then one count per chunk of the pass (averaging copies the
        # student's counter, which counts every training batch)
        assert counters and all(int(c) == chunks for c in counters)


@pytest.mark.parametrize("method, preset, expected", [
    ("selfpu", None, "final"), ("nnpu", "sps-reweight", "final"), ("nnpu", None, "best_epoch"),
    ("upu", None, "best_epoch")])
def test_benchmark_protocol_uses_the_final_rule_for_selfpu_rows(method, preset, expected):
    from adni_pu.workflows.benchmark import BenchmarkSpec, resolve_config

    assert resolve_config(BenchmarkSpec("mnist", method, preset), 0).selection == expected
    spec = BenchmarkSpec("mnist", method, preset, overrides=['selection="best_epoch"'])
    assert resolve_config(spec, 0).selection == "best_epoch"  # the user's setting wins

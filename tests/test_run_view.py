"""The run as strategies, selection, checkpoint and recorders see it: one typed view, one
vocabulary of events, networks with roles."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest
from conftest import tiny_config

from adni_pu.pu import recorders, strategies
from adni_pu.pu.run import EVENTS, role_of, student_name, teacher_name
from adni_pu.pu.trainer import Trainer

PU = Path(__file__).resolve().parents[1] / "adni_pu" / "pu"
OLD_HOOKS = {"begin_fit", "open_epoch", "close_epoch", "end_fit", "before_epoch",
             "begin_training", "after_step", "after_epoch"}


def test_every_hook_is_named_from_the_one_vocabulary():
    recorder_hooks = {n for n, _ in inspect.getmembers(recorders.Recorder, inspect.isfunction)
                      if not n.startswith("_")}
    assert recorder_hooks <= set(EVENTS)
    for cls in (Trainer, strategies.Baseline, strategies.SelfPU, recorders.Recorder):
        assert not OLD_HOOKS & set(dir(cls)), cls
    assert {"fit_start", "epoch_start", "epoch_end", "fit_end"} <= set(dir(Trainer))
    assert {"epoch_start", "training_start", "step_end", "training_end"} <= set(
        dir(strategies.Baseline))


def test_no_parameter_in_pu_is_an_untyped_engine_or_trainer():
    pattern = re.compile(r"\b(engine|trainer|trainers|run)\s*:\s*(Any|list\[Any\])")
    for path in PU.glob("*.py"):
        assert not pattern.search(path.read_text()), path


def test_events_reach_strategy_and_recorders_in_order(tiny_pu, monkeypatch):
    calls: list[str] = []

    class Tape(recorders.Recorder):
        def fit_start(self, run) -> None:
            calls.append("fit_start")

        def epoch_end(self, run, row) -> None:
            calls.append("epoch_end")

        def fit_end(self, run) -> None:
            calls.append("fit_end")

    trainer = Trainer(tiny_config(method="nnpu", epochs=2), tiny_pu, log=lambda m: None,
                      recorders=[Tape()])
    for event in ("epoch_start", "training_start", "step_end", "training_end"):
        hook = getattr(trainer.strategy, event)

        def spy(*args, _hook=hook, _event=event):
            calls.append(_event)
            return _hook(*args)

        monkeypatch.setattr(trainer.strategy, event, spy)
    trainer.fit()
    # consecutive optimiser steps collapse to one entry
    collapsed = [c for i, c in enumerate(calls) if i == 0 or c != calls[i - 1]]
    epoch = ["epoch_start", "training_start", "step_end", "training_end", "epoch_end"]
    assert collapsed == ["fit_start", *epoch, *epoch, "fit_end"]


def test_the_view_is_frozen_and_the_state_is_the_trainers(tiny_pu):
    trainer = Trainer(tiny_config(method="nnpu", epochs=1), tiny_pu, log=lambda m: None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        trainer.run.prior = 0.9  # type: ignore[misc]
    trainer.fit()
    assert trainer.run.state is trainer.state
    assert len(trainer.state.history) == 1
    # one way to each fact: the run's through the view, the students' through the state
    assert not any(hasattr(trainer, name) for name in ("prior", "students", "history", "best"))


def test_names_and_roles():
    assert [student_name(k, 2) for k in range(2)] == ["student1", "student2"]
    assert student_name(0, 1) == "model"
    assert teacher_name("student2") == "teacher2" and teacher_name("model") == "teacher"
    assert [role_of(n) for n in ("model", "student1", "teacher2", "teacher", "average")] == [
        "model", "student", "teacher", "teacher", "average"]


def test_a_single_student_keeps_its_teacher_apart(tiny_pu):
    """One student with a mean teacher: both are evaluated under their own names, and the
    teacher (once it exists) is the candidate, chosen by its role."""
    cfg = tiny_config(method="selfpu", epochs=4, selfpu={
        "rates": [0.3], "warmup_epochs": 1, "self_paced_end": 2, "select_every": 1,
        "teacher_rampup_epochs": 1, "student_consistency": "none"})
    trainer = Trainer(cfg, tiny_pu, log=lambda m: None)
    fit = trainer.fit()
    assert [(n.name, n.role) for n in trainer.state.networks()] == [
        ("model", "model"), ("teacher", "teacher")]
    last = fit.history[-1]
    assert "val/model/pu_risk" in last and "val/teacher/pu_risk" in last
    assert last["val/model/pu_risk"] != last["val/teacher/pu_risk"]
    assert last["selected/candidate"] == "teacher"

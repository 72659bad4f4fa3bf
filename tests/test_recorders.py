"""The trainer is only the loop: what a fit writes comes from recorders called at its hooks."""

from __future__ import annotations

import time

import pytest
from conftest import tiny_config

from adni_pu.pu.recorders import (
    Recorder,
    nn_correction_summary,
    nn_correction_text,
    read_metrics_csv,
    run_folder_recorders,
    write_metrics_csv,
)
from adni_pu.pu.trainer import Trainer


class _Tape(Recorder):
    def __init__(self) -> None:
        self.calls: list[tuple[str, int | None]] = []

    def fit_start(self, run) -> None:
        self.calls.append(("start", None))

    def epoch_end(self, run, row) -> None:
        assert run.state.history[-1] is row  # the row is in the history when recorders see it
        self.calls.append(("epoch", row["epoch"]))

    def fit_end(self, run) -> None:
        self.calls.append(("end", None))


def test_recorders_are_called_at_fit_start_each_epoch_and_fit_end(tiny_pu, tmp_path):
    tape = _Tape()
    trainer = Trainer(tiny_config(method="nnpu", epochs=3), tiny_pu, tmp_path / "run",
                      log=lambda m: None, recorders=[tape])
    trainer.fit()
    assert tape.calls == [("start", None), ("epoch", 0), ("epoch", 1), ("epoch", 2),
                          ("end", None)]
    assert not (tmp_path / "run").exists()  # with no file recorders, the loop writes nothing


def test_a_fit_stopped_by_its_deadline_does_not_end(tiny_pu):
    tape = _Tape()
    trainer = Trainer(tiny_config(method="nnpu", epochs=50), tiny_pu, log=lambda m: None,
                      recorders=[tape])
    result = trainer.fit(deadline=time.monotonic())  # only the exempt first epoch runs
    assert not result.complete
    assert tape.calls == [("start", None), ("epoch", 0)]


def test_the_standard_recorders_write_the_run_folder(tiny_pu, tmp_path):
    run = tmp_path / "run"
    Trainer(tiny_config(method="nnpu", epochs=2), tiny_pu, run, log=lambda m: None).fit()
    for name in ("config.toml", "provenance.json", "data.json", "metrics.csv",
                 "checkpoints/last.pt", "best_model.pt", "selection.json", "curves.png"):
        assert (run / name).is_file(), name
    assert [type(r).__name__ for r in run_folder_recorders(None)] == ["EpochLog"]


def test_nn_correction_summary_reads_shares_per_phase_from_history_or_csv(tmp_path):
    history = [
        {"epoch": 0, "phase": 1, "train/student1/nn_correction": 0.0,
         "train/student2/nn_correction": 0.2},
        {"epoch": 1, "phase": 2, "train/student1/nn_correction": 0.5,
         "train/student2/nn_correction": 0.3},
        {"epoch": 2, "phase": 3, "train/student1/nn_correction": 1.0,
         "train/student2/nn_correction": 0.8},
    ]
    summary = nn_correction_summary(history)
    assert summary["share"] == pytest.approx((0.1 + 0.4 + 0.9) / 3)
    assert summary["by_phase"] == pytest.approx({"phase1": 0.1, "phase2": 0.4, "phase3": 0.9})
    assert summary["first_epoch"] == pytest.approx(0.1)
    assert summary["last_epoch"] == pytest.approx(0.9)
    assert summary["columns"] == ["train/student1/nn_correction", "train/student2/nn_correction"]
    write_metrics_csv(history, tmp_path / "metrics.csv")  # strings from the file: same numbers
    assert nn_correction_summary(read_metrics_csv(tmp_path / "metrics.csv")) == summary
    text = nn_correction_text(summary)
    assert "fired in 46.7 % of training batches over 3 epochs" in text
    assert "first epoch 10.0 %, last epoch 90.0 %" in text
    assert "by phase: phase1 10.0 %, phase2 40.0 %, phase3 90.0 %" in text
    assert "overfitting the unlabelled set" in text


def test_nn_correction_that_never_fired_or_does_not_exist_is_said_so():
    never = nn_correction_summary([{"phase": 1, "train/model/nn_correction": 0.0},
                                   {"phase": 1, "train/model/nn_correction": 0.0}])
    assert never["share"] == 0.0 and never["by_phase"] == {"phase1": 0.0}
    text = nn_correction_text(never)
    assert "never fired" in text and "uPU" in text and "by phase" not in text
    naive = nn_correction_summary([{"phase": 1, "train/model/loss": 0.3}])
    assert naive is None
    assert nn_correction_text(naive).startswith("Not applicable")


def test_validation_logits_are_written_per_epoch_only_when_asked(tiny_pu, tmp_path):
    import numpy as np

    from adni_pu.pu import checkpoint

    plain = tmp_path / "plain"
    Trainer(tiny_config(method="nnpu", epochs=2), tiny_pu, plain, log=lambda m: None).fit()
    assert not (plain / "val_logits").exists()
    run = tmp_path / "run"
    cfg = tiny_config(method="selfpu", epochs=4, record_val_logits=True,
                      selfpu={"warmup_epochs": 1, "self_paced_end": 2})
    trainer = Trainer(cfg, tiny_pu, run, log=lambda m: None)
    trainer.fit()
    split = np.load(run / "val_logits" / "split.npz")
    assert np.array_equal(split["labelled"], tiny_pu.val.labelled)
    assert np.array_equal(split["unlabelled"], tiny_pu.val.unlabelled_indices(tiny_pu.scheme))
    assert float(split["prior"]) == pytest.approx(trainer.run.prior)
    files = sorted(p.name for p in (run / "val_logits").glob("epoch-*.npz"))
    assert files == [f"epoch-{e:04d}.npz" for e in range(4)]
    last = np.load(run / "val_logits" / "epoch-0003.npz")
    assert sorted(last.files) == ["student1", "student2", "teacher1", "teacher2"]
    # the recorded logits are the ones the last epoch scored: its row's validation risk
    rows = read_metrics_csv(run / "metrics.csv")
    assert trainer.run.val_scores(last["teacher1"])["pu_risk"] == pytest.approx(
        float(rows[-1]["val/teacher1/pu_risk"]), abs=1e-6)
    assert sorted(np.load(run / "val_logits" / "epoch-0000.npz").files) == ["student1",
                                                                             "student2"]
    # recording does not change the training: a run resumes with the flag switched
    assert checkpoint.config_fingerprint(cfg) == checkpoint.config_fingerprint(
        tiny_config(method="selfpu", epochs=4, selfpu={"warmup_epochs": 1,
                                                       "self_paced_end": 2}))


def test_metrics_csv_appends_rows_and_rewrites_only_for_new_columns_or_a_new_fit(
        tmp_path, monkeypatch):
    from types import SimpleNamespace

    from adni_pu.pu import recorders

    whole: list[int] = []
    write = recorders.write_metrics_csv

    def counted(history, path):
        whole.append(len(history))
        return write(history, path)

    monkeypatch.setattr(recorders, "write_metrics_csv", counted)
    path = tmp_path / "run" / "metrics.csv"
    path.parent.mkdir()
    run = SimpleNamespace(is_main=True, state=SimpleNamespace(history=[]))
    rows = [{"epoch": 0, "phase": 1, "loss": 0.5}, {"epoch": 1, "phase": 1, "loss": 0.25},
            {"epoch": 2, "phase": 2, "loss": 0.125, "trusted": 7},
            {"epoch": 3, "phase": 3, "loss": 1 / 3}]

    def expected(history) -> str:
        write(history, tmp_path / "expected.csv")
        return (tmp_path / "expected.csv").read_text()

    recorder = recorders.MetricsCsv(path.parent)
    recorder.fit_start(run)
    for row in rows:
        run.state.history.append(row)
        recorder.epoch_end(run, row)
        assert path.read_text() == expected(run.state.history)
    assert whole == [1, 3]  # the first epoch and the one with a new column; the rest appended
    assert read_metrics_csv(path)[3] == {"epoch": "3", "phase": "3", "loss": str(1 / 3),
                                         "trusted": ""}

    # A resume from the checkpoint of epoch 1: the file has later rows and a torn one.
    with path.open("a") as handle:
        handle.write("4,3,0.1")
    run.state.history = rows[:2]
    resumed = recorders.MetricsCsv(path.parent)
    resumed.fit_start(run)
    row = {"epoch": 2, "phase": 2, "loss": 0.2, "trusted": 9}
    run.state.history = [*rows[:2], row]
    resumed.epoch_end(run, row)
    assert path.read_text() == expected(run.state.history)
    assert [r["epoch"] for r in read_metrics_csv(path)] == ["0", "1", "2"]


def test_curves_have_only_panels_with_data(tmp_path):
    from adni_pu.pu.plots import curve_panels, plot_training

    history = [{"epoch": e, "train/model/loss": 1.0 / (e + 1), "val/model/pu_risk": 0.5,
                "val/model/pn_accuracy": float("nan")} for e in range(3)]
    titles = [title for title, _ in curve_panels(history, "pu_risk")]
    assert titles == ["training loss", "validation pu_risk (selection criterion)"]
    assert plot_training(history, tmp_path, "pu_risk") == [tmp_path / "curves.png"]
    tracked = [{**row, "test_diagnostic/model/accuracy": 0.9} for row in history]
    assert [t for t, _ in curve_panels(tracked, "pu_risk")][-1] == \
        "accuracy (test: diagnostic only)"
    assert plot_training([{"epoch": 0}], tmp_path / "none", "pu_risk") == []


def test_a_resumed_run_names_every_machine_it_trained_on(tiny_pu, tmp_path, monkeypatch):
    import json

    from adni_pu import provenance

    run, cfg = tmp_path / "run", tiny_config(method="nnpu", epochs=4)
    monkeypatch.setattr(provenance, "machine_description", lambda: "GPU box")
    assert not Trainer(cfg, tiny_pu, run, log=lambda m: None).fit(
        deadline=time.monotonic()).complete  # one epoch, then paused
    monkeypatch.setattr(provenance, "machine_description", lambda: "CPU box")
    assert Trainer(cfg, tiny_pu, run, log=lambda m: None).fit().complete
    record = json.loads((run / "provenance.json").read_text())
    assert [(p["start_epoch"], p["machine"]) for p in record["pieces"]] == [
        (0, "GPU box"), (1, "CPU box")]
    assert record["machine"] == "CPU box"  # the top level is the latest piece, as before
    assert provenance.run_machines(run) == ["GPU box", "CPU box"]


def test_a_fresh_fit_starts_the_pieces_and_older_records_count_as_one_piece():
    from adni_pu.provenance import run_machines, run_provenance

    old = {"machine": "H200", "date": "2026-11-28", "command": "adni-pu benchmark"}
    pieces = run_provenance(old, 163)["pieces"]
    assert [(p["start_epoch"], p["machine"]) for p in pieces][0] == (None, "H200")
    assert len(pieces) == 2 and pieces[1]["start_epoch"] == 163
    assert len(run_provenance(old, 0)["pieces"]) == 1  # a run trained again from epoch 0
    later = {"pieces": [{"start_epoch": 0, "machine": "A"}, {"start_epoch": 5, "machine": "B"}]}
    assert [p["machine"] for p in run_provenance(later, 3)["pieces"][:-1]] == ["A"]
    assert run_machines(None) is None

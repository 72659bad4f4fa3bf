"""The trainer is only the loop: what a fit writes comes from recorders called at its hooks."""

from __future__ import annotations

import time

from conftest import tiny_config

from adni_pu.pu.recorders import Recorder, run_folder_recorders
from adni_pu.pu.trainer import Trainer


class _Tape(Recorder):
    def __init__(self) -> None:
        self.calls: list[tuple[str, int | None]] = []

    def fit_start(self, trainer) -> None:
        self.calls.append(("start", None))

    def epoch_end(self, trainer, row) -> None:
        assert trainer.history[-1] is row  # the row is in the history when recorders see it
        self.calls.append(("epoch", row["epoch"]))

    def fit_end(self, trainer) -> None:
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

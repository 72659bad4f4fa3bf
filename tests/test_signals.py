"""The one interrupt mechanism (adni_pu.signals): its exception, exit codes and line, and the
temporary files that a signal must never leave behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from adni_pu import fileio
from adni_pu.signals import (
    Interrupted,
    exit_code,
    interrupted_line,
    signal_of,
    stop_on_signals,
)


@pytest.mark.parametrize("sig, code, name", [(signal.SIGTERM, 143, "SIGTERM"),
                                             (signal.SIGINT, 130, "the user (Ctrl-C)")])
def test_a_signal_is_an_interrupt_with_its_exit_code_and_line(sig, code, name):
    with pytest.raises(Interrupted) as caught, stop_on_signals():
        os.kill(os.getpid(), sig)
    assert isinstance(caught.value, KeyboardInterrupt) and caught.value.exit_code == code
    wrapped = RuntimeError("a workflow's own")
    wrapped.__cause__ = caught.value
    assert signal_of(wrapped) == sig and exit_code(wrapped) == code
    assert interrupted_line(wrapped, "kept x") == f"interrupted by {name}; kept x"
    assert signal_of(KeyboardInterrupt()) == signal.SIGINT  # a plain Ctrl-C


def test_the_handlers_before_come_back_after_the_block():
    before = signal.getsignal(signal.SIGTERM)

    class Own(Interrupted):
        pass

    with pytest.raises(Own), stop_on_signals(), stop_on_signals(Own):  # the inner one wins
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before


def _signal_while_creating(monkeypatch):
    """SIGTERM arrives while the temporary file is being made (after it exists, before its
    name is returned): found by the contract suite, where it left `.last.pt.*.tmp`."""
    real = fileio.new_file_mode

    def mode() -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        return real()

    monkeypatch.setattr(fileio, "new_file_mode", mode)


def test_a_signal_while_the_temporary_file_is_made_leaves_no_file(tmp_path, monkeypatch):
    _signal_while_creating(monkeypatch)
    with pytest.raises(Interrupted), stop_on_signals():
        fileio.atomic_write_text(tmp_path / "a.txt", "text")
    with pytest.raises(Interrupted), stop_on_signals():
        fileio.write_temporary(tmp_path / "b.bin", b"data")
    assert list(tmp_path.iterdir()) == []


def test_a_signal_while_the_stage_is_made_leaves_no_folder(tmp_path: Path, monkeypatch):
    real = fileio.tempfile.mkdtemp

    def mkdtemp(**kwargs) -> str:
        made = real(**kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # the folder exists, its name not yet known
        return made

    monkeypatch.setattr(fileio.tempfile, "mkdtemp", mkdtemp)
    with pytest.raises(Interrupted), stop_on_signals(), fileio.staged_folder(tmp_path, "x"):
        pass
    assert list(tmp_path.iterdir()) == []

"""Ctrl-C and SIGTERM: the one interrupt mechanism of every command and workflow.

:func:`stop_on_signals` turns SIGINT (Ctrl-C) and SIGTERM into :class:`Interrupted`, a
``KeyboardInterrupt`` carrying the signal, so every ``except KeyboardInterrupt`` /
``finally`` clean-up runs for both (a SIGTERM otherwise ends Python with no clean-up at all,
leaving temporary files). The CLI installs it around every command
(:class:`adni_pu.cli.app._App`); a workflow that must say what it kept (preprocessing, synth)
installs it with its own subclass, whose ``hint`` the CLI prints. Every interrupt ends in
one line, :func:`interrupted_line` (``interrupted by SIGTERM; <hint>``), and exit status
:func:`exit_code` (128 + the signal: 130 for Ctrl-C, 143 for SIGTERM).

Light: imports nothing of adni_pu, so any layer can use it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

#: The signals that stop a command: each raises :class:`Interrupted`.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C) or SIGTERM stopped a command; ``signum`` says which and ``hint``
    (when given) what is kept and how to go on. A ``KeyboardInterrupt``, not an error of
    :mod:`adni_pu.errors`, so clean-ups written for Ctrl-C run for both signals."""

    def __init__(self, signum: int, hint: str | None = None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)
        self.hint = hint

    @property
    def exit_code(self) -> int:
        """The shell's convention: 128 + the signal number (130 Ctrl-C, 143 SIGTERM)."""
        return 128 + self.signum

    def __str__(self) -> str:
        return interrupted_line(self, self.hint or "run the command again")


@contextlib.contextmanager
def _handling(handler: Any) -> Iterator[None]:
    """``handler`` for SIGINT and SIGTERM while the block runs; the previous handlers are
    restored after (main thread only: the callers check)."""
    old = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


@contextlib.contextmanager
def stop_on_signals(raise_as: type[Interrupted] = Interrupted) -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM raise ``raise_as(signum)`` (an
    :class:`Interrupted`).

    After the first signal both are ignored until the block ends, so a second Ctrl-C cannot
    break the clean-up; the previous handlers are restored on exit (an outer block's, e.g.
    the CLI's, take over again). Outside the main thread (signals cannot be caught there)
    the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise raise_as(signum)

    with _handling(handler):
        yield


@contextlib.contextmanager
def holding_off_signals() -> Iterator[None]:
    """Ignore SIGINT and SIGTERM while the block runs (a clean-up that must finish); the
    previous handlers are restored after. Main thread only, as :func:`stop_on_signals`."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with _handling(signal.SIG_IGN):
        yield


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold back SIGINT and SIGTERM while the block runs (a commit of a few renames, the
    creation of a temporary file and the recording of its name), so an interrupt never
    stops it half-way; the first signal that came is raised again when it ends (to the
    handlers of before). Main thread only.

    The handlers are swapped for one that notes the signal, not the signal mask: a mask is
    per thread, and a process with other threads (torch's, a test runner's) would take the
    signal on one of those, running the handler in the main thread at once.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []

    def note(signum: int, frame: Any) -> None:
        came.append(signum)

    with _handling(note):
        yield
    if came:
        signal.raise_signal(came[0])


def signal_of(exc: BaseException) -> int:
    """The signal behind an interrupt: the ``signum`` of ``exc`` or of an exception it wraps
    (a workflow's own interrupt may be raised from the signal's), else SIGINT (a plain
    ``KeyboardInterrupt`` is Ctrl-C)."""
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, "signum", None) is not None:
            return int(seen.signum)  # type: ignore[attr-defined]
        seen = seen.__cause__ or seen.__context__
    return int(signal.SIGINT)


def signal_label(signum: int) -> str:
    """How the line names a signal: ``the user (Ctrl-C)`` for SIGINT, else its name."""
    return "the user (Ctrl-C)" if signum == signal.SIGINT else signal.Signals(signum).name


def exit_code(exc: BaseException) -> int:
    """The exit status of an interrupted command: 128 + its signal (:func:`signal_of`)."""
    return 128 + signal_of(exc)


def interrupted_line(exc: BaseException, hint: str) -> str:
    """The one line of an interrupted command: which signal came, then ``hint``."""
    return f"interrupted by {signal_label(signal_of(exc))}; {hint}"

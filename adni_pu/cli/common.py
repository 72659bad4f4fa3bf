"""Small pieces shared by the CLI modules (light: no heavy imports)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

# the --set example of the commands that take volume-training settings (train, demo)
SETS_EXAMPLE = "train.epochs=20 --set prior=0.45"


def check_device(value: str) -> str:
    """``--device``'s check, before the command starts: a name that is not a device, or
    CUDA on a machine without it, is one line (:class:`adni_pu.errors.DeviceError`)."""
    if value not in ("auto", "cpu"):
        from adni_pu.pu.device_data import resolve_device  # torch: only for a real check

        resolve_device(value, "--device")
    return value


Device = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N",
                                     callback=check_device)]


def sets_option(example: str) -> Any:
    """The ``--set KEY=VALUE`` option (repeatable); ``example`` completes its help."""
    return Annotated[Optional[list[str]], typer.Option(  # noqa: UP045 - typer needs Optional
        "--set", metavar="KEY=VALUE", show_default="none",
        help=f"override a setting (repeatable), e.g. --set {example}")]


def deprecated_path(flag: str, name: str) -> Any:
    """A hidden ``flag`` option: the old spelling of the positional path ``name``."""
    return Annotated[Optional[Path], typer.Option(  # noqa: UP045 - typer needs Optional
        flag, hidden=True, help=f"deprecated spelling of {name}")]


def positional_path(value: Path | None, deprecated: Path | None, name: str, flag: str) -> Path:
    """The path given as positional ``name``, or through its deprecated option ``flag``.

    Commands once took some of their main paths as required options (``train --manifest M
    --out RUN``); that spelling still works, with a warning on stderr, and giving both
    spellings with different values is refused.
    """
    if deprecated is not None:
        if value is not None and value != deprecated:
            typer.echo(f"error: {name} given twice, as {value} and as {flag} {deprecated}; "
                       "give it once, as the positional argument", err=True)
            raise typer.Exit(2)
        typer.echo(f"warning: {flag} is deprecated; give {name} as a positional argument",
                   err=True)
        return deprecated
    if value is None:
        typer.echo(f"error: missing argument {name} (see --help)", err=True)
        raise typer.Exit(2)
    return value


# --------------------------------------------------------------------------- interrupts
class Interrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C) or SIGTERM stopped a command; ``signum`` says which. A
    ``KeyboardInterrupt`` (not an error of :mod:`adni_pu.errors`), so every ``except
    KeyboardInterrupt`` / ``finally`` clean-up runs for both signals; :func:`interrupted_exit`
    prints one line naming the signal and exits with 128 + ``signum``."""

    def __init__(self, signum: int, hint: str | None = None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.hint = hint


#: The signals that stop a command: each raises :class:`Interrupted`.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While a command runs, SIGINT (Ctrl-C) and SIGTERM raise
    :class:`Interrupted` carrying the signal: the one mechanism of every
    command, so each ``except KeyboardInterrupt`` / ``finally`` clean-up runs for both (a
    SIGTERM otherwise ends Python with no clean-up at all, leaving temporary files).

    After the first signal both are ignored until the block ends, so a second Ctrl-C cannot
    break the clean-up; the previous handlers are restored on exit. Outside the main thread
    (signals cannot be caught there) the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signum)

    old = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def signal_name(exc: BaseException) -> tuple[int, str]:
    """The signal behind an interrupt (SIGINT for a plain ``KeyboardInterrupt``) and how
    the line names it: ``the user (Ctrl-C)`` or ``SIGTERM``."""
    seen: BaseException | None = exc
    signum = int(signal.SIGINT)
    while seen is not None:  # a command's own interrupt may wrap the signal's
        if getattr(seen, "signum", None) is not None:
            signum = int(seen.signum)  # type: ignore[attr-defined]
            break
        seen = seen.__cause__ or seen.__context__
    if signum == signal.SIGINT:
        return signum, "the user (Ctrl-C)"
    return signum, signal.Signals(signum).name


def interrupted_exit(exc: BaseException, hint: str) -> typer.Exit:
    """Print the one line of an interrupted command (which signal came, then ``hint``: what
    is kept and how to go on) and return the exit to raise: 128 + the signal's number
    (130 for Ctrl-C, 143 for SIGTERM), the shell's convention."""
    signum, name = signal_name(exc)
    typer.echo(f"\ninterrupted by {name}; {hint}", err=True)
    return typer.Exit(128 + signum)

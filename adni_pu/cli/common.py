"""Small pieces shared by the CLI modules (light: no heavy imports)."""

from __future__ import annotations

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
def interrupted_exit(exc: BaseException, hint: str) -> typer.Exit:
    """Print the one line of an interrupted command (:func:`adni_pu.signals.interrupted_line`:
    which signal came, then ``hint``: what is kept and how to go on) and return the exit to
    raise: 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM), the shell's
    convention. The mechanism itself is :mod:`adni_pu.signals`."""
    from adni_pu.signals import exit_code, interrupted_line

    typer.echo(f"\n{interrupted_line(exc, hint)}", err=True)
    return typer.Exit(exit_code(exc))

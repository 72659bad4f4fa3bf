"""The Typer application behind the ``adni-pu`` console script.

Each verb lives in its own module with a ``register(app)`` function; heavy libraries
(torch, monai, ants) are imported inside the commands so ``adni-pu --help`` answers at once.

Conventions of every command (docs/interfaces.md, "Command line"):

- The paths a command must be given (what it reads, then what it writes) are positional
  arguments; every other setting, and every path with a default, is an ``--option``.
- Every option's help shows its default. Yes/no settings are flags (``--x/--no-x``).
- Help text is plain (no Rich markup), so ``[train]`` or ``<date>`` print as written.
- Errors: every library error a user can cause derives from :class:`adni_pu.errors.AdniPuError`;
  :class:`_App` catches that base once, prints ``error: <message>`` and exits with status 2.
  So it does with an ``OSError`` that names a path (a read-only folder, a full disk).
  Anything else is a bug and shows its traceback.
"""

from __future__ import annotations

import importlib
from typing import Annotated

import typer
from typer.core import TyperGroup

from adni_pu.errors import AdniPuError  # light: the error family imports nothing


class _App(TyperGroup):
    """The top-level command group: turns an :class:`AdniPuError` into one line and exit 2."""

    def invoke(self, ctx: typer.Context) -> object:
        try:
            return super().invoke(ctx)
        except AdniPuError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        except OSError as exc:
            if exc.filename is None:  # not about a path the user named: a bug, shown whole
                raise
            # a file the system refused (read-only, full disk, gone): the user's to fix
            typer.echo(f"error: {exc.filename}: {exc.strerror or exc}", err=True)
            raise typer.Exit(2) from exc


app = typer.Typer(
    cls=_App,
    name="adni-pu",
    help="Positive-unlabelled (Self-PU) learning for Alzheimer's disease from T1 MRI.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},
)

_VERBS: tuple[str, ...] = ("benchmark", "preprocess", "qc", "cohort", "train", "evaluate",
                           "predict", "demo")


def package_version() -> str:
    """The installed ``adni-pu`` version (package metadata), or a note when not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("adni-pu")
    except PackageNotFoundError:
        return "unknown (not installed; run `pip install -e .`)"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"adni-pu {package_version()}")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: Annotated[bool, typer.Option(
        "--version", callback=_show_version, is_eager=True,
        help="Print the adni-pu version and exit.")] = False,
) -> None:
    """Positive-unlabelled (Self-PU) learning for Alzheimer's disease from T1 MRI."""


for _name in _VERBS:
    importlib.import_module(f"adni_pu.cli.{_name}").register(app)


def main() -> None:
    """Console-script entry point."""
    app()

"""The Typer application behind the ``adni-pu`` console script.

Each verb lives in its own module with a ``register(app)`` function; heavy libraries
(torch, monai, ants) are imported inside the commands so ``adni-pu --help`` answers at once.

Conventions of every command (docs/interfaces.md, "Command line"):

- The paths a command must be given (what it reads, then what it writes) are positional
  arguments; every other setting, and every path with a default, is an ``--option``.
- Every option's help shows its default. Yes/no settings are flags (``--x/--no-x``).
- Help text is plain (no Rich markup), so ``[train]`` or ``<date>`` print as written.
- Errors: every library error a user can cause derives from :class:`adni_pu.errors.AdniPuError`;
  :class:`_App` catches that base once, prints ``error: <message>`` and exits with status 2;
  so it does with a usage error (a bad option value, a missing argument: click's own).
  So it does with an ``OSError`` that names a path (a read-only folder, a full disk), or
  that names none but is a full disk or a failing device. Ctrl-C and SIGTERM
  (:func:`adni_pu.signals.stop_on_signals`) print one line naming the signal, what is
  kept and how to continue, and exit 130 / 143. Anything else is a bug and shows its
  traceback.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
from collections.abc import Iterator
from typing import Annotated, TextIO

import typer
from typer.core import TyperGroup

from adni_pu.errors import AdniPuError, AdniPuWarning  # light: the family imports nothing

#: Errors of the system, not of adni-pu, that may come without a file name (a write deep
#: inside a library): one line too, since no traceback helps with a full disk.
_SYSTEM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG})

#: click's usage error (a bad option value, an unknown option, a missing argument), as the
#: click typer runs on defines it (typer may bundle its own copy of click).
_USAGE_ERROR: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")

#: What Ctrl-C or SIGTERM leaves behind, by command (one that gives no hint of its own).
_INTERRUPTED = {
    "train": "the run folder keeps the checkpoint of its last finished epoch; run the same "
             "command again to resume from it",
    "benchmark": "seeds with a result.json are kept and the current seed's checkpoint of its "
                 "last finished epoch; run the same command again to continue",
    "demo": "the stages already finished are kept; run the same command again to continue "
            "from them",
    "preprocess": "scans already finished are kept; run the same command again to process "
                  "the rest",
    "prior": "the classifier keeps the checkpoint of its last finished epoch; run the same "
             "command again to resume from it",
    "interpret": "the output folder holds what it held before (this run's maps are written "
                 "aside and only put in place once all are done); run the command again",
}
_INTERRUPTED_DEFAULT = ("every file is written whole or not at all, so nothing is left "
                        "half-written; run the command again")


@contextlib.contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """While a command runs, adni-pu's own warnings (:class:`AdniPuWarning`, e.g. a
    manifest's repaired split name) print as one line ``warning: <message>`` on stderr,
    not in Python's format with a source path; other warnings print as before."""
    import warnings

    before = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        if issubclass(category, AdniPuWarning):
            typer.echo(f"warning: {message}", err=True)
        else:
            before(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = before


class _App(TyperGroup):
    """The top-level command group: turns an :class:`AdniPuError`, an ``OSError`` about a
    file or a full disk, and Ctrl-C or SIGTERM into one line (exit 2; 130 / 143)."""

    def invoke(self, ctx: typer.Context) -> object:
        from adni_pu.cli.common import interrupted_exit
        from adni_pu.signals import stop_on_signals

        try:
            with _warnings_as_lines(), stop_on_signals():
                return super().invoke(ctx)
        except AdniPuError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        except _USAGE_ERROR as exc:  # a bad value, a missing argument: one line too
            if type(exc).__name__ == "NoArgsIsHelpError":
                raise  # no arguments: the help, as click shows it
            where = exc.ctx.command_path if exc.ctx is not None else ctx.command_path
            typer.echo(f"error: {exc.format_message()} (see {where} --help)", err=True)
            raise typer.Exit(2) from exc
        except OSError as exc:
            if exc.filename is not None:
                # a file the system refused (read-only, full disk, gone): the user's to fix
                typer.echo(f"error: {exc.filename}: {exc.strerror or exc}", err=True)
            elif exc.errno in _SYSTEM_ERRNOS:
                typer.echo(f"error: a write failed: {exc.strerror or exc} (errno "
                           f"{errno.errorcode.get(exc.errno, exc.errno)}); free some space "
                           "or choose another output folder, then run the command again",
                           err=True)
            else:  # not about a path the user named: a bug, shown whole
                raise
            raise typer.Exit(2) from exc
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: what is kept, how to go on
            hint = getattr(exc, "hint", None) or _INTERRUPTED.get(
                ctx.invoked_subcommand or "", _INTERRUPTED_DEFAULT)
            raise interrupted_exit(exc, hint) from None


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

_VERBS: tuple[str, ...] = ("benchmark", "preprocess", "qc", "cohort", "prior", "train", "evaluate",
                           "predict", "interpret", "demo", "synth")


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

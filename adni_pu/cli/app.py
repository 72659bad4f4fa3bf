"""The Typer application behind the ``adni-pu`` console script.

Each verb lives in its own module with a ``register(app)`` function; heavy libraries
(torch, monai, ants) are imported inside the commands so ``adni-pu --help`` answers at once.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="adni-pu",
    help="Positive-unlabelled (Self-PU) learning for Alzheimer's disease from T1 MRI.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_VERBS: tuple[str, ...] = ("benchmark", "preprocess", "cohort", "volumes")

for _name in _VERBS:
    importlib.import_module(f"adni_pu.cli.{_name}").register(app)


def main() -> None:
    """Console-script entry point."""
    app()

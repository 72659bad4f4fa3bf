"""``adni-pu demo``: thin wrapper around :func:`adni_pu.workflows.demo.run_demo`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from adni_pu.cli.common import SETS_EXAMPLE, sets_option
from adni_pu.workflows.demo import DemoSettings  # light: no torch, MONAI or ITK at import

Sets = sets_option(SETS_EXAMPLE)

_DEMO = DemoSettings()


def demo(
    subjects: Annotated[int, typer.Option(help="synthetic subjects")] = _DEMO.subjects,
    out: Annotated[Path, typer.Option(help="output folder")] = _DEMO.out,
    preprocessing: Annotated[str, typer.Option(
        help="real (the adni-pu preprocess pipeline) or ideal (the generator's perfect "
             "model-grid volumes; a fallback that skips preprocessing)")] = _DEMO.preprocessing,
    epochs: Annotated[int, typer.Option(
        help="training epochs per run (a method on a fold)")] = _DEMO.epochs,
    methods: Annotated[str, typer.Option(help="comma-separated training presets")
                       ] = ",".join(_DEMO.methods),
    folds: Annotated[int, typer.Option(
        help="cross-validation folds: every subject is scored once, by the fold that holds "
             "it out")] = _DEMO.folds,
    seed: Annotated[int, typer.Option(help="seed of the cohort and the training")] = _DEMO.seed,
    workers: Annotated[int, typer.Option(help="preprocessing processes")] = _DEMO.workers,
    threads: Annotated[int, typer.Option(help="torch threads for training")] = _DEMO.threads,
    prior: Annotated[str, typer.Option(
        help="class prior of the PU methods per fold: cohort (the positive share of the "
             "fold's training subjects with a truth) or estimate (from the fold's PU data "
             "alone, as without amyloid PET; the report shows it beside the truth)")
    ] = _DEMO.prior,
    set_: Sets = None,
) -> None:
    """Synthetic cohort -> preprocess -> cohort -> train Self-PU and baselines -> report."""
    from adni_pu.workflows.demo import run_demo

    settings = DemoSettings(subjects=subjects, out=out, preprocessing=preprocessing,
                            epochs=epochs, methods=tuple(m.strip() for m in
                                                         methods.split(",") if m.strip()),
                            folds=folds, seed=seed, workers=workers, threads=threads,
                            overrides=tuple(set_ or []), prior=prior)
    report = run_demo(settings, log=lambda m: typer.echo(m, err=True))
    typer.echo(f"report: {report}")


def register(app: typer.Typer) -> None:
    """Add ``demo`` to the main app."""
    app.command("demo")(demo)

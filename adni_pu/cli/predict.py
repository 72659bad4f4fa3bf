"""``adni-pu predict``: thin wrapper around :func:`adni_pu.workflows.predict.predict_scans`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from adni_pu.cli.common import Device


def predict(
    run: Annotated[Path, typer.Argument(metavar="RUN",
                                        help="run folder written by `adni-pu train`")],
    scans: Annotated[list[Path], typer.Argument(
        metavar="SCAN",
        help="NIfTI scans: model-grid volumes are used as they are, raw T1 scans are "
             "preprocessed first with the run's recorded settings")],
    out: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        show_default="none: printed only", help="write the table as CSV")] = None,
    work_dir: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        show_default="RUN/predictions/preprocessed",
        help="where raw scans are preprocessed")] = None,
    device: Device = "auto",
) -> None:
    """Per-scan probability of the run's positive class (the class its cohort defines,
    e.g. for the ``paper`` preset "a positive clinical diagnosis or amyloid SUVR >= 1.08",
    not amyloid status alone) from the run's selected model.

    A scan that cannot be scored (missing, unreadable, failed preprocessing, or refused by
    the model-grid input check: not one 3D grid volume, NaN/inf voxels, constant) gets one
    line with its reason and no probability; the others are still scored, and the exit
    status is 1.
    """
    from adni_pu.workflows.predict import positive_class, predict_scans

    table = predict_scans(run, scans, out, work_dir, device)
    what = positive_class(run)
    typer.echo("positive class: " + (f"{what} (the run's cohort)" if what else
                                     "as the run's manifest labels it (no cohort settings "
                                     "beside the manifest say more)"))
    failed = table["prediction"] == ""
    for row, bad in zip(table.itertuples(), failed):
        if bad:
            typer.echo(f"{row.scan}\t-\t{row.status}: {row.error}")
        else:
            typer.echo(f"{row.scan}\t{row.probability:.4f}\t{row.prediction}\t({row.status})")
    if out is not None:
        typer.echo(f"predictions: {out}")
    if failed.any():
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``predict`` to the main app."""
    app.command("predict")(predict)

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
    method: Annotated[Optional[str], typer.Option(  # noqa: UP045
        show_default="none: RUN is a run folder",
        help="RUN is a comparison folder (`adni-pu benchmark cohort`): average this "
             "method's fold models")] = None,
    seed: Annotated[Optional[int], typer.Option(  # noqa: UP045
        show_default="every seed's fold models", help="with --method: one seed's")] = None,
) -> None:
    """Per-scan probability of the run's positive class (the class its cohort defines,
    e.g. for the ``paper`` preset "a positive clinical diagnosis or amyloid SUVR >= 1.08",
    not amyloid status alone) from the run's selected model (or, on a comparison folder
    with --method, the mean over the method's fold models and its spread).

    A scan that cannot be scored (missing, unreadable, failed preprocessing, or refused by
    the model-grid input check: not one 3D grid volume, NaN/inf voxels, constant) gets one
    line with its reason and no probability; the others are still scored, and the exit
    status is 1.
    """
    from adni_pu.workflows.compare.ensemble import is_comparison
    from adni_pu.workflows.predict import positive_class, predict_scans

    if method is not None or seed is not None or is_comparison(run):
        _ensemble(run, scans, method, seed, out, device)
        return
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


def _ensemble(run: Path, scans: list[Path], method: str | None, seed: int | None,
              out: Path | None, device: str) -> None:
    """``predict`` on a comparison folder: the fold models of ``method`` together."""
    from adni_pu.errors import ConfigError
    from adni_pu.workflows.compare.ensemble import ensemble_predict, fold_models, is_comparison
    from adni_pu.workflows.predict import positive_class

    if not is_comparison(run) or method is None:
        raise ConfigError(f"{run}: --method and --seed need a comparison folder, and a "
                          "comparison folder needs --method (whose fold models predict)")
    table = ensemble_predict(run, scans, method, seed, out, device)
    what = positive_class(fold_models(run, method, seed)[0])
    typer.echo("positive class: " + (f"{what} (the cohort's)" if what else "as the "
                                     "comparison's manifest labels it"))
    for row in table.itertuples():
        if row.prediction == "":
            typer.echo(f"{row.scan}\t-\t{row.status}: {row.error}")
        else:
            typer.echo(f"{row.scan}\t{row.probability:.4f}\t{row.prediction}\t(spread "
                       f"{row.spread_std:.4f} sd, {row.spread_min:.4f}-{row.spread_max:.4f} over "
                       f"{row.n_models} fold models)")
    if out is not None:
        typer.echo(f"predictions: {out}")
    if (table["prediction"] == "").any():
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``predict`` to the main app."""
    app.command("predict")(predict)

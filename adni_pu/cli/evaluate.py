"""``adni-pu evaluate``: thin wrapper around :func:`adni_pu.workflows.evaluate.evaluate_run`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from adni_pu.cli.common import Device


def evaluate(
    run: Annotated[Path, typer.Argument(metavar="RUN",
                                        help="run folder written by `adni-pu train`")],
    split: Annotated[str, typer.Option(
        help="manifest split to evaluate; the run's training and validation subjects are "
             "refused")] = "test",
    manifest: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        show_default="the one the run was trained on", help="another manifest")] = None,
    bootstrap: Annotated[Optional[int], typer.Option(  # noqa: UP045
        show_default="the run's setting, 1000", help="bootstrap resamples")] = None,
    out: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        show_default="RUN/evaluation/<split>; RUN/evaluation/<manifest>-<sha8>/<split> for "
                     "another manifest", help="output folder")] = None,
    device: Device = "auto",
    method: Annotated[Optional[str], typer.Option(  # noqa: UP045
        show_default="none", help="RUN is a comparison folder: this method's piece")] = None,
    fold: Annotated[Optional[int], typer.Option(  # noqa: UP045
        show_default="none", help="with --method: the piece's fold")] = None,
    seed: Annotated[Optional[int], typer.Option(  # noqa: UP045
        show_default="0 with one seed", help="with --method: the piece's seed")] = None,
) -> None:
    """Accuracy, balanced accuracy, AUC, sensitivity, specificity, hidden-positive recall and
    AUC, and the all-negative / all-positive accuracies, with 95 % CIs; ROC plot."""
    from adni_pu.pu.metrics import format_ci
    from adni_pu.workflows.compare.ensemble import resolve_run
    from adni_pu.workflows.evaluate import REPORT_METRICS, evaluate_run

    run = resolve_run(run, method, fold, seed)  # a comparison folder's piece: a run folder
    result = evaluate_run(run, split, manifest, device=device, n_boot=bootstrap, out=out)
    for warning in result["warnings"]:
        typer.echo(f"warning: {warning}", err=True)
    typer.echo(f"{split}: {result['n_subjects']} subjects, {result['n_scans']} scans "
               f"({result['n_subjects_unknown_truth']} subjects without truth left out)")
    typer.echo(f"{'metric':24s} {'per scan':28s} per subject")
    for m in REPORT_METRICS:
        typer.echo(f"{m:24s} {format_ci(result['scan_level'][m]):28s} "
                   f"{format_ci(result['subject_level'][m])}")
    typer.echo(f"hidden positives scored: {result['n_hidden_positive_subjects']} subject(s) "
               "(unlabelled, positive by the truth)")
    from adni_pu.pu.recorders import nn_correction_text

    if result["nn_correction"] != {"recorded": False}:
        typer.echo("nnPU correction: "
                   + nn_correction_text(result["nn_correction"], result.get("method")))
    typer.echo(f"report: {result['files']['report']}")


def register(app: typer.Typer) -> None:
    """Add ``evaluate`` to the main app."""
    app.command("evaluate")(evaluate)

"""``adni-pu train``: thin wrapper around :func:`adni_pu.workflows.train.train_volumes`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from adni_pu.cli.common import SETS_EXAMPLE, deprecated_path, positional_path, sets_option

Sets = sets_option(SETS_EXAMPLE)


def train(
    manifest: Annotated[Optional[Path], typer.Argument(  # noqa: UP045
        metavar="MANIFEST", show_default=False,
        help="cohort manifest (CSV/Parquet) or cohort folder from `adni-pu cohort build` "
             "(required)")] = None,
    run: Annotated[Optional[Path], typer.Argument(  # noqa: UP045
        metavar="RUN", show_default=False,
        help="run folder to write; rerun the same command to resume (required)")] = None,
    config: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        show_default="none",
        help="TOML settings (sections [train] and [data]; e.g. RUN/volume_config.toml)")] = None,
    preset: Annotated[Optional[str], typer.Option(  # noqa: UP045
        show_default="the file's or --set preset, else selfpu",
        help="training preset: naive, upu, nnpu, selfpu or an ablation row; "
             "see `adni-pu presets`")] = None,
    set_: Sets = None,
    manifest_opt: deprecated_path("--manifest", "MANIFEST") = None,
    out_opt: deprecated_path("--out", "RUN") = None,
) -> None:
    """Train on the manifest's train split, select on val; write the run folder RUN."""
    from adni_pu.workflows.train import train_volumes
    from adni_pu.workflows.volume_settings import load_volume_config

    manifest = positional_path(manifest, manifest_opt, "MANIFEST", "--manifest")
    out = positional_path(run, out_opt, "RUN", "--out")
    cfg = load_volume_config(config, set_ or [], preset)
    fit = train_volumes(manifest, cfg, out)
    import os

    if os.environ.get("RANK", "0") != "0":  # under torchrun only rank 0 reports
        return
    typer.echo(f"selected: {fit.best_candidate} after epoch {fit.best_epoch + 1} "
               f"({cfg.train.val_criterion} {fit.best_score:.4f})")
    from adni_pu.pu.recorders import nn_correction_summary, nn_correction_text

    typer.echo("nnPU correction: " + nn_correction_text(nn_correction_summary(fit.history),
                                                        cfg.train.method))
    typer.echo(f"run folder: {out}")


def register(app: typer.Typer) -> None:
    """Add ``train`` to the main app."""
    app.command("train")(train)

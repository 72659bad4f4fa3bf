"""``adni-pu prior``: thin wrapper around
:func:`adni_pu.workflows.prior.estimate_manifest_prior`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from adni_pu.cli.common import SETS_EXAMPLE, sets_option

Sets = sets_option(SETS_EXAMPLE)


def prior(
    manifest: Annotated[Path, typer.Argument(
        metavar="MANIFEST", show_default=False,
        help="cohort manifest (CSV/Parquet) or cohort folder from `adni-pu cohort build`")],
    out: Annotated[Path, typer.Argument(
        metavar="OUT", show_default=False,
        help="folder for the P-vs-U classifier's run and prior_estimate.json; rerun the "
             "same command to resume")],
    config: Annotated[Path | None, typer.Option(
        show_default="none",
        help="TOML settings of the run the prior is for (sections [train] and [data]); "
             "the classifier uses its network and data settings")] = None,
    set_: Sets = None,
) -> None:
    """Estimate the class prior of a cohort from its positive and unlabelled scans alone
    (no PET truth): a P-vs-U classifier on the train split, best-bin estimation on val."""
    from adni_pu.errors import VolumeRunError
    from adni_pu.workflows.class_prior import collapse_reason, estimate_line
    from adni_pu.workflows.prior import estimate_manifest_prior
    from adni_pu.workflows.volume_settings import load_volume_config

    cfg = load_volume_config(config, set_ or [], "naive")
    record = estimate_manifest_prior(manifest, cfg, out)
    if collapse_reason(record) is not None:  # recorded, but no number to train with
        raise VolumeRunError(f"{estimate_line(record)} (record: {out / 'prior_estimate.json'}"
                             "); set the prior with --set prior=VALUE, or give the "
                             "validation split more subjects")
    typer.echo(estimate_line(record))
    typer.echo(f"use it: adni-pu train MANIFEST RUN --set prior={record['value']:.4f}  "
               "(or --set prior='\"estimate\"' to estimate it inside the run)")
    typer.echo(f"record: {out / 'prior_estimate.json'}")


def register(app: typer.Typer) -> None:
    """Add ``prior`` to the main app."""
    app.command("prior")(prior)

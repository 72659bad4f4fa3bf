"""``adni-pu qc``: thin wrapper around :func:`adni_pu.preprocessing.contact_sheet`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def qc(
    output: Annotated[Path, typer.Argument(
        metavar="OUTPUT", help="A folder written by adni-pu preprocess.")],
    out_png: Annotated[Optional[Path], typer.Option(  # noqa: UP045 - typer needs Optional
        "--out", show_default="OUTPUT/qc_contact_sheet.png", help="Contact sheet PNG path.")
    ] = None,
    z_threshold: Annotated[float, typer.Option(
        "--z", help="Robust z-score that marks an outlier.")] = 3.5,
) -> None:
    """Contact sheet of all QC pictures, outliers first; prints the outliers."""
    from adni_pu.preprocessing import contact_sheet

    png, outliers = contact_sheet(output, out_png, z_threshold)
    typer.echo(f"contact sheet: {png}")
    typer.echo(f"{len(outliers)} outlier(s)")
    for r in outliers:
        typer.echo(f"  {r.get('scan_label')} [{r.get('status')}]: {r['outlier_reason']}")


def register(app: typer.Typer) -> None:
    """Add ``qc`` to the main app."""
    app.command("qc")(qc)

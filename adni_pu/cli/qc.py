"""``adni-pu qc``: the visual QC report of a preprocessing folder (and its ratings).

Thin wrapper around :func:`adni_pu.preprocessing.qc_report.write_report`, the ratings
functions of :mod:`adni_pu.preprocessing.qc_ratings` and, for small folders,
:func:`adni_pu.preprocessing.contact_sheet`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def qc(
    output: Annotated[Path, typer.Argument(
        metavar="OUTPUT", help="A folder written by adni-pu preprocess.")],
    ratings: Annotated[Optional[Path], typer.Option(  # noqa: UP045 - typer needs Optional
        "--ratings", show_default="none", metavar="TSV",
        help="qc_ratings.tsv to resume from: the report starts with its ratings.")] = None,
    merge: Annotated[Optional[list[Path]], typer.Option(  # noqa: UP045
        "--merge", show_default="none", metavar="TSV",
        help="Two raters' qc_ratings.tsv (give --merge twice): writes "
             "OUTPUT/qc/qc_ratings_merged.tsv (disagreements rated unsure) and "
             "qc_disagreements.tsv, lists the disagreements, and starts the report from the "
             "merged ratings.")] = None,
    sheet: Annotated[bool, typer.Option(
        "--sheet", help="Also write the PNG contact sheet (for small folders).")] = False,
    out_png: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "--out", show_default="OUTPUT/qc_contact_sheet.png",
        help="Contact sheet PNG path (implies --sheet).")] = None,
    z_threshold: Annotated[float, typer.Option(
        "--z", help="Robust z-score that marks an outlier.")] = 3.5,
) -> None:
    """Write OUTPUT/qc/index.html (every scan: metrics, pictures, ratings); prints outliers."""
    from adni_pu.errors import ConfigError
    from adni_pu.locking import output_lock
    from adni_pu.preprocessing.qc_group import check_preprocess_folder

    if merge and len(merge) != 2:
        raise ConfigError(f"--merge: expected two ratings files (--merge A.tsv --merge B.tsv), "
                          f"found {len(merge)}")
    if merge and ratings:
        raise ConfigError("--ratings and --merge: give one (the report starts from the merged "
                          "ratings)")
    check_preprocess_folder(output)
    if out_png is not None:  # a file qc did not write is refused before anything is written
        from adni_pu.outputs import claim_file
        from adni_pu.preprocessing.qc_group import is_contact_sheet

        claim_file(out_png, "qc", is_contact_sheet, "contact sheet PNG")
    with output_lock(output, "qc"):  # one writer per folder; write_report's own lock nests
        _report(output, ratings, merge, sheet or out_png is not None, out_png, z_threshold)


def _report(output: Path, ratings: Path | None, merge: list[Path] | None, sheet: bool,
            out_png: Path | None, z_threshold: float) -> None:
    """The report (started from ``ratings`` or the merge of ``merge``), the contact sheet
    when asked for, and the outliers printed."""
    from adni_pu.preprocessing.qc_ratings import read_ratings
    from adni_pu.preprocessing.qc_report import REPORT_DIR, known_scan_ids, write_report

    start = None
    if ratings or merge:
        known = known_scan_ids(output)
        if ratings:
            start = read_ratings(ratings, known)
            typer.echo(f"resuming from {ratings}: {len(start)} rating(s)")
        else:
            start = _merge(output / REPORT_DIR, *(read_ratings(p, known) for p in merge or []))
    page, ranked = write_report(output, start, z_threshold)
    typer.echo(f"QC report: {page}  (open it in a browser; keys: ? for help)")
    if sheet:
        from adni_pu.preprocessing import contact_sheet

        png, _ = contact_sheet(output, out_png, z_threshold)
        typer.echo(f"contact sheet: {png}")
    outliers = [r for r in ranked if r["outlier_score"] > z_threshold]
    typer.echo(f"{len(outliers)} outlier(s)")
    for r in outliers:
        typer.echo(f"  {r.get('scan_label')} [{r.get('status')}]: {r['outlier_reason']}")


def _merge(folder: Path, first: dict, second: dict) -> dict:
    """Write the merged ratings and the disagreements into ``folder``; returns the merged
    ratings (scan id -> Rating) for the report."""
    from adni_pu.fileio import atomic_write_text
    from adni_pu.preprocessing.qc_ratings import (
        disagreements_text,
        merge_ratings,
        write_ratings,
    )
    from adni_pu.preprocessing.qc_report import DISAGREEMENTS, MERGED_RATINGS

    merged, disagreements = merge_ratings(first, second)
    path, copy = write_ratings(folder / MERGED_RATINGS, merged)
    if copy:
        typer.echo(f"kept the earlier {path.name} as {copy.name}")
    table = atomic_write_text(folder / DISAGREEMENTS, disagreements_text(disagreements))
    typer.echo(f"merged {len(merged)} rating(s): {path}")
    typer.echo(f"{len(disagreements)} disagreement(s) (rated unsure in the merged file; "
               f"{table}):")
    for d in disagreements:
        typer.echo(f"  {d.scan_id}: {d.first.rater or '?'} {d.first.rating}, "
                   f"{d.second.rater or '?'} {d.second.rating}")
    return {r.scan_id: r for r in merged}


def register(app: typer.Typer) -> None:
    """Add ``qc`` to the main app."""
    app.command("qc")(qc)

"""``adni-pu preprocess``: thin wrapper around :func:`adni_pu.preprocessing.run_preprocessing`.

Nothing heavy is imported at module level so ``adni-pu --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from adni_pu.cli.common import sets_option


def next_steps(output: Path) -> str:
    """What to run after ``preprocess``: look at the QC, then build the cohort (paths
    quoted for the shell, so a line pasted back works whatever the path holds)."""
    from shlex import quote

    return (f"next: adni-pu qc {quote(str(output))}   (QC report {output / 'qc' / 'index.html'}: "
            "look at and rate every scan)\n"
            f"      adni-pu cohort build ADNIMERGE.csv {quote(str(output / 'summary.csv'))} "
            "COHORT_DIR [--qc-ratings qc_ratings.tsv]")


def preprocess(
    input: Annotated[Optional[Path], typer.Argument(  # noqa: UP045
        metavar="INPUT", show_default=False,
        help="BIDS folder, ADNI download (ADNI/PTID/series/date_time/"
        "image ID/), folder of NIfTI files or DICOM series, CSV (subject, session, path), "
        "or one NIfTI file (required).")] = None,
    output: Annotated[Optional[Path], typer.Argument(  # noqa: UP045
        metavar="OUTPUT", show_default=False,
        help="Output folder: a BIDS derivatives dataset (layout: docs/interfaces.md) "
             "(required).")] = None,
    config: Annotated[Optional[Path], typer.Option(  # noqa: UP045 - typer needs Optional
        show_default="none", help="Settings TOML file.")] = None,
    workers: Annotated[Optional[int], typer.Option(  # noqa: UP045
        show_default="runner.workers, 1", help="Parallel scans (processes).")] = None,
    threads: Annotated[Optional[int], typer.Option(  # noqa: UP045
        show_default="runner.threads_per_worker, 1", help="Threads per worker.")] = None,
    shard: Annotated[Optional[str], typer.Option(  # noqa: UP045
        show_default="all scans", help="Process share i/N of the scans.")] = None,
    dask_scheduler: Annotated[Optional[str], typer.Option(  # noqa: UP045
        show_default="none: local processes",
        help="Dask distributed scheduler address (tcp://host:port).")] = None,
    set_: sets_option("skullstrip.method=template") = None,
    progress: Annotated[Optional[bool], typer.Option(  # noqa: UP045
        "--progress/--no-progress", show_default="runner.progress, on",
        help="Show a progress bar.")] = None,
    convert_layout: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "--convert-layout", metavar="OUTPUT", show_default="none",
        help="Instead of preprocessing: rename the files of an OUTPUT folder written by an "
             "earlier adni-pu to BIDS derivatives names, in place (give no INPUT).")] = None,
) -> None:
    """Preprocess T1 scans: N4, skull strip, MNI registration, cerebellum removal, QC."""
    from adni_pu.cli.common import positional_path
    from adni_pu.preprocessing import load_config, run_preprocessing

    if convert_layout is not None:
        if input is not None or output is not None:
            typer.echo("error: --convert-layout OUTPUT takes no INPUT or OUTPUT argument; "
                       "convert first, then run adni-pu preprocess INPUT OUTPUT", err=True)
            raise typer.Exit(2)
        _convert(convert_layout)
        return
    input = positional_path(input, None, "INPUT", "")
    output = positional_path(output, None, "OUTPUT", "")
    cfg = load_config(config, list(set_ or []))
    # Ctrl-C / SIGTERM: PreprocessInterrupted, whose hint the app prints (adni_pu.signals)
    summary = run_preprocessing(
        input, output, cfg, workers=workers, threads_per_worker=threads, shard=shard,
        dask_scheduler=dask_scheduler, progress=progress)
    counts = summary["status"].value_counts().to_dict()
    typer.echo(f"{len(summary)} scans: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    for row in summary.itertuples():
        if row.status in ("failed", "failed-qc"):
            typer.echo(f"  {row.status}: sub-{row.subject_id} ses-{row.session_id}: {row.error}")
        elif str(getattr(row, "note", "")).startswith(("redone", "reused")):
            typer.echo(f"  {row.status}: sub-{row.subject_id} ses-{row.session_id}: {row.note}")
    notes = summary["note"] if "note" in summary.columns else summary["status"].iloc[:0]
    kept = notes.astype(str).str.startswith("kept from an earlier run")
    if kept.any():
        unusable = summary.loc[kept, "status"].isin(["stale", "missing"]).sum()
        typer.echo(f"  {int(kept.sum())} row(s) kept from earlier runs into this folder "
                   f"({int(unusable)} stale or missing: see their note)")
    typer.echo(f"summary: {summary.attrs.get('summary_path', output / 'summary.csv')}")
    if counts.get("done", 0) or counts.get("skipped", 0):  # usable volumes exist
        typer.echo(next_steps(output))
    if counts.get("failed", 0) or counts.get("failed-qc", 0):
        raise typer.Exit(1)


def _convert(folder: Path) -> None:
    """``--convert-layout``: rename in place, then say what changed and what to redo."""
    from shlex import quote

    from adni_pu.preprocessing.legacy_layout import convert_layout

    done = convert_layout(folder)
    if done.temporaries:
        typer.echo(f"removed {done.temporaries} temporary file(s) left by a stopped run")
    if not done.scans and not done.finished:
        typer.echo(f"{folder}: already in BIDS derivatives names; nothing to convert")
        return
    if done.finished:
        typer.echo(f"finished a conversion of {folder} that was stopped before its end")
    if done.scans:
        typer.echo(f"converted {done.scans} scan(s) in {folder} to BIDS derivatives names "
                   f"({done.files} files renamed; nothing processed again)")
    for path in done.summaries:
        typer.echo(f"  {path.name}: preprocessed_path now names the converted volumes")
    if done.summaries:
        typer.echo("  cohorts built from this folder before name the old files: build them "
                   f"again (adni-pu cohort build ADNIMERGE.csv "
                   f"{quote(str(folder / 'summary.csv'))} COHORT_DIR)")


def register(app: typer.Typer) -> None:
    """Add ``preprocess`` to the main app."""
    app.command("preprocess")(preprocess)

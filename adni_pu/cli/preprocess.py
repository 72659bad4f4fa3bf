"""``adni-pu preprocess`` and ``adni-pu qc``: thin wrappers around adni_pu.preprocessing.

Nothing heavy is imported at module level so ``adni-pu --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import typer


def next_steps(output: Path) -> str:
    """What to run after ``preprocess``: look at the QC, then build the cohort."""
    return (f"next: adni-pu qc {output}   (contact sheet of the QC pictures, outliers first)\n"
            f"      adni-pu cohort build ADNIMERGE.csv {output / 'summary.csv'} COHORT_DIR")


def register(app: typer.Typer) -> None:
    """Add the ``preprocess`` and ``qc`` commands to ``app``."""

    @app.command("preprocess")
    def preprocess(
        input: Path = typer.Argument(
            ..., metavar="INPUT", help="BIDS folder, ADNI download (ADNI/PTID/series/date_time/"
            "image ID/), folder of NIfTI files or DICOM series, CSV (subject, session, path), "
            "or one NIfTI file."),
        output: Path = typer.Argument(..., metavar="OUTPUT",
                                      help="Output folder (layout: docs/interfaces.md)."),
        config: Path | None = typer.Option(None, "--config", show_default="none",
                                           help="Settings TOML file."),
        workers: int | None = typer.Option(None, "--workers", show_default="runner.workers, 1",
                                           help="Parallel scans (processes)."),
        threads: int | None = typer.Option(
            None, "--threads", show_default="runner.threads_per_worker, 1",
            help="Threads per worker."),
        shard: str | None = typer.Option(None, "--shard", show_default="all scans",
                                         help="Process share i/N of the scans."),
        dask_scheduler: str | None = typer.Option(
            None, "--dask-scheduler", show_default="none: local processes",
            help="Dask distributed scheduler address (tcp://host:port)."),
        set_: list[str] = typer.Option(
            [], "--set", metavar="KEY=VALUE", show_default="none",
            help="Override a setting (repeatable), e.g. --set skullstrip.method=template."),
        progress: bool | None = typer.Option(
            None, "--progress/--no-progress", show_default="runner.progress, on",
            help="Show a progress bar."),
    ) -> None:
        """Preprocess T1 scans: N4, skull strip, MNI registration, cerebellum removal, QC."""
        from adni_pu.preprocessing import load_config, run_preprocessing
        from adni_pu.preprocessing.runner import PreprocessInterrupted

        try:
            cfg = load_config(config, list(set_))
            summary = run_preprocessing(
                input, output, cfg, workers=workers, threads_per_worker=threads, shard=shard,
                dask_scheduler=dask_scheduler, progress=progress)
        except PreprocessInterrupted as stop:
            typer.echo(f"error: {stop}", err=True)
            raise typer.Exit(stop.exit_code) from None
        counts = summary["status"].value_counts().to_dict()
        typer.echo(f"{len(summary)} scans: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
        for row in summary.itertuples():
            if row.status in ("failed", "failed-qc"):
                typer.echo(f"  {row.status}: sub-{row.subject_id} ses-{row.session_id}: {row.error}")
        typer.echo(f"summary: {summary.attrs.get('summary_path', output / 'summary.csv')}")
        if counts.get("done", 0) or counts.get("skipped", 0):  # usable volumes exist
            typer.echo(next_steps(output))
        if counts.get("failed", 0) or counts.get("failed-qc", 0):
            raise typer.Exit(1)

    @app.command("qc")
    def qc(
        output: Path = typer.Argument(..., metavar="OUTPUT",
                                      help="A folder written by adni-pu preprocess."),
        out_png: Path | None = typer.Option(None, "--out",
                                            show_default="OUTPUT/qc_contact_sheet.png",
                                            help="Contact sheet PNG path."),
        z_threshold: float = typer.Option(3.5, "--z", help="Robust z-score that marks an outlier."),
    ) -> None:
        """Contact sheet of all QC pictures, outliers first; prints the outliers."""
        from adni_pu.preprocessing import contact_sheet

        png, outliers = contact_sheet(output, out_png, z_threshold)
        typer.echo(f"contact sheet: {png}")
        typer.echo(f"{len(outliers)} outlier(s)")
        for r in outliers:
            typer.echo(f"  {r.get('scan_label')} [{r.get('status')}]: {r['outlier_reason']}")

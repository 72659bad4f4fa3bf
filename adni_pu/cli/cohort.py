"""``adni-pu cohort build|report``: clinical tables -> labelled, split manifest and report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from adni_pu.cli.common import deprecated_path, positional_path, sets_option

cohort_app = typer.Typer(help="Build the PU-labelled, subject-split cohort manifest.",
                         no_args_is_help=True)


@cohort_app.command("build")
def build(
    clinical: Annotated[Optional[Path], typer.Argument(  # noqa: UP045
        metavar="CLINICAL", show_default=False,
        help="ADNIMERGE(_<date>).csv or a generic clinical table (see clinical_columns) "
             "(required)")] = None,
    scans: Annotated[Optional[Path], typer.Argument(  # noqa: UP045
        metavar="SCANS", show_default=False,
        help="preprocessing summary.csv or a table subject,session,path[,date] (required)")
    ] = None,
    out: Annotated[Optional[Path], typer.Argument(  # noqa: UP045
        metavar="OUT", show_default=False, help="output folder (required)")] = None,
    config: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        show_default="none", help="TOML settings file")] = None,
    preset: Annotated[Optional[str], typer.Option(  # noqa: UP045
        show_default="the file's or --set preset, else paper",
        help="paper, published-code, tracer-cutoffs or centiloid")] = None,
    amyloid: Annotated[Optional[list[Path]], typer.Option(  # noqa: UP045
        show_default="none", metavar="TABLE",
        help="amyloid table, repeatable: UC Berkeley UCBERKELEY_AMY_6MM_<date>.csv, "
             "UCBERKELEYAV45/FBB_<date>.csv, or subject,date,tracer,suvr (e.g. SUVRs from "
             "PET images); used before the clinical table's AV45/FBB/PIB "
             "(amyloid.precedence)")] = None,
    qc_ratings: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "--qc-ratings", show_default="none", metavar="TSV",
        help="qc_ratings.tsv saved from the QC report (adni-pu qc): scans rated fail are "
             "left out and listed in excluded.csv with the note; unsure and pass are kept")
    ] = None,
    set_: sets_option("matching.amyloid_window_days=180") = None,
    clinical_opt: deprecated_path("--clinical", "CLINICAL") = None,
    scans_opt: deprecated_path("--scans", "SCANS") = None,
    out_opt: deprecated_path("--out", "OUT") = None,
) -> None:
    """Match scans to visits and amyloid measures, label subjects, split them, write OUT."""
    from adni_pu.cohort import build_cohort, load_cohort_config, write_cohort
    from adni_pu.cohort.files import check_out_dir

    clinical = positional_path(clinical, clinical_opt, "CLINICAL", "--clinical")
    scans = positional_path(scans, scans_opt, "SCANS", "--scans")
    out = positional_path(out, out_opt, "OUT", "--out")
    check_out_dir(out)
    cfg = load_cohort_config(config, set_ or [], preset)
    cohort = build_cohort(clinical, scans, cfg, amyloid=list(amyloid or []),
                          qc_ratings=qc_ratings)
    paths = write_cohort(cohort, out, inputs={"settings file": config})
    from adni_pu.cohort import counts_table
    from adni_pu.cohort.report import pu_task_lines

    for issue in cohort.quality:
        if issue.kind == "amyloid_without_qc":  # rows used unchecked: say so on stderr too
            typer.echo(f"warning: {issue.table}: {issue.count} {issue.message}; "
                       f"{issue.action}", err=True)
    table = counts_table(cohort.manifest)
    typer.echo(table.to_string(index=False))
    for line in pu_task_lines(cohort.manifest):
        typer.echo(line.strip("*"), err=line.startswith("**"))
    _echo_issues(cohort.quality, paths)
    typer.echo(f"manifest: {paths['manifest']}")
    typer.echo(f"report: {paths['report']}")
    from shlex import quote  # a pasted-back path with a space or quote still works

    typer.echo(f"next: read {paths['report'].name}, then adni-pu train "
               f"{quote(str(paths['manifest']))} runs/selfpu")


#: How many data-quality issues `cohort build` prints (the rest are in the report).
SHOWN_ISSUES = 5


def _echo_issues(quality, paths: dict[str, Path]) -> None:
    """Print the most severe data-quality issues, each on one line, and where the rest are."""
    if not len(quality):
        typer.echo("no data-quality issue found")
        return
    rank = {"error": 0, "warning": 1, "info": 2}
    issues = sorted(quality, key=lambda i: (rank.get(i.severity, 3), -i.count))
    typer.echo(f"{len(issues)} data-quality issue(s), most severe first:")
    for issue in issues[:SHOWN_ISSUES]:
        example = f" (e.g. {issue.examples[0]})" if issue.examples else ""
        typer.echo(f"  {issue.severity} {issue.kind}: {issue.count} {issue.message} in "
                   f"{issue.table}; {issue.action}{example}")
    more = len(issues) - SHOWN_ISSUES
    typer.echo(("  ... and " + str(more) + " more; all" if more > 0 else "  all")
               + f" with examples in {paths['quality']} and {paths['report']}")


@cohort_app.command("report")
def report(
    manifest: Annotated[Path, typer.Argument(
        metavar="MANIFEST", help="manifest.csv/.parquet or a cohort folder")],
    out: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        show_default="beside the manifest", help="folder for the report")] = None,
) -> None:
    """Re-render the cohort report (counts, class prior, SUVR histogram, data quality)."""
    from adni_pu.cohort import report_from_path

    paths = report_from_path(manifest, out)
    typer.echo(f"report: {paths['report']}")


@cohort_app.command("presets")
def presets() -> None:
    """List the label presets."""
    from adni_pu.cohort.config import PRESET_DESCRIPTIONS

    for name, text in PRESET_DESCRIPTIONS.items():
        typer.echo(f"{name:16s} {text}")


def register(app: typer.Typer) -> None:
    """Add the ``cohort`` sub-app to the main app."""
    app.add_typer(cohort_app, name="cohort")

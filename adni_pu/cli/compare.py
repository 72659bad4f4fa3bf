"""``adni-pu benchmark cohort``: every method on the same subject folds and seeds of a cohort,
pooled and paired; ``adni-pu benchmark cohort-report``: the report from finished pieces."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from adni_pu.cli.common import sets_option


def _pairs(texts: list[str] | None) -> list[tuple[str, str]] | None:
    if not texts:
        return None
    out = []
    for text in texts:
        parts = text.split(",")
        if len(parts) != 2 or not all(parts):
            raise typer.BadParameter(f"{text!r}: expected A,B (two methods)",
                                     param_hint="--pair")
        out.append((parts[0], parts[1]))
    return out


def _part(piece: list[str] | None, report_only: bool) -> str | None:
    """The lock part of a process that takes some pieces (several such processes share
    OUT: each holds its folder lock shared and its part's exclusive); None: the whole
    comparison, or its report, alone in OUT."""
    if not piece or report_only:
        return None
    return "pieces-" + "-".join("".join(c if c.isalnum() else "_" for c in p) for p in piece)


def _prior(text: str) -> float | str:
    if text in ("cohort", "estimate"):
        return text
    try:
        return float(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r}: expected a number in (0, 1), 'cohort' or "
                                 "'estimate'", param_hint="--prior") from None


def cohort(
    manifest: Annotated[Path, typer.Argument(metavar="MANIFEST", show_default=False,
                                             help="cohort manifest (`adni-pu cohort build`)")],
    out: Annotated[Path, typer.Argument(metavar="OUT", show_default=False,
                                        help="comparison folder (resumable)")],
    methods: Annotated[str, typer.Option(
        help="comma-separated: naive, upu, nnpu, selfpu, vpu, nnpu-estimated (nnPU with "
             "the prior estimated from the PU data)")] = "naive,nnpu,selfpu",
    folds: Annotated[Optional[int], typer.Option(  # noqa: UP045
        show_default="5", help="cross-validation folds K (by subject)")] = None,
    seeds: Annotated[int, typer.Option(help="training seeds S per fold")] = 1,
    fold_seed: Annotated[int, typer.Option(help="seed of the fold assignment")] = 0,
    first_seed: Annotated[int, typer.Option(
        help="the first training seed (the seeds are FIRST_SEED to FIRST_SEED+SEEDS-1)")] = 0,
    test_size: Annotated[Optional[int], typer.Option(  # noqa: UP045
        show_default="none", help="hold out this many subjects as a fixed test set")] = None,
    keep_test: Annotated[bool, typer.Option(
        help="the manifest's split=test subjects are the fixed test set")] = False,
    holdout: Annotated[Optional[int], typer.Option(  # noqa: UP045
        show_default="none", metavar="N",
        help="repeated hold-out instead of folds: each seed its own split by subject, N "
             "held out (the split `cohort build` makes with that seed)")] = None,
    val_fraction: Annotated[Optional[float], typer.Option(  # noqa: UP045
        show_default="0.15", help="with --holdout: the share of all subjects that "
                                  "validates")] = None,
    prior: Annotated[str, typer.Option(
        metavar="NUMBER|cohort|estimate",
        help="class prior per fold, resolved as `adni-pu train` does")] = "cohort",
    config: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        show_default="none", help="TOML settings file for every piece")] = None,
    set_: sets_option("train.epochs=30") = None,
    piece: Annotated[Optional[list[str]], typer.Option(  # noqa: UP045
        show_default="all", metavar="i/N|i",
        help="take only these pieces: i/N (every N-th from the i-th, e.g. a Slurm array "
             "task's $SLURM_ARRAY_TASK_ID/N) or piece numbers; repeatable")] = None,
    report_only: Annotated[bool, typer.Option(
        help="train nothing: the report from the finished pieces")] = False,
    pair: Annotated[Optional[list[str]], typer.Option(  # noqa: UP045
        show_default="every PU method - naive, selfpu - nnpu", metavar="A,B",
        help="paired difference A minus B (repeatable)")] = None,
    bootstrap: Annotated[int, typer.Option(help="bootstrap resamples of the CIs")] = 1000,
) -> None:
    """Which method on my cohort: every method x fold x seed trained (each a resumable piece,
    a run folder), held-out predictions pooled, metrics with CIs and paired differences."""
    from adni_pu.errors import ConfigError
    from adni_pu.locking import output_lock
    from adni_pu.workflows.compare.pieces import CompareSpec, prepare, run_comparison
    from adni_pu.workflows.compare.report import write_report

    tic = time.perf_counter()
    if holdout is not None and folds is not None:
        raise ConfigError(f"--holdout {holdout} and --folds {folds}: choose one (a split per "
                          "seed, or K folds)")
    spec = CompareSpec(manifest=str(manifest), out=str(out),
                       methods=tuple(m.strip() for m in methods.split(",") if m.strip()),
                       folds=(1 if holdout is not None else 5) if folds is None else folds,
                       seeds=seeds, fold_seed=fold_seed,
                       first_seed=first_seed, test_size=test_size,
                       keep_test=keep_test, prior=_prior(prior),
                       config_file=str(config) if config is not None else None,
                       overrides=tuple(set_ or []), holdout=holdout,
                       val_fraction=val_fraction)
    pairs = _pairs(pair)
    with output_lock(out, "benchmark cohort", part=_part(piece, report_only)):
        if report_only:
            prepare(spec, piece)  # the same checks: the folder must hold this comparison
        else:
            counts = run_comparison(spec, piece, log=lambda m: typer.echo(m, err=True))
            wall = time.perf_counter() - tic
            typer.echo(f"pieces: {counts['trained']} trained, {counts['finished_before']} finished "
                       f"before, {counts['held_elsewhere']} held by another process "
                       f"({counts['pieces']} taken); {wall:.1f} s, of which training "
                       f"{counts['train_seconds']:.1f} s")
        command = "adni-pu benchmark cohort " + " ".join(
            [str(manifest), str(out), f"--methods {methods}",
             f"--holdout {holdout}" if holdout is not None else f"--folds {spec.folds}",
             f"--seeds {seeds}"] + ([f"--first-seed {first_seed}"] if first_seed else [])
            + ([f"--val-fraction {val_fraction}"] if val_fraction is not None else [])
            + ([f"--prior {prior}"] if prior != "cohort" else [])
            + [f"--config {config}"] * (config is not None)
            + [f"--set {s}" for s in set_ or []])
        if piece and not report_only:
            from adni_pu.workflows.compare.report import collect

            left = collect(spec)[2]
            if left:  # the other pieces are other processes'; the last one writes the report
                typer.echo(f"{len(left)} pieces of the comparison left (e.g. {left[0]}); once "
                           f"they are done: adni-pu benchmark cohort-report {out}")
                return
        path = write_report(out, pairs, bootstrap, command)
        typer.echo(f"report: {path}")


def cohort_report(
    out: Annotated[Path, typer.Argument(metavar="OUT", show_default=False,
                                        help="comparison folder")],
    pair: Annotated[Optional[list[str]], typer.Option(  # noqa: UP045
        show_default="every PU method - naive, selfpu - nnpu", metavar="A,B",
        help="paired difference A minus B (repeatable)")] = None,
    bootstrap: Annotated[int, typer.Option(help="bootstrap resamples of the CIs")] = 1000,
) -> None:
    """The comparison's report from its finished pieces (after a cluster's array job)."""
    from adni_pu.locking import output_lock
    from adni_pu.workflows.compare.report import write_report

    pairs = _pairs(pair)
    with output_lock(out, "benchmark cohort-report"):  # not while pieces are being trained
        command = " ".join([f"adni-pu benchmark cohort-report {out}",
                            *(f"--pair {p}" for p in pair or []),
                            *([f"--bootstrap {bootstrap}"] if bootstrap != 1000 else [])])
        path = write_report(out, pairs, bootstrap, command)
    typer.echo(f"report: {path}")

"""``adni-pu train|evaluate|predict|demo``: Self-PU and the baselines on MRI volumes.

Thin wrappers around :mod:`adni_pu.volume_run` (and :mod:`adni_pu.demo`); nothing heavy is
imported at module level so ``adni-pu --help`` answers at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from adni_pu.cli.common import positional_path, sets_option
from adni_pu.demo import DemoSettings  # light: no torch, MONAI or ITK at import

Sets = sets_option("train.epochs=20 --set prior=0.45")
Device = Annotated[str, typer.Option(help="auto, cpu or cuda")]


def _fail(exc: BaseException, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(code)


def _known_errors() -> tuple[type[BaseException], ...]:
    from adni_pu.cohort import CohortInputError, LeakageError
    from adni_pu.config import ConfigError
    from adni_pu.data.pu import PUConstructionError
    from adni_pu.distributed import DistributedError
    from adni_pu.pu.trainer import ResumeError
    from adni_pu.volume_run import VolumeRunError

    return (ConfigError, CohortInputError, LeakageError, PUConstructionError, ResumeError,
            VolumeRunError, DistributedError, FileNotFoundError, ValueError)


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
    manifest_opt: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "--manifest", hidden=True, help="deprecated spelling of MANIFEST")] = None,
    out_opt: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "--out", hidden=True, help="deprecated spelling of RUN")] = None,
) -> None:
    """Train on the manifest's train split, select on val; write the run folder RUN."""
    from adni_pu.volume_run import load_volume_config, train_volumes

    manifest = positional_path(manifest, manifest_opt, "MANIFEST", "--manifest")
    out = positional_path(run, out_opt, "RUN", "--out")
    try:
        cfg = load_volume_config(config, set_ or [], preset)
        fit = train_volumes(manifest, cfg, out)
    except _known_errors() as exc:
        raise _fail(exc) from exc
    import os

    if os.environ.get("RANK", "0") != "0":  # under torchrun only rank 0 reports
        return
    typer.echo(f"selected: {fit.best_candidate} after epoch {fit.best_epoch + 1} "
               f"({cfg.train.val_criterion} {fit.best_score:.4f})")
    typer.echo(f"run folder: {out}")


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
    device: Device = "auto",
) -> None:
    """Accuracy, balanced accuracy, AUC, sensitivity, specificity with 95 % CIs; ROC plot."""
    from adni_pu.volume_run import METRICS, evaluate_run, format_ci

    try:
        result = evaluate_run(run, split, manifest, device=device, n_boot=bootstrap)
    except _known_errors() as exc:
        raise _fail(exc) from exc
    typer.echo(f"{split}: {result['n_subjects']} subjects, {result['n_scans']} scans "
               f"({result['n_subjects_unknown_truth']} subjects without truth left out)")
    typer.echo(f"{'metric':20s} {'per scan':28s} per subject")
    for m in METRICS:
        typer.echo(f"{m:20s} {format_ci(result['scan_level'][m]):28s} "
                   f"{format_ci(result['subject_level'][m])}")
    typer.echo(f"report: {result['files']['report']}")


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
) -> None:
    """Per-scan probability of amyloid positivity from the run's selected model."""
    from adni_pu.volume_run import predict_scans

    try:
        table = predict_scans(run, scans, out, work_dir, device)
    except _known_errors() as exc:
        raise _fail(exc) from exc
    for row in table.itertuples():
        if row.model_input:
            typer.echo(f"{row.scan}\t{row.probability:.4f}\t{row.prediction}\t({row.status})")
        else:
            typer.echo(f"{row.scan}\t-\t{row.status}: {row.error}")
    if out is not None:
        typer.echo(f"predictions: {out}")
    if (table["model_input"] == "").any():
        raise typer.Exit(1)


_DEMO = DemoSettings()


def demo(
    subjects: Annotated[int, typer.Option(help="synthetic subjects")] = _DEMO.subjects,
    out: Annotated[Path, typer.Option(help="output folder")] = _DEMO.out,
    preprocessing: Annotated[str, typer.Option(
        help="real (the adni-pu preprocess pipeline) or ideal (the generator's perfect "
             "model-grid volumes; a fallback that skips preprocessing)")] = _DEMO.preprocessing,
    epochs: Annotated[int, typer.Option(
        help="training epochs per run (a method on a fold)")] = _DEMO.epochs,
    methods: Annotated[str, typer.Option(help="comma-separated training presets")
                       ] = ",".join(_DEMO.methods),
    folds: Annotated[int, typer.Option(
        help="cross-validation folds: every subject is scored once, by the fold that holds "
             "it out")] = _DEMO.folds,
    seed: Annotated[int, typer.Option(help="seed of the cohort and the training")] = _DEMO.seed,
    workers: Annotated[int, typer.Option(help="preprocessing processes")] = _DEMO.workers,
    threads: Annotated[int, typer.Option(help="torch threads for training")] = _DEMO.threads,
    set_: Sets = None,
) -> None:
    """Synthetic cohort -> preprocess -> cohort -> train Self-PU and baselines -> report."""
    from adni_pu.demo import run_demo

    try:
        settings = DemoSettings(subjects=subjects, out=out, preprocessing=preprocessing,
                                epochs=epochs, methods=tuple(m.strip() for m in
                                                             methods.split(",") if m.strip()),
                                folds=folds, seed=seed, workers=workers, threads=threads,
                                overrides=tuple(set_ or []))
        report = run_demo(settings, log=lambda m: typer.echo(m, err=True))
    except _known_errors() as exc:
        raise _fail(exc) from exc
    typer.echo(f"report: {report}")


def register(app: typer.Typer) -> None:
    """Add ``train``, ``evaluate``, ``predict`` and ``demo`` to the main app."""
    app.command("train")(train)
    app.command("evaluate")(evaluate)
    app.command("predict")(predict)
    app.command("demo")(demo)

"""``adni-pu benchmark {mnist,cifar10}``: the paper's benchmarks, mean (std) over seeds;
``adni-pu benchmark table``: one table from a folder of their results files; ``adni-pu
presets``: the training presets and the benchmark protocol's."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from adni_pu.cli.common import Device, sets_option
from adni_pu.workflows.prior import PRIOR_EPOCHS  # light: no torch at import

if TYPE_CHECKING:
    from adni_pu.workflows.benchmark import BenchmarkSpec

bench_app = typer.Typer(help="Reproduce the paper's MNIST / CIFAR-10 PU benchmarks.",
                        no_args_is_help=True)

Method = Annotated[str, typer.Option(help="naive, upu, nnpu, selfpu or vpu")]
# Exit status of a command that stopped at --time-limit with work left (EX_TEMPFAIL).
EXIT_INCOMPLETE = 75

# --prior-epochs' default (typer evaluates the annotations in this module's namespace)
PRIOR_EPOCHS_TEXT = ", ".join(f"{name} {n}" for name, n in PRIOR_EPOCHS.items())

Preset = Annotated[Optional[str], typer.Option(  # noqa: UP045 - typer needs Optional
    show_default="none: --method",
    help="a named configuration (ablation row), e.g. sps-reweight; see `adni-pu presets`")]


def _method_settings(method: str, preset: str | None, epochs: int | None, threads: int,
                     device: str) -> tuple[str | None, dict[str, Any]]:
    """The preset a run trains with (VPU: its own, with a prior-free selection) and the
    settings the command line sets under it."""
    if method not in ("naive", "upu", "nnpu", "selfpu", "vpu"):
        raise typer.BadParameter(f"{method!r}: expected naive, upu, nnpu, selfpu or vpu",
                                 param_hint="--method")
    if method == "vpu" and preset is None:  # with its own, prior-free selection
        preset = "vpu"
    settings: dict[str, Any] = {"threads": threads, "device": device}
    if preset is None:
        settings["method"] = method
    if epochs is not None:
        settings["epochs"] = epochs
    return preset, settings


def _run(spec: BenchmarkSpec, results_json: Path | None) -> None:
    """Run the benchmark ``spec`` and report its table, or where it stopped."""
    from adni_pu.workflows.benchmark import run_benchmark
    from adni_pu.workflows.results_format import markdown_table

    out = spec.out
    summary = run_benchmark(spec, results_json)
    if summary.get("status") == "incomplete":
        estimate = summary.get("prior_estimate") or {"done": True}
        stage = ("" if estimate["done"] else f" (prior estimate first: "
                 f"{estimate['epochs_done']}/{estimate['epochs']} classifier epochs)")
        typer.echo(f"stopped at the time limit: seed {summary['current_seed']}, "
                   f"{summary['epochs_done']}/{summary['epochs']} epochs done{stage}; run the "
                   f"same command again to continue ({out / 'progress.json'})")
        raise typer.Exit(EXIT_INCOMPLETE)
    typer.echo(markdown_table(summary))
    typer.echo(f"results: {out / 'results.json'}")


def _prior(text: str | None) -> float | str | None:
    """``--prior``: a number, or the word ``estimate``."""
    if text is None or text == "estimate":
        return text
    try:
        return float(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r}: expected a number in (0, 1) or 'estimate'",
                                 param_hint="--prior") from None


def _command(dataset: str):  # noqa: ANN202 - typer reads the signature
    def command(
        method: Method = "nnpu",
        preset: Preset = None,
        seeds: Annotated[int, typer.Option(help="number of seeds")] = 3,
        seed_offset: Annotated[int, typer.Option(help="first seed")] = 0,
        epochs: Annotated[Optional[int], typer.Option(  # noqa: UP045
            show_default="the preset's, 200", help="epochs")] = None,
        data_dir: Annotated[Path, typer.Option(help="folder with the data set files")] = Path(
            "data"),
        out: Annotated[Path, typer.Option(help="output folder (one run folder per seed)")] = Path(
            "runs/benchmark"),
        config: Annotated[Optional[Path], typer.Option(  # noqa: UP045
            show_default="none", help="TOML settings file")] = None,
        set_: sets_option("selfpu.rates=[0.2,0.3]") = None,
        n_labelled: Annotated[int, typer.Option(help="labelled positives n_p")] = 1000,
        prior: Annotated[Optional[str], typer.Option(  # noqa: UP045
            show_default="--set prior, else the paper's: 0.49 MNIST, 0.40 CIFAR-10",
            metavar="NUMBER|estimate",
            help="class prior; 'estimate': estimate it per seed from the PU data alone (a "
                 "naive P-vs-U classifier, best-bin estimation on the validation split) and "
                 "train with the estimate")] = None,
        prior_epochs: Annotated[Optional[int], typer.Option(  # noqa: UP045
            show_default=PRIOR_EPOCHS_TEXT,
            help="with --prior estimate: epochs of the P-vs-U classifier")] = None,
        scheme: Annotated[str, typer.Option(help="case-control or censoring")] = "case-control",
        val_fraction: Annotated[float, typer.Option(help="PU validation split size")] = 0.1,
        results_json: Annotated[Optional[Path], typer.Option(  # noqa: UP045
            show_default="none", help="also write the results JSON here")] = None,
        threads: Annotated[int, typer.Option(help="torch CPU threads (0: default)")] = 0,
        device: Device = "auto",
        train_limit: Annotated[Optional[int], typer.Option(  # noqa: UP045
            show_default="all", help="keep a seeded subset of the training split (smoke runs)")
        ] = None,
        test_limit: Annotated[Optional[int], typer.Option(  # noqa: UP045
            show_default="all", help="keep a seeded subset of the test split (smoke runs)")
        ] = None,
        time_limit: Annotated[Optional[float], typer.Option(  # noqa: UP045
            show_default="none",
            help="minutes to train before checkpointing and stopping (exit status 75); "
                 "the same command continues")] = None,
        population: Annotated[Optional[int], typer.Option(  # noqa: UP045
            show_default="none: one seed at a time, the ordinary engine",
            help="seeds trained at once, every network in one stack (equal to training them "
                 "one by one up to rounding; a GPU's launches are shared); 1 stacks one "
                 "seed's students")] = None,
    ) -> None:
        chosen, settings = _method_settings(method, preset, epochs, threads, device)
        from adni_pu.workflows.benchmark import BenchmarkSpec

        _run(BenchmarkSpec(
            dataset=dataset, method=method, preset=chosen,
            seeds=list(range(seed_offset, seed_offset + seeds)), data_dir=data_dir, out=out,
            n_labelled=n_labelled, prior=_prior(prior), prior_epochs=prior_epochs,
            scheme=scheme, val_fraction=val_fraction, config_file=config, settings=settings,
            overrides=list(set_ or []), train_limit=train_limit, test_limit=test_limit,
            time_limit=time_limit, population=population), results_json)

    command.__doc__ = f"Train on {dataset} PU splits over several seeds; write results JSON."
    return command


bench_app.command("mnist")(_command("mnist"))
bench_app.command("cifar10")(_command("cifar10"))


def _pair(text: str) -> tuple[str, str]:
    parts = text.split(",")
    if len(parts) != 2 or not all(parts):
        raise typer.BadParameter(f"{text!r}: expected A,B (two labels)", param_hint="--pair")
    return parts[0], parts[1]


def table(
    folder: Annotated[Path, typer.Argument(
        metavar="FOLDER", show_default=False,
        help="folder of results files (`--results-json` of each run)")],
    out: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        show_default="FOLDER-table beside FOLDER",
        help="output stem: writes STEM.md and STEM.json")] = None,
    with_: Annotated[Optional[list[Path]], typer.Option(  # noqa: UP045
        "--with", show_default="none", metavar="FOLDER",
        help="also read this folder's results files (repeatable), e.g. the baselines a row "
             "is compared with")] = None,
    pair: Annotated[Optional[list[str]], typer.Option(  # noqa: UP045
        show_default="none", metavar="A,B",
        help="also report A minus B (repeatable)")] = None,
    ablation: Annotated[bool, typer.Option(
        help="rows are presets; state and check the schedule per row")] = False,
    allow_mixed_schedule: Annotated[bool, typer.Option(
        help="with --ablation: flag rows with another schedule instead of refusing")] = False,
    label_from_name: Annotated[bool, typer.Option(
        help="label = file name without -s<seed> (rows that differ by --set only)")] = False,
    final_rule: Annotated[Optional[list[str]], typer.Option(  # noqa: UP045
        show_default="none", metavar="LABEL",
        help="report LABEL by the final-model rule's test accuracy (repeatable)")] = None,
    protocol: Annotated[bool, typer.Option(
        help="the benchmark protocol: every Self-PU row by the final rule, the baselines by "
             "their runs' own selection (instead of --final-rule)")] = False,
) -> None:
    """Build one table from a folder of benchmark results files: mean (std) over seeds and
    paired differences with 95 % CIs."""
    from adni_pu.workflows.results_table import write_table

    pairs = [_pair(p) for p in pair or []]
    command = " ".join(
        ["adni-pu benchmark table", str(folder)]
        + ([f"--out {out}"] if out is not None else [])
        + [f"--with {w}" for w in with_ or []]
        + [f"--pair {a},{b}" for a, b in pairs]
        + [flag for flag, on in (("--ablation", ablation),
                                 ("--allow-mixed-schedule", allow_mixed_schedule),
                                 ("--label-from-name", label_from_name)) if on]
        + [f"--final-rule {label}" for label in final_rule or []]
        + (["--protocol"] if protocol else []))
    text, stem = write_table(folder, out, pairs, ablation, allow_mixed_schedule, command,
                             label_from_name, tuple(final_rule or ()), protocol,
                             tuple(with_ or ()))
    typer.echo(text)
    typer.echo(f"table: {stem.with_name(stem.name + '.md')} and .json")


bench_app.command("table")(table)


def _compare_commands() -> None:
    """``benchmark cohort`` and ``benchmark cohort-report`` (:mod:`adni_pu.cli.compare`)."""
    from adni_pu.cli.compare import cohort, cohort_report

    bench_app.command("cohort")(cohort)
    bench_app.command("cohort-report")(cohort_report)


_compare_commands()


def presets() -> None:
    """List the named training configurations (the paper's ablation rows and baselines) and
    the benchmark protocol's presets."""
    from adni_pu.pu.config import PRESET_DESCRIPTIONS, PROTOCOL_DESCRIPTIONS, protocol_settings

    for name, text in PRESET_DESCRIPTIONS.items():
        typer.echo(f"{name:20s} {text}")
    typer.echo("\nbenchmark protocol (`adni-pu benchmark` sets these under the training preset; "
               "a settings file or --set overrides them):")
    for name, text in PROTOCOL_DESCRIPTIONS.items():
        values = ", ".join(f"{key}={_toml_value(value)}"
                           for key, value in protocol_settings(name).items())
        typer.echo(f"{name:20s} {text}: {values}")


def _toml_value(value: Any) -> str:
    """A setting's value as ``--set`` takes it (``true``, ``0.0005``, ``"final"``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def register(app: typer.Typer) -> None:
    """Add ``benchmark`` and ``presets`` to the main app."""
    app.add_typer(bench_app, name="benchmark")
    app.command("presets")(presets)

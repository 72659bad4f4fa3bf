"""Benchmark runs: one method on MNIST or CIFAR-10 over several seeds, mean (std) results.

Each seed trains in its own run folder (resumable: a finished seed is not trained again)
and the aggregate is written as the results JSON plus a Markdown table (the files:
:mod:`adni_pu.workflows.results_format`). What a row runs is its training preset plus the
benchmark protocol's named presets (:func:`resolve_config`, ``adni-pu presets``).

With a time limit the run works in pieces: it stops at an epoch boundary before the limit,
leaves the checkpoint and ``progress.json`` (what is done, what is left) in the output folder,
and the same command run again continues from there (see docs/training.md).

With ``--prior estimate`` (``BenchmarkSpec.prior = "estimate"``) each seed first estimates
the class prior from its PU data alone (:func:`adni_pu.workflows.prior.estimate_tensor_prior`:
a naive P-vs-U classifier in ``seed<N>/prior_estimate/``, best-bin estimation on the
validation split, the test split never read) and its risks train with the estimate; the PU
data are still built as the protocol builds them, and the protocol's prior is recorded
beside the estimate as the truth it is compared with.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adni_pu import config as cfgmod
from adni_pu import fileio
from adni_pu.errors import ConfigError
from adni_pu.locking import holding_output_lock
from adni_pu.provenance import run_machines
from adni_pu.signals import Interrupted, signal_of
from adni_pu.workflows.class_prior import resolve_prior
from adni_pu.workflows.results_format import (
    DATA_NAMES,
    aggregate,
    read_seed_result,
    seed_result_path,
    test_examples,
    write_results,
    write_seed_result,
)


@dataclass
class BenchmarkSpec:
    """What to run: data set, method or preset, seeds and the PU construction."""

    dataset: str
    method: str = "nnpu"
    preset: str | None = None
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    data_dir: Path = Path("data")
    out: Path = Path("runs/benchmark")
    n_labelled: int = 1000
    prior: float | str | None = None
    """The class prior: a number, ``"estimate"`` (:data:`PRIOR_ESTIMATE`), or None for the
    ``prior`` setting, else the paper's."""
    prior_epochs: int | None = None
    """With ``prior = "estimate"``: the P-vs-U classifier's epochs (None: the data set's
    :data:`adni_pu.workflows.prior.PRIOR_EPOCHS`)."""
    scheme: str = "case-control"
    val_fraction: float = 0.1
    config_file: Path | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    """TrainConfig values set by the caller (e.g. ``{"threads": 1, "device": "cpu"}``):
    over the file, under ``overrides``."""
    overrides: list[str] = field(default_factory=list)
    """The user's ``--set KEY=VALUE`` strings (highest precedence)."""
    train_limit: int | None = None
    test_limit: int | None = None
    time_limit: float | None = None
    """Minutes this command may train before it checkpoints and stops (None: no limit)."""
    population: int | None = None
    """Seeds trained at once as one stack (:mod:`adni_pu.pu.population`; 1: one seed, its
    students stacked); None: one seed at a time with the ordinary engine."""

    @property
    def label(self) -> str:
        return self.preset or self.method


PRIOR_ESTIMATE = "estimate"
"""``--prior estimate``: estimate each seed's class prior from its PU data."""


def estimates_prior(spec: BenchmarkSpec) -> bool:
    """Whether the seeds of ``spec`` train with an estimated class prior."""
    return spec.prior == PRIOR_ESTIMATE


def prior_epochs(spec: BenchmarkSpec) -> int:
    """The P-vs-U classifier's epochs of a ``--prior estimate`` benchmark."""
    from adni_pu.workflows.prior import PRIOR_EPOCHS

    return spec.prior_epochs if spec.prior_epochs is not None else PRIOR_EPOCHS[spec.dataset]


def check_prior_option(spec: BenchmarkSpec) -> None:
    """Refuse a ``--prior`` that is neither a number nor ``estimate``, and ``--prior-epochs``
    without ``--prior estimate`` or below 1 (before any work)."""
    if isinstance(spec.prior, str) and spec.prior != PRIOR_ESTIMATE:
        raise ConfigError(f"--prior {spec.prior!r}: expected a number in (0, 1) or "
                          f"{PRIOR_ESTIMATE!r}")
    if spec.prior_epochs is not None and not estimates_prior(spec):
        raise ConfigError(f"--prior-epochs {spec.prior_epochs}: only with --prior "
                          f"{PRIOR_ESTIMATE} (the epochs of its P-vs-U classifier)")
    if spec.prior_epochs is not None and spec.prior_epochs < 1:
        raise ConfigError(f"--prior-epochs {spec.prior_epochs}: expected at least 1")


def protocol_presets(dataset: str, method: str | None) -> list[str]:
    """The benchmark protocol's presets (``adni-pu presets``, :data:`~adni_pu.pu.config.
    PROTOCOL_PRESETS`) of a row on ``dataset`` whose training preset has ``method``: the
    data set's, then for Self-PU rows the final-model rule."""
    return [f"{dataset}-protocol", *(["selfpu-final-model"] if method == "selfpu" else [])]


def resolve_config(spec: BenchmarkSpec, seed: int) -> Any:
    """The TrainConfig of one seed. Lowest first: the data set's paper model, the data set's
    protocol preset, the training preset, the Self-PU protocol preset (Self-PU rows only;
    :func:`protocol_presets`), the file, ``spec.settings``, ``spec.overrides``; the seed last."""
    from adni_pu.data.benchmarks import PAPER_MODEL
    from adni_pu.pu.config import TrainConfig, preset_settings, protocol_settings

    training = preset_settings(spec.label)
    data_protocol, *row_protocol = protocol_presets(spec.dataset, training.get("method"))
    defaults: dict[str, Any] = {"model": PAPER_MODEL[spec.dataset]}
    for layer in (protocol_settings(data_protocol), training,
                  *(protocol_settings(name) for name in row_protocol)):
        cfgmod.deep_update(defaults, layer)
    cfg = cfgmod.load(TrainConfig, spec.config_file, spec.overrides, defaults, spec.settings)
    cfg = dataclasses.replace(cfg, seed=seed)  # the seed of this run wins over any setting
    if estimates_prior(spec) and cfg.prior is not None:
        raise cfgmod.ConfigError(
            f"--prior {PRIOR_ESTIMATE} and the setting prior = {cfg.prior} disagree; set the "
            "class prior once")
    if spec.prior is not None and cfg.prior is not None and spec.prior != cfg.prior:
        raise cfgmod.ConfigError(
            f"--prior {spec.prior} and the setting prior = {cfg.prior} disagree; set the class "
            "prior once")
    return cfg


def data_prior(spec: BenchmarkSpec, cfg: Any) -> float | None:
    """The class prior the PU data are built with and the risks use (None: the paper's).

    ``--prior`` and the ``prior`` setting (``--set prior=``, the file) name the same value,
    so it is recorded once, in ``data.json`` and the results, and trained with. With
    ``--prior estimate`` (no ``prior`` setting allowed) the data are built with the paper's
    prior, the truth the estimate is compared with; the risks use the estimate
    (:func:`with_estimated_prior`).
    """
    given = None if estimates_prior(spec) else spec.prior
    return given if given is not None else cfg.prior  # type: ignore[return-value]


def run_seed(spec: BenchmarkSpec, seed: int, cache_dir: Path | None = None,
             deadline: float | None = None, finish_first_epoch: bool = True
             ) -> dict[str, Any] | None:
    """Train and evaluate one seed; reuse its result file if it is already there.

    Returns None when training stopped at ``deadline`` (``time.monotonic()`` seconds)
    before the last epoch; the seed's run folder then holds the checkpoint to resume from.
    ``finish_first_epoch`` lets the first epoch run past the deadline (progress per piece).
    """
    saved = saved_result(spec, seed)
    if saved is not None:
        return saved
    prepared = prepare_seed(spec, seed, cache_dir, deadline, finish_first_epoch)
    if prepared is None:  # the deadline stopped the prior estimate's classifier
        return None
    trainer, estimate, trained = prepared
    fit = trainer.fit(deadline, finish_first_epoch and not trained)
    return seed_result(spec, seed, trainer, fit, estimate=estimate) if fit.complete else None


def run_population(spec: BenchmarkSpec, seeds: list[int], cache_dir: Path | None = None,
                   deadline: float | None = None, finish_first_epoch: bool = True
                   ) -> list[dict[str, Any]] | None:
    """Train ``seeds`` at once (:func:`adni_pu.pu.population.fit_population`) and evaluate
    each as :func:`run_seed` does; None when the deadline stopped them (all at one epoch)."""
    from adni_pu.pu.population import fit_population

    saved = {seed: saved_result(spec, seed) for seed in seeds}
    todo = [seed for seed in seeds if saved[seed] is None]
    trainers, estimates = [], []
    for seed in todo:  # prior estimates (if any) one seed at a time, before the stack
        prepared = prepare_seed(spec, seed, cache_dir, deadline, finish_first_epoch)
        if prepared is None:
            return None
        trainer, estimate, trained = prepared
        finish_first_epoch = finish_first_epoch and not trained
        trainers.append(trainer)
        estimates.append(estimate)
    fits = fit_population(trainers, deadline, finish_first_epoch) if trainers else []
    if not all(fit.complete for fit in fits):
        return None
    for seed, trainer, fit, estimate in zip(todo, trainers, fits, estimates):
        saved[seed] = seed_result(spec, seed, trainer, fit, len(trainers), estimate)
    return [saved[seed] for seed in seeds]  # type: ignore[misc]


def saved_result(spec: BenchmarkSpec, seed: int) -> dict[str, Any] | None:
    """The seed's result file when it was made with this seed's settings (with ``--prior
    estimate``: trained with the estimate it records, made by this classifier), else None."""
    saved = read_seed_result(spec.out, seed)
    if saved is None:
        return None
    cfg = resolve_config(spec, seed)
    if estimates_prior(spec):
        from adni_pu.workflows.prior import tensor_classifier_config

        estimate = saved.get("prior_estimate") or {}
        made_by = (estimate.get("classifier") or {}).get("config")
        if "value" not in estimate or made_by != cfgmod.to_dict(
                tensor_classifier_config(cfg, prior_epochs(spec))):
            return None
        cfg = dataclasses.replace(cfg, prior=estimate["value"])
    if saved.get("config") == cfgmod.to_dict(cfg):
        print(f"seed {seed}: already done ({seed_result_path(spec.out, seed)})",
              file=sys.stderr)
        return saved
    return None


def seed_trainer(spec: BenchmarkSpec, seed: int, cache_dir: Path | None = None) -> Any:
    """The seed's :class:`~adni_pu.pu.trainer.Trainer` on its PU split, in its run folder
    (with ``--prior estimate``: once the estimate is made, :func:`prepare_seed`)."""
    prepared = prepare_seed(spec, seed, cache_dir)
    assert prepared is not None  # no deadline: the estimate, if any, is made
    return prepared[0]


def seed_data(spec: BenchmarkSpec, seed: int, cfg: Any, cache_dir: Path | None = None) -> Any:
    """The seed's PU data as the benchmark protocol builds them."""
    from adni_pu.data.benchmarks import load_benchmark

    return load_benchmark(spec.dataset, spec.data_dir, spec.n_labelled, data_prior(spec, cfg),
                          spec.scheme, spec.val_fraction, seed=seed, cache_dir=cache_dir,
                          train_limit=spec.train_limit, test_limit=spec.test_limit)


def prepare_seed(spec: BenchmarkSpec, seed: int, cache_dir: Path | None = None,
                 deadline: float | None = None, finish_first_epoch: bool = True
                 ) -> tuple[Any, dict[str, Any] | None, bool] | None:
    """The seed's trainer, its prior estimate (None without ``--prior estimate``) and
    whether this call trained epochs of the estimate's classifier; None when ``deadline``
    stopped that classifier first (its run folder keeps the checkpoint)."""
    from adni_pu.pu.trainer import Trainer

    cfg = resolve_config(spec, seed)
    data = seed_data(spec, seed, cfg, cache_dir)
    run_dir = spec.out / f"seed{seed}"
    trained = [False]

    def estimate() -> dict[str, Any] | None:
        from adni_pu.workflows.prior import estimate_tensor_prior

        truth = {"true_prior": data.prior, "true_prior_split": float(data.train.truth.mean())}
        record, trained[0] = estimate_tensor_prior(data, cfg, run_dir, prior_epochs(spec),
                                                   truth, deadline=deadline,
                                                   finish_first_epoch=finish_first_epoch)
        return record

    # the protocol's prior (or --prior NUMBER) the data are built with, or the estimate
    prior = resolve_prior(PRIOR_ESTIMATE if estimates_prior(spec) else data.prior,
                          estimate=estimate)
    if prior is None:
        return None
    if prior.source == "estimate":
        data, cfg = with_estimated_prior(data, cfg, prior.value)
    return Trainer(cfg, data, run_dir), prior.estimate, trained[0]


def with_estimated_prior(data: Any, cfg: Any, prior: float) -> tuple[Any, Any]:
    """The data and settings that train with the estimated class prior ``prior``: the
    risks' prior (``TrainConfig.prior`` and ``PUData.prior``, which the trainer checks
    agree) is the estimate; ``data.info["prior"]`` keeps the prior the data were built
    with, and ``prior_source`` says where the trained one came from."""
    info = {**data.info, "prior_source": "estimate (prior_estimate.json)"}
    return (dataclasses.replace(data, prior=prior, info=info),
            dataclasses.replace(cfg, prior=prior))


def seed_result(spec: BenchmarkSpec, seed: int, trainer: Any, fit: Any,
                population: int | None = None, estimate: dict[str, Any] | None = None
                ) -> dict[str, Any]:
    """Evaluate a finished seed on its test split and write its ``result.json``
    (``population``: the seeds it trained with at once in one stack, whose time its epochs
    record; None: alone, with the ordinary engine; ``estimate``: the prior estimate it
    trained with, None for a given prior)."""
    cfg, test = trainer.cfg, trainer.data.test
    metrics, logits = trainer.evaluate_split(test)
    diag = [v for row in fit.history for k, v in row.items() if k.startswith("test_diagnostic/")]
    result = {
        "seed": seed,
        "config": cfgmod.to_dict(cfg),
        "data": trainer.data.info,
        "selection": cfg.selection,
        "selected_epoch": fit.best_epoch,
        "selected_model": fit.best_candidate,
        "val_criterion": cfg.val_criterion,
        "val_score": fit.best_score,
        "test": metrics,
        "test_accuracy_test_selected": max(diag) if diag else None,
        **_finalist_diagnostics(trainer, test),
        "seconds_per_epoch": _phase_seconds(fit.history),
        "population": population,
        "nn_correction_share": _nn_share(fit.history),
        "test_examples": test_examples(logits, test.truth),
        "prior_estimate": estimate,
        "machines": run_machines(trainer.run.run_dir),
    }
    write_seed_result(spec.out, seed, result)
    return result


def _finalist_diagnostics(trainer: Any, test: Any) -> dict[str, Any]:
    """The finalists after the last epoch: the one validation chooses, their validation
    scores and each one's test accuracy. Diagnostics only (the test split decides nothing):
    under ``selection = "best_epoch"`` they give the "final" rule's number from the same run."""
    from adni_pu.pu.metrics import binary_metrics
    from adni_pu.pu.selection import finalist_models

    final = trainer.state.final or {}
    accuracy = {name: binary_metrics(trainer.predict_logits(model, test), test.truth)["accuracy"]
                for name, model in finalist_models(trainer.run).items()}
    choice = final.get("choice")
    return {
        "finalist_choice_diagnostic": choice,
        "finalists_val_score_diagnostic": final.get("val_scores"),
        "test_accuracy_finalists_diagnostic": accuracy,
        "test_accuracy_final_rule_diagnostic": accuracy.get(choice) if choice else None,
    }


def _phase_seconds(history: list[dict[str, Any]]) -> dict[str, float]:
    from adni_pu.pu.recorders import seconds_by_phase

    return {k: v["mean"] for k, v in seconds_by_phase(history).items()}


def _nn_share(history: list[dict[str, Any]]) -> float | None:
    """Mean over epochs and models of the run's nn_correction shares (None: no correction)."""
    from adni_pu.pu.recorders import nn_correction_summary

    summary = nn_correction_summary(history)
    return None if summary is None else summary["share"]


class BenchmarkInterrupted(Interrupted):
    """Ctrl-C or SIGTERM (``signum``) stopped a benchmark (:mod:`adni_pu.signals`);
    ``hint`` says what is kept and how to continue."""

    def __init__(self, hint: str, signum: int = signal.SIGINT) -> None:
        super().__init__(signum, hint)


@holding_output_lock("benchmark", lambda args: args["spec"].out)
def run_benchmark(spec: BenchmarkSpec, results_json: Path | None = None,
                  command: str | None = None) -> dict[str, Any]:
    """Run every seed, then write ``results.json`` and ``results.md`` into ``spec.out``.

    With ``spec.time_limit`` the command may stop early: it then returns (and writes to
    ``progress.json``) a progress record with ``"status": "incomplete"`` instead. Holds
    the lock of ``spec.out`` (:mod:`adni_pu.locking`): a second benchmark into the same
    folder is refused. Ctrl-C raises :class:`BenchmarkInterrupted`, which says what is
    kept (finished seeds, the current seed's checkpoint) and how to continue.
    """
    try:
        return _run_benchmark(spec, results_json, command)
    except KeyboardInterrupt as stop:
        if isinstance(stop, BenchmarkInterrupted):
            raise
        raise BenchmarkInterrupted(interrupted_hint(spec), signal_of(stop)) from stop


def interrupted_hint(spec: BenchmarkSpec) -> str:
    """What an interrupted benchmark keeps, and that the same command continues from it."""
    done = [s for s in spec.seeds if seed_result_path(spec.out, s).is_file()]
    kept = [f"seed {s}: {seed_result_path(spec.out, s)}" for s in done]
    for s in (s for s in spec.seeds if s not in done):
        run = spec.out / f"seed{s}" / "checkpoints" / "last.pt"
        classifier = spec.out / f"seed{s}" / "prior_estimate" / "checkpoints" / "last.pt"
        if run.is_file():
            kept.append(f"seed {s}: the checkpoint of its last finished epoch ({run})")
        elif classifier.is_file():  # --prior estimate: the estimate's classifier comes first
            kept.append(f"seed {s}: its prior estimate's classifier after its last finished "
                        f"epoch ({classifier})")
    if not kept:
        return "no seed had finished an epoch, nothing is kept; run the same command again"
    return ("kept " + "; ".join(kept) + "; run the same command again to continue from "
            "there")


def _run_benchmark(spec: BenchmarkSpec, results_json: Path | None,
                   command: str | None) -> dict[str, Any]:
    start = time.monotonic()
    deadline = None if spec.time_limit is None else start + 60.0 * spec.time_limit
    if spec.time_limit is not None and spec.time_limit <= 0:
        raise ConfigError(f"time limit {spec.time_limit} minutes: expected a positive number")
    if spec.dataset not in DATA_NAMES:
        raise ConfigError(f"benchmark {spec.dataset!r}: expected one of {sorted(DATA_NAMES)}")
    if not spec.seeds:
        raise ConfigError("--seeds: expected at least 1 seed, found 0")
    if spec.population is not None and spec.population < 1:
        raise ConfigError(f"--population {spec.population}: expected at least 1")
    check_prior_option(spec)
    fileio.check_out_dir(spec.out, "the benchmark's run folders")
    spec.out.mkdir(parents=True, exist_ok=True)
    cache = spec.out / ".cache"
    command = command or " ".join(["adni-pu", *sys.argv[1:]])
    results: list[dict[str, Any]] = []
    trained = False  # only the first group this command trains may overrun by one epoch
    size = spec.population or 1
    for group in [spec.seeds[i:i + size] for i in range(0, len(spec.seeds), size)]:
        done = all(seed_result_path(spec.out, seed).is_file() for seed in group)
        if spec.population is None:
            one = run_seed(spec, group[0], cache, deadline, finish_first_epoch=not trained)
            found = None if one is None else [one]
        else:
            found = run_population(spec, group, cache, deadline, finish_first_epoch=not trained)
        trained = trained or not done
        if found is None:
            current = next(seed for seed in group
                           if not seed_result_path(spec.out, seed).is_file())
            progress = _progress(spec, current, [r["seed"] for r in results], command,
                                 time.monotonic() - start)
            fileio.atomic_write_text(spec.out / "progress.json",
                                     json.dumps(progress, indent=2) + "\n")
            return progress
        results.extend(found)
    summary = aggregate(spec, results, command)
    written = write_results(spec.out, summary, results_json)
    if spec.time_limit is not None:
        progress = {"status": "complete", "command": command, "seeds_done": spec.seeds,
                    "results": str(written)}
        fileio.atomic_write_text(spec.out / "progress.json",
                                 json.dumps(progress, indent=2) + "\n")
    return summary


def _progress(spec: BenchmarkSpec, seed: int, done: list[int], command: str,
              seconds: float) -> dict[str, Any]:
    """What an interrupted command leaves: seeds done, the current seed's last epoch."""
    metrics = spec.out / f"seed{seed}" / "metrics.csv"
    rows = _csv_rows(metrics)
    last = rows[-1] if rows else {}
    tests = [float(v) for row in rows for k, v in row.items()
             if k.startswith("test_diagnostic/") and v]
    extra: dict[str, Any] = {}
    if estimates_prior(spec):  # the seed's prior estimate comes first
        from adni_pu.workflows.prior import ESTIMATE_DIR, RECORD_NAME

        classifier = spec.out / f"seed{seed}" / ESTIMATE_DIR / "metrics.csv"
        extra["prior_estimate"] = {
            "done": (spec.out / f"seed{seed}" / RECORD_NAME).is_file(),
            "epochs_done": len(_csv_rows(classifier)),
            "epochs": prior_epochs(spec)}
    return {
        "status": "incomplete",
        "command": command,
        "time_limit_minutes": spec.time_limit,
        "seconds_this_piece": round(seconds, 1),
        "seeds": spec.seeds,
        "seeds_done": done,
        "current_seed": seed,
        "epochs_done": len(rows),
        "epochs": int(resolve_config(spec, seed).epochs),
        "last_epoch": {k: last[k] for k in ("phase", "selected/candidate", "selected/score")
                       if k in last},
        "test_accuracy_test_selected_so_far": max(tests) if tests else None,
        "metrics": str(metrics),
        **extra,
    }


def _csv_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a run folder's ``metrics.csv`` (none when it is not there yet)."""
    import csv

    if not path.is_file():
        return []
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))

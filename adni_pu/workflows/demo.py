"""``adni-pu demo``: the whole ADNI path on a synthetic cohort, on a small budget.

generate (``adni_pu.synth``) -> preprocess (``adni_pu.preprocessing``, the real pipeline;
``preprocessing="ideal"`` uses the generator's perfect model-grid volumes instead, a
fallback for machines where preprocessing is too slow) -> build the cohort
(``adni_pu.cohort``) -> train each method on each cross-validation fold
(``adni_pu.workflows.train``) -> score the held-out subjects -> ``report.md`` with the pooled
results table, reference lines, an ROC plot, an explanation and the time of every stage.

The defaults aim at 10 minutes on a 2-core CPU: 100 subjects with one baseline scan each
at 3 mm and disease effects within published ADNI effect sizes (docs/volumes.md, "Effect
sizes"), fast registration and skull-stripping settings, a slim 3-branch CNN (8 and 16
channels, each branch ending in a global average pool, the hippocampus branches pooling
inside the atlas hippocampus; the brain at 40^3, batch 8), the pipeline's cached stage
shared by all runs (disk cache), 2-fold cross-validation over all subjects (every subject
scored once, by the fold that held it out; :mod:`adni_pu.workflows.crossval`) and
8 epochs per run. The modelling policy (training settings, class prior, reference lines,
pooling) is :mod:`adni_pu.workflows.demo_policy`; the report
(:mod:`adni_pu.workflows.demo_report`) puts the reference lines beside the methods and
explains the numbers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adni_pu import config as cfgmod
from adni_pu import fileio
from adni_pu.errors import ConfigError, OutputError
from adni_pu.locking import holding_output_lock
from adni_pu.workflows.demo_policy import (
    demo_prior,
    estimated_demo_prior,
    method_settings,
    pool_method,
    reference_scores,
)

# Preprocessing settings for small synthetic heads, as values: registration at 4 mm with
# fewer iterations, deepbet at 192^3 and a lower QC floor on the brain volume (why:
# docs/training.md, "Demo").
FAST_PREPROCESSING: dict[str, Any] = {
    "registration": {"resolution_mm": 4.0, "iterations": [50, 20], "shrink_factors": [2, 1],
                     "smoothing_sigmas": [1.0, 0.0]},
    "skullstrip": {"deepbet_size": 192},
    "qc": {"min_brain_ml": 400.0},
}


@dataclass
class DemoSettings:
    """What the demo runs."""

    subjects: int = 100
    out: Path = Path("adni-pu-demo")
    preprocessing: str = "real"
    epochs: int = 8
    methods: tuple[str, ...] = ("naive", "upu", "nnpu", "selfpu")
    folds: int = 2
    seed: int = 0
    workers: int = 2
    bootstrap: int = 1000
    threads: int = 2
    overrides: tuple[str, ...] = ()
    prior: str = "cohort"
    """The class prior of each fold's PU methods: "cohort", the positive share of the fold's
    training subjects with a truth; "estimate", estimated from the fold's PU data alone
    (:func:`~adni_pu.workflows.demo_policy.estimated_demo_prior`), as a study without
    amyloid PET must."""
    synth: dict[str, Any] = field(default_factory=lambda: {
        "voxel_size": 3.0, "visit_probabilities": [1.0, 0.0, 0.0], "write_brain_masks": False,
        # hippocampal volume AD vs CN about 21 % smaller (Cohen's d about 1.6) and almost no
        # difference between amyloid-positive and -negative CN, as published for ADNI
        # (docs/volumes.md, "Effect sizes"); other effects at the generator's defaults
        "hippocampal_atrophy": 0.3, "atrophy_noise": 0.08,
        # the generator's ADNI composition (diagnosis mix and amyloid prevalence per
        # diagnosis, docs/volumes.md "Composition"): under the paper preset about a third of
        # the positives are labelled (the AD patients) and the rest, mostly amyloid-positive
        # MCI, are hidden in the unlabelled set; amyloid PET for 90 % of subjects, so that
        # most are scored
        "pet_fraction": 0.9,
    })

    def __post_init__(self) -> None:
        if self.folds < 2:
            raise ConfigError(f"folds={self.folds}: expected at least 2 (every subject is "
                             "scored by the fold that holds it out)")
        if self.subjects < 6 * self.folds:
            raise ConfigError(f"subjects={self.subjects}: {self.folds} folds need at least "
                             f"{6 * self.folds} subjects (each fold's train, val and test "
                             "need labelled and unlabelled subjects)")
        if self.preprocessing not in ("real", "ideal"):
            raise ConfigError(f"preprocessing: expected 'real' or 'ideal', found "
                             f"{self.preprocessing!r}")
        from adni_pu.pu.config import TRAINING_PRESETS

        # ``synth.KEY=VALUE`` overrides change the generator (e.g. its diagnosis mix); the
        # rest go to training. A bad generator setting is refused here, before any work.
        training = []
        for text in self.overrides:
            path, value = cfgmod.parse_override(text)
            if path[0] == "synth" and len(path) == 2:
                self.synth = {**self.synth, path[1]: value}
            else:
                training.append(text)
        self.overrides = tuple(training)
        if self.prior not in ("cohort", "estimate"):
            raise ConfigError(f"prior: expected 'cohort' or 'estimate', found {self.prior!r}")
        given = [t for t in training if cfgmod.parse_override(t)[0] in (["prior"],
                                                                         ["train", "prior"])]
        if self.prior == "estimate" and given:
            raise ConfigError(f"--prior estimate and --set {given[0]}: set the class prior once")
        from adni_pu.synth.config import SynthConfig

        cfgmod.from_dict(SynthConfig, self.synth, where="demo synth settings")
        unknown = [m for m in self.methods if m not in TRAINING_PRESETS]
        if not self.methods or unknown:
            raise ConfigError(f"methods: expected training presets from {sorted(TRAINING_PRESETS)}, "
                             f"found {list(self.methods)}")
        self.out = Path(self.out)
        for name in ("epochs", "threads", "workers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: expected at least 1")
        if self.bootstrap < 0:
            raise ConfigError(f"bootstrap={self.bootstrap}: expected 0 or more resamples")

    def check_training_settings(self) -> None:
        """Every run's training settings, ``--set`` included: refused before any work (not
        in ``__post_init__``: that would import torch wherever settings are made)."""
        from adni_pu.workflows.volume_settings import load_volume_config

        values = method_settings(self.epochs, self.seed, self.threads, self.out / "cache")
        for method in self.methods:
            load_volume_config(None, list(self.overrides), preset=method, values=values)


class StageProgress:
    """A line per finished item of a long stage, with the time so far and an estimate left.

    ``log`` gets e.g. ``"      scan 3/48 sub-X: done (9.8 s) | 31 s, ~7 min left"``; the
    estimate is the mean time per item so far times the items left.
    """

    def __init__(self, total: int, log: Callable[[str], None], unit: str,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.total, self.log, self.unit, self.clock = max(total, 0), log, unit, clock
        self.done = 0
        self.start = clock()

    def step(self, text: str = "") -> None:
        """Count one finished item and log its line."""
        self.done += 1
        elapsed = self.clock() - self.start
        left = elapsed / self.done * max(self.total - self.done, 0)
        what = f"{self.unit} {self.done}/{self.total}" + (f" {text}" if text else "")
        self.log(f"      {what} | {_duration(elapsed)}, ~{_duration(left)} left")


def _duration(seconds: float) -> str:
    """``42 s`` or ``3.5 min``."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def generate_stage(out: Path, settings: DemoSettings, log: Callable[[str], None]) -> Path:
    """Write the synthetic cohort to ``out/synth`` (skipped when it is already there)."""
    from adni_pu.synth import SynthConfig, generate_cohort

    synth_dir = out / "synth"
    synth_cfg = cfgmod.from_dict(SynthConfig, {
        **settings.synth, "ideal_preprocessed": settings.preprocessing == "ideal"})
    wanted = {"subjects": settings.subjects, "seed": settings.seed,
              "synth": json.loads(json.dumps(cfgmod.to_dict(synth_cfg)))}
    if not (synth_dir / "synth_config.toml").is_file():
        log(f"[1/5] generating {settings.subjects} synthetic subjects in {synth_dir}")
        generate_cohort(synth_dir, settings.subjects, settings.seed, synth_cfg)
        fileio.atomic_write_text(synth_dir / "demo_cohort.json", json.dumps(wanted) + "\n")
        return synth_dir
    made = json.loads((synth_dir / "demo_cohort.json").read_text()) \
        if (synth_dir / "demo_cohort.json").is_file() else {}
    if made != wanted:
        differ = sorted(k for k in wanted if made.get(k) != wanted[k]) if made else ["all"]
        raise OutputError(f"{synth_dir}: holds a synthetic cohort made with other settings "
                         f"(differing: {', '.join(differ)}; wanted subjects={settings.subjects}, "
                         f"seed={settings.seed}); choose another --out or remove it")
    log(f"[1/5] synthetic cohort already in {synth_dir}")
    return synth_dir


def preprocess_stage(out: Path, synth_dir: Path, settings: DemoSettings,
                     log: Callable[[str], None]) -> tuple[Path, str]:
    """Preprocess the raw scans (resumable); returns (summary.csv, a one-line note)."""
    if settings.preprocessing != "real":
        log("[2/5] using the generator's ideal model-grid volumes (no preprocessing)")
        return (synth_dir / "preprocessed_ideal" / "summary.csv",
                "ideal model-grid volumes from the generator (no preprocessing)")
    from adni_pu.preprocessing import load_config, run_preprocessing

    prep_dir = out / "preprocessed"
    log(f"[2/5] preprocessing the raw scans into {prep_dir} ({settings.workers} workers)")
    prep_cfg = load_config(values=FAST_PREPROCESSING)
    n_scans = sum(1 for _ in (synth_dir / "bids").glob("sub-*/ses-*/anat/*_T1w.nii.gz"))
    progress = StageProgress(n_scans, log, "scan")

    def on_result(row: dict) -> None:
        status = row["status"] + ("" if row["status"] == "skipped" else
                                  f" in {float(row.get('seconds') or 0):.1f} s")
        progress.step(f"sub-{row['subject_id']}: {status}")

    summary = run_preprocessing(synth_dir / "bids", prep_dir, prep_cfg,
                                workers=settings.workers, threads_per_worker=1, progress=False,
                                on_result=on_result)
    bad = summary[~summary["status"].isin(["done", "skipped"])]
    if len(bad):
        log(f"      {len(bad)} scan(s) failed preprocessing (left out): "
            + "; ".join(f"{r.subject_id}: {r.error}" for r in bad.head(3).itertuples()))
    note = f"{len(summary) - len(bad)} of {len(summary)} scans preprocessed"
    if len(bad):
        note += "; left out: " + "; ".join(f"{r.subject_id} ({r.status}: {r.error})"
                                          for r in bad.itertuples())
    return prep_dir / "summary.csv", note


def cohort_stage(out: Path, synth_dir: Path, summary_path: Path, split_seed: int,
                 log: Callable[[str], None], test_fraction: float = 0.25,
                 val_fraction: float = 0.2) -> tuple[Any, Path]:
    """Labels and subject-level splits (paper preset); returns (cohort, manifest path)."""
    from adni_pu.cohort import build_cohort, load_cohort_config, write_cohort

    log("[3/5] building the cohort (labels, subject-level splits)")
    cohort_cfg = load_cohort_config(values={"split": {
        "seed": split_seed, "test_fraction": test_fraction, "val_fraction": val_fraction}})
    cohort = build_cohort(synth_dir / "clinical" / "ADNIMERGE.csv", summary_path, cohort_cfg)
    paths = write_cohort(cohort, out)
    return cohort, Path(paths["manifest"])


def check_folds(fold_paths: list[Path], estimate: bool = False) -> None:
    """Refuse, before any training, folds whose training or validation split has no
    labelled positive (PU training needs both): a cohort with too few diagnosed patients
    for the number of folds (``estimate``: or too few validation scans for an estimate)."""
    from adni_pu.cohort import read_manifest

    frames = [read_manifest(path) for path in fold_paths]
    problem = fold_composition(frames, estimate)
    if problem is not None:
        raise ConfigError(f"{fold_paths[problem[0]]}: {problem[1]}; use more --subjects or "
                          "fewer --folds")


def fold_composition(frames: list[Any], estimate: bool = False) -> tuple[int, str] | None:
    """The first fold that PU training cannot run on, as (its index, why), or None
    (:func:`~adni_pu.workflows.crossval.fold_problem`; with ``estimate``, ``--prior
    estimate``, also a validation split below the estimate's minimum counts)."""
    from adni_pu.workflows.crossval import fold_problem

    for k, frame in enumerate(frames):
        why = fold_problem(frame)
        if why is None and estimate:
            why = _estimate_problem(frame)
        if why is not None:
            total = int(frame.groupby("subject_id")["pu_label"].max().sum())
            return k, (f"fold {k + 1}'s {why} (the cohort has {total} labelled positives, "
                       f"the diagnosed patients, for {len(frames)} folds)")
    return None


def _estimate_problem(frame: Any) -> str | None:
    """Why a fold's validation split is too small for a prior estimate, or None
    (:func:`adni_pu.workflows.class_prior.check_estimable_counts`)."""
    from adni_pu.workflows import class_prior

    val = frame[frame["split"].astype(str) == "val"]
    n_p = int((val["pu_label"] == 1).sum())
    n_u = len(val) - n_p
    if n_p >= class_prior.MIN_LABELLED_VAL and n_u >= class_prior.MIN_UNLABELLED_VAL:
        return None
    return (f"validation split holds {n_p} labelled positive and {n_u} unlabelled scans, "
            f"and --prior estimate needs at least {class_prior.MIN_LABELLED_VAL} and "
            f"{class_prior.MIN_UNLABELLED_VAL}")


def synthetic_manifest(settings: DemoSettings, n_subjects: int) -> tuple[Any, list[str]]:
    """The cohort manifest the demo would build from ``n_subjects`` synthetic subjects, and
    their ids in generation order, from the generator's subject table alone (no image is
    made): the cohort builder on the clinical table and a scan table like the
    preprocessing summary, as :func:`cohort_stage` builds them. Scans that fail
    preprocessing are not foreseen (:func:`check_folds` sees those)."""
    import tempfile

    import pandas as pd

    from adni_pu.cohort import build_cohort, load_cohort_config, read_manifest, write_manifest
    from adni_pu.synth import SynthConfig
    from adni_pu.synth.generate import clinical_rows
    from adni_pu.synth.subjects import make_subjects

    synth_cfg = cfgmod.from_dict(SynthConfig, dict(settings.synth))
    subjects = make_subjects(n_subjects, settings.seed, synth_cfg)
    clinical = pd.DataFrame([row for s in subjects for row in clinical_rows(s)])
    scans = pd.DataFrame([{"subject_id": s.bids_label, "session_id": v.bids_session,
                           "status": "done", "preprocessed_path":
                           f"sub-{s.bids_label}_ses-{v.bids_session}_T1w.nii.gz"}
                          for s in subjects for v in s.visits if v.has_mri])
    cfg = load_cohort_config(values={"check_scan_files": False, "split": {
        "seed": settings.seed, "test_fraction": 0.25, "val_fraction": 0.2}})
    manifest = build_cohort(clinical, scans, cfg).manifest
    with tempfile.TemporaryDirectory(prefix="adni-pu-demo-check-") as tmp:
        path = write_manifest(manifest, Path(tmp) / "manifest.csv")  # read as the demo does
        return read_manifest(path), [s.ptid for s in subjects]


def check_composition(settings: DemoSettings, search: int = 200) -> None:
    """Refuse, before any image is generated or preprocessed, a synthetic cohort whose
    folds PU training cannot run on (a fold's training or validation split without a
    labelled positive or an unlabelled subject), saying the smallest ``--subjects`` that
    works with these settings (searched up to ``search`` more subjects).

    Subject ``i`` of the generator depends only on the seed and ``i`` and is labelled on
    its own records, so the cohort of ``n`` subjects is the first ``n`` subjects' rows of
    one larger cohort: one build serves the whole search.
    """
    from adni_pu.workflows.crossval import fold_frames

    manifest, ids = synthetic_manifest(settings, settings.subjects + search)

    def problem_with(n: int, estimate: bool = settings.prior == "estimate"
                     ) -> tuple[int, str] | None:
        first = manifest[manifest["subject_id"].isin(set(ids[:n]))].reset_index(drop=True)
        try:
            return fold_composition(fold_frames(first, settings.folds, settings.seed),
                                    estimate)
        except ConfigError as exc:  # too few subjects left for the folds
            return 0, str(exc)

    problem = problem_with(settings.subjects)
    if problem is None:
        return
    if settings.prior == "estimate" and problem_with(settings.subjects, False) is None:
        # the folds train, but their validation splits are too small to estimate from: a
        # few more subjects never fix that (the demo's folds hold a handful of positives)
        raise ConfigError(f"--subjects {settings.subjects}: {problem[1]}, so the class prior "
                          "cannot be estimated on this demo's folds; use --prior cohort (the "
                          "default), or estimate it with `adni-pu prior` on a cohort whose "
                          "validation split is large enough. Checked before generating any "
                          "scan")
    for n in range(settings.subjects + 1, settings.subjects + search + 1):
        if problem_with(n) is None:
            fix = (f"the smallest --subjects that works with --folds {settings.folds} and "
                   f"--seed {settings.seed} is {n}")
            break
    else:
        fix = (f"no --subjects up to {settings.subjects + search} works with --folds "
               f"{settings.folds} and --seed {settings.seed}; use fewer --folds or a "
               "composition with more patients (--set synth.dx_proportions=...)")
    what = ("trained with an estimated prior" if settings.prior == "estimate" else "trained")
    raise ConfigError(f"--subjects {settings.subjects}: {problem[1]}, so a fold cannot be "
                      f"{what}; {fix} (or use fewer --folds). Checked before generating "
                      "any scan")


def train_method(manifest: Path, method: str, run_dir: Path, settings: dict[str, Any],
                 log: Callable[[str], None] = lambda m: None,
                 overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Train one preset on one fold, score its test split; returns the fold's record.

    ``log`` gets the trainer's lines (one per epoch). The record holds the held-out
    per-subject predictions, the validation AUC that chose the model, and for nnPU-type
    losses the share of batches where the non-negative correction fired.
    """
    import pandas as pd

    from adni_pu.pu.metrics import binary_metrics
    from adni_pu.pu.recorders import nn_correction_summary
    from adni_pu.workflows.evaluate import evaluate_run
    from adni_pu.workflows.train import train_volumes
    from adni_pu.workflows.volume_settings import load_volume_config

    tic = time.perf_counter()
    cfg = load_volume_config(None, list(overrides), preset=method, values=settings)
    fit = train_volumes(manifest, cfg, run_dir, log=log)
    evaluate_run(run_dir, "test", n_boot=0)
    subjects = pd.read_csv(run_dir / "evaluation" / "test" / "predictions_subjects.csv",
                           dtype={"subject_id": str})
    val = pd.read_csv(run_dir / "val_predictions.csv", dtype={"subject_id": str})
    val = val.groupby("subject_id").agg(logit=("logit", "mean"), truth=("truth", "first"))
    fired = nn_correction_summary(fit.history)
    return {"best_epoch": fit.best_epoch + 1, "candidate": fit.best_candidate,
            "seconds": time.perf_counter() - tic,
            "val_auc": binary_metrics(val["logit"].to_numpy(), val["truth"].to_numpy())["auc"],
            "nn_correction": fired["share"] if fired else None,
            "nn_correction_column": fired["columns"][0] if fired else None,
            "nn_correction_summary": fired,
            "predictions": subjects[["subject_id", "pu_label", "logit", "truth"]
                                    ].to_dict("records")}


@holding_output_lock("demo", lambda args: args["settings"].out)  # adni_pu.locking
def run_demo(settings: DemoSettings, log: Callable[[str], None] = print) -> Path:
    """Run every stage (each resumes if its output is already there); return report.md."""
    import numpy as np
    import pandas as pd

    from adni_pu.cohort import counts_table, read_manifest
    from adni_pu.pu.plots import roc_plot
    from adni_pu.workflows.crossval import fold_manifests
    from adni_pu.workflows.demo_report import render_report

    settings.check_training_settings()
    check_composition(settings)  # every fold trainable: before any scan is made
    out = fileio.check_out_dir(settings.out, "the demo's files")
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    start = tic = time.perf_counter()
    synth_dir = generate_stage(out, settings, log)
    times["generate"] = time.perf_counter() - tic
    tic = time.perf_counter()
    summary_path, prep_note = preprocess_stage(out, synth_dir, settings, log)
    times["preprocess"] = time.perf_counter() - tic
    tic = time.perf_counter()
    cohort, manifest = cohort_stage(out / "cohort", synth_dir, summary_path, settings.seed, log)
    fold_paths = fold_manifests(read_manifest(manifest), settings.folds, settings.seed,
                                out / "cohort" / "folds")
    check_folds(fold_paths, settings.prior == "estimate")
    times["cohort"] = time.perf_counter() - tic

    tic = time.perf_counter()
    n_runs = settings.folds * len(settings.methods)
    estimating = settings.prior == "estimate"  # one more (naive) run per fold
    log(f"[4/5] training {', '.join(settings.methods)} on {settings.folds} folds "
        f"({n_runs} runs of {settings.epochs} epochs"
        + (", after a prior estimate per fold)" if estimating else ")"))
    progress = StageProgress((n_runs + settings.folds * estimating) * settings.epochs, log,
                             "epoch")

    def stage_log(where: str) -> Callable[[str], None]:
        def fold_log(msg: str) -> None:
            if msg.startswith("epoch "):
                progress.step(f"({where}, {msg.removeprefix('epoch ')})")
            else:
                log(f"      {where}: {msg}")
        return fold_log

    folds: dict[str, list[dict[str, Any]]] = {m: [] for m in settings.methods}
    priors, estimates = [], []
    for k, path in enumerate(fold_paths):
        if estimating:
            values = method_settings(settings.epochs, settings.seed, settings.threads,
                                     out / "cache")
            extra, prior_note, prior, record = estimated_demo_prior(
                path, values, settings.overrides, out / "prior" / f"fold{k}",
                stage_log(f"prior estimate fold {k + 1}/{settings.folds}"), settings.bootstrap)
            estimates.append(record)
        else:
            extra, prior_note, prior = demo_prior(read_manifest(path))
        priors.append((prior, prior_note))
        for method in settings.methods:
            fold_log = stage_log(f"{method} fold {k + 1}/{settings.folds}")
            values = method_settings(settings.epochs, settings.seed, settings.threads,
                                     out / "cache", extra)
            folds[method].append(train_method(path, method, out / "runs" / method / f"fold{k}",
                                              values, fold_log, settings.overrides))
    results = {m: pool_method(f, settings.bootstrap) for m, f in folds.items()}
    for method, r in results.items():
        times[f"train+evaluate {method}"] = r["seconds"]
    first = pd.DataFrame(next(iter(results.values()))["predictions"])
    references = reference_scores(out / "cohort", synth_dir, fold_paths, first,
                                  settings.bootstrap)
    curves = {m: (np.asarray([p["logit"] for p in r["predictions"]], float),
                  np.asarray([p["truth"] for p in r["predictions"]], float))
              for m, r in {**results, **references}.items()}
    roc_plot(None, None, out / "roc.png", title="held-out subjects, all folds",  # type: ignore[arg-type]
             curves=curves)
    times["total"] = time.perf_counter() - start

    log("[5/5] writing the report")
    counts = counts_table(read_manifest(fold_paths[0]))
    report = out / "report.md"
    fileio.atomic_write_text(report, render_report(
        settings=settings, results=results, references=references, times=times,
        prep_note=prep_note, priors=priors, counts=counts.to_string(index=False),
        prior_source=settings.prior))
    fileio.atomic_write_text(out / "demo.json", json.dumps(
        {"settings": cfgmod.to_dict(settings), "times_s": times, "results": results,
         "references": references,
         **({"prior_estimates": estimates} if estimating else {})},
        indent=2, default=str) + "\n")
    log(f"done in {times['total']:.0f} s")
    return report

"""``adni-pu demo``: the whole ADNI path on a synthetic cohort, on a small budget.

generate (``adni_pu.synth``) -> preprocess (``adni_pu.preprocessing``, the real pipeline;
``preprocessing="ideal"`` uses the generator's perfect model-grid volumes instead, a
fallback for machines where preprocessing is too slow) -> build the cohort
(``adni_pu.cohort``) -> the product's comparison of methods (``adni-pu benchmark cohort``,
:mod:`adni_pu.workflows.compare`: every method on the same subject-level folds, each
held-out subject scored once by the fold that held it out, pooled, with paired
differences and calibration) -> ``report.md`` with the pooled results table, reference
lines, an ROC plot, an explanation and the time of every stage.

The defaults aim at 10 minutes on a 2-core CPU: 100 subjects with one baseline scan each
at 3 mm and disease effects within published ADNI effect sizes (docs/volumes.md, "Effect
sizes"), fast registration and skull-stripping settings, a slim 3-branch CNN (8 and 16
channels, each branch ending in a global average pool, the hippocampus branches pooling
inside the atlas hippocampus; the brain at 40^3, batch 8), the pipeline's cached stage
shared by all runs (disk cache), 2-fold cross-validation over all subjects and 8 epochs
per run. The training budget and what the report reads from the comparison are
:mod:`adni_pu.workflows.demo_policy`; the report (:mod:`adni_pu.workflows.demo_report`)
puts the reference lines beside the methods and explains the numbers. The comparison
folder ``OUT/comparison`` is an ordinary one: ``adni-pu benchmark cohort-report``,
``predict --method``, ``evaluate`` and ``interpret`` work on it.
"""

from __future__ import annotations

import dataclasses
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
from adni_pu.workflows.compare.references import LOGISTIC
from adni_pu.workflows.demo_policy import (
    TRUTH_LINE,
    method_results,
    method_settings,
    truth_reference,
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
#: The comparison's settings file: the demo budget (:func:`training_file`).
TRAINING_FILE = "demo_training.toml"


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
    """The class prior of each fold's PU methods, resolved as ``adni-pu train`` resolves it:
    "cohort", the positive share of the fold's training subjects with a truth; "estimate",
    estimated from the fold's PU data alone (each PU piece's own P-vs-U classifier), as a
    study without amyloid PET must."""
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

        values = method_settings(self.epochs, self.threads, self.out / "cache")
        for method in self.methods:
            load_volume_config(None, list(self.overrides), preset=method,
                               values={**values, "train": {**values["train"], "seed": self.seed}})


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


def planned_folds(settings: DemoSettings) -> list[dict[str, list[str]]]:
    """The subjects of each fold's train, val and test split that the demo with these
    settings will use, from the generator's subject table alone (no image is made; scans
    that fail preprocessing are not foreseen): the cheap part of the demo's record, which
    the test suite compares at full size (:mod:`benchmarks.demo_guard`)."""
    from adni_pu.workflows.compare.folds import fold_frames

    manifest, _ = synthetic_manifest(settings, settings.subjects)
    frames, _ = fold_frames(manifest, settings.folds, settings.seed, set())
    return [{split: sorted(set(f.loc[f["split"] == split, "subject_id"].astype(str)))
             for split in ("train", "val", "test")} for f in frames]


def comparison_spec(settings: DemoSettings, manifest: Path) -> Any:
    """The comparison the demo runs (``adni-pu benchmark cohort``): its methods on
    ``settings.folds`` folds of the cohort with one training seed, the demo's seed, which
    also draws the folds; the demo budget comes from its settings file
    (:func:`training_file`), the user's ``--set`` after it."""
    from adni_pu.workflows.compare.pieces import CompareSpec

    out = Path(settings.out)
    return CompareSpec(manifest=str(manifest), out=str(out / "comparison"),
                       methods=tuple(settings.methods), folds=settings.folds, seeds=1,
                       fold_seed=settings.seed, first_seed=settings.seed, prior=settings.prior,
                       config_file=str(out / TRAINING_FILE), overrides=tuple(settings.overrides))


def training_file(settings: DemoSettings) -> Path:
    """Write the demo budget's training settings as the comparison's settings file
    (``OUT/demo_training.toml``), unless it already holds them."""
    path = Path(settings.out) / TRAINING_FILE
    text = cfgmod.dumps_toml(method_settings(settings.epochs, settings.threads,
                                             Path(settings.out) / "cache"))
    if not (path.is_file() and path.read_text() == text):
        fileio.atomic_write_text(path, text)
    return path


def fold_problem(settings: DemoSettings, manifest: Any) -> str | None:
    """Why the comparison would refuse this cohort's folds, or None: the comparison's own
    checks (:func:`adni_pu.workflows.compare.folds.workable_folds`: every fold's training
    and validation split holds a labelled positive and an unlabelled subject;
    :func:`~adni_pu.workflows.compare.pieces.check_priors`: the class prior resolves in
    every fold, from the cohort or, with ``--prior estimate``, from enough validation
    scans)."""
    from adni_pu.workflows.compare.folds import fold_frames, subject_table, workable_folds
    from adni_pu.workflows.compare.pieces import check_priors

    problem = workable_folds(subject_table(manifest), settings.folds, settings.seed)
    if problem is not None:
        return problem
    frames, _ = fold_frames(manifest, settings.folds, settings.seed, set())
    spec = comparison_spec(settings, Path("manifest.csv"))
    try:
        check_priors(dataclasses.replace(spec, config_file=None), frames, "the cohort")
    except ConfigError as exc:
        return str(exc).removeprefix("the cohort: ")
    return None


def check_composition(settings: DemoSettings, search: int = 200) -> None:
    """Refuse, before any image is generated or preprocessed, a synthetic cohort whose
    folds the comparison would refuse (:func:`fold_problem`), saying the smallest
    ``--subjects`` that works with these settings (searched up to ``search`` more subjects).

    Subject ``i`` of the generator depends only on the seed and ``i`` and is labelled on
    its own records, so the cohort of ``n`` subjects is the first ``n`` subjects' rows of
    one larger cohort: one build serves the whole search.
    """
    manifest, ids = synthetic_manifest(settings, settings.subjects + search)

    def problem_with(n: int, prior: str = settings.prior) -> str | None:
        first = manifest[manifest["subject_id"].isin(set(ids[:n]))].reset_index(drop=True)
        return fold_problem(dataclasses.replace(settings, prior=prior), first)

    problem = problem_with(settings.subjects)
    if problem is None:
        return
    if settings.prior == "estimate" and problem_with(settings.subjects, "cohort") is None:
        # the folds train, but their validation splits are too small to estimate from: a
        # few more subjects never fix that (the demo's folds hold a handful of positives)
        raise ConfigError(f"--subjects {settings.subjects}: {problem}, so the class prior "
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
    raise ConfigError(f"--subjects {settings.subjects}: {problem}, so a fold cannot be "
                      f"trained; {fix} (or use fewer --folds). Checked before generating "
                      "any scan")


def comparison_stage(spec: Any, settings: DemoSettings, log: Callable[[str], None]
                     ) -> dict[str, Any]:
    """Run the comparison's pieces (each resumes) and write its report; returns
    ``report.json``'s record. ``log`` gets a line per epoch with the time left."""
    from adni_pu.locking import output_lock
    from adni_pu.workflows.class_prior import reads_no_prior
    from adni_pu.workflows.compare.pieces import Piece, piece_config, run_comparison
    from adni_pu.workflows.compare.report import write_report

    estimating = [m for m in settings.methods if settings.prior == "estimate" and not
                  reads_no_prior(m, piece_config(spec, Piece(m, 0, 0)).train.val_criterion)]
    n_runs = settings.folds * len(settings.methods)
    log(f"[4/5] comparing {', '.join(settings.methods)} on {settings.folds} folds "
        f"({n_runs} runs of {settings.epochs} epochs"
        + (f", {', '.join(estimating)} after a prior estimate each)" if estimating else ")"))
    progress = StageProgress((n_runs + settings.folds * len(estimating)) * settings.epochs,
                             log, "epoch")
    where = [""]

    def piece_log(msg: str) -> None:
        if msg.startswith("piece ") and ": " in msg:
            method, fold, _ = msg.split(": ", 1)[1].split("/")
            where[0] = f"{method} fold {int(fold.removeprefix('fold-')) + 1}/{settings.folds}"
        elif msg.startswith(("epoch ", "prior classifier: epoch ")):  # a run's or its estimate's
            progress.step(f"({where[0]}, {msg.replace('epoch ', '', 1)})")
        else:
            log(f"      {where[0]}: {msg}")

    with output_lock(Path(spec.out), "benchmark cohort"):
        run_comparison(spec, log=piece_log)
        write_report(Path(spec.out), None, settings.bootstrap, "adni-pu demo")
    return json.loads((Path(spec.out) / "report.json").read_text())  # type: ignore[no-any-return]


@holding_output_lock("demo", lambda args: args["settings"].out)  # adni_pu.locking
def run_demo(settings: DemoSettings, log: Callable[[str], None] = print) -> Path:
    """Run every stage (each resumes if its output is already there); return report.md."""
    import numpy as np

    from adni_pu.cohort import counts_table, read_manifest
    from adni_pu.pu.plots import roc_plot
    from adni_pu.workflows.compare.pieces import fold_manifest
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
    _, manifest = cohort_stage(out / "cohort", synth_dir, summary_path, settings.seed, log)
    training_file(settings)
    spec = comparison_spec(settings, manifest)
    times["cohort"] = time.perf_counter() - tic

    tic = time.perf_counter()
    report = comparison_stage(spec, settings, log)
    results = {m: method_results(spec, report, m) for m in settings.methods}
    for method, r in results.items():
        times[f"train+evaluate {method}"] = r["seconds"]
    times["compare (report)"] = (time.perf_counter() - tic
                                 - sum(r["seconds"] for r in results.values()))
    logistic = report["references"].get(LOGISTIC, {})
    references = {}
    if "metrics" in logistic:
        references[LOGISTIC] = {"pooled": {k: v for k, v in logistic.items()
                                           if k != "predictions"},
                                "predictions": logistic["predictions"]}
    first = next(iter(results.values()))["predictions"]
    references[TRUTH_LINE] = truth_reference(synth_dir, first, settings.bootstrap)
    curves = {m: (np.asarray([p["logit"] for p in r["predictions"]], float),
                  np.asarray([np.nan if p["truth"] is None else p["truth"]
                              for p in r["predictions"]], float))
              for m, r in {**results, TRUTH_LINE: references[TRUTH_LINE]}.items()}
    roc_plot(np.zeros(0), np.zeros(0), out / "roc.png",
             title="held-out subjects, all folds", curves=curves)
    times["total"] = time.perf_counter() - start

    log("[5/5] writing the report")
    counts = counts_table(read_manifest(fold_manifest(Path(spec.out), 0)))
    path = out / "report.md"
    fileio.atomic_write_text(path, render_report(
        settings=settings, results=results, references=references, times=times,
        prep_note=prep_note, counts=counts.to_string(index=False), comparison=report))
    fileio.atomic_write_text(out / "demo.json", json.dumps(
        {"settings": cfgmod.to_dict(settings), "times_s": times, "results": results,
         "references": references, "comparison": "comparison/report.json"},
        indent=2, default=str) + "\n")
    log(f"done in {times['total']:.0f} s")
    return path

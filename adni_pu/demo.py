"""``adni-pu demo``: the whole ADNI path on a synthetic cohort, on a small budget.

generate (``adni_pu.synth``) -> preprocess (``adni_pu.preprocessing``, the real pipeline;
``preprocessing="ideal"`` uses the generator's perfect model-grid volumes instead, a
fallback for machines where preprocessing is too slow) -> build the cohort
(``adni_pu.cohort``) -> train each method (``adni_pu.volume_run``) -> evaluate on the test
subjects -> ``report.md`` with the results table, an ROC plot and the time of every stage.

The defaults aim at about 10 minutes on a 2-core CPU: 32 subjects with one baseline scan
each at 3 mm, fast registration settings, a slim 3-branch CNN (8 and 16 channels), the
pipeline's cached stage shared by all methods (disk cache) and 12 epochs per method.
Results on so few subjects are noisy; the demo shows the workflow, not the methods'
accuracy.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adni_pu import config as cfgmod

# Preprocessing settings for small synthetic heads, from docs/preprocessing.md.
FAST_PREPROCESSING: tuple[str, ...] = (
    "registration.resolution_mm=4.0", "registration.iterations=[50,20]",
    "registration.shrink_factors=[2,1]", "registration.smoothing_sigmas=[1.0,0.0]",
    "qc.min_brain_ml=400.0",
)
# Training settings of the small budget (applied before the user's --set overrides).
DEMO_TRAINING: tuple[str, ...] = (
    "train.batch_size=16", "train.eval_batch_size=16", "train.lr=0.001",
    "train.progress=false", "train.model_args.channels=[8, 16]", "train.model_args.hidden=64",
    "bootstrap=1000",
)


@dataclass
class DemoSettings:
    """What the demo runs."""

    subjects: int = 32
    out: Path = Path("adni-pu-demo")
    preprocessing: str = "real"
    epochs: int = 12
    methods: tuple[str, ...] = ("naive", "upu", "nnpu", "selfpu")
    seed: int = 0
    workers: int = 2
    threads: int = 2
    overrides: tuple[str, ...] = ()
    synth: dict[str, Any] = field(default_factory=lambda: {
        "voxel_size": 3.0, "visit_probabilities": [1.0, 0.0, 0.0], "write_brain_masks": False,
        # clearer disease effects than the realistic defaults, so a small run shows signal
        "hippocampal_atrophy": 0.6, "preclinical_fraction": 0.25,
    })

    def __post_init__(self) -> None:
        if self.preprocessing not in ("real", "ideal"):
            raise ValueError(f"preprocessing: expected 'real' or 'ideal', found "
                             f"{self.preprocessing!r}")
        if self.subjects < 12:
            raise ValueError(f"subjects={self.subjects}: the demo needs at least 12 (train, "
                             "val and test each need labelled and unlabelled subjects)")
        if not self.methods:
            raise ValueError("methods: expected at least one training preset")
        self.out = Path(self.out)


def _selfpu_schedule(epochs: int) -> list[str]:
    """Self-PU phases scaled to a short run: warm-up 1/4, self-paced to 2/3, then distillation."""
    warmup = max(1, epochs // 4)
    end = max(warmup + 1, (2 * epochs) // 3)
    return [f"train.selfpu.warmup_epochs={warmup}", f"train.selfpu.self_paced_end={end}",
            "train.selfpu.select_every=1",
            f"train.selfpu.teacher_rampup_epochs={max(1, (epochs - end) // 2)}"]


def run_demo(settings: DemoSettings, log: Callable[[str], None] = print) -> Path:
    """Run every stage (each resumes if its output is already there); return report.md."""
    import pandas as pd

    out = settings.out
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    start = time.perf_counter()

    # 1. synthetic cohort
    tic = time.perf_counter()
    synth_dir = out / "synth"
    from adni_pu.synth import SynthConfig, generate_cohort

    synth_cfg = cfgmod.from_dict(SynthConfig, {
        **settings.synth, "ideal_preprocessed": settings.preprocessing == "ideal"})
    if not (synth_dir / "synth_config.toml").is_file():
        log(f"[1/5] generating {settings.subjects} synthetic subjects in {synth_dir}")
        generate_cohort(synth_dir, settings.subjects, settings.seed, synth_cfg)
    times["generate"] = time.perf_counter() - tic

    # 2. preprocessing
    tic = time.perf_counter()
    prep_note = "ideal model-grid volumes from the generator (no preprocessing)"
    if settings.preprocessing == "real":
        from adni_pu.preprocessing import load_config, run_preprocessing

        prep_dir = out / "preprocessed"
        log(f"[2/5] preprocessing the raw scans into {prep_dir} ({settings.workers} workers)")
        prep_cfg = load_config(None, list(FAST_PREPROCESSING))
        summary = run_preprocessing(synth_dir / "bids", prep_dir, prep_cfg,
                                    workers=settings.workers, threads_per_worker=1,
                                    progress=False)
        bad = summary[~summary["status"].isin(["done", "skipped"])]
        if len(bad):
            log(f"      {len(bad)} scan(s) failed preprocessing (left out): "
                + "; ".join(f"{r.subject_id}: {r.error}" for r in bad.head(3).itertuples()))
        summary_path = prep_dir / "summary.csv"
        prep_note = (f"{len(summary) - len(bad)} of {len(summary)} scans preprocessed"
                     + ("; left out: " + "; ".join(f"{r.subject_id} ({r.status}: {r.error})"
                                                   for r in bad.itertuples()) if len(bad) else ""))
    else:
        log("[2/5] using the generator's ideal model-grid volumes (no preprocessing)")
        summary_path = synth_dir / "preprocessed_ideal" / "summary.csv"
    times["preprocess"] = time.perf_counter() - tic

    # 3. cohort
    tic = time.perf_counter()
    from adni_pu.cohort import build_cohort, counts_table, load_cohort_config, write_cohort

    log("[3/5] building the cohort (labels, subject-level splits)")
    cohort_cfg = load_cohort_config(None, [f"split.seed={settings.seed}",
                                           "split.test_fraction=0.25",
                                           "split.val_fraction=0.2"])
    cohort = build_cohort(synth_dir / "clinical" / "ADNIMERGE.csv", summary_path, cohort_cfg)
    paths = write_cohort(cohort, out / "cohort")
    manifest = Path(paths["manifest"])
    counts = counts_table(cohort.manifest)
    times["cohort"] = time.perf_counter() - tic

    # 4. training and evaluation
    from adni_pu.volume_run import (
        METRICS,
        cohort_prior,
        evaluate_run,
        format_ci,
        load_volume_config,
        roc_plot,
        train_volumes,
    )

    frame = cohort.manifest.copy()
    frame["split"] = frame["split"].astype(str)
    prior, _, _ = cohort_prior(frame)
    train_rows = frame[frame["split"] == "train"]
    labelled_fraction = float((train_rows["pu_label"] == 1).mean())
    prior_note = f"{prior:.3f} (cohort: amyloid-positive fraction of training subjects with truth)"
    extra: list[str] = []
    if prior <= labelled_fraction + 0.02:
        prior = min(labelled_fraction + 0.05, 0.95)
        extra.append(f"prior={prior:.4f}")
        prior_note = (f"{prior:.3f} (set: the cohort's value was not above the labelled "
                      f"fraction {labelled_fraction:.3f} of the training scans)")
    results: dict[str, dict[str, Any]] = {}
    curves: dict[str, tuple] = {}
    for i, method in enumerate(settings.methods):
        tic = time.perf_counter()
        log(f"[4/5] training {method} ({i + 1}/{len(settings.methods)}, "
            f"{settings.epochs} epochs)")
        overrides = [*DEMO_TRAINING, f"train.epochs={settings.epochs}",
                     'data.cache="disk"', f'data.cache_dir="{(out / "cache").resolve()}"',
                     f"train.threads={settings.threads}", f"train.seed={settings.seed}",
                     *(_selfpu_schedule(settings.epochs)), *extra, *settings.overrides]
        cfg = load_volume_config(None, overrides, preset=method)
        run_dir = out / "runs" / method
        fit = train_volumes(manifest, cfg, run_dir, log=lambda m: None)
        result = evaluate_run(run_dir, "test")
        preds = pd.read_csv(run_dir / "evaluation" / "test" / "predictions_scans.csv")
        curves[method] = (preds["logit"].to_numpy(), preds["truth"].to_numpy())
        results[method] = {"best_epoch": fit.best_epoch + 1, "candidate": fit.best_candidate,
                           "metrics": result["scan_level"], "n_scored": result["n_scans_scored"],
                           "n_unknown": result["n_subjects_unknown_truth"],
                           "seconds": time.perf_counter() - tic}
        times[f"train+evaluate {method}"] = results[method]["seconds"]
    roc_plot(None, None, out / "roc.png", title="test split", curves=curves)  # type: ignore[arg-type]
    times["total"] = time.perf_counter() - start

    # 5. report
    log("[5/5] writing the report")
    lines = ["# adni-pu demo", "",
             f"Synthetic ADNI-like cohort of {settings.subjects} subjects (seed "
             f"{settings.seed}), preprocessing: **{settings.preprocessing}**, "
             f"{settings.epochs} epochs per method. Small data and a small budget: the numbers "
             "show the workflow, not the methods' accuracy.", "",
             "## Results on the test subjects", "",
             "Point estimate [95 % CI, percentile bootstrap over subjects, 1000 resamples].", "",
             "| method | " + " | ".join(m.replace("_", " ") for m in METRICS)
             + " | selected | seconds |",
             "|---|" + "---|" * (len(METRICS) + 2)]
    for method, r in results.items():
        cells = [format_ci(r["metrics"][m]) for m in METRICS]
        lines.append(f"| {method} | " + " | ".join(cells)
                     + f" | {r['candidate']} @ {r['best_epoch']} | {r['seconds']:.0f} |")
    first = next(iter(results.values()))
    lines += ["", f"{first['n_scored']} test scans with known truth; {first['n_unknown']} "
              "test subject(s) left out for unknown truth.", "", "![ROC](roc.png)", "",
              "## Cohort", "", f"Preprocessing: {prep_note}.", "",
              f"Class prior used: {prior_note}.", "",
              "```\n" + counts.to_string(index=False) + "\n```", "",
              "Full cohort report: `cohort/cohort_report.md`.", "",
              "## Time per stage (seconds)", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in times.items()]
    lines += ["", "## Files", "",
              "- `synth/`: raw BIDS scans, ADNIMERGE-style table, truth",
              "- `preprocessed/`: `adni-pu preprocess` output (real preprocessing only)",
              "- `cohort/`: manifest and cohort report",
              "- `runs/<method>/`: run folders (training curves `curves.png`, "
              "`evaluation/test/report.md`)", ""]
    report = out / "report.md"
    cfgmod.atomic_write_text(report, "\n".join(lines))
    cfgmod.atomic_write_text(out / "demo.json", json.dumps(
        {"settings": cfgmod.to_dict(settings), "times_s": times,
         "results": {k: {**v, "metrics": v["metrics"]} for k, v in results.items()}},
        indent=2, default=str) + "\n")
    log(f"done in {times['total']:.0f} s")
    return report

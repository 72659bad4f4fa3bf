"""``adni-pu demo``: the whole ADNI path on a synthetic cohort, on a small budget.

generate (``adni_pu.synth``) -> preprocess (``adni_pu.preprocessing``, the real pipeline;
``preprocessing="ideal"`` uses the generator's perfect model-grid volumes instead, a
fallback for machines where preprocessing is too slow) -> build the cohort
(``adni_pu.cohort``) -> train each method (``adni_pu.workflows.train``) -> evaluate on the test
subjects -> ``report.md`` with the results table, an ROC plot and the time of every stage.

The defaults aim at well under 10 minutes on a 2-core CPU: 48 subjects with one baseline
scan each at 3 mm, fast registration settings, a slim 3-branch CNN (8 and 16 channels), the
pipeline's cached stage shared by all methods (disk cache) and 16 epochs per method. The
disease effects are stronger than the generator's realistic defaults so that 26 training
scans carry a learnable signal; results on so few subjects are still noisy, and the demo
shows the workflow, not the methods' accuracy (see benchmarks/demo_cohort.py for that).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adni_pu import config as cfgmod
from adni_pu.errors import ConfigError, OutputError

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

    subjects: int = 48
    out: Path = Path("adni-pu-demo")
    preprocessing: str = "real"
    epochs: int = 16
    methods: tuple[str, ...] = ("naive", "upu", "nnpu", "selfpu")
    seed: int = 0
    workers: int = 2
    threads: int = 2
    overrides: tuple[str, ...] = ()
    synth: dict[str, Any] = field(default_factory=lambda: {
        "voxel_size": 3.0, "visit_probabilities": [1.0, 0.0, 0.0], "write_brain_masks": False,
        # much clearer disease effects than the realistic defaults, so that a run on 26
        # training scans learns something (measured: docs/training.md, "Demo")
        "hippocampal_atrophy": 0.8, "cortical_atrophy": 0.5, "ventricle_enlargement_mm": 8.0,
        "preclinical_fraction": 0.1, "atrophy_noise": 0.03,
    })

    def __post_init__(self) -> None:
        if self.preprocessing not in ("real", "ideal"):
            raise ConfigError(f"preprocessing: expected 'real' or 'ideal', found "
                             f"{self.preprocessing!r}")
        if self.subjects < 12:
            raise ConfigError(f"subjects={self.subjects}: the demo needs at least 12 (train, "
                             "val and test each need labelled and unlabelled subjects)")
        from adni_pu.pu.config import PRESETS

        unknown = [m for m in self.methods if m not in PRESETS]
        if not self.methods or unknown:
            raise ConfigError(f"methods: expected training presets from {sorted(PRESETS)}, "
                             f"found {list(self.methods)}")
        self.out = Path(self.out)


def _selfpu_schedule(epochs: int) -> list[str]:
    """Self-PU phases scaled to a short run: warm-up 1/4, self-paced to 2/3, then distillation."""
    warmup = max(1, epochs // 4)
    end = max(warmup + 1, (2 * epochs) // 3)
    return [f"train.selfpu.warmup_epochs={warmup}", f"train.selfpu.self_paced_end={end}",
            "train.selfpu.select_every=1",
            f"train.selfpu.teacher_rampup_epochs={max(1, (epochs - end) // 2)}"]


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
        cfgmod.atomic_write_text(synth_dir / "demo_cohort.json", json.dumps(wanted) + "\n")
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
    prep_cfg = load_config(None, list(FAST_PREPROCESSING))
    summary = run_preprocessing(synth_dir / "bids", prep_dir, prep_cfg,
                                workers=settings.workers, threads_per_worker=1, progress=False)
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
                 log: Callable[[str], None]) -> tuple[Any, Path]:
    """Labels and subject-level splits (paper preset); returns (cohort, manifest path)."""
    from adni_pu.cohort import build_cohort, load_cohort_config, write_cohort

    log("[3/5] building the cohort (labels, subject-level splits)")
    cohort_cfg = load_cohort_config(None, [f"split.seed={split_seed}",
                                           "split.test_fraction=0.25",
                                           "split.val_fraction=0.2"])
    cohort = build_cohort(synth_dir / "clinical" / "ADNIMERGE.csv", summary_path, cohort_cfg)
    paths = write_cohort(cohort, out)
    return cohort, Path(paths["manifest"])


def demo_prior(manifest_frame: Any) -> tuple[list[str], str, float]:
    """The class prior from the cohort, raised above the labelled fraction when a small
    cohort puts it at or below (PU risks need prior > labelled fraction).

    Returns (extra ``--set`` overrides, a note for the report, the prior).
    """
    from adni_pu.workflows.train import cohort_prior

    frame = manifest_frame.copy()
    frame["split"] = frame["split"].astype(str)
    prior, _, _ = cohort_prior(frame)
    train_rows = frame[frame["split"] == "train"]
    labelled_fraction = float((train_rows["pu_label"] == 1).mean())
    note = f"{prior:.3f} (cohort: amyloid-positive fraction of training subjects with truth)"
    if prior > labelled_fraction + 0.02:
        return [], note, prior
    prior = min(labelled_fraction + 0.05, 0.95)
    return ([f"prior={prior:.4f}"], f"{prior:.3f} (set: the cohort's value was not above "
            f"the labelled fraction {labelled_fraction:.3f} of the training scans)", prior)


def method_overrides(method: str, epochs: int, seed: int, threads: int, cache_dir: Path,
                     extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The ``--set`` list of one method's run on the demo budget (``extra`` last)."""
    return [*DEMO_TRAINING, f"train.epochs={epochs}", 'data.cache="disk"',
            f'data.cache_dir="{cache_dir.resolve()}"', f"train.threads={threads}",
            f"train.seed={seed}", *_selfpu_schedule(epochs),
            *extra]


def train_method(manifest: Path, method: str, run_dir: Path, overrides: list[str]
                 ) -> dict[str, Any]:
    """Train one preset, evaluate it on the test split; returns its results record."""
    import pandas as pd

    from adni_pu.workflows.evaluate import evaluate_run
    from adni_pu.workflows.train import load_volume_config, train_volumes

    tic = time.perf_counter()
    cfg = load_volume_config(None, overrides, preset=method)
    fit = train_volumes(manifest, cfg, run_dir, log=lambda m: None)
    result = evaluate_run(run_dir, "test")
    preds = pd.read_csv(run_dir / "evaluation" / "test" / "predictions_scans.csv")
    return {"best_epoch": fit.best_epoch + 1, "candidate": fit.best_candidate,
            "metrics": result["scan_level"], "subject_metrics": result["subject_level"],
            "n_scored": result["n_scans_scored"],
            "n_unknown": result["n_subjects_unknown_truth"],
            "seconds": time.perf_counter() - tic,
            "logits": preds["logit"].tolist(), "truth": preds["truth"].tolist()}


def run_demo(settings: DemoSettings, log: Callable[[str], None] = print) -> Path:
    """Run every stage (each resumes if its output is already there); return report.md."""
    import numpy as np

    from adni_pu.cohort import counts_table
    from adni_pu.pu.metrics import format_ci
    from adni_pu.pu.plots import roc_plot
    from adni_pu.workflows.evaluate import METRICS

    out = settings.out
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
    counts = counts_table(cohort.manifest)
    times["cohort"] = time.perf_counter() - tic

    extra, prior_note, _ = demo_prior(cohort.manifest)
    results: dict[str, dict[str, Any]] = {}
    for i, method in enumerate(settings.methods):
        log(f"[4/5] training {method} ({i + 1}/{len(settings.methods)}, "
            f"{settings.epochs} epochs)")
        overrides = method_overrides(method, settings.epochs, settings.seed, settings.threads,
                                     out / "cache", [*extra, *settings.overrides])
        results[method] = train_method(manifest, method, out / "runs" / method, overrides)
        times[f"train+evaluate {method}"] = results[method]["seconds"]
    curves = {m: (np.asarray(r["logits"]), np.asarray(r["truth"])) for m, r in results.items()}
    roc_plot(None, None, out / "roc.png", title="test split", curves=curves)  # type: ignore[arg-type]
    times["total"] = time.perf_counter() - start

    # 5. report
    log("[5/5] writing the report")
    lines = ["# adni-pu demo", "",
             f"Synthetic ADNI-like cohort of {settings.subjects} subjects (seed "
             f"{settings.seed}), preprocessing: **{settings.preprocessing}**, "
             f"{settings.epochs} epochs per method. Small data and a small budget: the numbers "
             "show the workflow, not the methods' accuracy (a dozen test subjects; see "
             "\"Demo\" in docs/training.md of adni-pu, and benchmarks/demo_cohort.py for "
             "a comparison on 240 subjects over seeds).", "",
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
         "results": results},
        indent=2, default=str) + "\n")
    log(f"done in {times['total']:.0f} s")
    return report

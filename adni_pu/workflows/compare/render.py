"""The comparison report as Markdown, its reliability diagram, and its results files in the
format ``adni-pu benchmark table`` reads (one per method, the pooled held-out predictions of
each seed as that seed's test results)."""

from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path
from typing import Any

from adni_pu.pu.metrics import format_ci, mean_std, metric_label
from adni_pu.workflows.compare.scores import METRICS, PAIRED_METRICS


def _ci(entry: dict[str, Any]) -> str:
    return format_ci(entry)


def _signed(v: float) -> str:
    return "n/a" if v is None or math.isnan(v) else f"{v:+.3f}"


def render(report: dict[str, Any]) -> str:
    """``report.md``: pooled held-out metrics, paired differences, references, the prior
    per fold, calibration and the fixed test set."""
    s = report["settings"]
    if s.get("holdout") is not None:
        lines = ["# Which method on this cohort: repeated hold-out comparison", "",
                 f"Manifest `{report['manifest']}`; per seed its own split by subject "
                 f"(stratified on the PU label and truth; the seed splits and trains): "
                 f"{s['holdout']} subjects held out, {s['val_fraction'] or 0.15:.0%} of all "
                 f"validating, the rest training; {s['seeds']} seed(s), methods "
                 f"{', '.join(s['methods'])}. Each seed's held-out subjects are scored once "
                 "by the model trained on its split; the validation split chose the epoch and "
                 "model, the held-out subjects chose nothing.", ""]
    else:
        lines = ["# Which method on this cohort: cross-validated comparison", "",
                 f"Manifest `{report['manifest']}`; {s['folds']} folds by subject (stratified "
                 f"on the PU label), {s['seeds']} seed(s), methods {', '.join(s['methods'])}. "
                 "Each subject is scored once per seed by the fold model that held it out; "
                 "each fold's validation split (drawn from its training part) chose the epoch "
                 "and model, the held-out fold chose nothing.", ""]
    if report["unfinished_pieces"]:
        lines += [f"**Incomplete:** {len(report['unfinished_pieces'])} pieces unfinished "
                  f"(e.g. {report['unfinished_pieces'][0]}); a method's seed counts only "
                  + ("when its piece is done." if s.get("holdout") is not None else
                     "when all its folds are done."), ""]
    if not report["has_truth"]:
        lines += ["The manifest has no truth (`truth` column empty): the metrics, paired "
                  "differences and calibration need one and are not given.", ""]
    else:
        lines += _metric_table(report["methods"], report["references"])
        lines += paired_lines(report["paired"])
    lines += _priors(report["priors"])
    lines += calibration_lines(report.get("calibration"))
    if report.get("independent_test"):
        lines += ["", "## Fixed test set (independent of the cross-validation)", "",
                  "Scored by the average of each method's fold models (all seeds); it chose "
                  "nothing. Kept apart from the cross-validated numbers above (Wen et al. "
                  "2020).", "", "| method | fold models | " + " | ".join(
                      metric_label(m) for m in METRICS) + " | mean spread across models |",
                  "|---|---|" + "---|" * (len(METRICS) + 1)]
        for m, t in report["independent_test"].items():
            cells = [_ci(t["ensemble"]["metrics"][k]) if k in t["ensemble"]["metrics"]
                     else "n/a" for k in METRICS]
            lines.append(f"| {m} | {t['fold_models']} | " + " | ".join(cells)
                         + f" | {t['mean_spread']:.3f} |")
    lines += ["", f"From `{report.get('command', '')}`.", ""]
    return "\n".join(lines)


def _metric_table(methods: dict[str, Any], refs: dict[str, Any]) -> list[str]:
    head = " | ".join(metric_label(m) for m in METRICS)
    lines = ["## Pooled held-out metrics", "",
             "Each cell: mean over seeds of the pooled metric [95 % CI, bootstrap over seeds "
             "and subjects]; below it, mean (std) over seeds.", "",
             f"| method | subjects | {head} |", "|---|---|" + "---|" * len(METRICS)]
    for name, r in methods.items():
        cells = [_ci(r["metrics"][m]) + "<br>" + mean_std(r["metrics"][m]["over_seeds"], 3)
                 for m in METRICS]
        lines.append(f"| {name} | {r['n_scored']} | " + " | ".join(cells) + " |")
    for name, r in refs.items():
        if "metrics" in r:
            cells = [_ci(r["metrics"][m]) for m in METRICS]
            lines.append(f"| reference: {name} | {r['n_scored']} | " + " | ".join(cells) + " |")
        elif "accuracy" in r:
            lines.append(f"| reference: {name} | | {r['accuracy']:.3f} |"
                         + " |" * (len(METRICS) - 1))
        else:
            lines += ["", f"Reference {name}: not available ({r['missing']})."]
    return lines + [""]


def paired_lines(paired: list[dict[str, Any]]) -> list[str]:
    if not paired:
        return []
    lines = ["## Paired differences (A minus B)", "",
             "Same subjects, folds and seeds for both methods; 95 % CI by a paired bootstrap "
             "over seeds and subjects. A CI that excludes 0 says the difference is unlikely "
             "to be the luck of this sample of subjects and seeds.", "",
             "| A - B | " + " | ".join(metric_label(m) for m in PAIRED_METRICS)
             + " | share of resamples A better (accuracy) |",
             "|---|" + "---|" * (len(PAIRED_METRICS) + 1)]
    for d in paired:
        cells = [f"{_signed(d['metrics'][m]['value'])} [{_signed(d['metrics'][m]['ci_low'])}, "
                 f"{_signed(d['metrics'][m]['ci_high'])}]" for m in PAIRED_METRICS]
        lines.append(f"| {d['pair']} | " + " | ".join(cells)
                     + f" | {d['metrics']['accuracy']['share_a_better']:.2f} |")
    return lines + [""]


def _priors(priors: list[dict[str, Any]]) -> list[str]:
    lines = ["## Class prior per fold", "", "| method | fold | seed | prior | source |",
             "|---|---|---|---|---|"]
    for p in priors:
        value = "n/a" if p["prior"] is None else f"{p['prior']:.3f}"
        unread = "" if p["read_by_method"] else " (not read by the method)"
        lines.append(f"| {p['method']} | {p['fold']} | {p['seed']} | {value} | "
                     f"{p['source']}{unread} |")
    return lines + [""]


def calibration_lines(cal: dict[str, Any] | None) -> list[str]:
    if cal is None:
        return ["## Calibration", "", "Calibration cannot be measured without a truth: the "
                "manifest's `truth` column is empty, so the probabilities cannot be compared "
                "with how often subjects are positive.", ""]
    lines = ["## Calibration", "", "Expected calibration error of each method's held-out "
             "probabilities against the truth (10 equal-width bins; all seeds pooled; "
             "reliability diagram: calibration.png). PU probabilities are often badly "
             "calibrated: read them as scores unless this error is small.", "",
             "| method | ECE | scored |", "|---|---|---|"]
    for m, c in cal.items():
        lines.append(f"| {m} | {c['ece']:.3f} | {c['n']} |")
    return lines + [""]


def calibration_plot(cal: dict[str, Any], path: Path) -> Path:
    """The reliability diagram: per method, each bin's positive fraction against its mean
    probability."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from adni_pu.fileio import atomic_write

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    for name, c in cal.items():
        ax.plot([b["mean_probability"] for b in c["bins"]],
                [b["positive_fraction"] for b in c["bins"]], marker="o",
                label=f"{name} (ECE {c['ece']:.3f})")
    ax.plot([0, 1], [0, 1], ls="--", c="grey", lw=0.8)
    ax.set(xlabel="predicted probability", ylabel="positive fraction (truth)",
           xlim=(0, 1), ylim=(0, 1), title="reliability (held-out)")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return path


def records(spec: Any, report: dict[str, Any], frames: dict[str, Any]) -> dict[str, Any]:
    """One results file per method (:mod:`adni_pu.workflows.results_format`): each seed's
    pooled held-out predictions as its test results, with per-subject truth and
    correctness, so ``adni-pu benchmark table OUT/records`` pairs them over seeds and
    subjects."""
    from adni_pu.pu.metrics import binary_metrics, percent_summary
    from adni_pu.workflows.results_format import test_examples

    out = {}
    for method, frame in frames.items():
        per_seed = []
        for seed, g in frame[frame["truth"].notna()].groupby("seed", sort=True):
            g = g.sort_values("subject_id")
            m = binary_metrics(g["logit"].to_numpy(), g["truth"].to_numpy())
            per_seed.append({"seed": int(seed), "selected_epoch": None, "selected_model": None,
                             "val_score": None, "test": m, "test_accuracy_test_selected": None,
                             "seconds_per_epoch": {}, "nn_correction_share": None,
                             "test_examples": test_examples(g["logit"], g["truth"]),
                             "prior_estimate": None, "machines": None})
        if not per_seed:
            continue
        out[method] = {
            "benchmark": "cohort-pu", "command": report.get("command", ""),
            "date": _dt.date.today().isoformat(), "machine": None,
            "data": f"cohort {report['manifest']} " + (
                f"({spec.holdout} subjects held out per seed, each seed its own split)"
                if spec.holdout is not None else
                f"({spec.folds}-fold cross-validation, pooled held-out subjects)"),
            "accuracy_unit": "percent",
            "settings": {"method": method, "n_labelled": None, "scheme": None,
                         "prior": str(spec.prior), "val_fraction": None,
                         "train_limit": None, "test_limit": None,
                         "seeds": [r["seed"] for r in per_seed], "folds": spec.folds,
                         "epochs": report["epochs"].get(method), "selfpu": None},
            "results": {method: {
                "test_accuracy": percent_summary([r["test"]["accuracy"] for r in per_seed]),
                "test_auc": percent_summary([r["test"]["auc"] for r in per_seed]),
                "test_balanced_accuracy": percent_summary(
                    [r["test"]["balanced_accuracy"] for r in per_seed]),
                "seconds_per_epoch": {}}},
            "per_seed": per_seed}
    return out

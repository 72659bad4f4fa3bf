"""``report.md`` of ``adni-pu demo``: the pooled results table, the reference lines and a
paragraph that says what the numbers are (and why methods coincide when they do)."""

from __future__ import annotations

import math
from typing import Any

REFERENCE_NOTES = {
    "logistic regression on 2 volumes": "two volumes measured on the preprocessed scans "
    "(hippocampal tissue, CSF around the lateral ventricles), fitted per fold on the "
    "training subjects' PU labels",
    "generator truth: hippocampal loss": "the generator's true hippocampal loss of each "
    "scan, which no model sees: what a perfect hippocampal measurement would give",
}


def _f(value: float | None) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else f"{value:.3f}"


def _ci(entry: dict[str, float]) -> str:
    return f"{_f(entry['value'])} [{_f(entry['ci_low'])}, {_f(entry['ci_high'])}]"


def coinciding(results: dict[str, dict[str, Any]]) -> list[tuple[list[str], str]]:
    """Groups of methods whose held-out predictions are identical (``"predictions"``) or,
    failing that, whose pooled metrics are identical to the last digit (``"metrics"``)."""
    names = list(results)
    out: list[tuple[list[str], str]] = []
    seen: set[str] = set()
    for i, a in enumerate(names):
        if a in seen:
            continue
        same_pred = [a]
        same_metrics = [a]
        for b in names[i + 1:]:
            if b in seen:
                continue
            pa = [(p["subject_id"], p["logit"]) for p in results[a]["predictions"]]
            pb = [(p["subject_id"], p["logit"]) for p in results[b]["predictions"]]
            if pa == pb:
                same_pred.append(b)
            elif results[a]["pooled"]["metrics"] == results[b]["pooled"]["metrics"]:
                same_metrics.append(b)
        if len(same_pred) > 1:
            out.append((same_pred, "predictions"))
            seen.update(same_pred)
        if len(same_metrics) > 1:
            out.append((same_metrics, "metrics"))
            seen.update(same_metrics)
    return out


def explanation(settings: Any, results: dict[str, dict[str, Any]],
                references: dict[str, dict[str, Any]]) -> list[str]:
    """The paragraphs under the table: what is synthetic, what is scored, what the
    reference lines and the CIs mean, and why methods coincide."""
    first = next(iter(results.values()))["pooled"]
    n, n_pos, n_all = first["n_scored"], first["n_positive"], first["n_subjects"]
    widths = [r["pooled"]["metrics"]["auc"]["ci_high"] - r["pooled"]["metrics"]["auc"]["ci_low"]
              for r in results.values()]
    finite = [w for w in widths if not math.isnan(w)]
    half = sum(finite) / len(finite) / 2 if finite else float("nan")
    above = [m for m, r in results.items() if r["pooled"]["metrics"]["auc"]["ci_low"] > 0.5]
    not_above = [m for m in results if m not in above]
    synth = settings.synth
    paras = [
        "**What these numbers are.** Every scan is synthetic: an ADNI-like cohort from "
        "`adni_pu.synth` whose disease effects stay within published ADNI effect sizes "
        f"(hippocampal atrophy {synth.get('hippocampal_atrophy', 'default')} at full "
        "severity; see docs/volumes.md for the calibration against the literature). The "
        "task is amyloid status (the PET truth), which a T1 scan shows only in part: "
        "amyloid-positive people without atrophy and amyloid-negative people with atrophy "
        "are generated as in ADNI. Each scan went through the real preprocessing.",
        f"**What is scored.** {settings.folds}-fold cross-validation over all subjects: "
        f"each subject is scored once, by the models of the one fold that held it out, and "
        f"the held-out predictions of all folds are pooled: {n} subjects with a known truth "
        f"({n_pos} amyloid-positive), {n_all - n} without amyloid PET left out. In each fold "
        "a validation split (a stratified fifth of the other subjects) chose the epoch and, "
        "for Self-PU, the student or teacher; the held-out subjects decided nothing. With "
        f"{n} subjects a 95 % CI of the AUC spans about +-{half:.2f}: methods whose "
        "intervals overlap are not separated by this demo "
        "(`benchmarks/demo_seeds.py` pools several seeds' demos and gives paired "
        "differences between methods with a CI over seeds and subjects).",
    ]
    verdict = ("AUC CI above 0.5: " + (", ".join(above) if above else "none")
               + ("; not above 0.5: " + ", ".join(not_above) if not_above else "") + ".")
    ref_text = []
    for name, ref in references.items():
        auc = ref["pooled"]["metrics"]["auc"]
        ref_text.append(f"{name} (AUC {_f(auc['value'])}: {REFERENCE_NOTES.get(name, '')})")
    paras.append("**Reference lines** on the same subjects and folds: " + "; ".join(ref_text)
                 + ". " + verdict)
    paras.append(_coincidence_text(results))
    all_positive = [m for m, r in results.items()
                    if r["pooled"]["metrics"]["specificity"]["value"] == 0.0]
    if all_positive:
        paras.append("**Threshold.** " + ", ".join(all_positive) + " called every scored "
                     "subject with a negative truth positive (specificity 0 at logit 0): the "
                     "class prior is high when most training subjects are labelled positives "
                     "(see \"Cohort\"); the AUC does not depend on the threshold.")
    return paras


def _coincidence_text(results: dict[str, dict[str, Any]]) -> str:
    parts = []
    for group, kind in coinciding(results):
        what = ("gave bit-identical held-out predictions" if kind == "predictions"
                else "have identical pooled metrics (their predictions differ)")
        parts.append(f"{' and '.join(group)} {what}.")
    for method, r in results.items():
        share = r.get("nn_correction")
        if share is None:
            continue
        column = r.get("nn_correction_column") or "nn_correction"
        if share == 0.0 and method == "nnpu":
            parts.append(f"{method}'s non-negative correction never fired (0 % of training "
                         f"batches, column `{column}` of each run's metrics.csv): the "
                         "unlabelled risk never went negative, so it minimised exactly "
                         "uPU's risk, and equal settings give equal models.")
        else:
            phases = r.get("nn_correction_by_phase") or {}
            by_phase = ("; by phase: " + ", ".join(f"{p} {100 * v:.1f} %"
                                                   for p, v in phases.items())
                        if len(phases) > 1 else "")
            parts.append(f"{method}'s non-negative correction (of its nnPU risk) fired in "
                         f"{100 * share:.1f} % of training batches (column `{column}` of "
                         f"metrics.csv{by_phase}).")
    if not parts:
        return "**Coinciding methods.** No two methods gave the same predictions."
    return "**Coinciding methods.** " + " ".join(parts)


def render_report(settings: Any, results: dict[str, dict[str, Any]],
                  references: dict[str, dict[str, Any]], times: dict[str, float],
                  prep_note: str, priors: list[tuple[float, str]], counts: str) -> str:
    """The whole ``report.md``."""
    from adni_pu.workflows.evaluate import METRICS

    order = ("auc",) + tuple(m for m in METRICS if m != "auc")
    lines = ["# adni-pu demo", "",
             f"Synthetic ADNI-like cohort of {settings.subjects} subjects (seed "
             f"{settings.seed}), preprocessing: **{settings.preprocessing}**, "
             f"{settings.folds}-fold cross-validation, {settings.epochs} epochs per run.", "",
             "## Results: amyloid status of the held-out subjects, all folds pooled", "",
             f"Point estimate [95 % CI, percentile bootstrap over subjects, "
             f"{settings.bootstrap} resamples]. Validation AUC: the mean over folds of the "
             "selected model's AUC on its fold's validation split (what chose it).", "",
             "| method | " + " | ".join("AUC" if m == "auc" else m.replace("_", " ")
                                        for m in order)
             + " | validation AUC | seconds |",
             "|---|" + "---|" * (len(order) + 2)]
    for method, r in results.items():
        cells = [_ci(r["pooled"]["metrics"][m]) for m in order]
        lines.append(f"| {method} | " + " | ".join(cells)
                     + f" | {_f(r['val_auc'])} | {r['seconds']:.0f} |")
    for name, ref in references.items():
        cells = [_ci(ref["pooled"]["metrics"]["auc"])] + ["-"] * (len(order) - 1)
        lines.append(f"| *reference: {name}* | " + " | ".join(cells) + " | - | - |")
    lines += ["", "![ROC](roc.png)", ""]
    for para in explanation(settings, results, references):
        lines += [para, ""]
    prior_lines = [f"fold {k + 1}: {note}" for k, (_, note) in enumerate(priors)]
    lines += ["## Cohort", "", f"Preprocessing: {prep_note}.", "",
              "Class prior used per fold: " + "; ".join(prior_lines) + ".", "",
              "Subjects of fold 1 (the other folds are alike; `all` is the whole cohort):", "",
              "```\n" + counts + "\n```", "",
              "Manifests: `cohort/folds/fold<k>/manifest.csv`; labels and the cohort report: "
              "`cohort/`.", "",
              "## Time per stage (seconds)", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in times.items()]
    lines += ["", "## Files", "",
              "- `synth/`: raw BIDS scans, ADNIMERGE-style table, truth",
              "- `preprocessed/`: `adni-pu preprocess` output (real preprocessing only)",
              "- `cohort/`: manifest, cohort report, the fold manifests, the volumes of the "
              "logistic-regression reference (`volume_features.csv`)",
              "- `runs/<method>/fold<k>/`: run folders (training curves `curves.png`, "
              "`metrics.csv`, `evaluation/test/predictions_subjects.csv`)",
              "- `demo.json`: settings, times, every method's per-fold records and pooled "
              "predictions", ""]
    return "\n".join(lines)

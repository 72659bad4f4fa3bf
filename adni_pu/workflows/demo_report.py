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


PRIOR_ESTIMATE_TEXT = (
    "here it is estimated from each fold's PU data alone (`--prior estimate`, as a study "
    "without amyloid PET must, and as `adni-pu train` estimates it: a naive P-vs-U "
    "classifier on the fold's training split, best-bin estimation on its validation split, "
    "the held-out subjects never read), with its 95 % bootstrap interval")


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


def _mean_ci_half_width(results: dict[str, dict[str, Any]], metric: str) -> float:
    """Half the mean width of the methods' 95 % CIs of ``metric`` (NaN where none)."""
    widths = [r["pooled"]["metrics"][metric]["ci_high"] - r["pooled"]["metrics"][metric]["ci_low"]
              for r in results.values() if metric in r["pooled"]["metrics"]]
    finite = [w for w in widths if not math.isnan(w)]
    return sum(finite) / len(finite) / 2 if finite else float("nan")


def scope(results: dict[str, dict[str, Any]]) -> str:
    """The report's first lines: what a cohort of this size can show, measured from its
    own CIs, and where the effect sizes are."""
    first = next(iter(results.values()))["pooled"]
    return (f"**What a cohort this size can show.** {first['n_scored']} subjects are scored "
            f"({first['n_positive']} positive, {first.get('n_hidden', 0)} of them hidden in "
            "the unlabelled set): the 95 % CIs below span about "
            f"+-{_mean_ci_half_width(results, 'accuracy'):.2f} in accuracy and "
            f"+-{_mean_ci_half_width(results, 'auc'):.2f} in AUC, so differences between "
            "methods smaller than that cannot be told apart here. This run shows that the "
            "whole path works and what a report holds; for effect sizes see the paper-scale "
            "results (935 subjects, up to 40 seeds, paired CIs) in docs/results.md of the "
            "adni-pu repository.")


def explanation(settings: Any, results: dict[str, dict[str, Any]],
                references: dict[str, dict[str, Any]]) -> list[str]:
    """The paragraphs under the table: what is synthetic, what is scored, the PU effect
    (naive training against the PU methods on the hidden positives), the reference lines,
    the CIs, and why methods coincide."""
    first = next(iter(results.values()))["pooled"]
    n, n_pos, n_all = first["n_scored"], first["n_positive"], first["n_subjects"]
    n_hidden = first.get("n_hidden", 0)
    negative, positive = first.get("all_negative_accuracy"), first.get("all_positive_accuracy")
    half = _mean_ci_half_width(results, "accuracy")
    synth = settings.synth
    paras = [
        "**What these numbers are.** Every scan is synthetic: an ADNI-like cohort from "
        "`adni_pu.synth` with ADNI's composition (diagnosis mix and amyloid positivity per "
        "diagnosis from published ADNI numbers) and disease effects within published ADNI "
        f"effect sizes (hippocampal atrophy {synth.get('hippocampal_atrophy', 'default')} at "
        "full severity; docs/volumes.md). Each scan went through the real preprocessing.",
        "**The PU task (the paper's).** Labelled positives are the diagnosed patients (AD / "
        "Dementia on file); everyone else is unlabelled. The truth, used only to score, is "
        "the paper's positive class: that diagnosis, or amyloid SUVR >= 1.08. So the "
        f"unlabelled set hides positives: {n_hidden} of the {n_pos} scored positives are "
        "unlabelled amyloid-positive people, mostly MCI. A method that learns only "
        "\"labelled vs the rest\" (naive) calls them negative; a PU method, told the class "
        "prior, should call more of them positive. Hidden-positive recall is the share of "
        "them called positive; hidden AUC ranks them against the unlabelled negatives "
        "without a threshold.",
        f"**What is scored.** {settings.folds}-fold cross-validation over all subjects: "
        f"each subject is scored once, by the models of the one fold that held it out, and "
        f"the held-out predictions of all folds are pooled: {n} subjects with a known truth "
        f"({n_pos} positive), {n_all - n} without one (no amyloid PET and no diagnosis) left "
        "out. In each fold a validation split (a stratified fifth of the other subjects) "
        "chose the epoch and, for Self-PU, the student or teacher, by the PU risk on its "
        "labels" + ("; VPU's by its variational loss, which reads no prior"
                    if "vpu" in results else "") +
        f"; the held-out subjects decided nothing. With {n} subjects a 95 % CI of "
        f"the accuracy spans about +-{half:.2f}."
        + (" Reference lines of accuracy: calling everyone negative scores "
           f"{_f(negative)}, everyone positive {_f(positive)}."
           if negative is not None else ""),
    ]
    paras.append(_pu_effect_text(results))
    ref_text = []
    for name, ref in references.items():
        auc = ref["pooled"]["metrics"]["auc"]
        ref_text.append(f"{name} (AUC {_f(auc['value'])}: {REFERENCE_NOTES.get(name, '')})")
    above = [m for m, r in results.items() if r["pooled"]["metrics"]["auc"]["ci_low"] > 0.5]
    paras.append("**Reference lines** on the same subjects and folds: " + "; ".join(ref_text)
                 + ". AUC CI above 0.5: " + (", ".join(above) if above else "none") + ".")
    paras.append(_coincidence_text(results))
    all_positive = [m for m, r in results.items()
                    if r["pooled"]["metrics"]["specificity"]["value"] == 0.0]
    if all_positive:
        paras.append("**Threshold.** " + ", ".join(all_positive) + " called every scored "
                     "subject with a negative truth positive (specificity 0 at logit 0): the "
                     "threshold follows the class prior it was given (see \"Cohort\"); the "
                     "AUC does not depend on the threshold.")
    return paras


def _pu_effect_text(results: dict[str, dict[str, Any]]) -> str:
    """Naive against the PU methods on the hidden positives, in numbers."""
    parts = []
    for method, r in results.items():
        m = r["pooled"]["metrics"]
        if "hidden_positive_recall" not in m:
            continue
        parts.append(f"{method} {_f(m['hidden_positive_recall']['value'])} "
                     f"[{_f(m['hidden_positive_recall']['ci_low'])}, "
                     f"{_f(m['hidden_positive_recall']['ci_high'])}]")
    if not parts:
        return "**The PU effect.** Not measured: the predictions carry no PU labels."
    text = "**The PU effect.** Hidden-positive recall: " + "; ".join(parts) + "."
    naive = results.get("naive", {}).get("pooled", {}).get("metrics", {})
    if "hidden_positive_recall" in naive:
        better = [m for m, r in results.items() if m != "naive"
                  and r["pooled"]["metrics"]["hidden_positive_recall"]["ci_low"]
                  > naive["hidden_positive_recall"]["ci_high"]]
        text += (" Above naive training with CIs that do not overlap: "
                 + (", ".join(better) if better else "none") + ". Whether a method also "
                 "gains accuracy depends on how many unlabelled negatives it calls positive "
                 "on the way (specificity); the paired differences are below, and over "
                 "seeds in `benchmarks/demo_seeds.py`.")
    return text


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
                  prep_note: str, counts: str, comparison: dict[str, Any]) -> str:
    """The whole ``report.md``: the demo's table and explanation, then the comparison's
    paired differences, class priors and calibration (``comparison``: its report.json)."""
    from adni_pu.pu.metrics import TABLE_METRICS, metric_label
    from adni_pu.workflows.compare.render import calibration_lines, paired_lines

    order = [m for m in TABLE_METRICS
             if m in next(iter(results.values()))["pooled"]["metrics"]]
    first = next(iter(results.values()))["pooled"]
    lines = ["# adni-pu demo", "",
             f"Synthetic ADNI-like cohort of {settings.subjects} subjects (seed "
             f"{settings.seed}), preprocessing: **{settings.preprocessing}**, "
             f"{settings.folds}-fold cross-validation, {settings.epochs} epochs per run, "
             "through `adni-pu benchmark cohort` (its own report: "
             "`comparison/report.md`).", "",
             scope(results), "",
             "## Results: the paper's positive class on the held-out subjects, all folds "
             "pooled", "",
             f"Point estimate [95 % CI, bootstrap over subjects, {settings.bootstrap} "
             "resamples]. Validation AUC: the mean over folds of the selected model's AUC on "
             "its fold's validation split (what chose it).", "",
             "| method | " + " | ".join(metric_label(m) for m in order)
             + " | validation AUC | seconds |",
             "|---|" + "---|" * (len(order) + 2)]
    for method, r in results.items():
        cells = [_ci(r["pooled"]["metrics"][m]) for m in order]
        lines.append(f"| {method} | " + " | ".join(cells)
                     + f" | {_f(r['val_auc'])} | {r['seconds']:.0f} |")
    for name, key in (("call everyone negative", "all_negative_accuracy"),
                      ("call everyone positive", "all_positive_accuracy")):
        if key in first:
            cells = [_f(first[key])] + ["-"] * (len(order) - 1)
            lines.append(f"| *reference: {name}* | " + " | ".join(cells) + " | - | - |")
    for name, ref in references.items():
        metrics = ref["pooled"]["metrics"]
        cells = [_ci(metrics[m]) if m in ("auc", "hidden_auc") and m in metrics else "-"
                 for m in order]
        lines.append(f"| *reference: {name}* | " + " | ".join(cells) + " | - | - |")
    lines += ["", "![ROC](roc.png)", ""]
    for para in explanation(settings, results, references):
        lines += [para, ""]
    lines += paired_lines(comparison["paired"])
    lines += calibration_lines(comparison.get("calibration"))
    source = (PRIOR_ESTIMATE_TEXT if settings.prior == "estimate" else
              "here it is the positive share of the fold's training subjects with a truth (in "
              "a study of your own, a published prevalence or a PET subsample gives it)")
    lines += ["## Cohort", "", f"Preprocessing: {prep_note}.", "",
              "Class prior given to uPU, nnPU and Self-PU per fold: " + prior_text(results)
              + f". PU risks need the prior of the positive class; {source}. Naive training "
              "uses no prior.", "",
              "Subjects of fold 1 (the other folds are alike; `all` is the whole cohort):", "",
              "```\n" + counts + "\n```", "",
              "Labels and the cohort report: `cohort/`; the fold manifests: "
              "`comparison/folds/fold-<k>/manifest.csv`.", "",
              "## Time per stage (seconds)", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in times.items()]
    lines += ["", "## Files", "",
              "- `synth/`: raw BIDS scans, ADNIMERGE-style table, truth",
              "- `preprocessed/`: `adni-pu preprocess` output (real preprocessing only)",
              "- `cohort/`: manifest and cohort report (`adni-pu cohort build`)",
              "- `demo_training.toml`: the demo budget, the comparison's settings file",
              "- `comparison/`: `adni-pu benchmark cohort`'s folder: `report.md`, "
              "`report.json`, `roc.png`, `calibration.png`, `records/` (for `adni-pu "
              "benchmark table`), the folds, the logistic regression's volumes "
              "(`volume_features.csv`) and one run folder per method and fold "
              "(`pieces/<method>/fold-<k>/seed-<seed>/`: `curves.png`, `metrics.csv`, "
              "`piece.json` with the held-out predictions)",
              "- `demo.json`: settings, times, every method's per-fold records and pooled "
              "predictions", ""]
    return "\n".join(lines)


def prior_text(results: dict[str, dict[str, Any]]) -> str:
    """Per fold the class prior the PU methods were given, with where it came from (an
    estimate: its 95 % CI), once per distinct value."""
    parts = []
    pu = [r for m, r in results.items() if m != "naive"]
    for k in range(len(pu[0]["folds"]) if pu else 0):
        notes = []
        for r in pu:
            fold = r["folds"][k]
            prior = fold.get("prior") or {}
            if prior.get("prior") is None or not prior.get("read_by_method", True):
                continue
            est = fold.get("prior_estimate") or {}
            ci = (f" [95 % CI {est['ci_low']:.3f}, {est['ci_high']:.3f}]"
                  if est.get("ci_low") is not None else "")
            note = f"{prior['prior']:.3f}{ci} ({prior.get('source', '')})"
            if note not in notes:
                notes.append(note)
        parts.append(f"fold {k + 1}: " + ("; ".join(notes) if notes else "n/a"))
    return "; ".join(parts) if parts else "none (no PU method)"

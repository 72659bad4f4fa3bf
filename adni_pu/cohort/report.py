"""The cohort report: counts per split and label, class prior, SUVR histogram, data quality.

Everything is computed from the manifest and what is passed in; reading a cohort folder
(``report_from_path``) and writing one (``write_cohort``) live in ``cohort.files``,
which calls this module (never the other way round).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from adni_pu.cohort.config import MEASURE_TRACERS, CohortConfig
from adni_pu.cohort.quality import QualityReport
from adni_pu.fileio import atomic_write, atomic_write_text

REPORT_NAME = "cohort_report.md"
HISTOGRAM_NAME = "suvr_histogram.png"


def subject_table(manifest: pd.DataFrame) -> pd.DataFrame:
    """One row per subject of a manifest (labels are per subject, so the first scan's)."""
    cols = [c for c in ("subject_id", "split", "pu_label", "truth", "hidden_positive")
            if c in manifest]
    first = manifest.groupby("subject_id", sort=True)[cols[1:]].first().reset_index()
    first["n_scans"] = manifest.groupby("subject_id", sort=True).size().to_numpy()
    if "hidden_positive" not in first:
        first["hidden_positive"] = 0
    return first


def _prior_row(name: str, subjects: pd.DataFrame) -> dict[str, Any]:
    truth = pd.to_numeric(subjects["truth"], errors="coerce")
    pu = pd.to_numeric(subjects["pu_label"], errors="coerce").fillna(0).astype(int)
    known = truth.notna()
    n, n_known = len(subjects), int(known.sum())
    n_pos = int((truth[known] == 1).sum())
    unl_known = known & (pu == 0)
    pos_known = known & (truth == 1)
    return {
        "split": name,
        "subjects": n,
        "labelled_positive": int((pu == 1).sum()),
        "unlabelled": int((pu == 0).sum()),
        "with_truth": n_known,
        "no_truth": n - n_known,
        "truth_positive": n_pos,
        # the class prior: P(amyloid positive) among subjects with a truth
        "class_prior": n_pos / n_known if n_known else np.nan,
        # what the labels imply: pi >= labelled fraction (every labelled subject positive)
        "labelled_fraction": float((pu == 1).mean()) if n else np.nan,
        # P(positive | unlabelled), among unlabelled subjects with a truth (nnPU's prior
        # for the unlabelled set in the censoring view)
        "prior_in_unlabelled": (float((truth[unl_known] == 1).mean())
                                if unl_known.any() else np.nan),
        # label frequency c = P(labelled | positive), among truth-positive subjects
        "label_frequency": float((pu[pos_known] == 1).mean()) if pos_known.any() else np.nan,
    }


def class_prior_table(manifest: pd.DataFrame) -> pd.DataFrame:
    """Class prior and label statistics per split and overall (one row each)."""
    subjects = subject_table(manifest)
    rows = [_prior_row(s, subjects.loc[subjects["split"] == s])
            for s in ("train", "val", "test") if (subjects["split"] == s).any()]
    rows.append(_prior_row("all", subjects))
    return pd.DataFrame(rows)


def counts_table(manifest: pd.DataFrame) -> pd.DataFrame:
    """Subjects and scans per split and label (labelled / unlabelled / hidden positive)."""
    subjects = subject_table(manifest)
    rows = []
    for split in ("train", "val", "test", "all"):
        sub = subjects if split == "all" else subjects.loc[subjects["split"] == split]
        if sub.empty:
            continue
        pu = pd.to_numeric(sub["pu_label"], errors="coerce").fillna(0).astype(int)
        truth = pd.to_numeric(sub["truth"], errors="coerce")
        hidden = pd.to_numeric(sub["hidden_positive"], errors="coerce").fillna(0).astype(int)
        rows.append({
            "split": split, "subjects": len(sub), "scans": int(sub["n_scans"].sum()),
            "labelled_positive": int((pu == 1).sum()), "unlabelled": int((pu == 0).sum()),
            "hidden_positive": int(hidden.sum()),
            "truth_positive": int((truth == 1).sum()), "truth_negative": int((truth == 0).sum()),
            "truth_unknown": int(truth.isna().sum()),
        })
    return pd.DataFrame(rows)


def pu_summary(manifest: pd.DataFrame) -> dict[str, Any]:
    """What the labels ask of a PU method, over all subjects of a manifest.

    ``n_p`` labelled positives; ``class_prior``: truth-positive share of subjects with a
    truth; ``labelled_fraction``; ``hidden_positive``: unlabelled subjects whose truth is
    positive; ``hidden_share``: their share of the truth positives; ``unlabelled_known``:
    unlabelled subjects with a truth.
    """
    subjects = subject_table(manifest)
    pu = pd.to_numeric(subjects["pu_label"], errors="coerce").fillna(0).astype(int)
    truth = pd.to_numeric(subjects["truth"], errors="coerce")
    known = truth.notna()
    hidden = int(((pu == 0) & (truth == 1)).sum())
    positives = int((truth == 1).sum())
    return {
        "subjects": int(len(subjects)), "n_p": int((pu == 1).sum()),
        "with_truth": int(known.sum()), "truth_positive": positives,
        "class_prior": positives / int(known.sum()) if known.any() else float("nan"),
        "labelled_fraction": float((pu == 1).mean()) if len(pu) else float("nan"),
        "hidden_positive": hidden,
        "hidden_share": hidden / positives if positives else float("nan"),
        "unlabelled_known": int(((pu == 0) & known).sum()),
    }


#: The warning printed by ``cohort build`` and written into the report when the labels
#: leave no positive in the unlabelled set.
NO_HIDDEN_WARNING = (
    "WARNING: no unlabelled subject with a known truth is positive: wherever the truth is "
    "known the labels equal it, so this cohort poses a supervised task, not a PU one, and no "
    "PU method can differ from naive training on it. Use a preset that labels by diagnosis "
    "(`paper`) or check the amyloid inputs.")


def pu_task_lines(manifest: pd.DataFrame) -> list[str]:
    """One line with n_p, the class prior and the hidden share, and the warning when the
    unlabelled set holds no known positive (:data:`NO_HIDDEN_WARNING`)."""
    s = pu_summary(manifest)
    line = (f"n_p = {s['n_p']} labelled positives of {s['subjects']} subjects; class prior "
            f"{s['class_prior']:.3f} by the truth ({s['truth_positive']} positive of "
            f"{s['with_truth']} with a truth), labelled fraction {s['labelled_fraction']:.3f}; "
            f"{s['hidden_positive']} hidden positives in the unlabelled set "
            f"({s['hidden_share']:.0%} of the positives)")
    lines = [line]
    if s["hidden_positive"] == 0:
        lines.append(f"**{NO_HIDDEN_WARNING}**")
    return lines


def _cutoffs(config: CohortConfig | None, tracer: str) -> dict[str, float | None]:
    from adni_pu.cohort.labels import cutoffs

    label, truth = cutoffs((config or CohortConfig()).labels, tracer)
    return {"label": label, "truth": truth}


def plot_suvr_histogram(manifest: pd.DataFrame, path: str | Path,
                        config: CohortConfig | None = None) -> Path:
    """Histogram of the amyloid measures paired with scans, one panel per tracer, with the
    label (where amyloid labels) and truth cut-offs drawn as vertical lines (SUVRs, or
    Centiloids under ``labels.scale = "centiloid"``). Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    centiloid = (config is not None and config.labels.scale == "centiloid"
                 and "centiloid" in manifest)
    column = "centiloid" if centiloid else "suvr"
    # a manifest without amyloid columns (diagnosis-only labels) plots empty panels
    manifest = manifest.assign(**{c: np.nan for c in ("tracer", column) if c not in manifest})
    keep = [c for c in ("subject_id", "tracer", column, "suvr_date") if c in manifest]
    measures = manifest.loc[manifest[column].notna(), keep].drop_duplicates()
    tracers = [t for t in MEASURE_TRACERS if (measures["tracer"] == t).any()] or ["none"]
    fig, axes = plt.subplots(1, len(tracers), figsize=(5.0 * len(tracers), 3.6), squeeze=False)
    styles = {"label": ("tab:red", "-", "label cut-off"),
              "truth": ("black", "--", "truth cut-off")}
    for ax, tracer in zip(axes[0], tracers):
        values = measures.loc[measures["tracer"] == tracer, column].astype(float)
        cut = _cutoffs(config, tracer)
        if len(values):
            ax.hist(values, bins=min(40, max(5, len(values) // 3)), color="tab:blue", alpha=0.75)
        else:
            ax.text(0.5, 0.5, "no amyloid measure paired with a scan", ha="center",
                    va="center", transform=ax.transAxes)
        for kind, (colour, style, text) in styles.items():
            value = cut[kind]
            if value is not None:
                ax.axvline(value, color=colour, linestyle=style, label=f"{text} {value:g}")
        ax.set_title(f"{tracer} (n = {len(values)} measures)")
        ax.set_xlabel("Centiloid" if centiloid else "SUVR (whole-cerebellum reference)")
        ax.set_ylabel("measures")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return path


def _md_table(frame: pd.DataFrame, digits: int = 3) -> str:
    if frame.empty:
        return "_none_\n"

    def fmt(v: Any) -> str:
        if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA:
            return ""
        if isinstance(v, float):
            return f"{v:.{digits}f}"
        return str(v).replace("|", "\\|").replace("\n", " ")

    head = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "---|" * len(frame.columns)
    body = ["| " + " | ".join(fmt(v) for v in row) + " |"
            for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body]) + "\n"


def render_report(
    manifest: pd.DataFrame,
    out_dir: str | Path,
    quality: QualityReport | None = None,
    config: CohortConfig | None = None,
    excluded: pd.DataFrame | None = None,
    summary: dict[str, Any] | None = None,
) -> dict[str, Path]:
    """Write ``cohort_report.md`` and ``suvr_histogram.png`` into ``out_dir``."""
    out_dir = Path(out_dir)
    hist = plot_suvr_histogram(manifest, out_dir / HISTOGRAM_NAME, config)
    lines = ["# Cohort report", ""]
    if config is not None:
        lab = config.labels
        if lab.scale == "centiloid":
            label_cut = (f"{lab.centiloid_label_cutoff:g} CL (every tracer)"
                         if lab.centiloid_label_cutoff is not None else None)
            truth_cut = f"{lab.centiloid_truth_cutoff:g} CL"
            conv = "; ".join(f"{t}: CL = {a:g} x SUVR {b:+g}" for t, (a, b)
                             in config.amyloid.centiloid_conversions.items())
            truth_cut += f" (SUVRs without a Centiloid converted by {conv or 'nothing'})"
        else:
            label_cut = str(lab.label_cutoffs) if lab.label_cutoffs else None
            truth_cut = f"SUVR {lab.truth_cutoffs}"
        amyloid = (f" or an amyloid measure ({lab.amyloid_scope} measures) is at or above "
                   f"{label_cut}" if lab.amyloid_labels() and label_cut else "")
        truth_dx = (f"one of {lab.positive_diagnoses} on file, or " if lab.truth_from_diagnosis
                    else "")
        lines += [
            f"Preset **{config.preset}**. Labels are per subject: labelled positive if one of "
            f"{lab.positive_diagnoses} is on file ({lab.diagnosis_scope}){amyloid}; everyone "
            "else is unlabelled"
            + (" (labels.diagnosis_only: amyloid is used for the truth only)"
               if lab.diagnosis_only else "")
            + f". Truth (evaluation only): {truth_dx}an amyloid measure at or above "
            f"{truth_cut}. Hidden positives: unlabelled subjects whose truth is positive."
            + (f" Only subjects with baseline diagnosis in {lab.include_diagnoses}."
               if lab.include_diagnoses else ""),
            "",
            f"Amyloid paired within {config.matching.amyloid_window_days} days of the scan; "
            f"split seed {config.split.seed}"
            + (f", {config.split.k_folds} folds (fold {config.split.fold} is validation)"
               if config.split.k_folds >= 2 else "") + ".",
            "",
        ]
    if summary and summary.get("inputs"):
        lines += ["## Inputs", ""]
        for name, infos in summary["inputs"].items():
            for info in (infos if isinstance(infos, list) else [infos] if infos else []):
                lines.append(f"- {name}: `{info.get('path') or info.get('note')}`"
                             + (f" (sha256 {info['sha256'][:12]})" if info.get("sha256") else ""))
        lines.append("")
        for name, used in (summary.get("columns") or {}).items():
            found = ", ".join(f"{k}={v}" for k, v in used.items() if v)
            lines.append(f"- columns used in the {name} table: {found}")
        lines.append("")
    lines += ["## The PU task", "", *pu_task_lines(manifest), ""]
    lines += ["## Counts per split and label (subjects)", "", _md_table(counts_table(manifest))]
    prior = class_prior_table(manifest)
    lines += [
        "## Class prior", "",
        "`class_prior`: fraction amyloid-positive among subjects with a truth; "
        "`labelled_fraction`: what the labels alone imply (a lower bound on the prior); "
        "`prior_in_unlabelled`: positive fraction among unlabelled subjects with a truth; "
        "`label_frequency`: fraction of truth-positive subjects that are labelled. "
        "Subjects with no truth are left out of every metric and counted in `no_truth`.", "",
        _md_table(prior),
    ]
    lines += ["## Amyloid SUVR", "", f"![SUVR histogram]({hist.name})", ""]
    if "suvr_gap_days" in manifest:
        gaps = pd.to_numeric(manifest["suvr_gap_days"], errors="coerce").abs()
        paired = int(gaps.notna().sum())
        lines.append(f"{paired} of {len(manifest)} scans have an amyloid measure paired "
                     + (f"(median gap {gaps.median():.0f} days, max {gaps.max():.0f})."
                        if paired else "."))
        lines.append("")
    if "visit_match" in manifest:
        vm = manifest["visit_match"].fillna("none").value_counts().rename_axis("visit_match")
        lines += ["Scan-to-visit matching:", "", _md_table(vm.reset_index(name="scans"))]
    lines += ["## Data quality", ""]
    if quality is None:
        lines += ["_No quality record found beside this manifest._", ""]
    elif not len(quality):
        lines += ["No data-quality issue found.", ""]
    else:
        frame = quality.to_frame()[["severity", "kind", "table", "count", "message", "action",
                                    "examples"]]
        lines += [_md_table(frame)]
    if excluded is not None and len(excluded):
        by = excluded.groupby("reason").size().rename_axis("reason").reset_index(name="scans")
        lines += ["Scans left out of the manifest (listed in `excluded.csv`):", "", _md_table(by)]
    report = atomic_write_text(out_dir / REPORT_NAME, "\n".join(lines))
    return {"report": report, "histogram": hist}


"""The paper's ADNI testbed at its scale, on a synthetic cohort: what the comparison command
cannot know (the generator's truth line) and the table beside the paper's.

935 synthetic subjects with ADNI's composition (the generator's defaults, docs/volumes.md
"Composition") and the demo's disease effects, labelled by the ``paper`` preset (labelled:
diagnosed patients; truth: that diagnosis or SUVR >= 1.08, so amyloid-positive MCI and CN
are hidden in the unlabelled set). The methods are compared by ``adni-pu benchmark cohort
--holdout 113``: per seed s a subject-level split with split seed s holds out 113 subjects
(the paper's test count), validates on 15 % of all subjects and trains on the rest,
stratified by label and truth; training seed s. Every training setting is the demo's
(``benchmarks/paper-scale.toml``, chosen on the demo's tuning cohorts,
``benchmarks/results/demo-tuning-log.md``); nothing here was tuned, and each seed's
held-out subjects are scored once, after training::

    # 1. the cohort, once: the generator's ideal model-grid volumes
    adni-pu synth runs/paper-scale/synth --layout bids --subjects 935 --seed 0 \\
        --set 'visit_probabilities=[1,0,0]' --set ideal_preprocessed=true
    adni-pu cohort build runs/paper-scale/synth/clinical/ADNIMERGE.csv \\
        runs/paper-scale/synth/preprocessed_ideal/summary.csv runs/paper-scale/cohort
    #    or the raw scans through the real pipeline with the demo's fast settings
    #    (46 minutes on 2 cores), then `cohort build` on PREP/summary.csv
    adni-pu preprocess runs/paper-scale/synth/bids PREP --workers 2 \\
        --set registration.resolution_mm=4.0 --set 'registration.iterations=[50,20]' \\
        --set 'registration.shrink_factors=[2,1]' \\
        --set 'registration.smoothing_sigmas=[1.0,0.0]' \\
        --set skullstrip.deepbet_size=192 --set qc.min_brain_ml=400
    # 2. the methods, method x seed pieces (resumable; --piece i/N shares them out)
    adni-pu benchmark cohort runs/paper-scale/cohort/manifest.csv OUT --holdout 113 \\
        --seeds 40 --methods naive,upu,nnpu,selfpu,nnpu-estimated,vpu \\
        --config benchmarks/paper-scale.toml
    adni-pu benchmark cohort-report OUT --pair nnpu,naive --pair selfpu,nnpu \\
        --pair nnpu,upu --pair selfpu,naive --pair nnpu-estimated,nnpu --pair vpu,nnpu \\
        --pair vpu,naive
    # 3. the generator's truth line on each seed's split (seconds), then the table
    python -m benchmarks.paper_scale truth OUT --synth runs/paper-scale/synth
    python -m benchmarks.paper_scale table OUT --out benchmarks/results/paper-scale-table.md

Results: the comparison folder ``benchmarks/results/paper-scale/`` (``pieces/``: per method
and seed the held-out subjects' scores, the prior, the splits; ``report.md``/``.json``,
``records/``), its reference lines in ``references/seed-<S>.json`` and the table
``benchmarks/results/paper-scale-table.md`` / ``.json``: per method accuracy (the paper's
number), AUC and hidden-positive recall as mean (std) over seeds, the paired differences of
``report.json`` (bootstrap CI over seeds and subjects), the reference lines, the prior
estimates against the true priors, and the paper's ADNI table beside.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from adni_pu.fileio import atomic_write_text
from adni_pu.pu.metrics import TABLE_METRICS, metric_label
from benchmarks.common import REPO, command_line, mean_std_cell, script_parser, write_json

RESULTS = REPO / "benchmarks" / "results" / "paper-scale"
#: The reference lines and what each is (the logistic one: the comparison's own, kept here
#: for the converted results, whose scans are not committed).
LOGISTIC, TRUTH = "logistic regression on 2 volumes", "generator truth: hippocampal loss"
REFERENCE_NOTES = {
    LOGISTIC: "two volumes measured on the scans (hippocampal tissue, CSF around the lateral "
              "ventricles), a class-balanced logistic regression fitted on the training "
              "subjects' PU labels (labelled vs unlabelled, as naive training learns), "
              "threshold 0",
    TRUTH: "the generator's true hippocampal loss, which no model sees, cut at the threshold "
           "with the best accuracy against the truth on the training subjects: what a "
           "perfect hippocampal measurement with the best cut would give",
}
#: The paper's ADNI accuracies (%), test-selected on its private split.
PAPER = {"naive": 73.27, "upu": 73.45, "nnpu": 75.96, "selfpu": 79.50}
#: The paired differences of the table, A minus B (``cohort-report --pair``), and their
#: metrics.
PAIRS: tuple[tuple[str, str], ...] = (("nnpu", "naive"), ("selfpu", "nnpu"), ("nnpu", "upu"),
                                      ("selfpu", "naive"), ("nnpu-estimated", "nnpu"),
                                      ("vpu", "nnpu"), ("vpu", "naive"))
PAIRED = ("accuracy", "auc", "hidden_positive_recall")


def best_threshold(scores: Any, truth: Any) -> float:
    """The cut on ``scores`` (higher: positive) with the highest accuracy against ``truth``
    (1/0; NaN left out): midway between neighbouring scores, the lowest such cut on ties."""
    import numpy as np

    s = np.asarray(scores, dtype=float)
    t = np.asarray(truth, dtype=float)
    s, t = s[~np.isnan(t)], t[~np.isnan(t)] == 1
    if len(s) == 0:
        raise ValueError("best threshold: no score with a known truth")
    u = np.unique(s)
    cuts = np.r_[u[0] - 1.0, (u[:-1] + u[1:]) / 2, u[-1] + 1.0]
    correct = ((s[None, :] > cuts[:, None]) == t[None, :]).sum(axis=1)
    return float(cuts[int(np.argmax(correct))])


def truth_line(manifest: Path, synth: Path) -> dict[str, Any]:
    """The generator's truth line on one seed's split (its hold-out manifest): each
    subject's true hippocampal loss (mean over its scans), cut at the best threshold on the
    training subjects, scored on the held-out ones."""
    import pandas as pd

    from adni_pu.cohort import read_manifest
    from adni_pu.workflows.compare.folds import subject_table

    subjects = subject_table(read_manifest(manifest))
    truth = pd.read_csv(synth / "truth_scans.csv", dtype={"subject_id": str})
    loss = truth.groupby("subject_id")["hippocampal_loss"].mean().rename("logit")
    scored = subjects.merge(loss.reset_index(), on="subject_id")
    train, test = (scored[scored["split"].astype(str) == s] for s in ("train", "test"))
    held = int((subjects["split"].astype(str) == "test").sum())
    if len(test) != held:
        raise ValueError(f"{synth}/truth_scans.csv: {len(test)} of the {held} held-out "
                         f"subjects of {manifest} have a true hippocampal loss")
    cut = best_threshold(train["logit"], train["truth"])
    preds = test.assign(logit=test["logit"] - cut)
    return {"note": REFERENCE_NOTES[TRUTH],
            "threshold": {"hippocampal_loss": cut, "chosen_on": "train"},
            "predictions": [{"subject_id": r.subject_id, "pu_label": int(r.pu_label),
                             "logit": float(r.logit),
                             "truth": None if pd.isna(r.truth) else float(r.truth)}
                            for r in preds.itertuples()]}


def truth(args: argparse.Namespace) -> None:
    """The truth line of each seed of the comparison in ``args.folder``:
    ``references/seed-<S>.json``."""
    from adni_pu.workflows.compare.pieces import seed_manifest
    from adni_pu.workflows.compare.report import read_spec

    spec = read_spec(args.folder)
    if spec.holdout is None:
        raise SystemExit(f"{args.folder}: a comparison with --holdout (a split per seed)")
    for seed in spec.seed_values:
        tic = time.perf_counter()
        line = truth_line(seed_manifest(args.folder, seed), args.synth)
        out = {"seed": seed, "machine": args.machine, "command": command_line(__file__),
               "date": time.strftime("%Y-%m-%d"), "wall_s": round(time.perf_counter() - tic, 1),
               "lines": {TRUTH: line}}
        path = write_json(args.folder / "references" / f"seed-{seed}.json", out)
        print(f"truth line seed {seed} -> {path}")


def seed_list(seeds: list[int]) -> str:
    """Seeds as runs of consecutive numbers: [0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    runs: list[list[int]] = []
    for seed in sorted(seeds):
        if runs and seed == runs[-1][-1] + 1:
            runs[-1].append(seed)
        else:
            runs.append([seed])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def machine_cell(recs: list[dict]) -> str:
    """Each machine of ``recs`` with the seeds it ran (a machine description may itself
    hold semicolons, so machines are set apart by " / ")."""
    machines = sorted({r["machine"] for r in recs})
    if len(machines) == 1:
        return machines[0]
    return " / ".join(f"{m} (seeds {seed_list([r['seed'] for r in recs if r['machine'] == m])})"
                      for m in machines)


def per_seed_metrics(frame: Any) -> dict[int, dict[str, float]]:
    """Each seed's metrics of per-subject predictions (``seed, logit, truth, pu_label``)."""
    from adni_pu.pu.metrics import binary_metrics

    known = frame[frame["truth"].notna()]
    return {int(s): binary_metrics(g["logit"].to_numpy(float), g["truth"].to_numpy(float),
                                   g["pu_label"].to_numpy(float))
            for s, g in known.groupby("seed", sort=True)}


def finished(folder: Path) -> tuple[Any, dict[str, Any], list[dict]]:
    """A comparison folder's settings, per method the held-out predictions of its finished
    seeds, and the finished pieces' records (:func:`adni_pu.workflows.compare.report.collect`)."""
    from adni_pu.workflows.compare.report import collect, read_spec

    spec = read_spec(folder)
    frames, records, _ = collect(spec)
    if not frames:
        raise SystemExit(f"{folder}: no method has a finished seed")
    return spec, frames, records


def load(folder: Path) -> dict[str, Any]:
    """A comparison folder's settings, report, pooled predictions, finished pieces (per
    method, by seed) and reference lines."""
    import pandas as pd

    from adni_pu.workflows.compare.pieces import SETTINGS_FILE

    spec, frames, records = finished(folder)
    report_path = folder / "report.json"
    if not report_path.is_file():
        raise SystemExit(f"{folder}: no report.json; run adni-pu benchmark cohort-report "
                         f"{folder} first")
    pieces: dict[str, list[dict]] = {}
    for r in sorted(records, key=lambda r: r["seed"]):
        if int(r["seed"]) in set(frames.get(r["method"], pd.DataFrame({"seed": []}))["seed"]):
            pieces.setdefault(r["method"], []).append(r)
    refs = [json.loads(p.read_text()) for p in (folder / "references").glob("seed-*.json")]
    return {"spec": spec, "record": json.loads((folder / SETTINGS_FILE).read_text()),
            "report": json.loads(report_path.read_text()), "frames": frames,
            "pieces": pieces, "references": sorted(refs, key=lambda r: r["seed"])}


def reference_rows(refs: list[dict], report: dict[str, Any]) -> tuple[list[str], dict]:
    """The table rows of the reference lines (mean (std) over the seeds that have them, the
    methods' columns) and their summary: the lines of ``references/``, and the comparison's
    own logistic line where those lack it."""
    import pandas as pd

    from adni_pu.pu.metrics import summarise

    rows, summary = [], {}
    names = list(dict.fromkeys(name for r in refs for name in r["lines"]))
    for name in names:
        recs = [r for r in refs if name in r["lines"]]
        frame = pd.concat([pd.DataFrame(r["lines"][name]["predictions"]).assign(seed=r["seed"])
                           for r in recs]).astype({"truth": float})
        scored = per_seed_metrics(frame)
        values = {m: [scored[r["seed"]][m] for r in recs] for m in TABLE_METRICS}
        minutes = summarise([r["wall_s"] / 60 for r in recs])["mean"]
        rows.append(f"| *reference: {name}* | {seed_list([r['seed'] for r in recs])} | "
                    + " | ".join(mean_std_cell(values[m]) for m in TABLE_METRICS)
                    + f" | - | {minutes:.1f} | " + machine_cell(recs) + " |")
        summary[name] = {m: summarise(v) for m, v in values.items()}
        summary[name]["seeds"] = [r["seed"] for r in recs]
    own = report.get("references", {}).get(LOGISTIC, {})
    if LOGISTIC not in summary and "metrics" in own:
        cells = [f"{100 * own['metrics'][m]['over_seeds']['mean']:.1f} "
                 f"({100 * own['metrics'][m]['over_seeds']['std']:.1f})" for m in TABLE_METRICS]
        rows.append(f"| *reference: {LOGISTIC}* | (the comparison's) | " + " | ".join(cells)
                    + " | - | - | - |")
        summary[LOGISTIC] = {m: own["metrics"][m]["over_seeds"] for m in TABLE_METRICS}
    return rows, summary


def prior_estimation(recs: list[dict]) -> tuple[list[str], dict[str, Any]]:
    """The estimated-prior pieces' estimates against the training splits' true priors: a
    table per seed, the mean absolute error and how often the CI held the truth."""
    rows = []
    for r in recs:
        est = r.get("prior_estimate") or {}
        true = est.get("true_prior", r.get("splits", {}).get("train", {}).get("class_prior"))
        if est and true is not None:
            rows.append((r["seed"], {**est, "true_prior": true}))
    if not rows:
        return [], {}
    errors = [e["value"] - e["true_prior"] for _, e in rows]
    held = [e["ci_low"] <= e["true_prior"] <= e["ci_high"] for _, e in rows]
    summary = {"seeds": [s for s, _ in rows],
               "estimate": [e["value"] for _, e in rows],
               "ci": [[e["ci_low"], e["ci_high"]] for _, e in rows],
               "true_prior": [e["true_prior"] for _, e in rows], "error": errors,
               "mean_abs_error": sum(map(abs, errors)) / len(errors),
               "mean_error": sum(errors) / len(errors),
               "ci_holds_true_prior": sum(held), "n": len(rows)}
    lines = ["", "The class prior of nnpu-estimated, estimated per seed from the PU data "
             "alone (a P-vs-U classifier's scores of the validation split, best-bin "
             "estimation, 95 % bootstrap CI), against the training split's true prior (the "
             "amyloid-positive share of its subjects with a truth, which the estimate never "
             "sees):", "",
             "| seed | true prior | estimate [95 % CI] | error | CI holds the truth | "
             "P-vs-U validation AUC |", "|---|---|---|---|---|---|"]
    for (seed, e), err, ok in zip(rows, errors, held):
        auc = (e.get("classifier") or {}).get("val_pu_auc")
        lines.append(f"| {seed} | {e['true_prior']:.3f} | {e['value']:.3f} "
                     f"[{e['ci_low']:.3f}, {e['ci_high']:.3f}] | {err:+.3f} | "
                     f"{'yes' if ok else 'no'} | "
                     + (f"{auc:.3f}" if auc is not None else "-") + " |")
    lines += ["", f"Mean absolute error {summary['mean_abs_error']:.3f} over {len(rows)} "
              f"seed(s) (mean error {summary['mean_error']:+.3f}); the CI held the true "
              f"prior on {sum(held)} of {len(rows)}."]
    return lines, summary


def paired_line(d: dict[str, Any], metric: str, extra: str = "") -> str:
    """One paired difference as a table row, in percentage points."""
    m = d["metrics"][metric]
    return (f"| {d['pair']} | {metric.replace('_', ' ')} | {100 * m['value']:+.1f} "
            f"[{100 * m['ci_low']:+.1f}, {100 * m['ci_high']:+.1f}] | "
            f"{m['share_a_better']:.2f} | {seed_list(d['seeds'])} |{extra}")


def beside_rows(mine: dict[str, Any], other: dict[str, Any], names: tuple[str, str],
                n_boot: int) -> list[dict]:
    """Each method of comparison ``mine`` minus the same method of ``other`` (the same
    cohort's subjects another way, e.g. preprocessed scans against the generator's ideal
    volumes), paired on the seeds both have and, within each seed, the held-out subjects
    both scored; ``names`` name the two sides."""
    from adni_pu.workflows.compare.scores import paired_difference

    rows = []
    for method, a in mine.items():
        if method not in other:
            continue
        b = other[method]
        seeds = sorted(set(a["seed"]) & set(b["seed"]))
        if not seeds:
            continue
        a, b = a[a["seed"].isin(seeds)], b[b["seed"].isin(seeds)]
        held_out = [len(a), len(b)]
        common = a[["seed", "subject_id"]].merge(b[["seed", "subject_id"]])
        a, b = (f.merge(common) for f in (a, b))
        rows.append({"pair": f"{method}: {names[0]} - {names[1]}", "seeds": seeds,
                     "held_out": held_out, "paired_subjects": len(common),
                     "metrics": {m: paired_difference(a, b, n_boot=n_boot, metric=m)
                                 for m in PAIRED}})
    return rows


def _shown(path: Path) -> Path:
    """``path`` relative to the repository where it lies inside it."""
    full = path.resolve()
    return full.relative_to(REPO) if full.is_relative_to(REPO) else path


def table(args: argparse.Namespace) -> None:
    """The table beside the paper's, from a comparison folder and its reference lines."""
    from adni_pu.provenance import provenance
    from adni_pu.pu.metrics import summarise

    done = load(args.folder)
    report, pieces, frames = done["report"], done["pieces"], done["frames"]
    head = ["method", "seeds", *(metric_label(m) for m in TABLE_METRICS),
            "paper accuracy", "minutes per run", "machine"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    summary = {}
    for method, recs in pieces.items():
        scored = per_seed_metrics(frames[method])
        values = {m: [scored[r["seed"]][m] for r in recs] for m in TABLE_METRICS}
        minutes = summarise([r["train_seconds"] / 60 for r in recs])["mean"]
        paper = f"{PAPER[method]:.2f}" if method in PAPER else "-"
        rows.append(f"| {method} | {seed_list([r['seed'] for r in recs])} | "
                    + " | ".join(mean_std_cell(values[m]) for m in TABLE_METRICS)
                    + f" | {paper} | {minutes:.0f} | " + machine_cell(
                        [{"seed": r["seed"], "machine": r.get("machine") or "-"} for r in recs])
                    + " |")
        summary[method] = {m: summarise(v) for m, v in values.items()}
        summary[method]["seeds"] = [r["seed"] for r in recs]
        summary[method]["wall_s"] = [r["train_seconds"] for r in recs]
    first_method = next(iter(pieces))
    scored = per_seed_metrics(frames[first_method])
    for name, key in (("call everyone negative", "all_negative_accuracy"),
                      ("call everyone positive", "all_positive_accuracy")):
        rows.append(f"| *reference: {name}* | {seed_list(list(scored))} | "
                    + mean_std_cell([s[key] for s in scored.values()])
                    + " |" + " - |" * (len(head) - 3))
    ref_rows, ref_summary = reference_rows(done["references"], report)
    rows += ref_rows
    prior_lines, prior_summary = prior_estimation(pieces.get("nnpu-estimated", []))
    first = pieces[first_method][0]
    test, train = first["splits"]["test"], first["splits"]["train"]
    cohort = done["record"].get("cohort") or {}
    subjects = sum(first["splits"][s]["subjects"] for s in ("train", "val", "test"))
    described = (f"cohort seed {cohort['cohort_seed']}: {cohort['data']}" if cohort else
                 f"cohort `{done['spec'].manifest}`")
    lines = [
        "# The paper's ADNI testbed at its scale (synthetic cohort)", "",
        f"{subjects} subjects, {described}; labels by the `paper` preset; per "
        f"seed {test['subjects']} held out, {train['subjects']} trained on and the rest "
        f"({subjects - test['subjects'] - train['subjects']}) validated "
        "on, by subject. The first seed's training split: "
        f"n_p = {train['n_p']}, class prior {train['class_prior']:.3f}, "
        f"{train['hidden_positive']} hidden positives ({train['hidden_share']:.0%} of the "
        f"positives); its test split: {test['hidden_positive']} hidden positives of "
        f"{test['truth_positive']} positives. Test split, mean (std) over seeds, percent; "
        "each seed's metrics are on its own held-out subjects.", "",
        *rows, "",
        "Paired differences (percentage points), 95 % CI from a paired bootstrap over the "
        f"seeds and the held-out subjects within each seed ({report['n_boot']} resamples):",
        "", "| difference | metric | value [95 % CI] | share of resamples > 0 | seeds |",
        "|---|---|---|---|---|"]
    lines += [paired_line(d, m) for d in report["paired"] for m in PAIRED
              if m in d["metrics"]]
    beside = []
    if args.beside is not None:
        other = finished(args.beside)[1]
        beside = beside_rows(frames, other, (args.folder.name, args.beside.name),
                             report["n_boot"])
        lines += ["", "Each method against itself on the same subjects in "
                  f"`{_shown(args.beside)}` (paired bootstrap as above; subjects: those both "
                  "held out and scored, of those held out here and there, and how many of "
                  "them have a truth, which every metric needs):", "",
                  "| difference | metric | value [95 % CI] | share of resamples > 0 | seeds | "
                  "subjects |", "|---|---|---|---|---|---|"]
        lines += [paired_line(d, m, f" {d['paired_subjects']} of {d['held_out'][0]} / "
                                    f"{d['held_out'][1]} ({d['metrics'][m]['n_subjects']} "
                                    "with a truth) |")
                  for d in beside for m in PAIRED]
    lines += prior_lines
    if ref_summary:
        lines += ["", "Reference lines, on each seed's held-out subjects: " + "; ".join(
            f"*{name}*: {REFERENCE_NOTES.get(name, '')}" for name in ref_summary) + "."]
    lines += ["", "The paper's column is its ADNI table (Chen et al., ICML 2020): accuracy on "
              "its private 113-subject test split, with the model chosen on that split's "
              "curve; ours are chosen on validation. Different data: read the columns for "
              "the ordering and the size of the PU effect, not for equal numbers.", "",
              f"From `{report.get('command') or 'adni-pu benchmark cohort-report'}` and "
              f"`{command_line(__file__)}` over the "
              f"comparison folder `{_shown(args.folder)}` (each piece has its settings, "
              "prior, splits and machine).", ""]
    text = "\n".join(lines)
    atomic_write_text(args.out.with_suffix(".md"), text)
    write_json(args.out.with_suffix(".json"), {
        "command": command_line(__file__), "paper": PAPER, "methods": summary,
        "references": ref_summary, "paired": report["paired"],
        "prior_estimation": prior_summary,
        "beside": {"results": str(_shown(args.beside)), "paired": beside} if beside else None,
        "provenance": provenance()}, default=str)
    print(text)


def main() -> None:
    parser = script_parser(__doc__)
    sub = parser.add_subparsers(dest="step", required=True)
    t = sub.add_parser("truth", help="the generator's truth line on each seed's split")
    t.add_argument("folder", type=Path, help="the comparison folder (--holdout)")
    t.add_argument("--synth", type=Path, required=True,
                   help="the `adni-pu synth --layout bids` folder (its truth_scans.csv)")
    t.add_argument("--machine", default="2-core CPU VM, no GPU")
    p = sub.add_parser("table", help="the table beside the paper's")
    p.add_argument("folder", type=Path, nargs="?", default=RESULTS)
    p.add_argument("--out", type=Path, default=RESULTS.parent / "paper-scale-table.md")
    p.add_argument("--beside", type=Path, default=None,
                   help="another comparison folder of the same cohort's subjects (e.g. the "
                        "ideal volumes beside the real preprocessing): each method against "
                        "itself there, paired")
    args = parser.parse_args()
    {"truth": truth, "table": table}[args.step](args)


if __name__ == "__main__":
    main()

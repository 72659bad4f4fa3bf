"""The paper's ADNI testbed at its scale, on a synthetic cohort: naive, uPU, nnPU, Self-PU.

Beside them nnPU with the class prior estimated from the PU data alone (``nnpu-estimated``:
``prior = "estimate"``, :mod:`adni_pu.workflows.prior`, what a cohort without amyloid PET
has to do) and the demo's reference lines on the same splits: a logistic regression on two
volumes measured on the scans and the generator's true hippocampal loss.

935 synthetic subjects with ADNI's composition (the generator's defaults, docs/volumes.md
"Composition") and the demo's disease effects, labelled by the ``paper`` preset (labelled:
diagnosed patients; truth: that diagnosis or SUVR >= 1.08, so amyloid-positive MCI and CN
are hidden in the unlabelled set). Per seed a subject-level split holds out 113 subjects
(the paper's test count) and trains and validates on the other 822 (15 % of all subjects
validate), stratified by label and truth. The 3-branch CNN and every training setting are
the demo's (chosen on the demo's tuning cohorts, ``benchmarks/results/demo-tuning-log.md``);
nothing here was tuned, and the test split is scored once, after training.

In pieces that each write their own results file, so a run cut short keeps what finished
and every piece can run on another machine::

    # 1. generate the cohort once (and preprocess it: ``--preprocessing real``, 46 minutes
    #    on 2 cores; the default uses the generator's ideal model-grid volumes)
    python -m benchmarks.paper_scale prepare --work runs/paper-scale
    # 2. one method and one seed per call (seed = split seed = training seed); resumable
    python -m benchmarks.paper_scale run --work runs/paper-scale --method nnpu --seed 0
    #    (``--method nnpu-estimated``: nnPU with the estimated prior)
    # 3. the reference lines on seeds' splits (no CNN: seconds per seed once the volume
    #    features are measured, a few minutes the first time)
    python -m benchmarks.paper_scale references --work runs/paper-scale --seed 0 1 2
    # 4. the table over the results files found
    python -m benchmarks.paper_scale table
    # 5. a cohort prepared with --preprocessing real, its results in their own folder
    #    (``run --results``), each method paired with itself on the ideal volumes
    python -m benchmarks.paper_scale table --results benchmarks/results/paper-scale-real \
        --out benchmarks/results/paper-scale-real-table.md --beside benchmarks/results/paper-scale

Results: ``benchmarks/results/paper-scale/<method>-seed<S>.json`` (metrics with CIs over
subjects, per-subject test predictions, wall time, machine, settings, versions; for
``nnpu-estimated`` the prior estimate with its CI beside the training split's true prior),
``reference-seed<S>.json`` (the reference lines, the same metrics on the same held-out
subjects) and ``benchmarks/results/paper-scale-table.md`` / ``.json``: accuracy (the
paper's number), AUC and hidden-positive recall per method as mean (std) over seeds,
paired differences of accuracy with a bootstrap CI over seeds and subjects, the reference
lines, the prior estimates against the true priors, and the paper's ADNI table beside.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from adni_pu.fileio import atomic_write_text
from adni_pu.pu.metrics import TABLE_METRICS, metric_label
from benchmarks.common import (
    REPO,
    add_prepare_options,
    add_run_options,
    command_line,
    mean_std_cell,
    prepare_cohort,
    script_parser,
    train_on_split,
    write_json,
)

RESULTS = REPO / "benchmarks" / "results" / "paper-scale"
METHODS = ("naive", "upu", "nnpu", "selfpu", "nnpu-estimated", "vpu")
#: Methods that are a training preset with settings of their own: name -> (preset, the
#: ``--set`` overrides it adds after the demo's settings and the user's).
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    # the class prior from the PU data alone (a P-vs-U classifier and best-bin estimation
    # on the validation split): what a cohort without amyloid PET has to use
    "nnpu-estimated": ("nnpu", ('prior="estimate"',)),
}
#: The reference lines (names as :func:`adni_pu.workflows.demo_policy.reference_scores`
#: gives them) and what each is.
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
#: The paper's ADNI testbed (Chen et al., ICML 2020): 822 train, 113 test subjects.
SUBJECTS, TEST_SUBJECTS = 935, 113
VAL_FRACTION = 0.15
#: The paper's ADNI accuracies (%), test-selected on its private split.
PAPER = {"naive": 73.27, "upu": 73.45, "nnpu": 75.96, "selfpu": 79.50}
PAIRS: tuple[tuple[str, str], ...] = (("nnpu", "naive"), ("selfpu", "nnpu"), ("nnpu", "upu"),
                                      ("selfpu", "naive"), ("nnpu-estimated", "nnpu"),
                                      ("vpu", "nnpu"), ("vpu", "naive"))


def _settings(work: Path, subjects: int, cohort_seed: int, preprocessing: str, workers: int):
    from adni_pu.workflows.demo import DemoSettings

    return DemoSettings(subjects=subjects, out=work, preprocessing=preprocessing,
                        workers=workers, seed=cohort_seed)


def prepare(args: argparse.Namespace) -> None:
    """Generate (and with ``--preprocessing real`` preprocess) the cohort once."""
    settings = _settings(args.work, args.subjects, args.cohort_seed, args.preprocessing,
                         args.workers)
    prepare_cohort(settings, {"subjects": args.subjects, "cohort_seed": args.cohort_seed,
                              "synth": settings.synth, "workers": args.workers})


def method_run(method: str, overrides: list[str]) -> tuple[str, list[str]]:
    """The training preset and the ``--set`` overrides of ``method`` (:data:`VARIANTS`);
    a user's override of a setting the method fixes is refused (the results file would
    name a method it did not run)."""
    from adni_pu.config import parse_override

    preset, own = VARIANTS.get(method, (method, ()))
    fixed = {tuple(parse_override(o)[0]) for o in own}
    if ("prior",) in fixed:
        fixed.add(("train", "prior"))  # another name for the class prior
    clash = [o for o in overrides if tuple(parse_override(o)[0]) in fixed]
    if clash:
        raise SystemExit(f"--method {method} sets {', '.join(own)}; --set {clash[0]} "
                         "would change it (use --method " + preset + " for other values)")
    return preset, [*overrides, *own]


def prior_estimate_record(run_dir: Path) -> dict[str, Any] | None:
    """The run's prior estimate (``prior_estimate.json``) beside the training split's true
    prior, with the error and whether the CI holds the truth; None for a run that was
    given its prior."""
    path = run_dir / "prior_estimate.json"
    if not path.is_file():
        return None
    est = json.loads(path.read_text())
    used = json.loads((run_dir / "run.json").read_text()).get("prior")
    out = {**est, "prior_trained_with": used}
    if est.get("true_prior") is not None:
        out["error"] = est["value"] - est["true_prior"]
        out["ci_holds_true_prior"] = bool(est["ci_low"] <= est["true_prior"] <= est["ci_high"])
    return out


def run(args: argparse.Namespace) -> None:
    """Train one method on one seed's split and score its held-out subjects once."""
    from adni_pu.cohort import pu_summary
    from adni_pu.provenance import provenance

    subjects = json.loads((args.work / "prepared.json").read_text())["subjects"]
    preset, overrides = method_run(args.method, args.set)
    tic = time.perf_counter()
    done = train_on_split(argparse.Namespace(**{**vars(args), "set": overrides}), print,
                          preset=preset, test_fraction=TEST_SUBJECTS / subjects,
                          val_fraction=VAL_FRACTION)
    info, pooled, manifest = done["info"], done["pooled"], done["cohort"].manifest
    splits = {s: pu_summary(manifest[manifest["split"] == s]) for s in ("train", "val", "test")}
    out = {
        "benchmark": "paper-scale synthetic ADNI: naive vs uPU vs nnPU vs Self-PU",
        "command": command_line(__file__),
        "date": time.strftime("%Y-%m-%d"), "machine": f"{args.machine}; torch threads "
        f"{args.threads}", "data": f"synthetic ADNI-like cohort ({info['preprocessing']})",
        "method": args.method, "preset": preset, "seed": args.seed, "epochs": args.epochs,
        "cohort": {"subjects": info["subjects"], "cohort_seed": info["cohort_seed"],
                   "synth": info["synth"], "prior": done["prior"],
                   "prior_note": done["prior_note"], "splits": splits},
        "settings": done["settings"], "overrides": overrides,
        "wall_s": round(time.perf_counter() - tic, 1),
        "metrics": pooled["metrics"], "n_scored": pooled["n_scored"],
        "n_positive": pooled["n_positive"], "n_hidden": pooled.get("n_hidden"),
        "result": done["record"], "provenance": provenance(),
    }
    estimate = prior_estimate_record(done["run_dir"])
    if estimate is not None:
        out["prior_estimate"] = estimate
        out["cohort"]["prior_note"] += "; not given to this run, which estimated its prior"
    path = write_json(args.results / f"{args.method}-seed{args.seed}.json", out, default=str)
    m = pooled["metrics"]
    print(f"{args.method} seed {args.seed}: accuracy {m['accuracy']['value']:.3f}, AUC "
          f"{m['auc']['value']:.3f}, hidden-positive recall "
          f"{m['hidden_positive_recall']['value']:.3f} ({out['wall_s']:.0f} s) -> {path}")
    if estimate is not None:
        print(f"  prior estimate {estimate['value']:.3f} [{estimate['ci_low']:.3f}, "
              f"{estimate['ci_high']:.3f}], true {estimate.get('true_prior')}")


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


def reference_lines(work: Path, seed: int, n_boot: int = 1000,
                    results: Path | None = None) -> dict[str, Any]:
    """The reference lines on seed ``seed``'s subject-level split of the cohort prepared in
    ``work``, scored on its held-out subjects as the methods are (:data:`REFERENCE_NOTES`).

    The split is the one :func:`run` trains on (the same cohort stage, seed and
    fractions), built in a temporary folder so that no cohort folder of a running training
    is written; with ``results``, refused before any scoring when a method's results file
    there of this seed held out other subjects. The volume features are measured once and kept in
    ``work/volume_features.csv`` (:func:`~adni_pu.workflows.demo_policy.reference_scores`).
    """
    import tempfile

    import pandas as pd

    from adni_pu.cohort import pu_summary, read_manifest
    from adni_pu.workflows.crossval import pooled_metrics, subject_frame
    from adni_pu.workflows.demo import cohort_stage
    from adni_pu.workflows.demo_policy import reference_scores

    info = json.loads((work / "prepared.json").read_text())
    with tempfile.TemporaryDirectory(prefix="paper-scale-split-") as tmp:
        _, path = cohort_stage(Path(tmp) / "cohort", work / "synth", Path(info["summary"]),
                               seed, lambda m: None,
                               test_fraction=TEST_SUBJECTS / info["subjects"],
                               val_fraction=VAL_FRACTION)
        manifest = read_manifest(path)
        manifest["split"] = manifest["split"].astype(str)
        split = manifest.groupby("subject_id")["split"].first()
        subjects = subject_frame(manifest)
        subjects["split"] = subjects["subject_id"].map(split)
        test_ids = set(subjects.loc[subjects["split"] == "test", "subject_id"])
        if results is not None:
            check_same_subjects(results, seed, sorted(test_ids))
        # the truth line on the training subjects too: its cut is chosen on them
        scored = subjects[subjects["split"].isin(["train", "test"])]
        lines = reference_scores(work, work / "synth", [path], scored.drop(columns="split"),
                                 n_boot)
    truth = pd.DataFrame(lines[TRUTH]["predictions"])
    on_test = truth["subject_id"].isin(test_ids)
    cut = best_threshold(truth.loc[~on_test, "logit"], truth.loc[~on_test, "truth"])
    truth = truth[on_test].assign(logit=lambda f: f["logit"] - cut)
    out: dict[str, Any] = {}
    for name, preds in ((LOGISTIC, pd.DataFrame(lines[LOGISTIC]["predictions"])),
                        (TRUTH, truth)):
        if set(preds["subject_id"]) != test_ids:
            raise ValueError(f"{name}: scored {len(preds)} subjects, not the split's "
                             f"{len(test_ids)} held-out ones")
        pooled = pooled_metrics(preds, n_boot)
        out[name] = {"note": REFERENCE_NOTES[name], "metrics": pooled["metrics"],
                     "n_scored": pooled["n_scored"], "n_positive": pooled["n_positive"],
                     "n_hidden": pooled.get("n_hidden"),
                     "predictions": preds.to_dict("records")}
    out[TRUTH]["threshold"] = {"hippocampal_loss": cut, "chosen_on": "train"}
    splits = {s: pu_summary(manifest[manifest["split"] == s]) for s in ("train", "val", "test")}
    return {"lines": out, "splits": splits, "info": info}


def check_same_subjects(results: Path, seed: int, ids: list[str]) -> None:
    """Refuse held-out subjects ``ids`` (sorted) that differ from those of a method's
    results file of the same seed (another cohort or split), naming the file."""
    for method in METHODS:
        path = results / f"{method}-seed{seed}.json"
        if path.is_file():
            theirs = sorted(p["subject_id"] for p in
                            json.loads(path.read_text())["result"]["predictions"])
            if theirs != ids:
                raise SystemExit(f"{path}: holds out {len(theirs)} other subjects than "
                                 f"seed {seed}'s split of this cohort ({len(ids)}); the "
                                 "reference lines would not be on the same subjects")


def references(args: argparse.Namespace) -> None:
    """The reference lines of each seed's split: ``reference-seed<S>.json`` per seed."""
    from adni_pu.provenance import provenance

    for seed in args.seed:
        tic = time.perf_counter()
        done = reference_lines(args.work, seed, args.boot, args.results)
        info = done["info"]
        out = {
            "benchmark": "paper-scale synthetic ADNI: reference lines",
            "command": command_line(__file__), "date": time.strftime("%Y-%m-%d"),
            "machine": args.machine, "data": f"synthetic ADNI-like cohort "
            f"({info['preprocessing']})", "seed": seed,
            "cohort": {"subjects": info["subjects"], "cohort_seed": info["cohort_seed"],
                       "synth": info["synth"], "splits": done["splits"]},
            "wall_s": round(time.perf_counter() - tic, 1), "references": done["lines"],
            "provenance": provenance()}
        path = write_json(args.results / f"reference-seed{seed}.json", out, default=str)
        print(f"references seed {seed} ({out['wall_s']:.0f} s) -> {path}: " + "; ".join(
            f"{name}: accuracy {r['metrics']['accuracy']['value']:.3f}, AUC "
            f"{r['metrics']['auc']['value']:.3f}" for name, r in done["lines"].items()))


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


def load_results(directory: Path) -> dict[str, list[dict]]:
    """Every results file of ``directory``, by method, sorted by seed."""
    out: dict[str, list[dict]] = {}
    for method in METHODS:
        recs = [json.loads(f.read_text()) for f in directory.glob(f"{method}-seed*.json")]
        if recs:
            out[method] = sorted(recs, key=lambda r: r["seed"])
    return out


def predictions(recs: list[dict], seeds: list[int]) -> Any:
    """The per-subject test predictions of results files ``recs`` on ``seeds``, one frame
    with a ``seed`` column (what :func:`paired_difference` pairs on)."""
    import pandas as pd

    return pd.concat([pd.DataFrame(r["result"]["predictions"]).assign(seed=r["seed"])
                      for r in recs if r["seed"] in seeds])


def paired_rows(results: dict[str, list[dict]], n_boot: int = 1000) -> list[dict]:
    """Paired differences (accuracy and AUC) on the seeds both methods have."""

    from adni_pu.workflows.compare.scores import paired_difference

    rows = []
    for a, b in PAIRS:
        if a not in results or b not in results:
            continue
        seeds = sorted({r["seed"] for r in results[a]} & {r["seed"] for r in results[b]})
        if not seeds:
            continue
        frames = {m: predictions(results[m], seeds) for m in (a, b)}
        for metric in ("accuracy", "auc", "hidden_positive_recall"):
            d = paired_difference(frames[a], frames[b], n_boot=n_boot, metric=metric)
            rows.append({"pair": f"{a} - {b}", "metric": metric, "seeds": seeds, **d})
    return rows


def beside_rows(results: dict[str, list[dict]], other: dict[str, list[dict]],
                names: tuple[str, str], n_boot: int = 1000) -> list[dict]:
    """Each method of ``results`` minus the same method of ``other`` (the same cohort's
    subjects another way, e.g. preprocessed scans against the generator's ideal volumes),
    paired on the seeds both have and, within each seed, the held-out subjects both
    scored (all of them where both cohorts made the same split); ``names`` name the two
    sides in the rows."""

    from adni_pu.workflows.compare.scores import paired_difference

    rows = []
    for method in METHODS:
        if method not in results or method not in other:
            continue
        seeds = sorted({r["seed"] for r in results[method]} & {r["seed"] for r in other[method]})
        if not seeds:
            continue
        a, b = predictions(results[method], seeds), predictions(other[method], seeds)
        held_out = [len(a), len(b)]
        common = a[["seed", "subject_id"]].merge(b[["seed", "subject_id"]])
        a, b = (f.merge(common) for f in (a, b))
        pair = f"{method}: {names[0]} - {names[1]}"
        for metric in ("accuracy", "auc", "hidden_positive_recall"):
            d = paired_difference(a, b, n_boot=n_boot, metric=metric)
            rows.append({"pair": pair, "metric": metric, "seeds": seeds,
                         "held_out": held_out, "paired_subjects": len(common), **d})
    return rows


def load_references(directory: Path) -> list[dict]:
    """Every ``reference-seed<S>.json`` of ``directory``, sorted by seed."""
    recs = [json.loads(f.read_text()) for f in directory.glob("reference-seed*.json")]
    return sorted(recs, key=lambda r: r["seed"])


def reference_rows(refs: list[dict]) -> tuple[list[str], dict[str, Any]]:
    """The table rows of the reference lines (mean (std) over the seeds that have them, the
    methods' columns) and their summary."""
    from adni_pu.pu.metrics import summarise

    rows, summary = [], {}
    names = list(dict.fromkeys(name for r in refs for name in r["references"]))
    for name in names:
        recs = [r for r in refs if name in r["references"]]
        values = {m: [r["references"][name]["metrics"][m]["value"] for r in recs]
                  for m in TABLE_METRICS}
        minutes = summarise([r["wall_s"] / 60 for r in recs])["mean"]
        rows.append(f"| *reference: {name}* | {seed_list([r['seed'] for r in recs])} | "
                    + " | ".join(mean_std_cell(values[m]) for m in TABLE_METRICS)
                    + f" | - | {minutes:.1f} | " + machine_cell(recs) + " |")
        summary[name] = {m: summarise(v) for m, v in values.items()}
        summary[name]["seeds"] = [r["seed"] for r in recs]
    return rows, summary


def prior_estimation(recs: list[dict]) -> tuple[list[str], dict[str, Any]]:
    """The estimated-prior runs' estimates against the training splits' true priors: a
    table per seed, the mean absolute error and how often the CI held the truth."""
    rows = [(r["seed"], r["prior_estimate"]) for r in recs
            if (r.get("prior_estimate") or {}).get("true_prior") is not None]
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


def _shown(path: Path) -> Path:
    """``path`` relative to the repository where it lies inside it."""
    full = path.resolve()
    return full.relative_to(REPO) if full.is_relative_to(REPO) else path


def table(args: argparse.Namespace) -> None:
    """Aggregate the results files into the table beside the paper's."""
    from adni_pu.provenance import provenance
    from adni_pu.pu.metrics import summarise

    results = load_results(args.results)
    if not results:
        raise SystemExit(f"no results files in {args.results}")
    head = ["method", "seeds", *(metric_label(m) for m in TABLE_METRICS),
            "paper accuracy", "minutes per run", "machine"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    summary = {}
    for method, recs in results.items():
        cells = [mean_std_cell([r["metrics"][m]["value"] for r in recs]) for m in TABLE_METRICS]
        minutes = summarise([r["wall_s"] / 60 for r in recs])["mean"]
        paper = f"{PAPER[method]:.2f}" if method in PAPER else "-"
        rows.append(f"| {method} | {seed_list([r['seed'] for r in recs])} | "
                    + " | ".join(cells) + f" | {paper} | {minutes:.0f} | "
                    + machine_cell(recs) + " |")
        summary[method] = {m: summarise([r["metrics"][m]["value"] for r in recs])
                           for m in TABLE_METRICS}
        summary[method]["seeds"] = [r["seed"] for r in recs]
        summary[method]["wall_s"] = [r["wall_s"] for r in recs]
    any_recs = next(iter(results.values()))
    for name, key in (("call everyone negative", "all_negative_accuracy"),
                      ("call everyone positive", "all_positive_accuracy")):
        rows.append(f"| *reference: {name}* | {seed_list([r['seed'] for r in any_recs])} | "
                    + mean_std_cell([r["metrics"][key]["value"] for r in any_recs])
                    + " |" + " - |" * (len(head) - 3))
    ref_rows, ref_summary = reference_rows(load_references(args.results))
    rows += ref_rows
    paired = paired_rows(results, args.boot)
    prior_lines, prior_summary = prior_estimation(results.get("nnpu-estimated", []))
    first = any_recs[0]
    test = first["cohort"]["splits"]["test"]
    train = first["cohort"]["splits"]["train"]
    lines = [
        "# The paper's ADNI testbed at its scale (synthetic cohort)", "",
        f"{first['cohort']['subjects']} subjects, cohort seed "
        f"{first['cohort']['cohort_seed']}: {first['data']}; labels by the `paper` preset; per "
        f"seed {test['subjects']} held out, {train['subjects']} trained on and the rest "
        f"({first['cohort']['subjects'] - test['subjects'] - train['subjects']}) validated "
        "on, by subject. The first seed's training split: "
        f"n_p = {train['n_p']}, class prior {train['class_prior']:.3f}, "
        f"{train['hidden_positive']} hidden positives ({train['hidden_share']:.0%} of the "
        f"positives); its test split: {test['hidden_positive']} hidden positives of "
        f"{test['truth_positive']} positives. Test split, mean (std) over seeds, percent; "
        "each seed's metrics are on its own held-out subjects.", "",
        *rows, "",
        "Paired differences (percentage points), 95 % CI from a paired bootstrap over the "
        f"seeds and the held-out subjects within each seed ({args.boot} resamples):", "",
        "| difference | metric | value [95 % CI] | share of resamples > 0 | seeds |",
        "|---|---|---|---|---|"]
    for d in paired:
        lines.append(f"| {d['pair']} | {d['metric'].replace('_', ' ')} | "
                     f"{100 * d['value']:+.1f} [{100 * d['ci_low']:+.1f}, "
                     f"{100 * d['ci_high']:+.1f}] | {d['share_a_better']:.2f} | "
                     f"{seed_list(d['seeds'])} |")
    beside = []
    if args.beside is not None:
        other = load_results(args.beside)
        if not other:
            raise SystemExit(f"--beside {args.beside}: no results files there")
        beside = beside_rows(results, other, (args.results.name, args.beside.name), args.boot)
        lines += ["", "Each method against itself on the same subjects in "
                  f"`{_shown(args.beside)}` (paired bootstrap as above; subjects: those both "
                  "held out and scored, of those held out here and there, and how many of "
                  "them have a truth, which every metric needs):", "",
                  "| difference | metric | value [95 % CI] | share of resamples > 0 | seeds | "
                  "subjects |", "|---|---|---|---|---|---|"]
        lines += [f"| {d['pair']} | {d['metric'].replace('_', ' ')} | "
                  f"{100 * d['value']:+.1f} [{100 * d['ci_low']:+.1f}, "
                  f"{100 * d['ci_high']:+.1f}] | {d['share_a_better']:.2f} | "
                  f"{seed_list(d['seeds'])} | {d['paired_subjects']} of {d['held_out'][0]} / "
                  f"{d['held_out'][1]} ({d['n_subjects']} with a truth) |"
                  for d in beside]
    lines += prior_lines
    if ref_summary:
        lines += ["", "Reference lines, on each seed's held-out subjects: " + "; ".join(
            f"*{name}*: {REFERENCE_NOTES.get(name, '')}" for name in ref_summary) + "."]
    lines += ["", "The paper's column is its ADNI table (Chen et al., ICML 2020): accuracy on "
              "its private 113-subject test split, with the model chosen on that split's "
              "curve; ours are chosen on validation. Different data: read the columns for "
              "the ordering and the size of the PU effect, not for equal numbers.", "",
              "From `python -m benchmarks.paper_scale table` over "
              f"`{_shown(args.results)}/*.json` (each file has its command, settings, machine "
              "and versions).", ""]
    text = "\n".join(lines)
    atomic_write_text(args.out.with_suffix(".md"), text)
    write_json(args.out.with_suffix(".json"), {
        "command": command_line(__file__), "paper": PAPER, "methods": summary,
        "references": ref_summary, "paired": paired, "prior_estimation": prior_summary,
        "beside": {"results": str(_shown(args.beside)), "paired": beside} if beside else None,
        "provenance": provenance()}, default=str)
    print(text)


def main() -> None:
    parser = script_parser(__doc__)
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare", help="generate (and preprocess) the cohort")
    add_prepare_options(p, "runs/paper-scale", subjects=SUBJECTS)
    p.add_argument("--preprocessing", choices=("ideal", "real"), default="ideal")
    r = sub.add_parser("run", help="train and test one method with one seed")
    add_run_options(r, METHODS, "runs/paper-scale", epochs=8, threads=2)
    r.add_argument("--results", type=Path, default=RESULTS,
                   help="folder for the results file (another machine's pieces)")
    f = sub.add_parser("references", help="the reference lines of seeds' splits (no CNN)")
    f.add_argument("--work", type=Path, default=Path("runs/paper-scale"),
                   help="the prepared cohort")
    f.add_argument("--seed", type=int, nargs="+", default=[0], help="split seeds")
    f.add_argument("--results", type=Path, default=RESULTS)
    f.add_argument("--boot", type=int, default=1000, help="bootstrap resamples of the CIs")
    f.add_argument("--machine", default="2-core CPU VM, no GPU")
    t = sub.add_parser("table", help="aggregate the results files")
    t.add_argument("--results", type=Path, default=RESULTS)
    t.add_argument("--out", type=Path, default=RESULTS.parent / "paper-scale-table.md")
    t.add_argument("--boot", type=int, default=1000)
    t.add_argument("--beside", type=Path, default=None,
                   help="another results folder of the same cohort's subjects (e.g. the "
                        "ideal volumes beside the real preprocessing): each method against "
                        "itself there, paired")
    args = parser.parse_args()
    {"prepare": prepare, "run": run, "references": references, "table": table}[args.step](args)


if __name__ == "__main__":
    main()

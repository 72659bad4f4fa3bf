"""``adni-pu demo`` over several seeds: wall time and every method's pooled metrics with CIs.

Each seed is a fresh cohort (the generator's seed), fresh folds and fresh training::

    # one demo per seed, timed (each writes runs/demo-seed<N>/, as the README's command)
    for s in 0 1 2; do /usr/bin/time -v adni-pu demo --out runs/demo-seed$s --seed $s \\
        2> runs/demo-seed$s.time; done
    # the tables: benchmarks/results/demo-seeds.md and .json
    python -m benchmarks.demo_seeds --runs runs/demo-seed0 runs/demo-seed1 runs/demo-seed2

Per seed and method, on the pooled held-out subjects: accuracy (the paper's number; the
all-negative and all-positive accuracies are its reference lines), hidden-positive recall
(the share of the unlabelled set's true positives called positive) and AUC, each [95 % CI];
the wall time (``/usr/bin/time``'s elapsed time when the ``.time`` file beside the run
folder has it, else the demo's own total); the mean (std) over seeds; and paired
differences (nnPU minus naive, Self-PU minus nnPU, nnPU minus uPU, Self-PU minus naive, and
the CNN methods minus the logistic-regression reference for AUC) with a paired bootstrap CI
over the seeds and the subjects within each seed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from benchmarks.common import REPO, RESULTS, command_line, script_parser, write_json

# Paired differences reported: nnPU against naive and Self-PU against nnPU, then the rest of
# the method ladder and the CNN against the logistic-regression reference (same subjects,
# same folds).
LOGISTIC = "logistic regression on 2 volumes"
PAIRS: tuple[tuple[str, str], ...] = (("nnpu", "naive"), ("selfpu", "nnpu"), ("nnpu", "upu"),
                                      ("selfpu", "naive"), ("selfpu", LOGISTIC),
                                      ("nnpu", LOGISTIC))
#: The tables per seed, in order: the metric and its heading.
TABLES: tuple[tuple[str, str], ...] = (
    ("accuracy", "Accuracy (the paper's number)"),
    ("hidden_positive_recall", "Hidden-positive recall (share of the unlabelled set's true "
                               "positives called positive)"),
    ("auc", "AUC"))
REFERENCE_ACCURACY = (("call everyone negative", "all_negative_accuracy"),
                      ("call everyone positive", "all_positive_accuracy"))


def _ci(entry: dict) -> str:
    if "ci_low" not in entry:
        return f"{entry['value']:.3f}"
    return f"{entry['value']:.3f} [{entry['ci_low']:.3f}, {entry['ci_high']:.3f}]"


def _wall(run: Path, record: dict) -> tuple[float, str]:
    """Seconds of the whole command (``/usr/bin/time -v``) or the demo's own total."""
    timing = run.parent / f"{run.name}.time"
    if timing.is_file():
        match = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)",
                          timing.read_text())
        if match:
            h, m, s = match.groups()
            return int(h or 0) * 3600 + int(m) * 60 + float(s), "/usr/bin/time"
    return float(record["times_s"]["total"]), "demo total"


def _predictions(record: dict, name: str) -> list[dict]:
    """Per-subject held-out predictions of a method or a reference line of one seed."""
    source = record["results"] if name in record["results"] else record["references"]
    return source[name]["predictions"]


def comparison_overhead(record: dict) -> dict[str, float]:
    """What the comparison stage took beyond its pieces (``times_s``'s "compare (report)":
    the stage's wall time minus each piece's training and scoring), in seconds and as a
    share of the pieces' time."""
    pieces = sum(v for k, v in record["times_s"].items() if k.startswith("train+evaluate "))
    own = float(record["times_s"]["compare (report)"])
    return {"overhead_s": round(own, 2), "overhead_share": round(own / pieces, 4),
            "pieces_s": round(pieces, 1)}


def _mean_cell(values: list[float]) -> str:
    from adni_pu.pu.metrics import summarise

    d = summarise(values)
    return f"{d['mean']:.3f} ({d['std']:.3f})" if d["n"] else "-"


def seed_table(records: dict, metric: str, methods: list[str], refs: list[str]) -> list[str]:
    """One table: a row per seed with each method's ``metric`` [CI], then mean (std).

    Accuracy gets the all-negative and all-positive reference columns; AUC and hidden AUC
    get the reference lines (the logistic regression, the generator's truth)."""
    extra = ([name for name, _ in REFERENCE_ACCURACY] if metric == "accuracy"
             else refs if metric in ("auc", "hidden_auc") else [])
    rows = ["| seed | scored (positive, hidden) | " + " | ".join(methods)
            + "".join(f" | *{r}*" for r in extra) + " |",
            "|---|---|" + "---|" * (len(methods) + len(extra))]
    values: dict[str, list[float]] = {c: [] for c in [*methods, *extra]}
    for rec in records.values():
        first = rec["results"][methods[0]]["pooled"]
        cells = []
        for m in methods:
            entry = rec["results"][m]["pooled"]["metrics"].get(metric)
            cells.append(_ci(entry) if entry else "-")
            values[m].append(entry["value"] if entry else float("nan"))
        for name in extra:
            if metric == "accuracy":  # a share of the subjects: no CI
                value = first.get(dict(REFERENCE_ACCURACY)[name])
                entry = None if value is None else {"value": value}
            else:
                entry = rec["references"][name]["pooled"]["metrics"].get(metric)
            cells.append(_ci(entry) if entry else "-")
            values[name].append(entry["value"] if entry else float("nan"))
        rows.append(f"| {rec['settings']['seed']} | {first['n_scored']} ({first['n_positive']}, "
                    f"{first.get('n_hidden', '?')}) | " + " | ".join(cells) + " |")
    rows.append("| mean (std) | | " + " | ".join(_mean_cell(values[c]) for c in values)
                + " |")
    return rows


#: Method names as the docs write them.
DISPLAY = {"naive": "naive", "upu": "uPU", "nnpu": "nnPU", "selfpu": "Self-PU"}
#: The generated blocks: where each lives (between ``<!-- demo-numbers:NAME -->`` and
#: ``<!-- /demo-numbers:NAME -->``) and what renders it.
DOC_BLOCKS: dict[str, str] = {"readme": "README.md", "table": "docs/results.md"}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _pair(data: dict, pair: str, metric: str) -> dict | None:
    return next((d for d in data["paired"] if d["pair"] == pair and d["metric"] == metric),
                None)


def _diff(d: dict, digits: int = 3) -> str:
    return f"{d['value']:+.{digits}f} [{d['ci_low']:+.{digits}f}, {d['ci_high']:+.{digits}f}]"


def _walls(data: dict) -> str:
    walls = [s["wall_s"] / 60 for s in data["seeds"]]
    return f"{min(walls):.1f}-{max(walls):.1f} min" if len(walls) > 1 else f"{walls[0]:.1f} min"


def render_blocks(data: dict) -> dict[str, str]:
    """The demo's numbers as the README and docs/results.md show them, from the committed
    ``demo-seeds.json`` (so the pages can only show what that file holds)."""
    seeds = data["seeds"]
    methods = list(seeds[0]["accuracy"])
    names = ", ".join(str(s["seed"]) for s in seeds)
    date = str(data["provenance"]["date"])[:10]
    acc = {m: _mean([s["accuracy"][m]["value"] for s in seeds]) for m in methods}
    neg = _mean([s["reference_accuracy"]["call everyone negative"]["value"] for s in seeds])
    recall = _pair(data, "nnpu - naive", "hidden_positive_recall")
    readme = (f"Measured over seeds {names} ({date}, {data['provenance']['machine']}; "
              f"docs/results.md): mean accuracy {min(acc.values()):.2f}-{max(acc.values()):.2f} "
              f"across the {len(methods)} methods, against {neg:.2f} for calling everyone "
              "negative" + (f"; nnPU minus naive hidden-positive recall {_diff(recall, 2)}"
                            if recall else "") + f"; wall time {_walls(data)} per run.")
    head = "| | " + " | ".join(DISPLAY.get(m, m) for m in methods) + " | reference |"
    rows = [head, "|---|" + "---|" * (len(methods) + 1)]
    refs = {"accuracy": ("call everyone negative", "reference_accuracy"),
            "auc": ("logistic regression on 2 volumes", "references")}
    for metric, label in (("accuracy", "accuracy"), ("hidden_positive_recall",
                                                      "hidden-positive recall"), ("auc", "AUC")):
        cells = [_mean_cell([s[metric][m]["value"] for s in seeds]) for m in methods]
        ref = refs.get(metric)
        ref_cell = (f"{ref[0]} {_mean_cell([s[ref[1]][ref[0]]['value'] for s in seeds])}"
                    if ref else "")
        rows.append(f"| {label} | " + " | ".join(cells) + f" | {ref_cell} |")
    n = data["paired"][0]["n_subjects"] if data["paired"] else 0
    metric_names = {"accuracy": "accuracy", "auc": "AUC",
                    "hidden_positive_recall": "hidden-positive recall"}
    paired = [f"{' minus '.join(DISPLAY.get(x, x) for x in pair.split(' - '))} "
              f"{metric_names[metric]} {_diff(d)}"
              for (pair, metric) in (("nnpu - naive", "hidden_positive_recall"),
                                     ("nnpu - naive", "accuracy"), ("selfpu - nnpu", "accuracy"),
                                     (f"selfpu - {LOGISTIC}", "auc"))
              if (d := _pair(data, pair, metric))]
    table = (f"Seeds {names} ({date}, {data['provenance']['machine']}; "
             "`benchmarks/results/demo-seeds.md`, every CI there): held-out subjects of both "
             "folds pooled, mean (std) over the seeds.\n\n" + "\n".join(rows)
             + f"\n\nPaired over the seeds ({n} subject-seeds, paired bootstrap): "
             + "; ".join(paired) + f". Wall time per run: {_walls(data)}"
             + (f" ({data['load']})" if data.get("load") else "") + ".")
    return {"readme": readme, "table": table}


def block(text: str, name: str) -> str | None:
    """The contents of the generated block ``name`` in ``text`` (None: no such block)."""
    match = re.search(rf"<!-- demo-numbers:{name} -->\n(.*?)<!-- /demo-numbers:{name} -->",
                      text, flags=re.S)
    return match.group(1).removesuffix("\n") if match else None


def update_docs(data: dict, repo: Path = REPO) -> list[Path]:
    """Write the rendered blocks into the README and docs/results.md (atomically)."""
    from adni_pu.fileio import atomic_write_text

    written = []
    for name, body in render_blocks(data).items():
        path = repo / DOC_BLOCKS[name]
        text = path.read_text()
        if block(text, name) is None:
            raise SystemExit(f"{path}: no <!-- demo-numbers:{name} --> block to fill")
        new = re.sub(rf"(<!-- demo-numbers:{name} -->\n).*?(<!-- /demo-numbers:{name} -->)",
                     lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text,
                     flags=re.S)
        if new != text:
            atomic_write_text(path, new)
            written.append(path)
    return written


def main() -> None:
    p = script_parser(__doc__)
    p.add_argument("--runs", type=Path, nargs="+", required=True)
    p.add_argument("--name", default="demo-seeds")
    p.add_argument("--load", default="", help="load average while measuring (for the record)")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    args = p.parse_args()

    import pandas as pd

    from adni_pu.fileio import atomic_write_text
    from adni_pu.provenance import provenance
    from adni_pu.workflows.compare.scores import paired_difference

    records = {run: json.loads((run / "demo.json").read_text()) for run in args.runs}
    methods = list(next(iter(records.values()))["results"])
    refs = list(next(iter(records.values()))["references"])
    summary = []
    for run, rec in records.items():
        wall, source = _wall(run, rec)
        first = rec["results"][methods[0]]["pooled"]
        summary.append({"run": str(run), "seed": rec["settings"]["seed"],
                        "wall_s": round(wall, 1), "n_scored": first["n_scored"],
                        "n_positive": first["n_positive"], "n_hidden": first.get("n_hidden"),
                        "wall_source": source, "times_s": rec["times_s"],
                        **{metric: {m: rec["results"][m]["pooled"]["metrics"].get(metric)
                                    for m in methods} for metric, _ in TABLES},
                        "references": {r: rec["references"][r]["pooled"]["metrics"]["auc"]
                                       for r in refs},
                        "reference_accuracy": {
                            name: {"value": first.get(key)} for name, key in REFERENCE_ACCURACY},
                        "nn_correction": {m: rec["results"][m]["nn_correction"]
                                          for m in methods},
                        **comparison_overhead(rec)})
    paired = []
    for a, b in PAIRS:
        if not {a, b} <= set(methods) | set(refs):
            continue
        frames = {m: pd.concat([pd.DataFrame(_predictions(rec, m)).assign(
            seed=rec["settings"]["seed"]) for rec in records.values()]) for m in (a, b)}
        metrics = (["auc"] if b == LOGISTIC else ["accuracy", "auc"]
                   + (["hidden_positive_recall"] if "pu_label" in frames[a] else []))
        for metric in metrics:
            d = paired_difference(frames[a], frames[b], metric=metric)
            paired.append({"pair": f"{a} - {b}", **d})
    walls = ", ".join(f"seed {s['seed']} {s['wall_s'] / 60:.1f} min" for s in summary)
    overheads = ", ".join(f"seed {s['seed']} {s['overhead_s']:.1f} s "
                          f"({100 * s['overhead_share']:.1f} %)" for s in summary)
    lines = [f"# adni-pu demo over {len(summary)} seed(s)", "",
             "Every method's metric [95 % CI, bootstrap over subjects] on the pooled held-out "
             "subjects of the seed's cross-validation (`adni-pu benchmark cohort` inside the "
             "demo), scored against the paper's positive class (`paper` preset); reference "
             "lines in italics. Command per seed: "
             "`adni-pu demo --out runs/demo-seed<N> --seed <N>` (the README's command with a "
             f"seed). Wall time: {walls}." + (f" Load average while measuring: {args.load}."
                                              if args.load else ""),
             "", "The comparison's own time in each run (its stage's wall time minus the time "
             "its pieces trained and scored: checks, fold manifests, the report with its "
             f"bootstrap, reference line and plots) against the pieces' time: {overheads}; "
             "what the current code takes: `benchmarks/comparison_overhead.py`.", ""]
    for metric, heading in TABLES:
        lines += [f"## {heading}", "", *seed_table(records, metric, methods, refs), ""]
    lines += ["## Paired differences", "",
              "Mean over seeds of each seed's difference on the same subjects; 95 % CI from a "
              "paired bootstrap over the seeds and the subjects within each seed (1000 "
              "resamples):", "",
              "| difference | metric | value [95 % CI] | share of resamples > 0 | "
              "subject-seeds |", "|---|---|---|---|---|"]
    for d in paired:
        lines.append(f"| {d['pair']} | {d['metric'].replace('_', ' ')} | {d['value']:+.3f} "
                     f"[{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] | {d['share_a_better']:.2f} | "
                     f"{d['n_subjects']} |")
    lines += ["", "From `python -m benchmarks.demo_seeds --runs "
              + " ".join(str(r) for r in args.runs) + "`.", ""]
    out = args.out_dir
    atomic_write_text(out / f"{args.name}.md", "\n".join(lines))
    write_json(out / f"{args.name}.json", {
        "command": command_line(__file__), "seeds": summary, "paired": paired,
        "load": args.load, "provenance": provenance()}, default=str)
    print("\n".join(lines))
    if args.name == "demo-seeds":
        for path in update_docs(json.loads((out / f"{args.name}.json").read_text())):
            print(f"updated the demo numbers in {path}")


if __name__ == "__main__":
    main()

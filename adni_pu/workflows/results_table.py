"""The results table of the MNIST and CIFAR-10 benchmarks from a folder of results files
(Markdown + JSON): ``adni-pu benchmark table FOLDER``.

    # one file per method (or preset) and seed, each from one benchmark command, e.g.
    adni-pu benchmark mnist --method nnpu --seeds 1 --out runs/nnpu-s0 \\
        --results-json benchmarks/results/mnist200/nnpu-s0.json
    adni-pu benchmark table benchmarks/results/mnist200 [--pair A,B ...]
    adni-pu benchmark table benchmarks/results/ablation200 --ablation

Reads every ``*.json`` of the folder (the files ``--results-json`` writes, in the format of
:mod:`adni_pu.workflows.results_format`; a file may hold several seeds of one method, its
label is ``settings.method``) and writes ``FOLDER-table.md`` and ``FOLDER-table.json``
beside the folder (``--out STEM`` to choose; ``--with OTHER`` adds another folder's files,
e.g. the baselines a later row is paired with). Per method or preset: test accuracy of the
validation-selected model (the honest number), the test-selected accuracy (a diagnostic:
the test split chose the epoch), AUC, each as mean (sample std) over seeds in percent, the
number of seeds, the epochs, seconds per epoch by phase and, where the per-seed records
carry it, the mean share of training batches where the nnPU correction fired. Paired
differences of test accuracy on the seeds both methods ran (Self-PU minus nnPU, nnPU minus
naive and every ``--pair A,B``) come with a 95 % CI: a paired bootstrap over seeds and test
examples (:func:`adni_pu.pu.metrics.paired_bootstrap`) when the per-seed records carry
``test_examples`` (per-example truth and correctness), else a t-interval over seeds; the
table says which.

``--ablation``: rows are presets, the schedule (epochs, warm-up end, self-paced end) is
stated per row and every row must share it (refused otherwise; ``--allow-mixed-schedule``
keeps the rows and flags those that differ). Within one label all files must share the
schedule in either mode.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from adni_pu.pu.metrics import mean_std, percent_summary
from adni_pu.workflows.results_format import (
    FINAL_RULE_KEY,
    SCHEDULE_KEYS,
    ResultsError,
    data_settings,
    estimate_summary,
    read_results_file,
    schedule,
    unpack_bits,
)

METHOD_ORDER = ("naive", "upu", "nnpu", "selfpu", "vpu")
DEFAULT_PAIRS: tuple[tuple[str, str], ...] = (("selfpu", "nnpu"), ("nnpu", "naive"))


def load_results(folder: Path, label_from_name: bool = False,
                 also: tuple[Path, ...] = ()) -> dict[str, dict[str, Any]]:
    """Per label: its files, schedule and per-seed records (one per seed, from any file).

    The label is ``settings.method`` (the method or preset), or with ``label_from_name`` the
    file's name without a trailing ``-s<seed>`` (rows that differ by a ``--set`` only). The
    folders in ``also`` are read as if their files were in ``folder`` (rows kept in another
    results folder, e.g. the baselines a later row is compared with)."""
    files = []
    for where in (folder, *also):
        if not where.exists():
            raise ResultsError(f"{where}: folder not found (expected a folder of results "
                               "files written by `adni-pu benchmark ... --results-json FILE`)")
        if not where.is_dir():
            raise ResultsError(f"{where}: is a file, not a folder; expected a folder of "
                               "results files (`adni-pu benchmark ... --results-json FILE`)")
        found = sorted(where.glob("*.json"))
        if not found:
            raise ResultsError(f"{where}: no *.json results files (expected the files written "
                               "by `adni-pu benchmark ... --results-json FILE`)")
        files += found
    out: dict[str, dict[str, Any]] = {}
    for path in files:
        data = read_results_file(path)
        method = data["settings"]["method"]
        label = re.sub(r"-s\d+$", "", path.stem) if label_from_name else method
        entry = out.setdefault(label, {"files": [], "schedule": schedule(data["settings"]),
                                       "selection": data["settings"].get("selection"),
                                       "selfpu": data["settings"].get("selfpu") is not None,
                                       "data": data_settings(data["settings"]),
                                       "seeds": {}, "seed_files": {}, "machines": []})
        for what, value in (("schedule", schedule(data["settings"])),
                            ("data", data_settings(data["settings"]))):
            if value != entry[what]:
                raise ResultsError(f"{path}: {what} {value} of {label!r} differs from "
                                   f"{entry[what]} in {entry['files'][0]}")
        entry["files"].append(str(path))
        machine = data.get("machine") or "not recorded"
        if machine not in entry["machines"]:
            entry["machines"].append(machine)
        for record in data["per_seed"]:
            seed = record["seed"]
            if seed in entry["seeds"]:
                raise ResultsError(f"{path}: seed {seed} of {label!r} is also in "
                                   f"{entry['seed_files'][seed]}; keep one file per seed")
            entry["seeds"][seed] = record
            entry["seed_files"][seed] = str(path)
    return out



def use_final_rule(entry: dict[str, Any], label: str) -> None:
    """Make the final-model rule's test accuracy (the finalist the validation split chose
    after the last epoch) this label's honest number, in place; its per-example results are
    not recorded, so paired differences involving it use the t-interval, and its AUC is
    not known (n/a). Runs made under ``selection = "final"`` already report that model:
    nothing changes for them, and their per-example results stay."""
    entry["rule"] = "final"
    if entry.get("selection") == "final":
        return
    for seed, record in entry["seeds"].items():
        if record.get(FINAL_RULE_KEY) is None:
            raise ResultsError(f"{entry['seed_files'][seed]}: seed {seed} of {label!r} has "
                               f"no {FINAL_RULE_KEY!r} (made before the final-model rule existed)")
        record["test"] = {**record["test"], "accuracy": record[FINAL_RULE_KEY], "auc": None}
        record.pop("test_examples", None)


def method_row(entry: dict[str, Any]) -> dict[str, Any]:
    """One row: means (std) over seeds in percent, timings and the nn_correction share."""
    from adni_pu.pu.metrics import summarise

    records = [entry["seeds"][s] for s in sorted(entry["seeds"])]
    pct = percent_summary
    phases = sorted({p for r in records for p in r["seconds_per_epoch"]})
    shares = [r["nn_correction_share"] for r in records
              if r.get("nn_correction_share") is not None]
    estimates = [(s, entry["seeds"][s]["prior_estimate"]) for s in sorted(entry["seeds"])
                 if entry["seeds"][s].get("prior_estimate")]
    return {
        "seeds": sorted(entry["seeds"]),
        "n_seeds": len(records),
        "rule": entry.get("rule", "as run (the run's `selection`)"),
        **entry["schedule"],
        "test_accuracy": pct([r["test"]["accuracy"] for r in records]),
        "test_accuracy_test_selected": pct([r["test_accuracy_test_selected"] for r in records]),
        "test_auc": pct([r["test"].get("auc") for r in records]),
        "seconds_per_epoch": {p: summarise([r["seconds_per_epoch"][p] for r in records
                                            if p in r["seconds_per_epoch"]]) for p in phases},
        "nn_correction_share": summarise(shares) if shares else None,
        "prior_estimate": estimate_summary(estimates) if estimates else None,
        "machines": entry["machines"],
        "files": entry["files"],
    }


def accuracy_difference(entries: dict[str, dict[str, Any]], a: str, b: str,
                      n_boot: int = 1000, level: float = 0.95) -> dict[str, Any]:
    """Test accuracy of ``a`` minus ``b`` (percentage points) on the seeds both ran, from
    the seed records of results files (the per-subject paired difference of a cohort's
    predictions is :func:`adni_pu.workflows.compare.scores.paired_difference`).

    95 % CI by a paired bootstrap over seeds and test examples when every seed's record of
    both carries its per-example results (``test_examples``), otherwise a t-interval over
    the seeds (nan with fewer than two).
    """
    from scipy.stats import t

    for name in (a, b):
        if name not in entries:
            raise ResultsError(f"--pair {a},{b}: no results for {name!r}; found "
                               f"{sorted(entries)}")
    if entries[a]["data"] != entries[b]["data"]:
        raise ResultsError(f"{entries[a]['files'][0]}: data settings {entries[a]['data']} "
                           f"differ from {entries[b]['data']} of {b!r} ({entries[b]['files'][0]}); "
                           "a paired difference needs the same PU data")
    seeds = sorted(set(entries[a]["seeds"]) & set(entries[b]["seeds"]))
    diffs = [100.0 * (entries[a]["seeds"][s]["test"]["accuracy"]
                      - entries[b]["seeds"][s]["test"]["accuracy"]) for s in seeds]
    n = len(diffs)
    out = {"pair": f"{a} - {b}", "metric": "test accuracy, percentage points", "level": level,
           "seeds": seeds, "n_seeds": n, "per_seed": dict(zip(seeds, diffs))}
    correct = _correct_per_seed(entries, a, b, seeds)
    if correct is not None and n:
        from adni_pu.pu.metrics import paired_bootstrap

        def diff(picks: list[tuple[int, Any]]) -> float:
            return 100.0 * sum(float(correct[g][0][i].mean() - correct[g][1][i].mean())
                               for g, i in picks) / len(picks)

        boot = paired_bootstrap([len(c[0]) for c in correct], diff, n_boot, 0, level)
        return {**out, **boot, "n_examples": sum(len(c[0]) for c in correct),
                "interval": f"paired bootstrap over seeds and test examples ({n_boot} "
                            "resamples)"}
    mean = sum(diffs) / n if n else float("nan")
    if n > 1:
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
        half = float(t.ppf((1 + level) / 2, n - 1)) * sd / math.sqrt(n)
    else:
        half = float("nan")
    return {**out, "value": mean, "ci_low": mean - half, "ci_high": mean + half,
            "interval": "t-interval over seeds (no per-example test results in the files)"}


def _correct_per_seed(entries: dict[str, dict[str, Any]], a: str, b: str, seeds: list[int]
                      ) -> list[tuple[Any, Any]] | None:
    """Per seed, whether ``a`` and ``b`` were right on each test example (None when a record
    lacks them); refuses seeds whose two runs were tested on different examples."""
    out = []
    for seed in seeds:
        ra, rb = entries[a]["seeds"][seed], entries[b]["seeds"][seed]
        ea, eb = ra.get("test_examples"), rb.get("test_examples")
        if not ea or not eb:
            return None
        if ea["n"] != eb["n"] or ea["truth"] != eb["truth"]:
            raise ResultsError(f"{entries[a]['seed_files'][seed]}: seed {seed}: {a!r} and "
                               f"{b!r} ({entries[b]['seed_files'][seed]}) were tested on different "
                               "test examples (test_examples.truth differs)")
        out.append((unpack_bits(ea["correct"], ea["n"]), unpack_bits(eb["correct"], eb["n"])))
    return out


def check_schedules(rows: dict[str, dict[str, Any]], allow_mixed: bool) -> dict[str, Any]:
    """Whether every row used the same schedule (None entries, i.e. baselines' warm-up and
    self-paced ends, are not compared); refuses unless ``allow_mixed``, else flags rows."""
    reference: dict[str, Any] = {}
    for label, row in rows.items():
        for key in SCHEDULE_KEYS:
            if row[key] is not None:
                reference.setdefault(key, (row[key], label))
    differing = sorted(label for label, row in rows.items()
                       if any(row[k] is not None and row[k] != reference[k][0]
                              for k in SCHEDULE_KEYS))
    if differing and not allow_mixed:
        label = differing[0]
        key = next(k for k in SCHEDULE_KEYS
                   if rows[label][k] is not None and rows[label][k] != reference[k][0])
        raise ResultsError(f"{rows[label]['files'][0]}: {key} = {rows[label][key]} but "
                           f"{reference[key][0]} in {reference[key][1]!r}; every row of the "
                           "ablation must use the same schedule (--allow-mixed-schedule flags "
                           "them instead)")
    return {"same": not differing, "schedule": {k: v for k, (v, _) in reference.items()},
            "differing": differing}


def _share(row: dict[str, Any]) -> str:
    """The nn correction cell; says how many seeds carried it when not all did."""
    share = row["nn_correction_share"]
    text = mean_std(share, 3)
    if share and share["n"] != row["n_seeds"]:
        text = f"{share['mean']:.3f} (n={share['n']} of {row['n_seeds']} seeds)"
    return text


def _num(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{v:+.2f}"


def _estimate_lines(rows: dict[str, dict[str, Any]]) -> list[str]:
    """The rows trained with an estimated class prior: the estimate beside the true prior
    (mean (std) over seeds, the absolute error and how often the 95 % CI held the truth)."""
    rows = {label: r["prior_estimate"] for label, r in rows.items() if r["prior_estimate"]}
    if not rows:
        return []
    lines = ["", "Rows trained with an estimated class prior: the estimate over seeds beside "
             "the true prior (seeds without a true prior are left out of the error).", "",
             "| row | seeds | estimator | estimate | true prior | absolute error | 95 % CI "
             "holds the truth |", "|---|---|---|---|---|---|---|"]
    for label, e in rows.items():
        truths = sorted({r["true_prior"] for r in e["per_seed"] if r["true_prior"] is not None})
        lines.append(f"| {label} | {len(e['per_seed'])} | {e['method']} | "
                     f"{mean_std(e['value'], 3)} | {', '.join(f'{t:.3f}' for t in truths) or 'n/a'}"
                     f" | {mean_std(e['abs_error'], 3)} | "
                     f"{e['ci_coverage']['covered']} of {e['ci_coverage']['n']} |")
    return lines


def render(rows: dict[str, dict[str, Any]], paired: list[dict[str, Any]], ablation: bool,
           check: dict[str, Any] | None, command: str) -> str:
    """The Markdown tables."""
    what = "preset" if ablation else "method"
    sched = " | warm-up end | self-paced end" if ablation else ""
    lines = [f"# MNIST PU benchmark: {'ablation' if ablation else 'methods'}", "",
             "Mean (sample std) over seeds, percent. Test accuracy: the model chosen on the "
             "validation split (honest): rows marked (final rule) by the finalist it chose after the "
             "last epoch (docs/selfpu.md, 'The final model'), the others by the run's own "
             "selection (the best validation epoch). Test-selected: the best test accuracy over epochs "
             "and candidates (a diagnostic, the test split chose it). nn correction: share "
             "of training batches where the nnPU correction fired (mean over epochs and "
             "models, then seeds; n/a: no correction, or not in the per-seed records).", "",
             f"| {what} | seeds | epochs{sched} | test accuracy % | test-selected % "
             "(diagnostic) | AUC % | s/epoch by phase | nn correction | machine |",
             "|---|---|---|" + ("---|---|" if ablation else "") + "---|---|---|---|---|---|"]
    flagged = set(check["differing"]) if check else set()
    for label, r in rows.items():
        name = f"{label} (schedule differs)" if label in flagged else label
        if r["rule"] == "final":
            name += " (final rule)"
        secs = ", ".join(f"{p}: {v['mean']:.1f}" for p, v in r["seconds_per_epoch"].items())
        cells = [name, str(r["n_seeds"]), str(r["epochs"])]
        if ablation:
            cells += ["-" if r[k] is None else str(r[k])
                      for k in ("warmup_epochs", "self_paced_end")]
        cells += [mean_std(r["test_accuracy"]), mean_std(r["test_accuracy_test_selected"]),
                  mean_std(r["test_auc"]), secs or "n/a", _share(r), "; ".join(r["machines"])]
        lines.append("| " + " | ".join(cells) + " |")
    if check is not None:
        lines += ["", "Schedule: " + ("every row used " if check["same"] else
                                      "rows differ (flagged); the first seen: ")
                  + ", ".join(f"{k} {v}" for k, v in check["schedule"].items()) + "."]
    lines += _estimate_lines(rows)
    if paired:
        lines += ["", "Paired differences of test accuracy (validation-selected) on the seeds "
                  "both ran, percentage points, with a 95 % CI (how it was computed: last "
                  "column):", "",
                  "| difference | mean [95 % CI] | seeds | interval |", "|---|---|---|---|"]
        for d in paired:
            lines.append(f"| {d['pair']} | {_num(d['value'])} [{_num(d['ci_low'])}, "
                         f"{_num(d['ci_high'])}] | {d['n_seeds']} | {d['interval']} |")
    lines += ["", f"From `{command}`.", ""]
    return "\n".join(lines)


def build(folder: Path, pairs: list[tuple[str, str]], ablation: bool = False,
          allow_mixed: bool = False, command: str = "", label_from_name: bool = False,
          final_rule: tuple[str, ...] = (), protocol: bool = False,
          also: tuple[Path, ...] = ()) -> tuple[str, dict[str, Any]]:
    """Markdown and JSON of the table of ``folder``'s results files; the labels named in
    ``final_rule`` report the final-model rule's test accuracy (docs/selfpu.md). With
    ``protocol`` the benchmark protocol decides instead: every Self-PU row (a file with
    Self-PU settings) by the final rule, every baseline by its run's own selection. The
    folders in ``also`` add their files (:func:`load_results`)."""
    entries = load_results(folder, label_from_name, also)
    if protocol:
        if final_rule:
            raise ResultsError("--protocol and --final-rule: choose one (the protocol names "
                               "every Self-PU row itself)")
        final_rule = tuple(label for label, e in entries.items() if e["selfpu"])
    for label in final_rule:
        if label not in entries:
            raise ResultsError(f"--final-rule {label}: no results for it; found "
                               f"{sorted(entries)}")
        use_final_rule(entries[label], label)
    order = [m for m in METHOD_ORDER if m in entries] + [m for m in entries
                                                        if m not in METHOD_ORDER]
    rows = {label: method_row(entries[label]) for label in order}
    check = check_schedules(rows, allow_mixed) if ablation else None
    wanted = [p for p in DEFAULT_PAIRS if p[0] in entries and p[1] in entries]
    wanted += [p for p in pairs if p not in wanted]
    paired = [accuracy_difference(entries, a, b) for a, b in wanted]
    text = render(rows, paired, ablation, check, command)
    return text, {"command": command, "mode": "ablation" if ablation else "methods",
                  "accuracy_unit": "percent", "rows": rows, "paired": paired,
                  "schedule_check": check}


def table_stem(folder: Path, out: Path | None = None) -> Path:
    """Where the table of ``folder`` goes: ``out`` (a stem; a trailing ``.md`` or ``.json``
    is dropped, so ``--out tab.md`` writes tab.md), else ``FOLDER-table`` beside it."""
    if out is None:
        return folder.parent / f"{folder.name}-table"
    return out.with_suffix("") if out.suffix in (".md", ".json") else out


def is_table_record(path: Path) -> bool:
    """Whether ``path`` is a ``STEM.json`` that ``adni-pu benchmark table`` wrote."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(record, dict) and "rows" in record and "paired" in record
            and str(record.get("command", "")).startswith("adni-pu benchmark table"))


def claim_table(stem: Path, folders: tuple[Path, ...]) -> None:
    """Refuse a table stem whose files would be read as results by the next table (inside
    FOLDER or a ``--with`` folder), or would replace files this command did not write: a
    ``STEM.json`` that is no table record, or a ``STEM.md`` without one
    (:func:`adni_pu.outputs.claim_file`)."""
    from adni_pu.outputs import claim_file

    for where in folders:
        if stem.parent.resolve() == where.resolve():
            raise ResultsError(f"--out {stem}: inside the results folder {where}; its "
                               f"{stem.name}.json would be read as a results file by the next "
                               "table; expected a stem outside the results folders")
    record = stem.with_name(stem.name + ".json")
    claim_file(record, "benchmark table", is_table_record, "table record (STEM.json)")
    claim_file(stem.with_name(stem.name + ".md"), "benchmark table",
               lambda _md: is_table_record(record), "table (STEM.md beside its STEM.json)")


def write_table(folder: Path, out: Path | None = None, pairs: list[tuple[str, str]] = (),
                ablation: bool = False, allow_mixed: bool = False, command: str = "",
                label_from_name: bool = False, final_rule: tuple[str, ...] = (),
                protocol: bool = False, also: tuple[Path, ...] = ()) -> tuple[str, Path]:
    """:func:`build` the table of ``folder`` and write ``STEM.md`` and ``STEM.json`` (with
    provenance; :func:`table_stem`), holding the lock of STEM's folder; returns the
    Markdown and the stem. Nothing is written when the files cannot be put into one table
    (:class:`ResultsError`) or STEM names files this command did not write
    (:func:`claim_table`)."""
    from adni_pu.fileio import atomic_write_text
    from adni_pu.locking import output_lock
    from adni_pu.provenance import provenance

    text, record = build(folder, list(pairs), ablation, allow_mixed, command, label_from_name,
                         tuple(final_rule), protocol, tuple(also))
    stem = table_stem(folder, out)
    claim_table(stem, (folder, *also))
    record["provenance"] = provenance()
    with output_lock(stem.parent, "benchmark table"):
        claim_table(stem, (folder, *also))  # again, now that no other table can write it
        atomic_write_text(stem.with_name(stem.name + ".md"), text)
        atomic_write_text(stem.with_name(stem.name + ".json"),
                          json.dumps(record, indent=2, default=str) + "\n")
    return text, stem

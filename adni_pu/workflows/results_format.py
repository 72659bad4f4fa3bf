"""The benchmark's results files: what ``adni-pu benchmark`` writes and the results table reads.

Two files, both JSON:

- ``OUT/seed<N>/result.json`` (:func:`seed_result_path`): one seed, the fields
  :data:`SEED_FIELDS` (its settings, the selected model, the honest test metrics of the
  model validation chose, the diagnostics that read the test split after the fact, timing,
  the per-example test results of :func:`test_examples` and the machines its pieces ran
  on). A finished seed is never trained again while its ``config`` matches.
- ``OUT/results.json`` (and the copy ``--results-json FILE`` writes; :func:`aggregate`):
  the seeds of one method or preset: ``settings`` (``method`` names the label under
  ``results``), ``results`` (each measure as mean, sample std and count over the seeds, in
  percent), ``per_seed`` (:data:`PER_SEED_FIELDS` of each seed's record), and the command,
  date, machines (every machine a seed trained on, from its run folder's pieces:
  :func:`results_machine`) and package versions that made it. Seeds trained with estimated class
  priors (``--prior estimate``) add ``prior_estimate`` (:func:`estimate_summary`: each
  seed's estimate beside the true prior) and label the row ``<method>+estimated-prior``.
  :func:`read_results_file` reads one back for :mod:`adni_pu.workflows.results_table`.

Per-example test results are bit-packed (:func:`pack_bits`), so a committed results file
stays small while tables can still bootstrap over test examples.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

from adni_pu import fileio
from adni_pu.errors import AdniPuError
from adni_pu.pu.metrics import mean_std, percent_summary, summarise

#: The ``data`` field of a results file, by benchmark data set.
DATA_NAMES = {"mnist": "MNIST (original IDX)", "cifar10": "CIFAR-10"}
#: The seed record's file in the seed's run folder.
SEED_RESULT = "result.json"
#: The results file and its Markdown table in a benchmark's output folder.
RESULTS_FILE = "results.json"
RESULTS_TABLE = "results.md"
#: The fields of a seed's ``result.json``, in the order they are written.
SEED_FIELDS: tuple[str, ...] = (
    "seed", "config", "data", "selection", "selected_epoch", "selected_model", "val_criterion",
    "val_score", "test", "test_accuracy_test_selected", "finalist_choice_diagnostic",
    "finalists_val_score_diagnostic", "test_accuracy_finalists_diagnostic",
    "test_accuracy_final_rule_diagnostic", "seconds_per_epoch", "population",
    "nn_correction_share", "test_examples", "prior_estimate", "machines")
#: The fields of each seed's record that a results file keeps under ``per_seed``.
PER_SEED_FIELDS: tuple[str, ...] = (
    "seed", "selected_epoch", "selected_model", "val_score", "test",
    "test_accuracy_test_selected", "finalist_choice_diagnostic",
    "finalists_val_score_diagnostic", "test_accuracy_finalists_diagnostic",
    "test_accuracy_final_rule_diagnostic", "seconds_per_epoch", "population",
    "nn_correction_share", "test_examples", "prior_estimate", "machines")
#: The per-seed field with the test accuracy of the finalist validation chose after the
#: last epoch (the final-model rule's number from a run kept by another rule).
FINAL_RULE_KEY = "test_accuracy_final_rule_diagnostic"
#: The fields a results file must have (:func:`read_results_file`).
RESULTS_FIELDS: tuple[str, ...] = ("settings", "per_seed", "results")
#: The schedule and PU-data settings of ``settings`` (:func:`schedule`, :func:`data_settings`).
SCHEDULE_KEYS = ("epochs", "warmup_epochs", "self_paced_end")
DATA_KEYS = ("n_labelled", "scheme", "prior", "val_fraction", "train_limit", "test_limit")
#: The label suffix of a row trained with estimated class priors (``--prior estimate``):
#: its own row beside the row trained with the protocol's prior, on the same PU data.
ESTIMATED_PRIOR_SUFFIX = "+estimated-prior"
#: The fields of a seed's prior estimate that a results file keeps (not the classifier's
#: settings, which the seed's result.json holds).
ESTIMATE_FIELDS = ("value", "ci_low", "ci_high", "method", "alpha", "n_positive",
                   "n_unlabelled", "n_bootstrap", "scheme", "split", "true_prior",
                   "true_prior_split")


class ResultsError(AdniPuError, ValueError):
    """Results files that cannot be read or put into one table (one line: file, field,
    what was found)."""


# --------------------------------------------------------------------------- one seed


def seed_result_path(out: Path, seed: int) -> Path:
    """Where the record of ``seed`` of the benchmark in ``out`` is written."""
    return Path(out) / f"seed{seed}" / SEED_RESULT


def write_seed_result(out: Path, seed: int, record: dict[str, Any]) -> Path:
    """Write the seed's record (exactly :data:`SEED_FIELDS`, in that order); returns its path."""
    if set(record) != set(SEED_FIELDS):
        raise ValueError(f"seed record fields {sorted(record)} differ from {sorted(SEED_FIELDS)}")
    path = seed_result_path(out, seed)
    fileio.atomic_write_text(path, json.dumps({k: record[k] for k in SEED_FIELDS}, indent=2)
                             + "\n")
    return path


def read_seed_result(out: Path, seed: int) -> dict[str, Any] | None:
    """The seed's record, or None when it has none yet; a damaged file is a
    :class:`ResultsError` naming it."""
    path = seed_result_path(out, seed)
    if not path.is_file():
        return None
    record = _read_json(path)
    if not isinstance(record, dict):
        raise ResultsError(f"{path}: expected a JSON object, the result of a seed of "
                           f"`adni-pu benchmark`, found a {type(record).__name__}; remove the "
                           "file to train the seed again")
    return record


def test_examples(logits: Any, truth: Any) -> dict[str, Any]:
    """Per-example test results, compact enough for a committed results file: the truth and
    whether the selected model was right (logit > 0), bit-packed and base64-encoded, so
    tables can bootstrap over test examples."""
    import numpy as np

    truth = np.asarray(truth, dtype=np.float64)
    correct = (np.asarray(logits, dtype=np.float64) > 0) == (truth == 1)
    return {"n": int(truth.size), "encoding": "numpy packbits, base64",
            "truth": pack_bits(truth == 1), "correct": pack_bits(correct)}


def pack_bits(flags: Any) -> str:
    """Booleans as packed bits in base64 (:func:`unpack_bits` reverses it)."""
    import base64

    import numpy as np

    return base64.b64encode(np.packbits(np.asarray(flags, dtype=bool)).tobytes()).decode()


def unpack_bits(text: str, n: int) -> Any:
    """The ``n`` booleans of :func:`pack_bits`."""
    import base64

    import numpy as np

    return np.unpackbits(np.frombuffer(base64.b64decode(text), np.uint8))[:n].astype(bool)


# --------------------------------------------------------------------------- several seeds


def aggregate(spec: Any, results: list[dict[str, Any]], command: str) -> dict[str, Any]:
    """The results file (accuracies in percent) of ``results``, the seed records of the
    benchmark ``spec`` (a :class:`~adni_pu.workflows.benchmark.BenchmarkSpec`)."""
    from adni_pu.provenance import machine_description, package_versions

    pct = percent_summary
    method = {
        "test_accuracy": pct([r["test"]["accuracy"] for r in results]),
        "test_accuracy_test_selected": pct([r["test_accuracy_test_selected"] for r in results]),
        "test_accuracy_final_rule_diagnostic": pct(
            [r.get("test_accuracy_final_rule_diagnostic") for r in results]),
        "test_balanced_accuracy": pct([r["test"]["balanced_accuracy"] for r in results]),
        "test_auc": pct([r["test"]["auc"] for r in results]),
        "test_f1": pct([r["test"]["f1"] for r in results]),
        "seconds_per_epoch": {
            phase: summarise([r["seconds_per_epoch"][phase] for r in results
                              if phase in r["seconds_per_epoch"]])
            for phase in sorted({p for r in results for p in r["seconds_per_epoch"]})
        },
        "selected_epochs": [r["selected_epoch"] for r in results],
        "selected_models": [r["selected_model"] for r in results],
        "finalist_choices_diagnostic": [r.get("finalist_choice_diagnostic") for r in results],
    }
    first = results[0]["config"]
    estimates = [(r["seed"], r.get("prior_estimate")) for r in results]
    estimated = [(seed, e) for seed, e in estimates if e is not None]
    if estimated and len(estimated) != len(results):
        raise ResultsError(f"seeds {[s for s, e in estimates if e is None]} trained with a "
                           f"given class prior, seeds {[s for s, _ in estimated]} with an "
                           "estimated one: expected one kind in one results file")
    label = spec.label + (ESTIMATED_PRIOR_SUFFIX if estimated else "")
    data_name = DATA_NAMES[spec.dataset]
    if spec.dataset == "cifar10" and "jpeg" in str(spec.data_dir).lower():
        data_name = "CIFAR-10 (JPEG q75 copy)"
    return {
        "benchmark": f"{spec.dataset}-pu",
        "command": command,
        "date": _dt.date.today().isoformat(),
        "machine": results_machine(results, machine_description()),
        "data": data_name,
        "accuracy_unit": "percent",
        "settings": {
            "method": label, "n_labelled": spec.n_labelled, "scheme": spec.scheme,
            "prior": results[0]["data"]["prior"], "val_fraction": spec.val_fraction,
            "seeds": [r["seed"] for r in results], "epochs": first["epochs"],
            "train_limit": spec.train_limit, "test_limit": spec.test_limit,
            "batch_size": first["batch_size"], "lr": first["lr"],
            "weight_decay": first["weight_decay"], "model": first["model"],
            "val_criterion": first["val_criterion"], "pn_validation": first["pn_validation"],
            "selection": first.get("selection", "best_epoch"),
            "selfpu": first["selfpu"] if first["method"] == "selfpu" else None,
            # the data were built with "prior"; the risks trained with each seed's estimate
            **({"prior_source": "estimate"} if estimated else {}),
        },
        "versions": package_versions(),
        "results": {label: method},
        "per_seed": [{k: _kept(k, r.get(k)) for k in PER_SEED_FIELDS} for r in results],
        **({"prior_estimate": estimate_summary(estimated)} if estimated else {}),
    }


def results_machine(results: list[dict[str, Any]], here: str) -> str:
    """The machines that trained ``results`` (each seed's ``machines``, from its run folder's
    pieces), in order, each once; ``here`` for seeds without that record. A benchmark
    resumed on another machine names both, not only the one that wrote the file."""
    machines = [m for r in results for m in (r.get("machines") or [here])]
    return " + ".join(dict.fromkeys(machines)) if machines else here


def _kept(key: str, value: Any) -> Any:
    """A per-seed field as a results file keeps it (a prior estimate without the
    classifier's settings)."""
    if key != "prior_estimate" or value is None:
        return value
    kept = {k: value[k] for k in ESTIMATE_FIELDS if k in value}
    classifier = value.get("classifier") or {}
    kept["classifier"] = {k: classifier[k] for k in ("epochs", "selected_epoch", "val_pu_auc")
                          if k in classifier}
    return kept


def estimate_summary(estimates: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """Prior estimates of several seeds beside the true prior: per seed the estimate, its
    CI, the true prior, the absolute error and whether the CI covers the true prior; over
    the seeds the estimate's and the absolute error's mean (std) and the CI coverage.
    ``estimates``: (seed, record of :func:`adni_pu.workflows.prior.estimate_with_classifier`
    with ``true_prior``)."""
    rows = []
    for seed, e in estimates:
        truth = e.get("true_prior")
        known = truth is not None
        rows.append({"seed": seed, "value": e["value"], "ci_low": e["ci_low"],
                     "ci_high": e["ci_high"], "true_prior": truth,
                     "abs_error": abs(e["value"] - truth) if known else None,
                     "ci_covers_true_prior": (e["ci_low"] <= truth <= e["ci_high"]
                                              if known else None)})
    covered = [r["ci_covers_true_prior"] for r in rows if r["true_prior"] is not None]
    first = estimates[0][1]
    return {"method": first["method"], "split": first.get("split"),
            "classifier_epochs": (first.get("classifier") or {}).get("epochs"),
            "per_seed": rows, "value": summarise([r["value"] for r in rows]),
            "abs_error": summarise([r["abs_error"] for r in rows]),
            "ci_coverage": {"covered": sum(covered), "n": len(covered)}}


def estimate_markdown(summary: dict[str, Any]) -> str:
    """A table of :func:`estimate_summary`: per seed the estimate, CI, true prior and
    absolute error, then the mean (std) absolute error and the CI coverage."""
    lines = ["| seed | estimate | 95 % CI | true prior | abs error |", "|---|---|---|---|---|"]
    for r in summary["per_seed"]:
        truth = "n/a" if r["true_prior"] is None else f"{r['true_prior']:.3f}"
        error = "n/a" if r["abs_error"] is None else f"{r['abs_error']:.3f}"
        lines.append(f"| {r['seed']} | {r['value']:.3f} | [{r['ci_low']:.3f}, "
                     f"{r['ci_high']:.3f}] | {truth} | {error} |")
    cover = summary["ci_coverage"]
    lines += ["", f"Estimate {mean_std(summary['value'], 3)}; absolute error "
              f"{mean_std(summary['abs_error'], 3)} (mean (std) over seeds); the 95 % CI "
              f"covers the true prior in {cover['covered']} of {cover['n']} seeds."]
    return "\n".join(lines) + "\n"


def markdown_table(summary: dict[str, Any]) -> str:
    """A one-row-per-method table of a results file: honest accuracy, the test accuracy of
    the finalist validation chooses after the last epoch and the test-selected accuracy
    (both diagnostics), AUC, s/epoch; then the criterion and rule that selected the models."""
    lines = ["| method | test accuracy % (val-selected) | final-rule % (diagnostic) | "
             "test-selected % (diagnostic) | AUC % | s/epoch by phase |",
             "|---|---|---|---|---|---|"]
    fmt = mean_std
    for name, r in summary["results"].items():
        secs = ", ".join(f"{p}: {v['mean']:.1f}" for p, v in r["seconds_per_epoch"].items())
        lines.append(f"| {name} | {fmt(r['test_accuracy'])} | "
                     f"{fmt(r.get('test_accuracy_final_rule_diagnostic'))} | "
                     f"{fmt(r['test_accuracy_test_selected'])} | {fmt(r['test_auc'])} | {secs} |")
    settings = summary.get("settings", {})
    if settings.get("val_criterion"):
        from adni_pu.pu.criteria import criterion_sentence

        lines += ["", "Model selected " + criterion_sentence(
            settings["val_criterion"], settings.get("selection", "best_epoch"))
            + (" (validation labels are the truth: pn_validation)"
               if settings.get("pn_validation") else "") + "."]
    estimate = summary.get("prior_estimate")
    if estimate:
        lines += ["", f"Class prior estimated per seed from the PU data alone "
                  f"({estimate['method']} on the {estimate['split']} split, P-vs-U classifier "
                  f"of {estimate['classifier_epochs']} epochs); the risks trained with the "
                  "estimate, the PU data were built with the true prior:", "",
                  estimate_markdown(estimate).rstrip("\n")]
    return "\n".join(lines) + "\n"


def write_results(out: Path, summary: dict[str, Any], also: Path | None = None) -> Path:
    """Write the results file :data:`RESULTS_FILE` and its table :data:`RESULTS_TABLE` into
    ``out`` (and the results file to ``also``, ``--results-json``); returns its path."""
    text = json.dumps(summary, indent=2) + "\n"
    path = Path(out) / RESULTS_FILE
    fileio.atomic_write_text(path, text)
    fileio.atomic_write_text(Path(out) / RESULTS_TABLE, markdown_table(summary))
    if also is not None:
        fileio.atomic_write_text(also, text)
    return path


def read_results_file(path: Path) -> dict[str, Any]:
    """A results file, checked for the fields a table reads: :data:`RESULTS_FIELDS`, and
    ``settings.method`` naming an entry of ``results`` (:class:`ResultsError` otherwise)."""
    data = _read_json(path)
    for key in RESULTS_FIELDS:
        if not isinstance(data, dict) or key not in data:
            raise ResultsError(f"{path}: field {key!r} missing; expected a results file of "
                               "`adni-pu benchmark ... --results-json`")
    method = data["settings"].get("method")
    if method not in data["results"]:
        raise ResultsError(f"{path}: settings.method is {method!r} but results holds "
                           f"{sorted(data['results'])}")
    return data  # type: ignore[no-any-return]


def schedule(settings: dict[str, Any]) -> dict[str, int | None]:
    """Epochs and, for Self-PU, the warm-up and self-paced ends (None for the baselines)."""
    sp = settings.get("selfpu") or {}
    return {"epochs": settings.get("epochs"), "warmup_epochs": sp.get("warmup_epochs"),
            "self_paced_end": sp.get("self_paced_end")}


def data_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The PU data a run was trained and tested on (must match for a paired difference)."""
    return {k: settings.get(k) for k in DATA_KEYS}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultsError(f"{path}: not JSON ({err})") from None

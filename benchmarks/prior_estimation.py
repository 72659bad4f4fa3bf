"""How far the class prior estimated from PU data alone (``adni-pu benchmark --prior
estimate``) lies from the truth, on MNIST and CIFAR-10 built as the benchmark builds them.

Per data set and seed: the PU data of ``adni-pu benchmark {mnist,cifar10}`` (the nnPU row's
network and protocol settings), the benchmark's P-vs-U classifier
(:func:`adni_pu.workflows.prior.tensor_classifier_config`, naive PN chosen by the P-vs-U
AUC on validation) and best-bin estimation (BBE) on the validation split, exactly as the
benchmark estimates; beside it, Elkan & Noto's (KDD 2008) e1 estimator from the same
classifier's validation scores, for comparison. The truth is the positive fraction of the
seed's training split (and of its validation U, which BBE estimates first); the test split
is never read.

Steps:

- ``tune``: tuning seeds that no reported result uses. One classifier per seed for
  ``--max-epochs``, every epoch's validation scores recorded; for each epoch budget E the
  model the trainer would keep (the best P-vs-U AUC in the first E epochs) gives BBE's and
  e1's estimate, and their error against the validation split's truth. Writes
  ``benchmarks/results/prior-estimation-tuning.json``; the choices made from it are in
  ``benchmarks/results/prior-estimation-tuning-log.md``.
- ``run``: the reported seeds; one results file per data set and seed in
  ``benchmarks/results/prior-estimation/`` as each finishes (a finished one is skipped; the
  classifiers' run folders in ``runs/prior-estimation/`` resume).
- ``table``: ``benchmarks/results/prior-estimation.md`` and ``.json`` from those files:
  per seed the estimate, its CI, the true prior and the absolute error; the mean (std)
  absolute error and the CI coverage per data set.

Run on a shared 2-core VM with one thread::

    OMP_NUM_THREADS=1 python benchmarks/prior_estimation.py tune --dataset mnist --seeds 100 101
    OMP_NUM_THREADS=1 python benchmarks/prior_estimation.py run --dataset mnist --seeds 0 1 2 3 4
    python benchmarks/prior_estimation.py table
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    REPO,
    RESULTS,
    command_line,
    results_record,
    script_parser,
    write_json,
)

OUT = RESULTS / "prior-estimation"
TUNING = RESULTS / "prior-estimation-tuning.json"
TABLE = RESULTS / "prior-estimation"  # stem: .md and .json
RUNS = REPO / "runs" / "prior-estimation"
MACHINE = "2-core CPU VM, no GPU"
DATA_DIRS = {"mnist": REPO.parent / "shared" / "data" / "mnist",
             "cifar10": REPO.parent / "shared" / "data" / "cifar10-jpeg"}
DATA_NAMES = {"mnist": "MNIST (original IDX)", "cifar10": "CIFAR-10 (JPEG q75 copy)"}


# ----------------------------------------------------------------------------- estimators


def e1_alpha(logits_p: Any, ratio: float) -> float:
    """Elkan & Noto's e1: c = p(s=1 | y=1), the mean of the P-vs-U classifier's
    probability over held-out labelled positives, under the classifier's own mix of
    labelled and unlabelled training entries (``ratio`` = labelled / unlabelled). Where
    positives lie apart from negatives, g(x) = ratio / (ratio + alpha) for a positive, so
    alpha = ratio (1 - c) / c: the positive fraction of U, clipped to [0, 1]."""
    import numpy as np

    c = float(np.mean(1.0 / (1.0 + np.exp(-np.asarray(logits_p, dtype=np.float64)))))
    return float(np.clip(ratio * (1.0 - c) / c, 0.0, 1.0))


def entry_ratio(data: Any, cfg: Any) -> float:
    """Labelled over unlabelled training entries as the classifier saw them (every batch
    holds them in the data's ratio, or ``positive_share`` of labelled positives)."""
    if cfg.positive_share > 0:
        return cfg.positive_share / (1.0 - cfg.positive_share)
    train = data.train
    return float(train.labelled.sum()) / len(train.unlabelled_indices(data.scheme))


# ----------------------------------------------------------------------------- setup


def spec_for(args: argparse.Namespace, seed: int) -> Any:
    """The benchmark's spec of the nnPU row on ``args.dataset`` (one torch thread, CPU)."""
    from adni_pu.workflows.benchmark import BenchmarkSpec

    return BenchmarkSpec(dataset=args.dataset, method="nnpu", seeds=[seed],
                         data_dir=DATA_DIRS[args.dataset], out=RUNS,
                         n_labelled=args.n_labelled, train_limit=args.train_limit,
                         test_limit=args.test_limit,
                         settings={"threads": 1, "device": "cpu", "progress": False})


def seed_setup(args: argparse.Namespace, seed: int) -> tuple[Any, Any]:
    """The seed's PU data (as the benchmark builds them) and the row's settings."""
    from adni_pu.workflows.benchmark import resolve_config, seed_data

    spec = spec_for(args, seed)
    cfg = resolve_config(spec, seed)
    return seed_data(spec, seed, cfg, RUNS / ".cache"), cfg


def truths(data: Any) -> dict[str, float]:
    """What the estimate is compared with: the protocol's prior (the data were built
    with), the training split's positive fraction (the class prior the estimate targets)
    and the positive fraction of the validation split's U (what BBE estimates first)."""
    val = data.val
    u = val.unlabelled_indices(data.scheme)
    return {"true_prior": float(data.prior), "true_prior_split": float(data.train.truth.mean()),
            "true_alpha_val": float(val.truth[u].mean())}


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    return {"n_labelled": args.n_labelled, "train_limit": args.train_limit,
            "test_limit": args.test_limit, "scheme": "case-control", "val_fraction": 0.1,
            "row": "nnpu (the benchmark's network and protocol settings)"}


# ----------------------------------------------------------------------------- tune


def tune_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One tuning seed: the classifier for ``args.max_epochs`` with every epoch's
    validation scores, then BBE and e1 per epoch budget."""
    import dataclasses

    import numpy as np
    import torch

    from adni_pu.pu.metrics import roc_auc
    from adni_pu.pu.prior_estimate import best_bin_alpha
    from adni_pu.pu.trainer import Trainer
    from adni_pu.workflows.prior import prior_free_data, tensor_classifier_config

    torch.set_num_threads(1)
    data, cfg = seed_setup(args, seed)
    blind = prior_free_data(data)
    settings = dataclasses.replace(tensor_classifier_config(cfg, args.max_epochs),
                                   record_val_logits=True)
    run_dir = RUNS / "tune" / f"{args.dataset}-s{seed}"
    tic = time.process_time()
    trainer = Trainer(settings, blind, run_dir)
    trainer.fit()
    cpu = time.process_time() - tic
    val = blind.val
    p_mask = val.labelled
    u_idx = val.unlabelled_indices(blind.scheme)
    truth = truths(data)
    ratio = entry_ratio(blind, settings)
    per_epoch = []
    for epoch in range(args.max_epochs):
        with np.load(run_dir / "val_logits" / f"epoch-{epoch:04d}.npz") as saved:
            logits = saved["model"].astype(np.float64)
        auc = roc_auc(np.concatenate([logits[p_mask], logits[u_idx]]),
                      np.r_[np.ones(int(p_mask.sum())), np.zeros(len(u_idx))])
        per_epoch.append({"epoch": epoch, "val_pu_auc": auc,
                          "bbe_alpha": best_bin_alpha(logits[p_mask], logits[u_idx]),
                          "e1_alpha": e1_alpha(logits[p_mask], ratio)})
    budgets = []
    for budget in range(1, args.max_epochs + 1):
        aucs = [r["val_pu_auc"] for r in per_epoch[:budget]]
        kept = per_epoch[int(np.argmax(aucs))]  # the first best, as the trainer keeps it
        budgets.append({"epochs": budget, "kept_epoch": kept["epoch"],
                        "val_pu_auc": kept["val_pu_auc"],
                        "bbe_alpha": kept["bbe_alpha"], "e1_alpha": kept["e1_alpha"],
                        "bbe_error": abs(kept["bbe_alpha"] - truth["true_alpha_val"]),
                        "e1_error": abs(kept["e1_alpha"] - truth["true_alpha_val"])})
    # scores of the training split instead of validation (the kept model of the full run)
    train_logits = trainer.predict_logits(trainer.best_model(), blind.train)
    train_u = blind.train.unlabelled_indices(blind.scheme)
    train_alpha = best_bin_alpha(train_logits[blind.train.labelled], train_logits[train_u])
    return {"seed": seed, "cpu_seconds": cpu, **truth, "entry_ratio": ratio,
            "per_epoch": per_epoch, "budgets": budgets,
            "train_split_scores": {
                "bbe_alpha": train_alpha,
                "true_alpha_train": float(blind.train.truth[train_u].mean()),
                "bbe_error": abs(train_alpha - float(blind.train.truth[train_u].mean()))}}


def tune(args: argparse.Namespace) -> None:
    """Tuning seeds of one data set into :data:`TUNING` (others kept; a seed done with the
    same settings is skipped)."""
    record = json.loads(TUNING.read_text()) if TUNING.is_file() else {}
    key = args.dataset
    entry = record.get(key)
    wanted = {**settings_of(args), "max_epochs": args.max_epochs}
    if entry is None or entry.get("settings") != wanted:
        entry = {"settings": wanted, "seeds": {}}
    for seed in args.seeds:
        if str(seed) in entry["seeds"]:
            print(f"{key} seed {seed}: already tuned", file=sys.stderr)
            continue
        entry["seeds"][str(seed)] = tune_seed(args, seed)
        entry.update(command=command_line(__file__), machine=MACHINE,
                     data=DATA_NAMES[key], date=time.strftime("%Y-%m-%d"))
        record[key] = entry
        write_json(TUNING, record)
        print(f"{key} seed {seed}: tuned", file=sys.stderr)
    print(tuning_text(record[key]))


def tuning_text(entry: dict[str, Any]) -> str:
    """Mean validation error of BBE and e1 over the tuning seeds, per epoch budget."""
    import numpy as np

    seeds = list(entry["seeds"].values())
    lines = ["| epochs | kept epochs | val P-vs-U AUC | BBE val error | e1 val error |",
             "|---|---|---|---|---|"]
    for i, budget in enumerate(seeds[0]["budgets"]):
        rows = [s["budgets"][i] for s in seeds]
        lines.append(f"| {budget['epochs']} | {', '.join(str(r['kept_epoch'] + 1) for r in rows)}"
                     f" | {np.mean([r['val_pu_auc'] for r in rows]):.4f}"
                     f" | {np.mean([r['bbe_error'] for r in rows]):.4f}"
                     f" | {np.mean([r['e1_error'] for r in rows]):.4f} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- run


def result_path(dataset: str, seed: int) -> Path:
    return OUT / f"{dataset}-s{seed}.json"


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One reported seed, estimated as ``adni-pu benchmark --prior estimate`` estimates."""
    import torch

    from adni_pu.pu.trainer import Trainer
    from adni_pu.workflows.prior import (
        ESTIMATE_DIR,
        estimate_with_classifier,
        prior_free_data,
        tensor_classifier_config,
    )

    torch.set_num_threads(1)
    data, cfg = seed_setup(args, seed)
    settings = tensor_classifier_config(cfg, args.epochs)
    run_dir = RUNS / f"{args.dataset}-s{seed}"
    truth = truths(data)
    tic = time.process_time()
    trainer = Trainer(settings, prior_free_data(data), run_dir / ESTIMATE_DIR)
    estimate = estimate_with_classifier(trainer, run_dir, {
        "true_prior": truth["true_prior"], "true_prior_split": truth["true_prior_split"]})
    assert estimate is not None
    cpu = time.process_time() - tic
    val = trainer.data.val
    logits = trainer.predict_logits(trainer.best_model(), val)
    from adni_pu.pu.prior_estimate import prior_from_alpha

    e1 = e1_alpha(logits[val.labelled], entry_ratio(trainer.data, settings))
    train = data.train
    e1_prior = prior_from_alpha(e1, data.scheme, int(train.labelled.sum()), len(train))
    target = truth["true_prior_split"]
    estimate = {k: v for k, v in estimate.items() if k != "classifier"} | {
        "classifier": {k: v for k, v in estimate["classifier"].items() if k != "config"}}
    results = {"seed": seed, "estimate": estimate, **truth,
               "abs_error": abs(estimate["value"] - target),
               "abs_error_vs_protocol_prior": abs(estimate["value"] - truth["true_prior"]),
               "ci_covers_true_prior": estimate["ci_low"] <= target <= estimate["ci_high"],
               "alpha_error_val": abs(estimate["alpha"] - truth["true_alpha_val"]),
               "e1": {"alpha": e1, "value": e1_prior, "abs_error": abs(e1_prior - target)},
               "classifier_cpu_seconds": round(cpu, 1)}
    return results_record(f"prior-estimation-{args.dataset}", command_line(__file__),
                          DATA_NAMES[args.dataset], results,
                          settings={**settings_of(args), "classifier_epochs": args.epochs},
                          machine_note=f" ({MACHINE}, 1 torch thread, OMP_NUM_THREADS=1)")


def run(args: argparse.Namespace) -> None:
    """The reported seeds, one results file each, skipping finished ones."""
    wanted = {**settings_of(args), "classifier_epochs": args.epochs}
    for seed in args.seeds:
        path = result_path(args.dataset, seed)
        if path.is_file() and json.loads(path.read_text()).get("settings") == wanted:
            print(f"{args.dataset} seed {seed}: already done ({path})", file=sys.stderr)
            continue
        record = run_seed(args, seed)
        write_json(path, record)
        r = record["results"]
        print(f"{args.dataset} seed {seed}: estimate {r['estimate']['value']:.4f} "
              f"[{r['estimate']['ci_low']:.4f}, {r['estimate']['ci_high']:.4f}], truth "
              f"{r['true_prior_split']:.4f}, e1 {r['e1']['value']:.4f} "
              f"({r['classifier_cpu_seconds']:.0f} CPU s)", file=sys.stderr)


# ----------------------------------------------------------------------------- table


def table(args: argparse.Namespace) -> None:
    """``prior-estimation.md`` / ``.json`` from the per-seed files."""
    import numpy as np

    from adni_pu.pu.metrics import mean_std, summarise
    from adni_pu.workflows.results_format import estimate_markdown, estimate_summary

    files = sorted(OUT.glob("*.json"))
    if not files:
        raise SystemExit(f"{OUT}: no results files; run the `run` step first")
    by_set: dict[str, list[dict[str, Any]]] = {}
    for path in files:
        record = json.loads(path.read_text())
        by_set.setdefault(record["benchmark"].removeprefix("prior-estimation-"), []).append(
            {**record, "file": str(path.relative_to(REPO))})
    out: dict[str, Any] = {"benchmark": "prior-estimation", "command": command_line(__file__),
                           "machine": MACHINE, "data_sets": {}}
    lines = ["# Class prior estimated from PU data alone: error on MNIST and CIFAR-10", "",
             "Made by `python benchmarks/prior_estimation.py table` from the per-seed files "
             "in `benchmarks/results/prior-estimation/` (each names the command that made "
             f"it); machine: {MACHINE}, one torch thread. The estimate is the one "
             "`adni-pu benchmark --prior estimate` makes (BBE on the validation split's "
             "scores of a naive P-vs-U classifier); the true prior is the positive fraction "
             "of the seed's training split (the protocol's prior the data were built with "
             "is given beside it); the 95 % CI is the bootstrap over validation examples.",
             ""]
    for name, records in sorted(by_set.items()):
        records.sort(key=lambda r: r["results"]["seed"])
        estimates = [(r["results"]["seed"], {**r["results"]["estimate"],
                                             "true_prior": r["results"]["true_prior_split"]})
                     for r in records]
        summary = estimate_summary(estimates)
        e1 = summarise([r["results"]["e1"]["abs_error"] for r in records])
        vs_protocol = summarise([r["results"]["abs_error_vs_protocol_prior"] for r in records])
        cpu = float(np.sum([r["results"]["classifier_cpu_seconds"] for r in records]))
        settings = records[0]["settings"]
        out["data_sets"][name] = {
            "data": records[0]["data"], "settings": settings,
            "commands": sorted({r["command"] for r in records}),
            "protocol_prior": records[0]["results"]["true_prior"], "bbe": summary,
            "bbe_abs_error_vs_protocol_prior": vs_protocol, "e1_abs_error": e1,
            "classifier_cpu_seconds": cpu, "files": [r["file"] for r in records]}
        limit = (f", training subset of {settings['train_limit']} images "
                 f"(`--train-limit`), {settings['n_labelled']} labelled positives"
                 if settings.get("train_limit") else
                 f", the whole training split, {settings['n_labelled']} labelled positives")
        lines += [f"## {records[0]['data']}", "",
                  f"Seeds {', '.join(str(s) for s, _ in estimates)}{limit}; P-vs-U classifier "
                  f"of {settings['classifier_epochs']} epochs "
                  f"({cpu / 60:.1f} CPU-minutes in all). Commands: "
                  + "; ".join(f"`{c}`" for c in out["data_sets"][name]["commands"]) + ".", "",
                  estimate_markdown(summary).rstrip("\n"), "",
                  "Validation P-vs-U AUC of each seed's kept classifier (its ceiling in "
                  "case-control data is 1 - prior / 2): " + ", ".join(
                      f"seed {r['results']['seed']} "
                      f"{r['results']['estimate']['classifier']['val_pu_auc']:.3f}"
                      for r in records) + ".", "",
                  f"Against the protocol's prior {records[0]['results']['true_prior']:.2f}: "
                  f"absolute error {mean_std(vs_protocol, 3)}. Elkan & Noto's e1 from the same "
                  f"classifier: absolute error {mean_std(e1, 3)}.", ""]
    out["markdown"] = "\n".join(lines)
    write_json(TABLE.with_suffix(".json"), out)
    from adni_pu import fileio

    fileio.atomic_write_text(TABLE.with_suffix(".md"), out["markdown"])
    print(out["markdown"])


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__)
    steps = parser.add_subparsers(dest="step", required=True)
    for name, fn in (("tune", tune), ("run", run)):
        step = steps.add_parser(name)
        step.set_defaults(fn=fn)
        step.add_argument("--dataset", choices=sorted(DATA_DIRS), required=True)
        step.add_argument("--seeds", type=int, nargs="+", required=True)
        step.add_argument("--n-labelled", type=int, default=1000)
        step.add_argument("--train-limit", type=int, default=None)
        step.add_argument("--test-limit", type=int, default=None,
                          help="kept for the benchmark's data; the test split is not read")
        if name == "tune":
            step.add_argument("--max-epochs", type=int, default=12)
        else:
            step.add_argument("--epochs", type=int, required=True,
                              help="the classifier's epochs (from the tuning log)")
    steps.add_parser("table").set_defaults(fn=table)
    args = parser.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()

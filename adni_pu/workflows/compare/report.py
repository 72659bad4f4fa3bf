"""The comparison's report: ``OUT/report.md`` and ``OUT/report.json``, the ROC plot and the
reliability diagram, and one results file per method in ``OUT/records/`` (the format of
``adni-pu benchmark table``, :mod:`adni_pu.workflows.results_format`), from the finished
pieces alone (``--report-only`` aggregates what other processes trained)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from adni_pu import fileio
from adni_pu.errors import ConfigError
from adni_pu.workflows.compare import scores
from adni_pu.workflows.compare.pieces import (
    SETTINGS_FILE,
    CompareSpec,
    all_pieces,
    read_piece,
)

PU_METHODS = ("upu", "nnpu", "selfpu", "vpu", "nnpu-estimated")


def read_spec(out: Path) -> CompareSpec:
    """The comparison recorded in ``OUT/comparison.json``."""
    path = Path(out) / SETTINGS_FILE
    if not path.is_file():
        raise ConfigError(f"{out}: not a comparison folder ({SETTINGS_FILE} missing); run "
                          "`adni-pu benchmark cohort MANIFEST OUT` first")
    data = json.loads(path.read_text())
    settings = {k: tuple(v) if isinstance(v, list) else v for k, v in data["settings"].items()}
    return CompareSpec(manifest=data["manifest"], out=str(out), **settings)


def default_pairs(methods: tuple[str, ...]) -> list[tuple[str, str]]:
    """Every PU method against naive, then Self-PU against nnPU and nnPU with an estimated
    prior against nnPU given it."""
    pairs = [(m, "naive") for m in methods if m in PU_METHODS and "naive" in methods]
    for a in ("selfpu", "nnpu-estimated"):
        if a in methods and "nnpu" in methods:
            pairs.append((a, "nnpu"))
    return pairs


def collect(spec: CompareSpec) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """Per method the pooled held-out predictions of each seed whose folds are all finished
    (``seed, subject_id, ...``), the finished pieces' records, and the unfinished pieces."""
    import pandas as pd

    records, missing = [], []
    for piece in all_pieces(spec):
        record = read_piece(Path(spec.out), piece)
        if record is None:
            missing.append(piece.name)
        else:
            records.append(record)
    frames: dict[str, Any] = {}
    for method in spec.methods:
        rows = []
        for seed in spec.seed_values:
            mine = [r for r in records if r["method"] == method and r["seed"] == seed]
            if len(mine) == spec.folds:
                rows += [{**p, "seed": seed, "fold": r["fold"]} for r in mine
                         for p in r["held_out"]]
        if rows:
            frames[method] = with_probability(pd.DataFrame(rows).astype({"truth": float}))
    return frames, records, missing


def with_probability(frame: Any) -> Any:
    """``frame`` with ``probability`` = sigmoid(logit) where a row has none (records kept
    without it: :mod:`benchmarks`' converted paper-scale pieces)."""
    from adni_pu.pu.metrics import sigmoid

    if "probability" not in frame:
        frame["probability"] = float("nan")
    missing = frame["probability"].isna()
    frame.loc[missing, "probability"] = sigmoid(frame.loc[missing, "logit"].to_numpy(float))
    return frame


def build(spec: CompareSpec, pairs: list[tuple[str, str]] | None, n_boot: int
          ) -> dict[str, Any]:
    """The report's record (what ``report.json`` holds)."""
    import pandas as pd

    frames, records, missing = collect(spec)
    if not frames:
        raise ConfigError(f"{spec.out}: no method has finished every fold of a seed yet "
                          f"({len(missing)} pieces unfinished, e.g. {missing[0]}); run the "
                          "pieces first")
    for a, b in pairs or []:
        for name in (a, b):
            if name not in spec.methods:
                raise ConfigError(f"--pair {a},{b}: {name!r} is not one of the compared "
                                  f"methods {', '.join(spec.methods)}")
    has_truth = any(f["truth"].notna().any() for f in frames.values())
    report: dict[str, Any] = {
        "manifest": spec.manifest, "settings": spec.recorded(), "has_truth": has_truth,
        "unfinished_pieces": missing, "n_boot": n_boot,
        "methods": {m: scores.method_scores(f, n_boot) for m, f in frames.items()},
        "paired": scores.paired_scores(frames, list(pairs or default_pairs(spec.methods)),
                                       n_boot) if has_truth else [],
        "priors": [{"method": r["method"], "fold": r["fold"], "seed": r["seed"],
                    "prior": (r.get("prior") or {}).get("prior"),
                    "source": (r.get("prior") or {}).get("source"),
                    "read_by_method": (r.get("prior") or {}).get("read_by_method", True)}
                   for r in sorted(records, key=lambda r: (r["method"], r["fold"], r["seed"]))],
        "selected_epochs": {m: [r["selected_epoch"] for r in records if r["method"] == m]
                            for m in spec.methods},
        "train_seconds": sum(r["train_seconds"] for r in records),
        "epochs": {m: max((r["epochs"] for r in records if r["method"] == m), default=None)
                   for m in spec.methods},
    }
    report["calibration"] = ({m: scores.calibration(f["probability"].to_numpy(),
                                                    f["truth"].to_numpy())
                              for m, f in frames.items()} if has_truth else None)
    test = {}
    for m in spec.methods:
        mine = [r for r in records if r["method"] == m and r.get("independent_test")]
        if mine:
            rows = pd.DataFrame([{**p, "seed": r["seed"], "fold": r["fold"]} for r in mine
                                 for p in r["independent_test"]]).astype({"truth": float})
            ens = scores.ensemble_test(rows)
            test[m] = {"fold_models": len(mine),
                       "ensemble": scores.method_scores(ens, n_boot),
                       "mean_spread": float(ens["spread"].mean())}
    report["independent_test"] = test or None
    report["references"] = references(spec, frames, n_boot) if has_truth else {}
    return report


def references(spec: CompareSpec, frames: dict[str, Any], n_boot: int) -> dict[str, Any]:
    """Reference lines on the same folds: all-negative and all-positive accuracy, and the
    logistic regression on the two measured volumes (where the scans are model-grid
    volumes; otherwise the reason it is missing)."""
    import pandas as pd

    from adni_pu.errors import AdniPuError
    from adni_pu.workflows.compare.pieces import fold_manifest, seed_manifest
    from adni_pu.workflows.compare.references import (
        LOGISTIC,
        logistic_reference,
        volume_features,
    )

    first = next(iter(frames.values()))
    truth = first[first["seed"] == first["seed"].min()]["truth"].dropna().to_numpy()
    out: dict[str, Any] = {"all-negative": {"accuracy": float((truth == 0).mean())},
                           "all-positive": {"accuracy": float((truth == 1).mean())}}
    # K folds: one split of the subjects, the same in every seed; hold-out: a split per seed
    splits = ([(s, [seed_manifest(Path(spec.out), s)]) for s in sorted(set(first["seed"]))]
              if spec.holdout is not None else
              [(int(first["seed"].min()), [fold_manifest(Path(spec.out), k)
                                           for k in range(spec.folds)])])
    try:
        manifests = {s: [pd.read_csv(p, dtype={"subject_id": str}) for p in paths]
                     for s, paths in splits}
        cache = Path(spec.out) / "volume_features.csv"
        paths = sorted(set(manifests[splits[0][0]][0]["scan_path"].astype(str)))
        features = pd.read_csv(cache) if cache.is_file() else None
        if features is None or sorted(features["scan_path"]) != paths:
            features = volume_features(paths)
            fileio.atomic_write_text(cache, features.to_csv(index=False))
        parts = []
        for seed, folds in manifests.items():
            part = pd.concat([logistic_reference(f, features) for f in folds])
            parts.append(part.merge(first[first["seed"] == seed][["subject_id", "pu_label"]],
                                    on="subject_id").assign(
                seed=seed if spec.holdout is not None else 0))
        logistic = pd.concat(parts)
        out[LOGISTIC] = {**scores.method_scores(logistic, n_boot), "predictions": logistic[
            ["seed", "subject_id", "pu_label", "logit", "truth"]].to_dict("records")}
    except (AdniPuError, ValueError, OSError) as exc:
        out[LOGISTIC] = {"missing": " ".join(str(exc).split())}
    return out


def write_report(out: Path, pairs: list[tuple[str, str]] | None = None, n_boot: int = 1000,
                 command: str = "") -> Path:
    """Build the report from the finished pieces; write report.md, report.json, roc.png,
    calibration.png and ``records/<method>.json``. Returns report.md."""
    from adni_pu.pu.plots import roc_plot
    from adni_pu.workflows.compare.render import calibration_plot, records, render

    spec = read_spec(out)
    report = build(spec, pairs, n_boot)
    report["command"] = command
    frames, _, _ = collect(spec)
    out = Path(out)
    if report["has_truth"]:
        curves = {m: (f.groupby("subject_id")["probability"].mean().to_numpy(),
                      f.groupby("subject_id")["truth"].first().to_numpy())
                  for m, f in frames.items()}
        roc_plot(np.zeros(0), np.zeros(0), out / "roc.png",
                 title="held-out ROC (probabilities averaged over seeds)", curves=curves)
        calibration_plot(report["calibration"], out / "calibration.png")
    for method, record in records(spec, report, frames).items():
        fileio.atomic_write_text(out / "records" / f"{method}.json",
                                 json.dumps(record, indent=2) + "\n")
    fileio.atomic_write_text(out / "report.json",
                             json.dumps(report, indent=2, default=_json) + "\n")
    path = out / "report.md"
    fileio.atomic_write_text(path, render(report))
    return path


def _json(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return str(value)

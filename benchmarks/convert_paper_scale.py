"""One-off: the paper-scale testbed's per-seed results files -> a comparison folder of
``adni-pu benchmark cohort --holdout 113`` (issue 53, item 4).

Each ``<method>-seed<S>.json`` becomes the piece ``pieces/<method>/fold-0/seed-<S>/piece.json``
(the held-out subjects' logits as they were, their probabilities as the sigmoid of the
logits, the prior, the selected epoch, the splits, the run's wall time and machine, and
where it came from); each ``reference-seed<S>.json`` becomes ``references/seed-<S>.json``
(the two reference lines' per-subject scores; the metrics are recomputed from them). The
comparison's ``comparison.json`` records the settings the command takes to make the same
splits and training settings (``--holdout 113 --val-fraction 0.15``, the seeds,
``--config benchmarks/paper-scale.toml``); the cohort's manifest is not committed, so its
hash is null and a rerun into the folder is refused (use a new folder). The old files are
removed by the caller (git rm) once the converted ones are committed.

    python -m benchmarks.convert_paper_scale benchmarks/results/paper-scale --seeds 40
    python -m benchmarks.convert_paper_scale benchmarks/results/paper-scale-real --seeds 5 \
        --methods naive,nnpu,selfpu --manifest runs/paper-scale-real/cohort/manifest.csv
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, script_parser

#: The commit whose files are converted (the per-seed files as the paper-scale script wrote
#: them).
SOURCE_COMMIT = "e6ed927"


def compact_json(record: dict[str, Any]) -> str:
    """Indented JSON with each per-subject row, and each object of plain values below the
    top, on one line (the files stay smaller than the per-seed files they replace)."""
    import re

    rows: list[str] = []

    def mark(value: Any, top: bool = False) -> Any:
        plain = isinstance(value, dict) and not any(isinstance(v, (dict, list))
                                                    for v in value.values())
        if isinstance(value, dict) and ("subject_id" in value or (plain and not top)):
            rows.append(json.dumps(value, separators=(",", ":")))
            return f"@@{len(rows) - 1}@@"
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        return value

    text = json.dumps(mark(record, top=True), indent=2)
    return re.sub(r'"@@(\d+)@@"', lambda m: rows[int(m.group(1))], text) + "\n"


def held_out(predictions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The old per-subject predictions as a piece's ``held_out`` rows (the order kept; no
    probability: the report takes the sigmoid of the logit where a row has none)."""
    out = []
    for p in predictions:
        truth = p.get("truth")
        truth = None if truth is None or (isinstance(truth, float) and math.isnan(truth)) \
            else float(truth)
        out.append({"subject_id": p["subject_id"], "pu_label": int(p["pu_label"]),
                    "truth": truth, "logit": float(p["logit"])})
    return out


def piece_record(old: dict[str, Any], path: Path, reads_prior: bool) -> dict[str, Any]:
    """One per-seed results file as the piece record ``run_piece`` writes, plus where it came
    from."""
    estimate = old.get("prior_estimate")
    if estimate is not None:
        used = estimate["prior_trained_with"]
        prior = {"prior": used["prior"], "source": used["source"], "read_by_method": True}
    else:
        prior = {"prior": old["cohort"]["prior"], "source": old["cohort"]["prior_note"],
                 "read_by_method": reads_prior}
    result = old["result"]
    return {
        "method": old["method"], "fold": 0, "seed": old["seed"], "prior": prior,
        "prior_estimate": estimate, "selected_epoch": result["best_epoch"],
        "selected_model": result["candidate"], "epochs": old["epochs"],
        "train_seconds": old["wall_s"],
        "splits": old["cohort"]["splits"], "machine": old["machine"],
        "converted_from": {
            "file": f"{path.relative_to(REPO)} at commit {SOURCE_COMMIT}",
            "date": old["date"], "val_auc": result.get("val_auc"),
            "nn_correction": result.get("nn_correction"),
            "git_commit": (old.get("provenance") or {}).get("git_commit")},
        "held_out": held_out(result["predictions"]), "independent_test": None}


def reference_record(old: dict[str, Any], path: Path) -> dict[str, Any]:
    """One ``reference-seed<S>.json`` as ``references/seed-<S>.json``: each line's note,
    threshold and per-subject scores (its metrics are recomputed from them)."""
    lines = {}
    for name, line in old["references"].items():
        lines[name] = {k: v for k, v in line.items()
                       if k in ("note", "threshold")}
        lines[name]["predictions"] = [
            {"subject_id": p["subject_id"], "pu_label": int(p["pu_label"]),
             "logit": float(p["logit"]),
             "truth": None if p["truth"] is None or math.isnan(p["truth"]) else p["truth"]}
            for p in line["predictions"]]
    return {"seed": old["seed"], "machine": old["machine"], "wall_s": old["wall_s"],
            "date": old["date"], "splits": old["cohort"]["splits"],
            "converted_from": {"file": f"{path.relative_to(REPO)} at commit {SOURCE_COMMIT}",
                               "git_commit": (old.get("provenance") or {}).get("git_commit")},
            "lines": lines}


def convert(folder: Path, seeds: int, methods: tuple[str, ...], manifest: str) -> None:
    from adni_pu.workflows.class_prior import reads_no_prior
    from adni_pu.workflows.compare.pieces import (
        SETTINGS_FILE,
        CompareSpec,
        Piece,
        method_preset,
        piece_config,
        piece_dir,
    )

    folder = folder.resolve()
    first = json.loads(next(folder.glob("naive-seed*.json")).read_text())
    spec = CompareSpec(manifest=manifest, out=str(folder), methods=methods, folds=1,
                       seeds=seeds, config_file="benchmarks/paper-scale.toml", holdout=113,
                       val_fraction=0.15)
    record = {"manifest": manifest, "manifest_sha256": None, "settings": spec.recorded(),
              "cohort": {"subjects": first["cohort"]["subjects"],
                         "cohort_seed": first["cohort"]["cohort_seed"],
                         "synth": first["cohort"]["synth"], "data": first["data"]},
              "converted_from": f"the per-seed files of {folder.relative_to(REPO)} at commit "
                                f"{SOURCE_COMMIT} (benchmarks/convert_paper_scale.py); each "
                                "piece's train_seconds is its run's whole wall time (cohort "
                                "split, training, scoring)"}
    (folder / SETTINGS_FILE).write_text(json.dumps(record, indent=2) + "\n")
    n = 0
    for path in sorted(folder.glob("*-seed*.json")):
        old = json.loads(path.read_text())
        if path.name.startswith("reference-"):
            out = folder / "references" / f"seed-{old['seed']}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(compact_json(reference_record(old, path)))
            n += 1
            continue
        method = old["method"]
        if method not in methods or old["seed"] >= seeds:
            raise SystemExit(f"{path}: {method} seed {old['seed']} is outside the comparison")
        cfg = piece_config(spec, Piece(method, 0, old["seed"]))
        reads = not reads_no_prior(method_preset(method)[0], cfg.train.val_criterion)
        where = piece_dir(folder, Piece(method, 0, old["seed"]))
        where.mkdir(parents=True, exist_ok=True)
        (where / "piece.json").write_text(compact_json(piece_record(old, path, reads)))
        n += 1
    print(f"{folder}: {n} files converted")


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--seeds", type=int, required=True)
    parser.add_argument("--methods", default="naive,upu,nnpu,selfpu,nnpu-estimated,vpu")
    parser.add_argument("--manifest", default="runs/paper-scale/cohort/manifest.csv")
    args = parser.parse_args()
    convert(args.folder, args.seeds, tuple(args.methods.split(",")), args.manifest)


if __name__ == "__main__":
    main()

"""``adni-pu predict``: per-scan probabilities of the run's positive class for new scans.

Scans already on the model grid are used as they are; raw T1 scans are first preprocessed
with the settings recorded by the preprocessing run that made the training volumes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from adni_pu.data.volume_config import VolumeDataConfig
from adni_pu.errors import VolumeRunError
from adni_pu.fileio import atomic_write_text
from adni_pu.pu.metrics import sigmoid
from adni_pu.workflows.run_folder import load_run, score_dataset


def on_model_grid(source: str | Path | Any, data: VolumeDataConfig) -> bool:
    """Whether a NIfTI file (a path, or its nibabel image) is already on the model grid: its
    first three axes' shape and its affine, after RAS reorientation, from the header alone.
    A 4D file on the grid counts (the input check then refuses it with its reason)."""
    import nibabel as nib

    from adni_pu.data.grid_check import canonical_affine, canonical_shape

    img = nib.load(str(source)) if isinstance(source, (str, Path)) else source
    if len(img.shape) < 3 or canonical_shape(img) != tuple(data.grid_shape):
        return False
    expected = data.grid_affine()
    return bool(np.allclose(canonical_affine(img), expected,
                            atol=1e-3 * abs(expected[0, 0]) + 1e-4))


def preprocess_folder(work: Path, scan: Path) -> Path:
    """Where ``predict`` preprocesses ``scan``: one folder per input file.

    Named after the file and a hash of its resolved path, so two different scans with the
    same file name (``a/T1.nii.gz``, ``b/T1.nii.gz``) never share, and overwrite, outputs.
    """
    resolved = str(Path(scan).resolve())
    digest = hashlib.sha256(resolved.encode()).hexdigest()[:12]
    name = "".join(c for c in Path(resolved).name.split(".")[0] if c.isalnum())[:40]
    return work / f"{name or 'scan'}-{digest}"


#: The columns of the predictions table, in order; an existing file with exactly this header
#: is an earlier table, which ``--out`` may replace.
PREDICTION_COLUMNS: tuple[str, ...] = ("scan", "status", "model_input", "probability", "logit",
                                       "prediction", "error")


def table_columns(path: Path) -> list[str] | None:
    """The header row of the CSV at ``path`` ([] for an empty file), or None when its start
    is not text (a model, a volume)."""
    import csv

    with open(path, "rb") as handle:
        first = handle.readline(1 << 16)
    try:
        text = first.decode("utf-8-sig").strip("\r\n")
    except UnicodeDecodeError:
        return None
    if not text.isprintable():  # control characters: a binary file
        return None
    return next(csv.reader([text]), []) if text else []


def is_predictions_table(path: Path) -> bool:
    """Whether ``path`` starts with the predictions table's header
    (:data:`PREDICTION_COLUMNS`): a table an earlier predict wrote, which ``--out`` may
    replace."""
    columns = table_columns(path)
    return bool(columns) and tuple(c.strip() for c in columns) == PREDICTION_COLUMNS


def check_table_out(out: Path, inputs: list[Path]) -> None:
    """Refuse a table path that is an input scan or an existing file other than an earlier
    predictions table (recognised by its header, :data:`PREDICTION_COLUMNS`) or an empty
    (0-byte) file (:func:`adni_pu.outputs.claim_file`): predict replaces the file whole, and
    a run's ``splits.csv``, a cohort manifest, a preprocessing ``summary.csv`` or a note
    must never be lost to a mistyped ``--out``."""
    from adni_pu.errors import OutputError
    from adni_pu.fileio import same_file_as
    from adni_pu.outputs import claim_file

    if same_file_as(out, {str(p): p for p in inputs}) is not None:
        raise OutputError(f"--out {out}: is one of the input scans; expected a new path for "
                          "the predictions table (CSV)")
    claim_file(out, "predict", is_predictions_table,
               f"predictions table (CSV with the columns {', '.join(PREDICTION_COLUMNS)})")


def _preprocess_raw(paths: list[Path], work: Path, prep_cfg: Any) -> dict[Path, dict]:
    """Preprocess raw scans, each in its own folder, in one spawned single-threaded worker.

    The same rule as ``adni-pu preprocess``: one ITK/ANTs/torch thread in a fresh process
    (ITK reads its thread count once per process) and the recorded registration seed, so
    the same scan always gives the same model input and probability. Returns the summary
    row of each resolved path.
    """
    from adni_pu.preprocessing import Scan
    from adni_pu.preprocessing.io import discover_scans
    from adni_pu.preprocessing.runner import run_in_workers

    jobs = []
    done: dict[Path, dict] = {}
    for path in dict.fromkeys(p.resolve() for p in paths):
        try:
            found = discover_scans([path])[0]
        except Exception as exc:  # noqa: BLE001 - an unusable name fails this scan only
            done[path] = {"status": "failed", "error": " ".join(str(exc).split())}
            continue
        jobs.append((Scan(found.subject_id, found.session_id, path),
                     preprocess_folder(work, path)))
    run_in_workers(jobs, prep_cfg, workers=1, threads=1,
                   collect=lambda row: done.__setitem__(Path(row["input_path"]), row))
    return done


def predict_scans(run_dir: str | Path, scans: list[str | Path], out: str | Path | None = None,
                  work_dir: str | Path | None = None, device: str = "auto") -> Any:
    """Per-scan probabilities of the run's positive class (the one its cohort defines:
    :func:`positive_class`) from the run's selected model.

    Files already on the model grid are used as they are. Other (raw) scans are first
    preprocessed, each into its own folder under ``work_dir`` (default
    ``RUN/predictions/preprocessed``), with the settings recorded by the preprocessing run
    that made the training volumes (``RUN/preprocess_config.toml``) and one thread, so
    reruns give identical probabilities; without those settings raw scans are refused.
    Every model input passes the model-grid input check (:mod:`adni_pu.data.grid_check`:
    one 3D volume of the grid, finite, not constant). A scan that is missing, unreadable,
    fails preprocessing or the input check fails its own row (``status`` failed or the
    preprocessing status, the reason in ``error``, no probability) and the others are still
    scored; when no scan is usable at all the whole call is refused. Returns a DataFrame (one
    row per input: :data:`PREDICTION_COLUMNS`) and writes it to ``out`` when given, holding
    the lock of its folder (:mod:`adni_pu.locking`).
    """
    from adni_pu.locking import output_lock

    run_dir = Path(run_dir)
    paths = [Path(s) for s in scans]
    if not paths:
        raise VolumeRunError("no scan given")
    if out is None:
        return _predict(run_dir, paths, None, work_dir, device)
    out = Path(out)
    check_table_out(out, paths)
    with output_lock(out.parent, "predict"):
        check_table_out(out, paths)  # again, now that no other predict can write it
        return _predict(run_dir, paths, out, work_dir, device)


def _predict(run_dir: Path, paths: list[Path], out: Path | None, work_dir: str | Path | None,
             device: str) -> Any:
    """:func:`predict_scans` once ``out`` is checked (and its folder locked)."""
    import pandas as pd

    from adni_pu.data.grid_check import spatial_problem
    from adni_pu.data.integrity import inspect_nifti
    from adni_pu.data.volumes import build_volume_dataset
    from adni_pu.errors import AdniPuError

    cfg, model, _ = load_run(run_dir, device)
    rows: list[dict[str, Any]] = []
    raw: list[int] = []
    for i, p in enumerate(paths):
        if not p.exists():
            rows.append({"scan": str(p), "status": "failed", "model_input": "",
                         "error": f"{p}: not found"})
            continue
        ready = False
        if not p.is_dir():  # a folder is a raw DICOM series
            img, why = inspect_nifti(p)  # the header alone: nothing is read into memory yet
            if why is None and (ready := on_model_grid(img, cfg.data)):
                why = spatial_problem(img, cfg.data.grid_shape)  # e.g. a 4D series
            if why is not None:
                rows.append({"scan": str(p), "status": "failed", "model_input": "",
                             "error": " ".join(f"{p}: {why}".split())})
                continue
        rows.append({"scan": str(p), "status": "model-grid" if ready else "raw",
                     "model_input": str(p) if ready else "", "error": ""})
        if not ready:
            raw.append(i)
    if all(r["status"] == "failed" for r in rows):
        raise VolumeRunError("no usable scan: " + "; ".join(r["error"] for r in rows))
    if raw:
        prep_cfg_path = run_dir / "preprocess_config.toml"
        if not prep_cfg_path.is_file():
            names = ", ".join(rows[i]["scan"] for i in raw)
            raise VolumeRunError(
                f"{names}: not on the model grid, and the run has no recorded preprocessing "
                f"settings ({prep_cfg_path} missing: its volumes did not come from "
                "`adni-pu preprocess`). Preprocess the scans with the settings used for the "
                "training volumes and pass the *_desc-preproc_T1w.nii.gz files.")
        from adni_pu.preprocessing import load_config

        prep_cfg = load_config(prep_cfg_path)
        work = Path(work_dir) if work_dir is not None else run_dir / "predictions" / "preprocessed"
        done = _preprocess_raw([paths[i] for i in raw], work, prep_cfg)
        for i in raw:
            row = done[paths[i].resolve()]
            if row["status"] in ("done", "skipped"):
                rows[i].update(status="preprocessed", model_input=row["preprocessed_path"])
            else:
                rows[i].update(status=row["status"], error=row["error"])
    usable = [i for i, r in enumerate(rows) if r["model_input"]]
    for r in rows:
        r.update(probability=float("nan"), logit=float("nan"), prediction="")
    for i in usable:
        # each scan its own dataset and batch: one scan refused by the input check fails its
        # own row only, and a scan's probability never depends on the other scans given
        # (batched CPU convolutions differ in the last digits with the batch's make-up)
        frame = pd.DataFrame({
            "subject_id": [f"scan{i}"], "session_id": "", "scan_path": [rows[i]["model_input"]],
            "pu_label": 0, "truth": float("nan"), "split": "predict"})
        try:
            lg = float(score_dataset(model, build_volume_dataset(
                frame, "predict", cfg.data, train=False), 1)[0])
        except AdniPuError as exc:  # the model-grid input check: this scan's failure
            rows[i].update(status="failed", error=" ".join(str(exc).split()))
            continue
        prob = float(sigmoid(np.asarray(lg, dtype=np.float64)))
        rows[i].update(probability=prob, logit=lg,
                       prediction="positive" if prob > 0.5 else "negative")
    table = pd.DataFrame(rows, columns=list(PREDICTION_COLUMNS))
    if out is not None:
        atomic_write_text(out, table.to_csv(index=False))
    return table


def positive_class(run_dir: str | Path) -> str | None:
    """What the run's model calls positive, in words: the positive class of the cohort it
    was trained on (recorded in ``run.json``; for a run made before that record, read from
    the ``cohort_config.toml`` beside its manifest), or None when no cohort settings say
    (a manifest not made by ``adni-pu cohort build``)."""
    from adni_pu.cohort.files import positive_class_of
    from adni_pu.workflows.run_folder import RUN_JSON, read_run_json

    path = Path(run_dir) / RUN_JSON
    info = read_run_json(path) if path.is_file() else {}
    if info.get("positive_class"):
        return str(info["positive_class"])
    return positive_class_of(info["manifest"]) if info.get("manifest") else None


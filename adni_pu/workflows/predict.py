"""``adni-pu predict``: per-scan probabilities of amyloid positivity for new scans.

Scans already on the model grid are used as they are; raw T1 scans are first preprocessed
with the settings recorded by the preprocessing run that made the training volumes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from adni_pu.data.volumes import VolumeDataConfig
from adni_pu.errors import VolumeRunError
from adni_pu.fileio import atomic_write_text
from adni_pu.pu.metrics import sigmoid
from adni_pu.workflows.train import load_run, score_dataset


def on_model_grid(path: str | Path, data: VolumeDataConfig) -> bool:
    """Whether a NIfTI file is already on the model grid (shape and affine, after RAS)."""
    import nibabel as nib

    img = nib.as_closest_canonical(nib.load(str(path)))
    if tuple(img.shape[:3]) != tuple(data.grid_shape):
        return False
    expected = data.grid_affine()
    return bool(np.allclose(img.affine, expected, atol=1e-3 * abs(expected[0, 0]) + 1e-4))


def preprocess_folder(work: Path, scan: Path) -> Path:
    """Where ``predict`` preprocesses ``scan``: one folder per input file.

    Named after the file and a hash of its resolved path, so two different scans with the
    same file name (``a/T1.nii.gz``, ``b/T1.nii.gz``) never share, and overwrite, outputs.
    """
    resolved = str(Path(scan).resolve())
    digest = hashlib.sha256(resolved.encode()).hexdigest()[:12]
    name = "".join(c for c in Path(resolved).name.split(".")[0] if c.isalnum())[:40]
    return work / f"{name or 'scan'}-{digest}"


def check_table_out(out: Path, inputs: list[Path]) -> None:
    """Refuse a table path that would overwrite an input scan or any file that is not a
    CSV (a model, a volume): predict writes its table there whole."""
    from adni_pu.errors import OutputError
    from adni_pu.fileio import same_file_as

    target = out.resolve()
    if same_file_as(out, {str(p): p for p in inputs}) is not None:
        raise OutputError(f"--out {out}: is one of the input scans; expected a new path for "
                          "the predictions table (CSV)")
    if target.exists() and (not target.is_file() or target.suffix.lower() != ".csv"):
        raise OutputError(f"--out {out}: exists and is not a CSV file; expected a new path "
                          "or an earlier predictions table (.csv)")


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
    """Per-scan probabilities of amyloid positivity from the run's selected model.

    Files already on the model grid are used as they are. Other (raw) scans are first
    preprocessed, each into its own folder under ``work_dir`` (default
    ``RUN/predictions/preprocessed``), with the settings recorded by the preprocessing run
    that made the training volumes (``RUN/preprocess_config.toml``) and one thread, so
    reruns give identical probabilities; without those settings raw scans are refused.
    A missing or unreadable scan fails its own row (the reason in ``error``); when no scan
    is usable the whole call is refused. Returns a DataFrame (one row per input: ``scan,
    status, model_input, probability, logit, prediction, error``) and writes it to
    ``out`` when given.
    """
    import pandas as pd

    from adni_pu.data.volumes import build_volume_dataset

    run_dir = Path(run_dir)
    paths = [Path(s) for s in scans]
    if not paths:
        raise VolumeRunError("no scan given")
    if out is not None:
        check_table_out(Path(out), paths)
    cfg, model, _ = load_run(run_dir, device)
    rows: list[dict[str, Any]] = []
    raw: list[int] = []
    for i, p in enumerate(paths):
        if not p.exists():
            rows.append({"scan": str(p), "status": "failed", "model_input": "",
                         "error": f"{p}: not found"})
            continue
        try:
            ready = p.is_file() and on_model_grid(p, cfg.data)
        except Exception as exc:  # noqa: BLE001 - an unreadable file is that scan's failure
            rows.append({"scan": str(p), "status": "failed", "model_input": "",
                         "error": " ".join(f"{p}: cannot read: {exc}".split())})
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
                "training volumes and pass the *_T1w_preproc.nii.gz files.")
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
    if usable:
        frame = pd.DataFrame({
            "subject_id": [f"scan{i}" for i in usable], "session_id": "",
            "scan_path": [rows[i]["model_input"] for i in usable], "pu_label": 0,
            "truth": float("nan"), "split": "predict"})
        dataset = build_volume_dataset(frame, "predict", cfg.data, train=False)
        # one scan a batch: a scan's probability must not depend on the other scans given
        # (batched CPU convolutions differ in the last digits with the batch's make-up)
        logits = score_dataset(model, dataset, 1)
        for i, lg in zip(usable, logits):
            prob = float(sigmoid(np.asarray(lg, dtype=np.float64)))
            rows[i].update(probability=prob, logit=float(lg),
                           prediction="amyloid-positive" if prob > 0.5 else "amyloid-negative")
    table = pd.DataFrame(rows, columns=["scan", "status", "model_input", "probability",
                                        "logit", "prediction", "error"])
    if out is not None:
        atomic_write_text(out, table.to_csv(index=False))
    return table

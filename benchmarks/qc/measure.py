"""The preprocessing steps run on a case (cached), its QC metrics, and the truth it is
scored against: the reference brain mask carried onto its grid and the displacement
between two transforms."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def stage(data: np.ndarray, affine: np.ndarray, cfg, cache: Path | None,
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


def case_metrics(st: dict, cfg, template_to_native: np.ndarray | None = None) -> dict:
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



def reference_brain(ch2_affine: np.ndarray, ref: np.ndarray, affine: np.ndarray,
                     shape: tuple[int, ...]) -> np.ndarray:
    """ch2bet > 0 carried (through the world) onto a canonical grid of the same world."""
    from scipy import ndimage

    m = np.linalg.inv(ch2_affine) @ affine
    out = ndimage.affine_transform(ref.astype(np.float32), m[:3, :3], offset=m[:3, 3],
                                   output_shape=shape, order=1, mode="constant")
    return out > 0.5


def registration_error(t2n: np.ndarray, t2n_ref: np.ndarray, points: np.ndarray) -> float:
    """Mean distance (mm) between where two transforms send the template brain's points."""
    a = points @ t2n[:3, :3].T + t2n[:3, 3]
    b = points @ t2n_ref[:3, :3].T + t2n_ref[:3, 3]
    return float(np.linalg.norm(a - b, axis=1).mean())


def rigid_about(centre: np.ndarray, degrees: float, axis: int, shift: np.ndarray) -> np.ndarray:
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


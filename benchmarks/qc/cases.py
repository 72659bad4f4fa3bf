"""What is done to a real head to make the calibration's cases: the perturbations of the
image and its header, the lists of good and broken copies, the perturbed final transforms
and the failed skull strips."""

from __future__ import annotations

import numpy as np


def smooth_resample(data: np.ndarray, affine: np.ndarray,
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


def reorder(data: np.ndarray, affine: np.ndarray, codes: str) -> tuple[np.ndarray, np.ndarray]:
    """The same image stored in voxel order ``codes`` (e.g. 'PIR') with a matching header."""
    import nibabel as nib

    start = nib.io_orientation(affine)
    target = nib.orientations.axcodes2ornt(tuple(codes))
    tr = nib.orientations.ornt_transform(start, target)
    img = nib.Nifti1Image(data, affine).as_reoriented(tr)
    return np.asarray(img.dataobj, dtype=np.float32), img.affine


def bias_field(shape: tuple[int, ...], strength: float) -> np.ndarray:
    """exp(strength * a smooth field scaled to [-1, 1])."""
    grid = np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij")
    field = np.sin(1.3 * grid[0] + 0.4) * np.cos(1.1 * grid[1] - 0.3) + 0.5 * grid[2]
    field /= np.abs(field).max()
    return np.exp(strength * field).astype(np.float32)


def rician(data: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Rician noise of sigma = ``fraction`` of the 99th intensity percentile."""
    rng = np.random.default_rng(seed)
    sigma = fraction * float(np.percentile(data, 99))
    re = data + rng.normal(0, sigma, data.shape)
    im = rng.normal(0, sigma, data.shape)
    return np.sqrt(re**2 + im**2).astype(np.float32)


def header_flip(affine: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """A header that mirrors voxel axis ``axis`` (the data stay): a left-right swap etc."""
    out = affine.copy()
    out[:3, 3] = affine[:3, 3] + affine[:3, axis] * (shape[axis] - 1)
    out[:3, axis] = -affine[:3, axis]
    return out


def header_swap(affine: np.ndarray, a: int, b: int) -> np.ndarray:
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
        d, a = smooth_resample(data, affine, sp)
        add(name, d, a, "good", f"Gaussian pre-filter, resampled to {sp} mm")
    d, a = reorder(data, affine, "PIR")
    add("stored_PIR", d, a, "good", "voxel order P-I-R (sagittal, as ADNI MPRAGE), header matches")
    d, a = reorder(*smooth_resample(data, affine, (1.2, 1.0, 1.0)), "LPS")
    add("stored_LPS_1.2mm", d, a, "good", "1.2 x 1 x 1 mm, voxel order L-P-S, header matches")
    add("mild_bias", data * bias_field(data.shape, 0.2), affine, "good",
        "multiplicative field exp(0.2 f), x0.82-x1.22")
    add("mild_noise", rician(data, 0.02, 1), affine, "good",
        "Rician noise, sigma 2% of the 99th percentile")
    d15, a15 = smooth_resample(data, affine, (1.5,) * 3)
    add("1.5mm_noise_bias", rician(d15 * bias_field(d15.shape, 0.2), 0.02, 2), a15, "good",
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
    add("header_flip_LR", data, header_flip(affine, data.shape, 0), "broken",
        "header mirrors x (left-right swap), data unchanged", same_world=False)
    add("header_flip_AP", data, header_flip(affine, data.shape, 1), "broken",
        "header mirrors y (anterior-posterior swap), data unchanged", same_world=False)
    add("header_swap_yz", data, header_swap(affine, 1, 2), "broken",
        "header exchanges the y and z axes (coronal read as axial), data unchanged",
        same_world=False)
    add("noise_5pct", rician(data, 0.05, 4), affine, "good",
        "Rician noise, sigma 5% of the 99th percentile (a noisy but usable scan)")
    add("noise_10pct", rician(data, 0.10, 5), affine, "info",
        "Rician noise, sigma 10% of the 99th percentile (borderline)")
    add("heavy_noise", rician(data, 0.15, 3), affine, "broken",
        "Rician noise, sigma 15% of the 99th percentile")
    add("severe_bias", data * bias_field(data.shape, 1.2), affine, "auto",
        "multiplicative field exp(1.2 f), x0.30-x3.3")
    add("extreme_bias", data * bias_field(data.shape, 2.5), affine, "info",
        "multiplicative field exp(2.5 f), x0.08-x12 (beyond what N4 fully undoes)")
    return cases



def package_head_cases(data: np.ndarray, affine: np.ndarray) -> dict[str, dict]:
    """Full-pipeline cases of a package head: as given (good); broken by the header
    (front-back flip, y/z swap) and by heavy noise. The left-right flip is left out: no
    image check can see it (:data:`KNOWN_LIMITS`)."""
    def case(d, a, label, note, same_world=True):
        return {"data": d, "affine": a, "label": label, "note": note, "same_world": same_world}

    return {
        "as_given": case(data, affine, "good", "the file as the package ships it"),
        "header_flip_AP": case(data, header_flip(affine, data.shape, 1), "broken",
                               "header mirrors y (anterior-posterior swap), data unchanged",
                               same_world=False),
        "header_swap_yz": case(data, header_swap(affine, 1, 2), "broken",
                               "header exchanges the y and z axes, data unchanged",
                               same_world=False),
        "heavy_noise": case(rician(data, 0.15, 3), affine, "broken",
                            "Rician noise, sigma 15% of the 99th percentile"),
    }



#: The final transform perturbed: (degrees, rotation axis, mm, translation axis).
MISREGISTRATIONS = ((5, 0, 0, 0), (10, 2, 0, 0), (15, 1, 0, 0), (0, 0, 5, 1),
                    (0, 0, 10, 0), (0, 0, 15, 2), (5, 2, 5, 0), (3, 0, 3, 1))


def failed_skull_strips(brain: np.ndarray, head: np.ndarray,
                        affine: np.ndarray) -> dict[str, tuple[np.ndarray, str, str]]:
    """Brain masks that failed skull strips give, from a good ``brain`` mask and the
    ``head`` mask on a canonical grid: name -> (mask, label, note)."""
    from scipy import ndimage

    spacing = np.sqrt((affine[:3, :3] ** 2).sum(axis=0))
    dist_in = ndimage.distance_transform_edt(brain, sampling=spacing)
    dist_out = ndimage.distance_transform_edt(~brain, sampling=spacing)
    head_in = ndimage.distance_transform_edt(head, sampling=spacing)
    xs = np.arange(brain.shape[0])[:, None, None]
    cx = int(np.argwhere(brain)[:, 0].mean())
    # the top 40 mm, in voxels of this grid (canonical: the third axis points up)
    top = np.argwhere(brain)[:, 2].max() - int(round(40 / spacing[2]))
    return {
        "mask_eroded_6mm": (dist_in > 6, "broken", "brain mask eroded by 6 mm"),
        "mask_eroded_3mm": (dist_in > 3, "info", "brain mask eroded by 3 mm"),
        "mask_dilated_6mm": ((dist_out <= 6) & head, "broken",
                             "brain mask dilated by 6 mm (into CSF/skull)"),
        "mask_with_skull": (head_in > 6, "broken",
                            "mask = head less the outer 6 mm (brain + skull)"),
        "mask_half_brain": (brain & (xs < cx), "broken", "right hemisphere missing from the mask"),
        "mask_top_missing": (brain & (np.arange(brain.shape[2])[None, None, :] < top), "broken",
                             "top 40 mm of the brain missing"),
    }

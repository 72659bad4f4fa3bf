"""Quality control: per-scan metrics and checks, and the QC picture.

The QC picture shows three orthogonal slices of the bias-corrected scan with the brain
(red) and cerebellum (cyan) outlines, and below them the preprocessed volume with the
MNI152 template's brain outline (yellow), so a misregistration shows as a gap between
the outline and the brain. A folder's pictures are looked at together in the HTML report
(:mod:`.qc_report`) or the contact sheet (:mod:`.qc_group`).

The checks (:func:`qc_checks`) look at the brain mask (volume, share of the head, where
the brain's edge lies relative to the mask's edge, edge contrast, noise inside it) and at
the registration (correlation with the template, Dice and end coverage of the carried
mask, and whether a small nudge would improve the fit);
docs/preprocessing.md shows how their thresholds were calibrated on real heads,
broken copies of them and the demo's synthetic scans.
"""

from __future__ import annotations

import io

import numpy as np

from .config import QCSettings
from .intensity import intensity_floor

# the folder-level readers live in .qc_group; importers of this module keep them
from .qc_group import OUTLIER_METRICS, contact_sheet, load_sidecars, rank_outliers  # noqa: F401


def _dice(a: np.ndarray, b: np.ndarray) -> float:
    total = int(a.sum()) + int(b.sum())
    return float(2 * int((a & b).sum()) / total) if total else 0.0


def _crop_to_mask(data: np.ndarray, brain: np.ndarray, spacing: tuple[float, ...],
                  pad_mm: float) -> tuple[np.ndarray, np.ndarray]:
    """Both arrays cut to the mask's bounding box grown by ``pad_mm`` (same results, faster)."""
    pad = [int(np.ceil(pad_mm / s)) + 1 for s in spacing]
    box = []
    for axis, p in enumerate(pad):
        hit = np.flatnonzero(brain.any(axis=tuple(a for a in range(brain.ndim) if a != axis)))
        box.append(slice(max(int(hit[0]) - p, 0), int(hit[-1]) + p + 1))
    box = tuple(box)
    return data[box], brain[box]


def _box(radius_mm: float, spacing: tuple[float, ...]) -> tuple[int, ...]:
    """Filter size of a box reaching ``radius_mm`` along each axis (at least one voxel)."""
    return tuple(2 * max(1, int(round(radius_mm / s))) + 1 for s in spacing)


def mask_edge_contrast(data: np.ndarray, brain: np.ndarray,
                       spacing: tuple[float, ...], width_mm: float = 3.0) -> float:
    """Mean intensity just outside the brain mask over the mean just inside it.

    A good T1 brain mask ends at dark CSF and bone, so the band outside is much darker
    than the band inside (a ratio well below 1). A mask that is eroded into the brain
    has brain tissue outside it, and one that is dilated or includes the skull has the
    bright scalp fat outside it: both push the ratio up towards or above 1. Bands are
    ``width_mm`` wide along each axis (box filters sized in mm, so anisotropic voxels
    are handled, and fast). Blur pushes it up too (a smooth head's brain spreads across
    the edge: 0.81-0.84 for an average of heads and a resampled head, against 0.79-0.85
    for 6 mm-eroded masks), so it only bounds gross failures; where the edge lies is
    :func:`mask_edge_offset_mm`'s job.
    Intensities are measured from the air's level (:func:`.intensity.intensity_floor` of
    the whole ``data``), so a scan stored with an offset reads as it would without one.
    Returns 0 for an empty or full mask, and inf when the band inside the mask is no
    brighter than the air (nothing there is brain).
    """
    from scipy import ndimage

    if not brain.any() or brain.all():
        return 0.0
    zero = intensity_floor(data)
    data, brain = _crop_to_mask(data, brain, spacing, width_mm)
    size = _box(width_mm, spacing)
    band_out = ndimage.maximum_filter(brain, size=size) & ~brain
    band_in = brain & ~ndimage.minimum_filter(brain, size=size)
    if not band_out.any():
        return 0.0
    mean_in = float(data[band_in].mean()) - zero
    if mean_in <= 0:
        return float("inf")
    return (float(data[band_out].mean()) - zero) / mean_in


def edge_profile(data: np.ndarray, brain: np.ndarray, spacing: tuple[float, ...],
                 inside_mm: float = 10.0, outside_mm: float = 8.0, sample_mm: float = 2.0
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Mean intensity across the brain mask's edge: the shells at each distance from it.

    Every voxel within ``inside_mm`` inside / ``outside_mm`` outside the mask gets its
    signed Euclidean distance in mm from the mask's edge (negative inside; the edge lies
    half a voxel beyond the last voxel of each side; ``spacing`` makes anisotropic voxels
    count in mm), and voxels are pooled in shells of max(1 mm, half the largest voxel
    side). Along an axis finer than ``sample_mm``, only every k-th voxel is used (k =
    floor(``sample_mm`` / spacing)): the distance transforms cost about 0.2 us a voxel,
    and each shell still averages thousands of voxels (on Colin27 at 1 mm it takes 0.3 s
    instead of 3 s, and moves :func:`mask_edge_offset_mm` of its mask by 0.06 mm).
    Returns the shells' mean distances (mm, increasing) and mean intensities over the
    median intensity inside the mask, both measured from the air's level
    (:func:`.intensity.intensity_floor` of the whole ``data``, so an offset in the file
    changes nothing); empty shells are left out. Averaged over the whole
    surface, a T1 head's profile falls from the brain to the dark CSF and bone gap and
    rises again at the scalp.
    """
    from scipy import ndimage

    zero = intensity_floor(data)
    data, brain = _crop_to_mask(data, brain, spacing, outside_mm + sample_mm + max(spacing))
    every = [max(1, int(sample_mm / s + 1e-6)) for s in spacing]
    sample = tuple(slice(None, None, k) for k in every)
    data, brain = data[sample], brain[sample]
    spacing = tuple(s * k for s, k in zip(spacing, every))
    half = float(np.mean(spacing)) / 2
    outside = ndimage.distance_transform_edt(~brain, sampling=spacing) - half
    inside = half - ndimage.distance_transform_edt(brain, sampling=spacing)
    signed = np.where(brain, inside, outside)
    step = max(1.0, max(spacing) / 2)
    edges = np.arange(-inside_mm, outside_mm + step / 2, step)
    near = (signed >= edges[0]) & (signed < edges[-1])
    shell = np.digitize(signed[near], edges) - 1
    n = np.bincount(shell, minlength=len(edges) - 1)
    dist = np.bincount(shell, weights=signed[near], minlength=len(edges) - 1)
    level = np.bincount(shell, weights=data[near].astype(np.float64), minlength=len(edges) - 1)
    scale = float(np.median(data[brain])) - zero if brain.any() else 0.0
    kept = n > 0
    return (dist[kept] / n[kept],
            (level[kept] / n[kept] - zero) / (scale if scale > 0 else 1.0))


def mask_edge_offset_mm(data: np.ndarray, brain: np.ndarray, spacing: tuple[float, ...],
                        fall: float = 0.7, rise: float = 0.1) -> float:
    """Where the brain's edge lies, in mm outside the brain mask's edge (negative: inside).

    In a T1 head the brain is wrapped in a dark gap (CSF and bone), then the bright
    scalp. On the profile of :func:`edge_profile` the brain's edge is where the intensity
    has made ``fall`` of its way down from the deep brain to the gap's floor. A good mask
    reads about -2 to -0.5 mm (the cortex is darker than the white matter, so most of the
    fall happens just inside the brain's outline); a mask eroded into the brain leaves
    brain outside it and reads several mm more (+2.8 to +4.8 mm for 6 mm), one dilated into
    CSF and bone, or one that holds the skull, several mm less (-5 mm and below). Blur or
    resampling lifts the gap's floor and spreads the fall over a few mm either side, but
    a blurred step keeps its middle: a smooth head (an average of heads, a resampled
    scan) reads within a mm or two of a sharp one, whereas the band ratio of
    :func:`mask_edge_contrast` rises with blur as it does with erosion. A level part-way
    down (not the darkest point) keeps a wide layer of CSF, a little brighter than bone,
    on the gap's side (one much brighter reads like brain: docs/preprocessing.md, Limits).

    The gap's floor is the lowest point of the profile going outward from the deepest
    shell until the profile (smoothed by [1, 2, 1] over shells) has risen ``rise`` (of
    the brain's median intensity) above its lowest point so far: the scalp, or the brain
    beyond the skull, ends the search, so air further out does not count. The deep level
    is the profile's highest point inside the floor; the crossing is interpolated between
    shells. Returns 0 for an empty or full mask.
    """
    if not brain.any() or brain.all():
        return 0.0
    dist, level = edge_profile(data, brain, spacing)
    if level.size < 3:
        return 0.0
    # the search ends on the smoothed profile (a flat face of a mask on coarse voxels
    # makes shells alternate); the levels are read on the profile itself
    smooth = np.convolve(np.pad(level, 1, mode="edge"), [0.25, 0.5, 0.25], mode="valid")
    low, end = 0, smooth.size
    for i in range(1, smooth.size):
        if smooth[i] < smooth[low]:
            low = i
        elif smooth[i] > smooth[low] + rise:
            end = i
            break
    floor = int(np.argmin(level[:end]))
    deep = int(np.argmax(level[:floor + 1]))
    edge = level[floor] + (1 - fall) * (level[deep] - level[floor])
    for i in range(deep + 1, floor + 1):
        if level[i] <= edge:
            t = (level[i - 1] - edge) / (level[i - 1] - level[i])
            return float(dist[i - 1] + t * (dist[i] - dist[i - 1]))
    return float(dist[floor])


def brain_noise(data: np.ndarray, brain: np.ndarray, spacing: tuple[float, ...],
                margin_mm: float = 4.0) -> float:
    """Noise inside the brain as a fraction of its median intensity above the air's.

    Each voxel minus the mean of its 26 neighbours has variance 27/26 sigma^2 for white
    noise; anatomy adds to it only at tissue borders, which a median absolute deviation
    ignores. Voxels within ``margin_mm`` of the mask's edge are left out (the brain's
    border is the strongest edge). Interpolated (resampled) scans have correlated noise
    and read lower: the value is meant for an upper limit, not as an SNR measurement.
    The brain's level is measured from the air's (:func:`.intensity.intensity_floor` of
    the whole ``data``): MRI air reads about 0, so on such a scan this is the median
    itself, and a file stored with an offset (``x * 10 - 1000``) reads the same.
    Returns 0 when too few voxels remain, and inf when the brain is no brighter than the
    air.
    """
    from scipy import ndimage

    if not brain.any():
        return 0.0
    zero = intensity_floor(data)
    data, brain = _crop_to_mask(data, brain, spacing, 2 * max(spacing))
    core = ndimage.minimum_filter(brain, size=_box(margin_mm, spacing))
    if core.sum() < 100:
        return 0.0
    x = data.astype(np.float32)
    local = (ndimage.uniform_filter(x, size=3, mode="nearest") * 27 - x) / 26
    resid = (x - local)[core]
    sigma = 1.4826 * float(np.median(np.abs(resid - np.median(resid)))) / np.sqrt(27 / 26)
    level = float(np.median(x[core])) - zero
    return sigma / level if level > 0 else float("inf")


def registration_metrics(
    data: np.ndarray, brain: np.ndarray, affine: np.ndarray, template_to_native: np.ndarray,
    resolution_mm: float = 2.0, step: float = 3.0,
) -> dict[str, float]:
    """How well a registered brain matches the MNI152 template, on the template grid.

    ``template_to_native`` (4x4, RAS mm) maps template points to native points, as
    :class:`~adni_pu.preprocessing.registration.Registration` gives it; ``affine`` is the
    native voxel-to-RAS affine of ``data`` and ``brain``. The masked brain and the mask
    are resampled (linear) onto the template grid at ``resolution_mm``. Returns
    ``registration_similarity`` (Pearson correlation with the template inside the
    template brain) and ``template_mask_dice`` (Dice of the carried brain mask and the
    template brain mask): the correlation depends on the scan's contrast, the Dice only
    on where the brain's outline lands. ``template_end_coverage`` is the share of the
    template brain's least-covered end (20 mm slab) that the mask covers.
    ``registration_gain`` is how much the correlation (of the registered brain smoothed
    by one template voxel) rises when it is nudged by ``step`` degrees or mm (the best of
    12 rigid nudges): at most about 0 at a registration optimum whatever the contrast or
    noise, clearly positive when the transform is off by a few degrees or mm (how much
    depends on the head: a noisy, low-contrast head gains less for the same error, and a
    real head's affine may sit a few mm from this correlation's optimum). Thresholds:
    :class:`~adni_pu.preprocessing.config.QCSettings`, calibrated by
    ``benchmarks/qc_calibration.py`` (in git at d825906).
    """
    from scipy import ndimage

    from .registration import _correlation, template_at

    tdata, tmask, taffine = template_at(float(resolution_mm))
    m = np.linalg.inv(affine) @ np.asarray(template_to_native, dtype=np.float64) @ taffine

    def carry(values: np.ndarray) -> np.ndarray:
        return ndimage.affine_transform(values.astype(np.float32), m[:3, :3], offset=m[:3, 3],
                                        output_shape=tdata.shape, order=1, mode="constant")

    # the fill outside the brain is the air's level, so an offset in the file changes nothing
    moved = carry(np.where(brain, data - intensity_floor(data), 0))
    moved_mask = carry(brain) > 0.5
    # the nudges interpolate, which smooths: compare them with an already smoothed image,
    # or noise alone makes any nudge look like a gain
    smooth = ndimage.gaussian_filter(moved, 1.0)
    gain = _best_nudge(smooth, tdata, tmask, taffine, step) - _correlation(smooth, tdata, tmask)
    return {
        "registration_similarity": round(_correlation(moved, tdata, tmask), 4),
        "template_mask_dice": round(_dice(moved_mask, tmask), 4),
        "template_end_coverage": round(_end_coverage(moved_mask, tmask, resolution_mm), 4),
        "registration_gain": round(gain, 4),
    }


def _end_coverage(moved_mask: np.ndarray, tmask: np.ndarray, spacing: float,
                  slab_mm: float = 20.0) -> float:
    """The least-covered end of the template brain: for each of its six outermost slabs
    (``slab_mm`` thick: left, right, back, front, bottom, top), the share of the template
    brain there that the registered mask covers; the minimum of the six. A mask or a
    field of view that misses a part of the brain (the vertex, the cerebellum, a frontal
    pole) leaves one end uncovered even when the overall Dice looks fine."""
    n = max(1, int(round(slab_mm / spacing)))
    worst = 1.0
    for axis in range(3):
        other = tuple(a for a in range(3) if a != axis)
        hit = np.flatnonzero(tmask.any(axis=other))
        for sl in (slice(hit[0], hit[0] + n), slice(hit[-1] - n + 1, hit[-1] + 1)):
            index = [slice(None)] * 3
            index[axis] = sl
            t = tmask[tuple(index)]
            worst = min(worst, float((moved_mask[tuple(index)] & t).sum()) / max(int(t.sum()), 1))
    return worst


def _rigid_nudges(centre: np.ndarray, step: float) -> list[np.ndarray]:
    """12 small rigid motions (4x4, mm): +-``step`` degrees about, and +-``step`` mm along,
    each axis; rotations are about ``centre``."""
    out = []
    for axis in range(3):
        i, j = [k for k in range(3) if k != axis]
        for sign in (-1.0, 1.0):
            t = np.radians(sign * step)
            r = np.eye(4)
            r[i, i], r[i, j], r[j, i], r[j, j] = np.cos(t), -np.sin(t), np.sin(t), np.cos(t)
            r[:3, 3] = centre - r[:3, :3] @ centre
            shift = np.eye(4)
            shift[axis, 3] = sign * step
            out += [r, shift]
    return out


def _best_nudge(moved: np.ndarray, template: np.ndarray, tmask: np.ndarray,
                taffine: np.ndarray, step: float) -> float:
    """The best correlation with the template after nudging ``moved`` (on the template
    grid) by one of :func:`_rigid_nudges`."""
    from scipy import ndimage

    from .registration import _correlation

    centre = taffine[:3, :3] @ np.argwhere(tmask).mean(axis=0) + taffine[:3, 3]
    inv = np.linalg.inv(taffine)
    best = -1.0
    for nudge in _rigid_nudges(centre, step):
        m = inv @ nudge @ taffine
        out = ndimage.affine_transform(moved, m[:3, :3], offset=m[:3, 3], order=1,
                                       mode="constant")
        best = max(best, _correlation(out, template, tmask))
    return best


def qc_checks(metrics: dict[str, float], settings: QCSettings) -> list[str]:
    """Reasons to refuse a result (empty list: accepted)."""
    problems = []
    vol = metrics.get("brain_volume_ml", 0.0)
    if vol <= 0:
        problems.append("brain mask is empty")
    elif vol < settings.min_brain_ml:
        problems.append(
            f"brain volume {vol:.0f} ml below the plausible minimum {settings.min_brain_ml:.0f} ml"
        )
    elif vol > settings.max_brain_ml:
        problems.append(
            f"brain volume {vol:.0f} ml above the plausible maximum {settings.max_brain_ml:.0f} ml"
        )
    frac = metrics.get("brain_fraction_of_head", 0.0)
    if frac > settings.max_brain_fraction_of_head:
        problems.append(
            f"brain mask covers {frac:.2f} of the head (max {settings.max_brain_fraction_of_head}"
            "): the skull was not removed"
        )
    offset = metrics.get("mask_edge_offset_mm")
    if offset is not None and offset > settings.max_mask_edge_offset_mm:
        problems.append(
            f"the brain's edge lies {offset:.1f} mm outside the brain mask (max "
            f"{settings.max_mask_edge_offset_mm}): brain is left outside the mask, the skull "
            "stripping cut into the brain"
        )
    elif offset is not None and offset < settings.min_mask_edge_offset_mm:
        problems.append(
            f"the brain's edge lies {-offset:.1f} mm inside the brain mask (at most "
            f"{-settings.min_mask_edge_offset_mm}): the mask reaches past the brain into CSF, "
            "bone or scalp, the skull stripping failed"
        )
    edge = metrics.get("mask_edge_contrast")
    if edge is not None and edge > settings.max_mask_edge_contrast:
        problems.append(
            f"brain mask edge contrast {edge:.2f} above {settings.max_mask_edge_contrast} "
            "(outside the mask is not darker than inside): the skull stripping failed"
            if np.isfinite(edge) else "the brain mask's edge is no brighter than the air: "
            "the skull stripping failed"
        )
    noise = metrics.get("brain_noise")
    if noise is not None and noise > settings.max_brain_noise:
        problems.append(
            f"noise in the brain {noise:.3f} of its median intensity, above "
            f"{settings.max_brain_noise}: too noisy to use" if np.isfinite(noise) else
            "the brain is no brighter than the air: no usable signal"
        )
    dice = metrics.get("template_mask_dice")
    if dice is not None and dice < settings.min_template_mask_dice:
        problems.append(
            f"registered brain mask overlaps the template brain with Dice {dice:.2f} below "
            f"{settings.min_template_mask_dice}: misregistration or a bad brain mask"
        )
    cover = metrics.get("template_end_coverage")
    if cover is not None and cover < settings.min_template_end_coverage:
        problems.append(
            f"registered brain mask covers only {cover:.2f} of one end of the template brain "
            f"(min {settings.min_template_end_coverage}): part of the brain is missing "
            "(mask or field of view) or the orientation is wrong"
        )
    gain = metrics.get("registration_gain")
    if gain is not None and gain > settings.max_registration_gain:
        problems.append(
            f"registration is off its optimum: a nudge of a few degrees or mm raises the "
            f"template correlation by {gain:.3f} (max {settings.max_registration_gain})"
        )
    sim = metrics.get("registration_similarity")
    if sim is not None and sim < settings.min_registration_similarity:
        problems.append(
            f"registration similarity {sim:.3f} below {settings.min_registration_similarity}"
        )
    return problems


def _slices(vol: np.ndarray, centre: tuple[int, int, int]) -> list[np.ndarray]:
    i, j, k = centre
    # display with anterior/superior up, RAS arrays: sagittal (y,z), coronal (x,z), axial (x,y)
    return [vol[i, :, :].T, vol[:, j, :].T, vol[:, :, k].T]


def _centre(mask: np.ndarray) -> tuple[int, int, int]:
    if mask.any():
        return tuple(int(round(c)) for c in np.argwhere(mask).mean(axis=0))  # type: ignore[return-value]
    return tuple(n // 2 for n in mask.shape)  # type: ignore[return-value]


def qc_picture(
    native: np.ndarray,
    brain: np.ndarray,
    cerebellum: np.ndarray,
    preproc: np.ndarray | None,
    template_outline: np.ndarray | None,
    title: str,
    settings: QCSettings,
    aspect: tuple[float, float, float] = (1.0, 1.0, 1.0),
) -> bytes:
    """PNG bytes of the QC picture (matplotlib Agg; no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rows = 2 if preproc is not None else 1
    fig, axes = plt.subplots(rows, 3, figsize=(9, 3.1 * rows), squeeze=False)
    fig.patch.set_facecolor("black")
    lo, hi = np.percentile(native[brain] if brain.any() else native, [1, 99.5])
    c = _centre(brain)
    sx, sy, sz = aspect
    asp = [sz / sy, sz / sx, sy / sx]
    for ax, img, b, cb, a in zip(
        axes[0], _slices(native, c), _slices(brain, c), _slices(cerebellum, c), asp
    ):
        ax.imshow(img, cmap="gray", vmin=lo, vmax=hi, origin="lower", aspect=a)
        if b.any():
            ax.contour(b.astype(float), levels=[0.5], colors="red", linewidths=0.7)
        if cb.any():
            ax.contour(cb.astype(float), levels=[0.5], colors="cyan", linewidths=0.7)
    if preproc is not None:
        cp = tuple(n // 2 for n in preproc.shape)
        outline = template_outline if template_outline is not None else preproc > 0
        vmax = float(np.percentile(preproc[preproc > 0], 99.5)) if (preproc > 0).any() else 1.0
        for ax, img, o in zip(axes[1], _slices(preproc, cp), _slices(outline, cp)):
            ax.imshow(img, cmap="gray", vmin=0, vmax=vmax, origin="lower")
            if o.any():
                ax.contour(o.astype(float), levels=[0.5], colors="yellow", linewidths=0.7)
    for ax in axes.ravel():
        ax.set_axis_off()
    fig.suptitle(title, color="white", fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=settings.picture_dpi, facecolor="black")
    plt.close(fig)
    return buf.getvalue()

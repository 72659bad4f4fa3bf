"""The overlay picture: group maps in three planes over the MNI template (matplotlib Agg)."""

from __future__ import annotations

import io

import numpy as np


def _planes(vol: np.ndarray, centre: tuple[int, int, int]) -> list[np.ndarray]:
    i, j, k = centre
    # RAS arrays, shown with anterior/superior up: sagittal (y, z), coronal (x, z), axial (x, y)
    return [vol[i, :, :].T, vol[:, j, :].T, vol[:, :, k].T]


def peak_voxel(maps: list[np.ndarray], mask: np.ndarray) -> tuple[int, int, int]:
    """Where the planes cross: the peak of the mean absolute map (smoothed by 2 voxels)
    inside ``mask``, the same for every row so the rows compare."""
    from scipy.ndimage import gaussian_filter

    mean = np.mean([np.abs(m) for m in maps], axis=0) if maps else np.zeros(mask.shape)
    smooth = np.where(mask, gaussian_filter(mean.astype(np.float32), 2.0), -np.inf)
    if not np.isfinite(smooth).any() or not np.any(smooth[np.isfinite(smooth)] > 0):
        return tuple(int(v) for v in np.argwhere(mask).mean(axis=0)) if mask.any() \
            else tuple(n // 2 for n in mask.shape)  # type: ignore[return-value]
    return tuple(int(v) for v in np.unravel_index(int(np.argmax(smooth)), mask.shape))  # type: ignore[return-value]


def overlay_png(template: np.ndarray, rows: list[tuple[str, np.ndarray]], mask: np.ndarray,
                affine: np.ndarray, title: str, signed: bool) -> bytes:
    """PNG bytes: one row per (label, map), three planes each, the map over ``template``.

    Each row is scaled to its own 99.5th percentile of ``|map|`` inside ``mask`` (the maps'
    units differ between methods; the region table gives shares); values under a fifth of
    that are left transparent. ``signed`` maps use a diverging colour map (red: towards
    the positive class; others red to yellow, not white, so the map stands out from the T1).
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    centre = peak_voxel([m for _, m in rows], mask)
    mm = (affine @ np.array([*centre, 1.0]))[:3]
    n = max(len(rows), 1)
    fig, axes = plt.subplots(n, 3, figsize=(9.5, 2.7 * n + 0.6), squeeze=False,
                             layout="constrained")
    fig.patch.set_facecolor("black")
    t_hi = float(np.percentile(template[template > 0], 99.5)) if (template > 0).any() else 1.0
    for r, (label, vol) in enumerate(rows):
        inside = np.abs(vol[mask]) if mask.any() else np.abs(vol).ravel()
        top = float(np.percentile(inside, 99.5)) if inside.size and inside.max() > 0 else 1.0
        image = None
        for ax, t, m in zip(axes[r], _planes(template, centre), _planes(vol, centre)):
            ax.imshow(t, cmap="gray", vmin=0, vmax=t_hi, origin="lower")
            shown = np.ma.masked_where(np.abs(m) < 0.2 * top, m)
            if signed:
                image = ax.imshow(shown, cmap="coolwarm", vmin=-top, vmax=top, origin="lower",
                                  alpha=0.85)
            else:
                image = ax.imshow(shown, cmap="autumn", vmin=0, vmax=top, origin="lower",
                                  alpha=0.85)
            ax.set_axis_off()
        for ax in axes[r, 1:]:  # coronal and axial: neurological view, right on the right
            ax.text(0.98, 0.03, "R", color="white", fontsize=7, ha="right",
                    transform=ax.transAxes)
        axes[r, 0].set_title(label, color="white", fontsize=8, loc="left")
        if image is not None:
            bar = fig.colorbar(image, ax=list(axes[r]), fraction=0.02, pad=0.01)
            bar.ax.tick_params(colors="white", labelsize=6)
    fig.suptitle(f"{title}\nplanes through MNI ({mm[0]:.0f}, {mm[1]:.0f}, {mm[2]:.0f}) mm",
                 color="white", fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, facecolor="black")
    plt.close(fig)
    return buf.getvalue()

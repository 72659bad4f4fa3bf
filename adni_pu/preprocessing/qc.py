"""Quality control: per-scan metrics and checks, the QC picture, and the contact sheet.

The QC picture shows three orthogonal slices of the bias-corrected scan with the brain
(red) and cerebellum (cyan) outlines, and below them the preprocessed volume with the
MNI152 template's brain outline (yellow), so a misregistration shows as a gap between
the outline and the brain. The contact sheet puts every scan's picture on one page,
outliers (by robust z-score of the QC metrics) and refused scans first.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from adni_pu.errors import OutputError

from .config import QCSettings

#: Metrics used to rank outliers; direction says which side is suspicious.
OUTLIER_METRICS: dict[str, str] = {
    "brain_volume_ml": "both",
    "brain_fraction_of_head": "both",
    "cerebellum_fraction_of_brain": "both",
    "registration_similarity": "low",
}


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
    sim = metrics.get("registration_similarity")
    if sim is not None and sim < settings.min_registration_similarity:
        problems.append(
            f"registration similarity {sim:.2f} below {settings.min_registration_similarity}"
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


def rank_outliers(records: list[dict]) -> list[dict]:
    """Records sorted most suspicious first, each with ``outlier_score`` and ``outlier_reason``.

    Score: the largest robust z-score (median / 1.4826 MAD, the scale floored at 5% of the
    median) over :data:`OUTLIER_METRICS` in the suspicious direction; refused or failed
    scans come first with score inf.
    """
    out = [dict(r) for r in records]
    stats = {}
    for name in OUTLIER_METRICS:
        vals = np.array(
            [r["qc"].get(name) for r in out if r.get("qc") and r["qc"].get(name) is not None],
            dtype=float,
        )
        if vals.size >= 3:
            med = float(np.median(vals))
            mad = float(np.median(np.abs(vals - med))) * 1.4826
            # floor the scale at 5% of the median: near-identical scans are not outliers
            stats[name] = (med, max(mad, 0.05 * abs(med), 1e-6))
    for r in out:
        if r.get("status") not in ("done", "skipped"):
            r["outlier_score"] = float("inf")
            r["outlier_reason"] = r.get("status", "") + ": " + str(r.get("error") or "")
            continue
        best, why = 0.0, ""
        for name, direction in OUTLIER_METRICS.items():
            value = (r.get("qc") or {}).get(name)
            if value is None or name not in stats:
                continue
            med, mad = stats[name]
            z = (value - med) / mad
            z = -z if direction == "low" else abs(z)
            if z > best:
                best, why = z, f"{name}={value:.3g} (median {med:.3g}, z={z:.1f})"
        r["outlier_score"] = best
        r["outlier_reason"] = why
    out.sort(key=lambda r: -r["outlier_score"])
    return out


def load_sidecars(output: Path) -> list[dict]:
    """Every scan sidecar under a preprocessing output folder."""
    records = []
    for path in sorted(Path(output).glob("sub-*/ses-*/*_sidecar.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        data["_sidecar"] = str(path)
        records.append(data)
    return records


def contact_sheet(
    output: str | Path, out_png: str | Path | None = None, z_threshold: float = 3.5,
    columns: int = 4,
) -> tuple[Path, list[dict]]:
    """Tile every QC picture of ``output`` into one PNG, outliers first.

    Returns the PNG path and the outliers (refused/failed scans and scans whose score
    exceeds ``z_threshold``), most suspicious first.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.image as mpimg
    import matplotlib.pyplot as plt

    output = Path(output)
    ranked = rank_outliers(load_sidecars(output))
    if not ranked:
        raise OutputError(f"{output}: no *_sidecar.json found; run adni-pu preprocess first")
    outliers = [r for r in ranked if r["outlier_score"] > z_threshold]
    out_png = Path(out_png) if out_png else output / "qc_contact_sheet.png"
    n = len(ranked)
    cols = min(columns, n)
    rows = int(np.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.2 * rows), squeeze=False)
    for ax in axes.ravel():
        ax.set_axis_off()
    for ax, r in zip(axes.ravel(), ranked):
        png = (r.get("outputs") or {}).get("qc")
        path = Path(r["_sidecar"]).parent / png if png else None
        if path is not None and path.is_file():
            ax.imshow(mpimg.imread(str(path)))
        flag = "OUTLIER " if r["outlier_score"] > z_threshold else ""
        label = f"{flag}{r.get('scan_label', '')} [{r.get('status')}]"
        ax.set_title(label + ("\n" + r["outlier_reason"][:70] if flag else ""),
                     fontsize=7, color="red" if flag else "black")
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    from .io import write_outputs

    write_outputs({out_png: buf.getvalue()})
    return out_png, outliers

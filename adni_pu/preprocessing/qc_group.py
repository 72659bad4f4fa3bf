"""A preprocessing folder's scans taken together: their records, outlier ranking, contact sheet.

Every scan's record is the JSON sidecar beside its preprocessed volume
(:func:`load_sidecars`); scans are ranked by the robust z-scores of their QC metrics
(:func:`metric_stats`, :func:`rank_outliers`), which both the HTML report
(:mod:`.qc_report`) and the PNG contact sheet (:func:`contact_sheet`, for small folders)
show outliers first.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from adni_pu.errors import OutputError
from adni_pu.outputs import claim_file

#: The contact sheet's default name, in the preprocessing output folder.
CONTACT_SHEET = "qc_contact_sheet.png"

#: The PNG text chunk that marks a contact sheet as qc's own (so --out may replace it).
SHEET_SOFTWARE = "adni-pu qc contact sheet"


def is_contact_sheet(path: Path) -> bool:
    """Whether ``path`` is a contact sheet qc wrote: a PNG whose ``Software`` text chunk
    (near its start, after the header) is :data:`SHEET_SOFTWARE`."""
    with open(path, "rb") as handle:
        head = handle.read(4096)
    return (head.startswith(b"\x89PNG\r\n\x1a\n")
            and b"Software\x00" + SHEET_SOFTWARE.encode() in head)


#: Metrics used to rank outliers; direction says which side is suspicious.
OUTLIER_METRICS: dict[str, str] = {
    "brain_volume_ml": "both",
    "brain_fraction_of_head": "both",
    "cerebellum_fraction_of_brain": "both",
    "registration_similarity": "low",
    "template_mask_dice": "low",
    "mask_edge_contrast": "high",
    "mask_edge_offset_mm": "both",
    "brain_noise": "high",
}


def metric_stats(records: list[dict], names: Iterable[str] = tuple(OUTLIER_METRICS)
                 ) -> dict[str, tuple[float, float]]:
    """Metric -> (median, robust scale) over the records' finite ``qc`` values, for every
    metric of ``names`` with at least 3 values. The scale is 1.4826 MAD floored at 5% of
    the median: near-identical scans are not outliers."""
    stats = {}
    for name in names:
        vals = np.array(
            [r["qc"].get(name) for r in records if r.get("qc") and r["qc"].get(name) is not None],
            dtype=float,
        )
        vals = vals[np.isfinite(vals)]
        if vals.size >= 3:
            med = float(np.median(vals))
            mad = float(np.median(np.abs(vals - med))) * 1.4826
            stats[name] = (med, max(mad, 0.05 * abs(med), 1e-6))
    return stats


def rank_outliers(records: list[dict]) -> list[dict]:
    """Records sorted most suspicious first, each with ``outlier_score`` and ``outlier_reason``.

    Score: the largest robust z-score (median / 1.4826 MAD, the scale floored at 5% of the
    median) over :data:`OUTLIER_METRICS` in the suspicious direction; refused or failed
    scans come first with score inf.
    """
    out = [dict(r) for r in records]
    stats = metric_stats(out)
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
    """Every scan record under a preprocessing output folder: the JSON sidecars of the
    preprocessed T1w (``sub-*/ses-*/anat/*_desc-preproc_T1w.json``), and the
    ``*_sidecar.json`` of a folder in the file layout of an earlier adni-pu. Each gets
    ``_sidecar`` (its path) and ``_qc_png`` (its QC picture's path, or "")."""
    output = Path(output)
    records = []
    found = [(p, output) for p in output.glob("sub-*/ses-*/anat/*_desc-preproc_T1w.json")]
    # the earlier layout named its outputs relative to the record's own folder
    found += [(p, p.parent) for p in output.glob("sub-*/ses-*/*_sidecar.json")]
    for path, base in sorted(found):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(data, dict):
            continue
        png = (data.get("outputs") or {}).get("qc")
        data["_sidecar"] = str(path)
        data["_qc_png"] = str(base / png) if png else ""
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
    check_preprocess_folder(output)
    ranked = rank_outliers(load_sidecars(output))
    if not ranked:
        raise OutputError(f"{output}: no scan records (sub-*/ses-*/anat/*_desc-preproc_T1w.json) "
                          "found; run adni-pu preprocess first")
    outliers = [r for r in ranked if r["outlier_score"] > z_threshold]
    out_png = Path(out_png) if out_png else output / CONTACT_SHEET
    # never replace a file qc did not write (adni_pu.outputs.claim_file), before drawing
    claim_file(out_png, "qc", is_contact_sheet, "contact sheet PNG")
    n = len(ranked)
    cols = min(columns, n)
    rows = int(np.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.2 * rows), squeeze=False)
    for ax in axes.ravel():
        ax.set_axis_off()
    for ax, r in zip(axes.ravel(), ranked):
        path = Path(r["_qc_png"]) if r.get("_qc_png") else None
        if path is not None and path.is_file():
            ax.imshow(mpimg.imread(str(path)))
        flag = "OUTLIER " if r["outlier_score"] > z_threshold else ""
        label = f"{flag}{r.get('scan_label', '')} [{r.get('status')}]"
        ax.set_title(label + ("\n" + r["outlier_reason"][:70] if flag else ""),
                     fontsize=7, color="red" if flag else "black")
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": SHEET_SOFTWARE})
    plt.close(fig)
    from .io import write_outputs

    write_outputs({out_png: buf.getvalue()})
    return out_png, outliers


def check_preprocess_folder(output: Path) -> None:
    """Refuse, naming it, an ``output`` that is a file or missing: the QC commands read a
    folder written by ``adni-pu preprocess``."""
    if output.exists() and not output.is_dir():
        raise OutputError(f"{output}: expected a folder written by adni-pu preprocess, found "
                          "a file")
    if not output.is_dir():
        raise OutputError(f"folder not found: {output} (expected a folder written by adni-pu "
                          "preprocess)")

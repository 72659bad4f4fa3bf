"""The visual QC report: ``OUTPUT/qc/index.html``, one static page for every scan of a folder.

The page opens from the file system (no server, nothing fetched from the network): the
scans' records are embedded as JSON, the script and style are inlined from
``report_assets/`` (hand-written, no framework), and the per-scan QC pictures under
``sub-*/figures/`` are linked by relative path and loaded only when shown. It has

- a group view: each QC metric as a strip plot with its box (one point per scan, the
  refusal limits of the folder's settings drawn; a click opens that scan) and a sortable,
  paged table of scans (status, metrics, robust z-scores; outliers first);
- a per-scan view: the QC picture at full resolution, metrics with z-scores and limits,
  status and reason; keyboard next / previous;
- ratings: pass / fail / unsure and a note per scan, entered with keys, kept in the
  browser's local storage as they are made and saved as ``qc_ratings.tsv``
  (:mod:`.qc_ratings`) by a download.

Why a download and not a local server writing the file: the report then works wherever
its folder is opened (a laptop with the folder copied or mounted, a cluster's file
browser), with no process to keep running, no port to forward through SSH and no code
that listens on the network; the price is that the file lands in the browser's download
folder and is moved by hand (a browser never overwrites a download: a second save is
``qc_ratings (1).tsv``).
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
import os
from importlib import resources
from pathlib import Path
from urllib.parse import quote

from adni_pu import outputs
from adni_pu.errors import OutputError
from adni_pu.fileio import atomic_write_text
from adni_pu.locking import holding_output_lock

from .config import QCSettings
from .qc_group import (
    CONTACT_SHEET,
    OUTLIER_METRICS,
    check_preprocess_folder,
    load_sidecars,
    metric_stats,
    rank_outliers,
)
from .qc_ratings import COLUMNS, RATINGS, Rating

REPORT_DIR = "qc"
REPORT_NAME = "index.html"
#: ``adni-pu qc --merge A --merge B``: the merged ratings and the disagreements, in qc/.
MERGED_RATINGS = "qc_ratings_merged.tsv"
DISAGREEMENTS = "qc_disagreements.tsv"
#: ``adni-pu qc OUTPUT``: every name it writes (the registry,
#: :mod:`adni_pu.workflows.output_registry`).
LAYOUT = outputs.layout(
    "qc", "OUTPUT", f"{REPORT_DIR}/{REPORT_NAME}",
    (f"{REPORT_DIR}/{REPORT_NAME}", "the QC report page"),
    (f"{REPORT_DIR}/{MERGED_RATINGS}", "two raters' merged ratings (--merge)"),
    (f"{REPORT_DIR}/{MERGED_RATINGS}.*.bak", "an earlier merged file, kept"),
    (f"{REPORT_DIR}/{DISAGREEMENTS}", "where the raters disagree (--merge)"),
    (CONTACT_SHEET, "the PNG contact sheet (--sheet)"))

#: Metrics shown, in this order (others a sidecar holds follow), with the QCSettings limits
#: that refuse a scan: metric -> (setting of the lower limit, setting of the upper limit).
LIMITS: dict[str, tuple[str | None, str | None]] = {
    "brain_volume_ml": ("min_brain_ml", "max_brain_ml"),
    "brain_fraction_of_head": (None, "max_brain_fraction_of_head"),
    "cerebellum_fraction_of_brain": (None, None),
    "mask_edge_offset_mm": ("min_mask_edge_offset_mm", "max_mask_edge_offset_mm"),
    "mask_edge_contrast": (None, "max_mask_edge_contrast"),
    "brain_noise": (None, "max_brain_noise"),
    "registration_similarity": ("min_registration_similarity", None),
    "template_mask_dice": ("min_template_mask_dice", None),
    "template_end_coverage": ("min_template_end_coverage", None),
    "registration_gain": (None, "max_registration_gain"),
}


def scan_id(record: dict) -> str:
    """The id a rating names: the sidecar's ``scan_label`` (``sub-S_ses-T``), else the
    sidecar file's name up to its ``_space-`` entity."""
    label = record.get("scan_label")
    if label:
        return str(label)
    name = Path(str(record.get("_sidecar", ""))).name
    return name.split("_space-")[0].split("_sidecar")[0]


def _number(value: object) -> float | None:
    """A finite float, or None (JSON has no inf or NaN; the reason says why)."""
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _settings(records: list[dict]) -> QCSettings:
    """The QC settings the folder's scans were refused with (the first sidecar's)."""
    from dataclasses import fields

    defaults = QCSettings()
    recorded = next(((r.get("settings") or {}).get("qc") for r in records
                     if isinstance((r.get("settings") or {}).get("qc"), dict)), None) or {}
    kept = {f.name: recorded[f.name] for f in fields(QCSettings)
            if isinstance(recorded.get(f.name), (int, float))}
    return QCSettings(**{**{f.name: getattr(defaults, f.name) for f in fields(QCSettings)},
                         **kept})


def _metric_names(records: list[dict]) -> tuple[list[str], list[str]]:
    """The QC metrics the records hold (those of :data:`LIMITS`, plotted and tabled) and
    their other numbers (volumes, intensities: shown on each scan's page only)."""
    seen: dict[str, None] = {}
    for r in records:
        for name, value in (r.get("qc") or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                seen.setdefault(name)
    return [n for n in LIMITS if n in seen], [n for n in seen if n not in LIMITS]


def _reason(record: dict) -> str:
    problems = record.get("qc_problems") or []
    return "; ".join(str(p) for p in problems) or str(record.get("error") or "")


def _figure_link(record: dict, report_dir: Path) -> str:
    png = record.get("_qc_png") or ""
    if not png or not Path(png).is_file():
        return ""
    rel = os.path.relpath(Path(png).resolve(), report_dir.resolve())
    return "/".join(quote(part) for part in Path(rel).as_posix().split("/"))


def report_data(records: list[dict], output: Path, report_dir: Path,
                ratings: dict[str, Rating] | None = None, z_threshold: float = 3.5) -> dict:
    """What the page shows of ``records`` (:func:`.qc_group.rank_outliers` of the folder's
    sidecars): metrics (name, limits, direction), scans (id, status, reason, outlier score,
    figure link, values, robust z-scores), ratings to start from."""
    settings = _settings(records)
    names, extra = _metric_names(records)
    stats = metric_stats(records, names)
    metrics = []
    for name in names:
        lo, hi = LIMITS.get(name, (None, None))
        metrics.append({"name": name, "dir": OUTLIER_METRICS.get(name, "both"),
                        "lo": getattr(settings, lo) if lo else None,
                        "hi": getattr(settings, hi) if hi else None})
    scans = []
    for r in records:
        qc = r.get("qc") or {}
        values = [_number(qc.get(n)) for n in names]
        z = [None if v is None or n not in stats else
             round((v - stats[n][0]) / stats[n][1], 2) for n, v in zip(names, values)]
        score = r["outlier_score"]
        scans.append({"id": scan_id(r), "status": str(r.get("status") or ""),
                      "reason": _reason(r), "why": r.get("outlier_reason") or "",
                      "score": round(score, 2) if math.isfinite(score) else None,
                      "fig": _figure_link(r, report_dir), "m": values, "z": z,
                      "x": [_number(qc.get(n)) for n in extra]})
    return {"folder": str(Path(output).resolve()), "key": str(Path(output).resolve()),
            "made": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "z_threshold": z_threshold, "metrics": metrics, "extra": extra, "scans": scans,
            "ratings_columns": list(COLUMNS), "rating_values": list(RATINGS),
            "ratings": [{"id": x.scan_id, "rating": x.rating, "note": x.note,
                         "rater": x.rater, "date": x.date} for x in (ratings or {}).values()]}


def _script_json(data: dict) -> str:
    """JSON safe inside a <script> element: no ``<``, ``>`` or ``&`` survives literally, so
    no scan id or note can close the element or start markup."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _asset(name: str) -> str:
    return resources.files("adni_pu.preprocessing").joinpath("report_assets", name).read_text(
        encoding="utf-8")


def render_report(data: dict) -> str:
    """The page's HTML: the template with the style, the data and the script inlined."""
    page = _asset("report.html")
    return (page.replace("{{title}}", html.escape(f"QC: {data['folder']}"))
            .replace("{{folder}}", html.escape(data["folder"]))
            .replace("{{style}}", _asset("report.css"))
            .replace("{{data}}", _script_json(data))
            .replace("{{script}}", _asset("report.js")))


def write_report(output: str | Path, ratings: dict[str, Rating] | None = None,
                 z_threshold: float = 3.5) -> tuple[Path, list[dict]]:
    """Write ``output/qc/index.html`` for the preprocessing folder ``output`` (holding the
    folder's lock), starting from ``ratings`` (e.g. a file being resumed); returns its
    path and the scans' records, most suspicious first (:func:`.qc_group.rank_outliers`)."""
    output = Path(output)
    check_preprocess_folder(output)
    return _write_locked(output, ratings, z_threshold)


@holding_output_lock("qc", "output")  # one writer per folder (adni_pu.locking)
def _write_locked(output: Path, ratings: dict[str, Rating] | None, z_threshold: float
                  ) -> tuple[Path, list[dict]]:
    report_dir = output / REPORT_DIR
    records = rank_outliers(load_sidecars(output))
    if not records:
        raise OutputError(f"{output}: no scan records (sub-*/ses-*/anat/*_desc-preproc_T1w.json) "
                          "found; run adni-pu preprocess first")
    data = report_data(records, output, report_dir, ratings, z_threshold)
    return atomic_write_text(report_dir / REPORT_NAME, render_report(data)), records


def known_scan_ids(output: str | Path) -> list[str]:
    """The ids a ratings file of folder ``output`` may name."""
    return [scan_id(r) for r in load_sidecars(Path(output))]

"""The cohort folder's files: writing a built cohort (:func:`write_cohort`, a manifest
alone with :func:`write_manifest`) and reading a manifest back (:func:`read_manifest`, the
one manifest reader; :func:`report_from_path` re-renders a folder's report).

Every file is written atomically (temporary name, then rename) under the folder's lock, and
nothing is written when a file would overwrite an input of the build.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from adni_pu import config as cfgmod
from adni_pu import outputs
from adni_pu.cohort.config import load_cohort_config
from adni_pu.cohort.manifest import Cohort
from adni_pu.cohort.manifest_check import validate_manifest
from adni_pu.cohort.quality import QualityReport
from adni_pu.cohort.report import HISTOGRAM_NAME, REPORT_NAME, class_prior_table, render_report
from adni_pu.errors import CohortInputError, OutputError
from adni_pu.fileio import atomic_write, atomic_write_text, same_file_as
from adni_pu.fileio import check_out_dir as _check_out_dir
from adni_pu.locking import holding_output_lock, output_lock

_DATE_COLUMNS = ("suvr_date", "examdate", "scan_date")


def _csv_text(frame: pd.DataFrame) -> str:
    out = frame.copy()
    for col in out.columns:
        if pd.api.types.is_datetime64_any_dtype(out[col]):
            out[col] = out[col].dt.strftime("%Y-%m-%d")
    return out.to_csv(index=False)


def _paths_for_output(manifest: pd.DataFrame, out_dir: Path, mode: str) -> pd.DataFrame:
    if mode != "relative":
        return manifest
    out = manifest.copy()
    out["scan_path"] = [os.path.relpath(p, out_dir.resolve()) for p in out["scan_path"]]
    return out


def write_manifest(manifest: pd.DataFrame, path: str | Path) -> Path:
    """Write a manifest as CSV or Parquet (by suffix), atomically."""
    path = Path(path)
    if path.suffix == ".parquet":
        return atomic_write(path, lambda tmp: manifest.to_parquet(tmp, index=False))
    return atomic_write_text(path, _csv_text(manifest))


def check_out_dir(out_dir: str | Path) -> None:
    """Refuse an output folder that is a file (or lies under one) before anything is written."""
    _check_out_dir(out_dir, "the cohort files")


def output_names(cohort: Cohort, render: bool = True) -> list[str]:
    """The file names :func:`write_cohort` writes into its folder."""
    manifest = "manifest.parquet" if cohort.config.output.format == "parquet" else "manifest.csv"
    return [*TABLES, manifest, *(REPORT if render else ())]


#: What every cohort build writes, its manifest (by ``output.format``) and its report.
TABLES = ("cohort_config.toml", "subjects.csv", "excluded.csv", "quality.csv", "cohort.json")
MANIFESTS = ("manifest.csv", "manifest.parquet")
REPORT = (REPORT_NAME, HISTOGRAM_NAME)

#: ``adni-pu cohort build ... OUT``: every name it writes (the registry,
#: :mod:`adni_pu.workflows.output_registry`).
LAYOUT = outputs.Layout("cohort build", "OUT", "cohort.json", tuple(
    outputs.Output(name, "cohort build", "the cohort's tables, manifest and report")
    for name in (*TABLES, *MANIFESTS, *REPORT)))

#: ``adni-pu cohort report MANIFEST [--out OUT]``: the report alone.
REPORT_LAYOUT = outputs.Layout("cohort report", "OUT", REPORT_NAME, tuple(
    outputs.Output(name, "cohort report", "the cohort report") for name in REPORT))


def check_not_inputs(out_dir: Path, names: list[str],
                     inputs: dict[str, str | Path | None]) -> None:
    """Refuse to write a file of ``names`` in ``out_dir`` that is one of ``inputs``.

    ``inputs``: what each input is (e.g. ``"clinical table"``) -> its path. Raises
    :class:`OutputError` naming the output file and the input it would overwrite.
    """
    given = {what: Path(p) for what, p in inputs.items() if p is not None}
    for name in names:
        target = out_dir / name
        if not target.exists():
            continue
        what = same_file_as(target, given)
        if what is not None:
            raise OutputError(
                f"output folder {out_dir}: writing {name} would overwrite the {what} "
                f"{given[what]}, an input of this build; choose another output folder (or "
                "move the input out of it)")


def _inputs_of(cohort: Cohort) -> dict[str, str | Path | None]:
    inputs = cohort.summary.get("inputs", {}) if cohort.summary else {}
    found: dict[str, str | Path | None] = {
        "clinical table": (inputs.get("clinical") or {}).get("path"),
        "scan table": (inputs.get("scans") or {}).get("path")}
    for i, table in enumerate(inputs.get("amyloid") or []):
        found[f"amyloid table {i + 1}"] = table.get("path")
    found["QC ratings file"] = (inputs.get("qc_ratings") or {}).get("path")
    return found


@holding_output_lock("cohort build", "out_dir")  # one writer per folder (adni_pu.locking)
def write_cohort(cohort: Cohort, out_dir: str | Path, render: bool = True,
                 inputs: dict[str, str | Path | None] | None = None) -> dict[str, Path]:
    """Write the manifest, subject table, exclusions, quality issues, settings and report.

    Files (in ``out_dir``): ``manifest.csv`` (or ``.parquet``), ``subjects.csv``,
    ``excluded.csv``, ``quality.csv``, ``cohort_config.toml``, ``cohort.json`` and, with
    ``render``, ``cohort_report.md`` with ``suvr_histogram.png``. Nothing is written when
    one of them would overwrite an input of the build (the tables, and ``inputs``, e.g.
    the settings file: what -> path), or when ``out_dir`` is a file.
    """

    out_dir = Path(out_dir)
    check_out_dir(out_dir)
    check_not_inputs(out_dir, output_names(cohort, render),
                     {**_inputs_of(cohort), **(inputs or {})})
    try:
        return _write_cohort_files(cohort, out_dir, render)
    except OSError as exc:
        raise OutputError(f"output folder {out_dir}: cannot write the cohort files ({exc})"
                          ) from exc


def _write_cohort_files(cohort: Cohort, out_dir: Path, render: bool) -> dict[str, Path]:
    from adni_pu.provenance import provenance

    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = cohort.config
    manifest = _paths_for_output(cohort.manifest, out_dir, cfg.output.scan_paths)
    name = "manifest.parquet" if cfg.output.format == "parquet" else "manifest.csv"
    paths: dict[str, Path] = {}
    paths["config"] = cfgmod.save(cfg, out_dir / "cohort_config.toml")
    paths["subjects"] = atomic_write_text(out_dir / "subjects.csv", _csv_text(cohort.subjects))
    paths["excluded"] = atomic_write_text(out_dir / "excluded.csv", _csv_text(cohort.excluded))
    paths["quality"] = atomic_write_text(out_dir / "quality.csv",
                                                 _csv_text(cohort.quality.to_frame()))
    summary = dict(cohort.summary)
    summary["manifest"] = name
    summary["provenance"] = provenance()
    if render:
        summary["class_prior"] = class_prior_table(manifest).to_dict("records")
        paths.update(render_report(manifest, out_dir, quality=cohort.quality, config=cfg,
                                   excluded=cohort.excluded, summary=summary))
    paths["summary"] = atomic_write_text(
        out_dir / "cohort.json", json.dumps(summary, indent=2, default=str) + "\n")
    paths["manifest"] = write_manifest(manifest, out_dir / name)
    return paths


def read_manifest(path: str | Path) -> pd.DataFrame:
    """Read a manifest (CSV or Parquet; a cohort folder finds its manifest) with its types.

    Every value is validated first (:func:`~adni_pu.cohort.manifest_check.validate_manifest`):
    a label, truth, fold or split that training would misread raises ``ManifestError``.
    """
    path = Path(path)
    if path.is_dir():
        for name in ("manifest.parquet", "manifest.csv"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise CohortInputError(f"{path}: no manifest.csv or manifest.parquet in this folder")
    if not path.is_file():
        raise CohortInputError(f"{path}: manifest not found")
    try:
        if path.suffix == ".parquet":
            frame = pd.read_parquet(path)
        else:
            frame = pd.read_csv(path, dtype={"subject_id": str, "session_id": str,
                                             "scan_id": str, "scan_path": str})
    except (ValueError, OSError) as exc:  # empty, not CSV/Parquet, unreadable
        raise CohortInputError(f"{path}: cannot read the manifest ({exc})") from exc
    frame = validate_manifest(frame, path)
    for col in _DATE_COLUMNS:
        if col in frame:
            frame[col] = pd.to_datetime(frame[col], errors="coerce")
    for col in ("pu_label", "truth", "hidden_positive", "fold"):
        if col in frame:
            frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("Int64")
    return frame


def report_from_path(path: str | Path, out_dir: str | Path | None = None) -> dict[str, Path]:
    """Re-render the report of a manifest file or cohort folder (CLI ``cohort report``).

    quality.csv, excluded.csv and cohort_config.toml beside the manifest are used when
    present; the report is written beside the manifest unless ``out_dir`` is given, under
    that folder's lock (a cohort build or another report into it is refused).
    """
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    with output_lock(out_dir or folder, "cohort report"):
        return _report(path, folder, out_dir)


def _report(path: Path, folder: Path, out_dir: str | Path | None) -> dict[str, Path]:
    """:func:`report_from_path`'s work, under the lock."""
    manifest = read_manifest(path)
    quality = None
    if (folder / "quality.csv").is_file():
        frame = pd.read_csv(folder / "quality.csv", dtype=str, keep_default_na=False)
        quality = QualityReport.from_frame(frame)
    excluded = None
    if (folder / "excluded.csv").is_file():
        excluded = pd.read_csv(folder / "excluded.csv", dtype=str)
    config = None
    if (folder / "cohort_config.toml").is_file():
        config = load_cohort_config(folder / "cohort_config.toml")
    summary = None
    if (folder / "cohort.json").is_file():
        try:
            summary = json.loads((folder / "cohort.json").read_text())
        except json.JSONDecodeError:
            summary = None
    return render_report(manifest, out_dir or folder, quality, config, excluded, summary)


def positive_class_of(manifest: str | Path) -> str | None:
    """The positive class of the cohort a manifest belongs to, in words
    (:func:`~adni_pu.cohort.config.positive_class_text`), from the ``cohort_config.toml``
    that ``adni-pu cohort build`` wrote beside it; None for a manifest made otherwise."""
    from adni_pu.cohort.config import positive_class_text
    from adni_pu.errors import AdniPuError

    path = Path(manifest)
    settings = (path if path.is_dir() else path.parent) / "cohort_config.toml"
    if not settings.is_file():
        return None
    try:
        return positive_class_text(load_cohort_config(settings).labels)
    except (AdniPuError, OSError, ValueError):
        return None

"""The preprocessing output as a BIDS derivatives dataset: file names, sidecars, description.

Names follow sMRIPrep (BIDS 1.10 derivatives; ``from-``/``to-``/``mode-`` as fMRIPrep
writes its transforms), so pybids and fMRIPrep-style tools index the folder::

    OUTPUT/dataset_description.json
    OUTPUT/sub-S/ses-T/anat/sub-S_ses-T_space-MNI152NLin2009aSym_res-1p5mm_desc-preproc_T1w.nii.gz
    OUTPUT/sub-S/figures/sub-S_ses-T_desc-qc_T1w.png

``space-`` is the TemplateFlow name of the template the pipeline registers to (nilearn's
bundled ICBM 2009a nonlinear symmetric brain, :mod:`adni_pu.atlas`). ``res-`` names the
model grid by its voxel size (``1p5mm``: 1.5 mm); TemplateFlow has no 1.5 mm grid for this
template, so each file on the grid says in its sidecar's ``Resolution`` what the label
means. Files without ``space-`` are on the grid of the T1w input, as in sMRIPrep.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adni_pu import outputs

from .config import PreprocessConfig
from .io import Scan
from .scans import bids_label

#: TemplateFlow identifier of the template (``adni_pu.atlas.template_paths()["t1"]``).
TEMPLATE = "MNI152NLin2009aSym"
TEMPLATE_TEXT = ("ICBM 2009a nonlinear symmetric MNI152 template (TemplateFlow "
                 f"{TEMPLATE}; the copy bundled with nilearn)")
BIDS_VERSION = "1.10.0"
DESCRIPTION = "dataset_description.json"
BIDSIGNORE = ".bidsignore"
#: What the BIDS validator is told to skip: the run's own tables and settings, the
#: transforms (no BIDS rule yet; named as fMRIPrep names them) and the QC pictures.
IGNORED = ("summary.csv", "summary_shard-*.csv", "preprocess_config.toml",
           "qc_contact_sheet.png", "*_xfm.mat", "*_xfm.nii.gz", "sub-*/figures", "qc/",
           "qc_ratings*.tsv")

#: Output kind -> file name after ``sub-S_ses-T_`` (``{space}``: ``space-<tpl>_res-<label>``).
#: ``*_json`` kinds are the BIDS sidecars of the kind before them; ``sidecar`` is the sidecar
#: of the preprocessed T1w and also the scan's record (settings, QC, timings, input hash):
#: it is written for every scan, also for one that failed and has no volume.
NAMES: dict[str, str] = {
    "preproc": "{space}_desc-preproc_T1w.nii.gz",
    "sidecar": "{space}_desc-preproc_T1w.json",
    "brainmask_template": "{space}_desc-brain_mask.nii.gz",
    "brainmask_template_json": "{space}_desc-brain_mask.json",
    "brainmask_native": "desc-brain_mask.nii.gz",
    "brainmask_native_json": "desc-brain_mask.json",
    "cerebellum_template": "{space}_label-CBM_mask.nii.gz",
    "cerebellum_template_json": "{space}_label-CBM_mask.json",
    "cerebellum_native": "label-CBM_mask.nii.gz",
    "cerebellum_native_json": "label-CBM_mask.json",
    "affine": f"from-T1w_to-{TEMPLATE}_mode-image_xfm.mat",
    "warp": f"from-T1w_to-{TEMPLATE}_mode-image_desc-syn_xfm.nii.gz",
    "qc": "desc-qc_T1w.png",
}
#: Kinds written to ``sub-S/figures/`` instead of ``sub-S/ses-T/anat/``.
FIGURES = frozenset({"qc"})

#: ``adni-pu preprocess INPUT OUTPUT``: every name it writes into OUTPUT (the registry,
#: :mod:`adni_pu.workflows.output_registry`), from the names above.
LAYOUT = outputs.Layout("preprocess", "OUTPUT", DESCRIPTION, (
    outputs.Output(DESCRIPTION, "preprocess", "the BIDS derivatives description"),
    outputs.Output(BIDSIGNORE, "preprocess", "what the BIDS validator skips"),
    outputs.Output("summary.csv", "preprocess", "one row per scan: status, paths, hash"),
    outputs.Output("summary_shard-*.csv", "preprocess", "one shard's rows (--shard)"),
    outputs.Output("preprocess_config.toml", "preprocess", "the settings"),
    *(outputs.Output(f"sub-*/{'figures' if kind in FIGURES else 'ses-*/anat'}/sub-*_ses-*_"
                     + name.format(space="space-*_res-*"), "preprocess", kind)
      for kind, name in NAMES.items())))

#: Output kind -> the file name suffix it had after ``sub-S_ses-T_``, in ``sub-S/ses-T/``.
LEGACY_SUFFIXES: dict[str, str] = {
    "preproc": "T1w_preproc.nii.gz",
    "brainmask_template": "brainmask_template.nii.gz",
    "brainmask_native": "brainmask_native.nii.gz",
    "cerebellum_template": "cerebellum_template.nii.gz",
    "cerebellum_native": "cerebellum_native.nii.gz",
    "affine": "affine.mat",
    "warp": "warp.nii.gz",
    "qc": "qc.png",
    "sidecar": "sidecar.json",
}

# every file name an output of scan ``label`` can have, whatever its grid (for the cleanup
# of a scan's earlier outputs, e.g. made on another grid)
_ANY_OUTPUT = (r"(?:space-[A-Za-z0-9]+_res-[A-Za-z0-9]+_)?"
               r"(?:desc-preproc_T1w|desc-brain_mask|label-CBM_mask)\.(?:nii\.gz|json)"
               r"|from-T1w_to-[A-Za-z0-9]+_mode-image(?:_desc-syn)?_xfm\.(?:mat|nii\.gz)"
               r"|desc-qc_T1w\.png")


def res_label(spacing_mm: float) -> str:
    """The ``res-`` label of a grid of ``spacing_mm`` voxels: ``1p5mm`` for 1.5 mm."""
    return f"{float(spacing_mm):g}".replace(".", "p") + "mm"


def resolution(spacing_mm: float, shape: Sequence[int]) -> dict[str, str]:
    """The BIDS ``Resolution`` field: what the ``res-`` label of the model grid means."""
    from adni_pu import atlas

    affine = atlas.model_grid_affine(float(spacing_mm), tuple(int(n) for n in shape))
    origin = ", ".join(f"{v:g}" for v in affine[:3, 3])
    size = " x ".join(str(int(n)) for n in shape)
    default = (float(spacing_mm) == atlas.MODEL_GRID_SPACING
               and tuple(shape) == atlas.MODEL_GRID_SHAPE)
    text = (f"{float(spacing_mm):g} mm isotropic, {size} voxels, first voxel centre at "
            f"({origin}) mm in {TEMPLATE}" + (
                ": the SPM/CAT12 grid of the published ADNI data" if default else "")
            + "; the model grid of adni-pu, not a TemplateFlow resolution of the template")
    return {res_label(spacing_mm): text}


def scan_names(subject: str, session: str, res: str) -> dict[str, str]:
    """Each output kind of scan ``sub-<subject>_ses-<session>`` -> its path relative to the
    dataset root (``subject`` and ``session`` are BIDS labels already)."""
    label = f"sub-{subject}_ses-{session}"
    space = f"space-{TEMPLATE}_res-{res}"
    out = {}
    for kind, name in NAMES.items():
        folder = (f"sub-{subject}/figures" if kind in FIGURES
                  else f"sub-{subject}/ses-{session}/anat")
        out[kind] = f"{folder}/{label}_{name.format(space=space)}"
    return out


def earlier_outputs(output: Path, subject: str, session: str) -> list[Path]:
    """The files of scan ``sub-<subject>_ses-<session>`` now under ``output`` whatever grid
    made them (another ``res-``), and those of the layout before BIDS derivatives names."""
    label = f"sub-{subject}_ses-{session}"
    pattern = re.compile(rf"{re.escape(label)}_(?:{_ANY_OUTPUT})")
    found = []
    for folder in (output / f"sub-{subject}" / f"ses-{session}" / "anat",
                   output / f"sub-{subject}" / "figures"):
        if folder.is_dir():
            found += [p for p in folder.iterdir() if pattern.fullmatch(p.name)]
    legacy = output / f"sub-{subject}" / f"ses-{session}"
    found += [legacy / f"{label}_{s}" for s in LEGACY_SUFFIXES.values()
              if (legacy / f"{label}_{s}").is_file()]
    return sorted(found)


def file_uri(path: str | Path) -> str:
    """``file://`` URI of ``path`` (absolute)."""
    return Path(path).absolute().as_uri()


def preproc_metadata(config: Any, input_path: str | Path, names: dict[str, str]) -> dict:
    """BIDS fields of the preprocessed T1w's sidecar (``config``: a PreprocessConfig)."""
    cer = config.cerebellum
    inten = config.intensity
    norm = {"percentile": f"the brain's {inten.low_percentile:g}th and "
                          f"{inten.high_percentile:g}th percentiles mapped to 0 and 1, clipped",
            "zscore": "the brain's mean 0 and standard deviation 1",
            "none": "none (N4-corrected intensities)"}[inten.method]
    grid = config.grid
    steps = ["N4 bias-field correction", f"skull stripping ({config.skullstrip.method})",
             f"{config.registration.transform} registration to {TEMPLATE}",
             f"resampling to the model grid ({grid.interpolation})"]
    if cer.enabled:
        steps.append("cerebellum removal (set to 0)")
    steps.append(f"intensity normalisation ({inten.method})")
    sources = [file_uri(input_path)] + [f"bids::{names[k]}" for k in
                                        ("brainmask_native", "affine")]
    return {
        "Description": "T1w image preprocessed by adni-pu: " + ", ".join(steps) + ".",
        "SkullStripped": True,
        "CerebellumRemoved": bool(cer.enabled),
        "CerebellumDescription": (
            f"voxels of the AAL regions {', '.join(cer.regions)} (dilated "
            f"{cer.dilate_mm:g} mm, template space) are 0" if cer.enabled
            else "the cerebellum is kept (cerebellum.enabled = false)"),
        "IntensityNormalization": norm,
        "Resolution": resolution(grid.spacing_mm, grid.shape),
        "Sources": sources,
    }


def mask_metadata(kind: str, config: Any, input_path: str | Path,
                  names: dict[str, str]) -> dict:
    """BIDS sidecar of the mask ``kind`` (brainmask_/cerebellum_ + template/native)."""
    grid = config.grid
    regions = ", ".join(config.cerebellum.regions)
    native = ("on the grid and in the voxel order of the T1w input (no space- entity: the "
              "input's own space)")
    on_grid = f"on the model grid in {TEMPLATE}"
    xfm = f"bids::{names['affine']}"
    if kind == "brainmask_native":
        out = {"Type": "Brain", "Description": f"brain mask of the skull stripping, {native}",
               "Sources": [file_uri(input_path)]}
    elif kind == "brainmask_template":
        out = {"Type": "Brain",
               "Description": f"the native brain mask carried through the transform, {on_grid}",
               "Sources": [f"bids::{names['brainmask_native']}", xfm]}
    elif kind == "cerebellum_template":
        from adni_pu import atlas

        out = {"Type": "ROI",
               "Description": f"cerebellum: AAL atlas regions {regions} dilated "
                              f"{config.cerebellum.dilate_mm:g} mm, {on_grid}; the voxels "
                              "set to 0 in the preprocessed T1w",
               "Sources": [file_uri(atlas.template_paths()["aal"])]}
    else:
        out = {"Type": "ROI",
               "Description": f"cerebellum: the AAL regions {regions} carried from "
                              f"{TEMPLATE} through the inverse transform and kept inside the "
                              f"brain mask, {native}",
               "Sources": [file_uri(input_path), xfm]}
    if not config.cerebellum.enabled and kind.startswith("cerebellum"):
        out["Description"] = "empty: cerebellum removal is off (cerebellum.enabled = false)"
    if kind.endswith("template"):
        out["Resolution"] = resolution(grid.spacing_mm, grid.shape)
    else:
        out["SpatialReference"] = file_uri(input_path)
    return out


def source_datasets(inputs: object) -> list[dict[str, str]]:
    """``SourceDatasets`` for a run over ``inputs`` (a folder, a file or a list of paths):
    the input's DOI and URL when its own dataset_description.json gives a DOI, else a
    ``file://`` URL of the input (the common folder of a list)."""
    import os

    if isinstance(inputs, (str, Path)):
        root = Path(inputs)
    else:
        paths = [str(Path(getattr(p, "path", p)).absolute()) for p in inputs]  # type: ignore[union-attr]
        if not paths:
            return []
        root = Path(os.path.commonpath(paths)) if len(paths) > 1 else Path(paths[0])
    entry: dict[str, str] = {"URL": file_uri(root)}
    desc = root / DESCRIPTION
    if root.is_dir() and desc.is_file():
        try:
            data = json.loads(desc.read_text())
        except (OSError, ValueError):
            data = {}
        if isinstance(data, dict):
            doi = str(data.get("DatasetDOI") or "").strip()
            if doi:
                entry = {"DOI": doi, **entry}
            if data.get("BIDSVersion"):
                entry["Version"] = f"BIDS {data['BIDSVersion']}"
    return [entry]


def generated_by() -> list[dict[str, str]]:
    """``GeneratedBy``: adni-pu, its version and (when its metadata has one) code URL."""
    from importlib import metadata

    from adni_pu import __version__

    entry = {"Name": "adni-pu", "Version": __version__,
             "Description": "adni-pu preprocess: N4, skull stripping, registration to "
                            f"{TEMPLATE}, cerebellum removal, intensity normalisation"}
    try:
        meta = metadata.metadata("adni-pu")
    except metadata.PackageNotFoundError:
        return [entry]
    entry["Version"] = meta.get("Version", __version__)
    urls = [u.split(",", 1)[-1].strip() for u in meta.get_all("Project-URL") or []]
    url = next((u for u in urls if u), meta.get("Home-page") or "")
    if url:
        entry["CodeURL"] = url
    return [entry]


def description(sources: list[dict[str, str]]) -> dict[str, Any]:
    """The dataset_description.json of a preprocessing output folder."""
    out: dict[str, Any] = {
        "Name": "adni-pu preprocessed T1w (model grid, skull and cerebellum removed)",
        "BIDSVersion": BIDS_VERSION,
        "DatasetType": "derivative",
        "GeneratedBy": generated_by(),
    }
    if sources:
        out["SourceDatasets"] = sources
    return out


def write_description(output: Path, sources: list[dict[str, str]]) -> Path:
    """Write ``output/dataset_description.json`` atomically, keeping the sources an earlier
    run into the folder recorded, and the :data:`IGNORED` lines of ``.bidsignore`` (added
    to the user's own lines). Unchanged content is not rewritten, so shards writing the
    same files at once race harmlessly (each rename puts the same bytes)."""
    from adni_pu.fileio import atomic_write_text

    path = Path(output) / DESCRIPTION
    try:
        before = path.read_text()
        old = json.loads(before)
    except (OSError, ValueError):
        before, old = "", {}
    known = old.get("SourceDatasets") if isinstance(old, dict) else None
    merged = [s for s in known if isinstance(s, dict)] if isinstance(known, list) else []
    merged += [s for s in sources if s not in merged]
    text = json.dumps(description(merged), indent=2) + "\n"
    if before != text:
        atomic_write_text(path, text)
    ignore = Path(output) / BIDSIGNORE
    try:
        current = ignore.read_text()
    except OSError:
        current = ""
    missing = [line for line in IGNORED if line not in current.splitlines()]
    if missing:
        sep = "\n" if current and not current.endswith("\n") else ""
        atomic_write_text(ignore, current + sep + "".join(f"{m}\n" for m in missing))
    return path


def output_paths(scan: Scan, output: str | Path,
                 config: PreprocessConfig | None = None) -> dict[str, Path]:
    """Where each output of ``scan`` goes under ``output`` (BIDS derivatives names). The
    ``res-`` label is ``config``'s model grid; without ``config``, that of the scan's record
    already there (reading a finished run), else the default grid's (``1p5mm``)."""
    subject, session = bids_label(scan.subject_id), bids_label(scan.session_id)
    if config is not None:
        res = res_label(config.grid.spacing_mm)
    else:
        res = res_label(PreprocessConfig().grid.spacing_mm)
        made = _records(Path(output), subject, session)
        if len(made) == 1:
            res = made[0].name.split("_res-", 1)[1].split("_", 1)[0]
    names = scan_names(subject, session, res)
    return {k: Path(output) / rel for k, rel in names.items()}


def _records(output: Path, subject: str, session: str) -> list[Path]:
    """The records of scan ``sub-<subject>_ses-<session>`` under ``output``, any grid."""
    folder = output / f"sub-{subject}" / f"ses-{session}" / "anat"
    return sorted(folder.glob(f"sub-{subject}_ses-{session}_space-*_res-*_desc-preproc_T1w"
                              ".json"))


def find_record(scan: Scan, output: str | Path, config: PreprocessConfig | None = None) -> Path:
    """The record (desc-preproc_T1w.json) of ``scan`` under ``output``: the one of
    ``config``'s grid, else one made on another grid (its settings hash tells), else the
    path the record of ``config``'s grid would have."""
    path = output_paths(scan, output, config)["sidecar"]
    if path.is_file():
        return path
    other = _records(Path(output), bids_label(scan.subject_id), bids_label(scan.session_id))
    return other[0] if other else path


def is_done(scan: Scan, output: str | Path, config_hash: str,
            config: PreprocessConfig | None = None) -> bool:
    """Whether ``scan`` already has complete outputs made from the same input content with
    the same settings (see :func:`resume_check`)."""
    return resume_check(scan, output, config_hash, config)[0]


def resume_check(scan: Scan, output: str | Path, config_hash: str,
                 config: PreprocessConfig | None = None) -> tuple[bool, str]:
    """(done, note): whether ``scan``'s outputs can be reused, and a line for summary.csv's
    ``note`` saying why not (or what differs when they are reused).

    Outputs are reused only when the record (:func:`find_record`; ``config`` gives the
    grid of the names) says ``done`` with the same settings hash and the same input content
    (SHA-256 of the file, or of the DICOM folder's files; recomputed only when size, times
    or inode changed), and every output file it lists is there. The input is keyed by its
    content, not by its path as typed: the same file reached from another working folder or
    through another path is reused, with a note naming the earlier path. An input replaced
    at the same path is redone and says so, never skipped. The note is ``""`` for a scan
    without earlier outputs.
    """
    from adni_pu.fileio import input_identity

    try:
        side = json.loads(find_record(scan, output, config).read_text())
    except (OSError, json.JSONDecodeError):
        return False, ""
    if side.get("status") not in ("done", "failed-qc"):
        return False, ""
    if side.get("settings_hash") != config_hash:
        return False, (f"redone: earlier outputs were made with other settings (hash "
                       f"{side.get('settings_hash')}, now {config_hash})")
    known = {"sha256": side.get("input_sha256", ""), "stat": side.get("input_stat", "")}
    if not known["sha256"]:
        return False, "redone: earlier outputs do not record their input's content"
    try:
        now = input_identity(scan.path, known)
    except OSError:
        return False, ""
    moved = _moved_from(side, scan.path)
    if now["sha256"] != known["sha256"]:
        if moved:
            return False, (f"redone: earlier outputs came from {moved} (sha256 "
                           f"{known['sha256'][:12]}), this input differs (sha256 "
                           f"{now['sha256'][:12]})")
        return False, (f"redone: the input changed since its outputs were made (sha256 "
                       f"{known['sha256'][:12]} then, {now['sha256'][:12]} now)")
    if side.get("status") != "done":
        return False, ""
    listed = side.get("outputs", {}).values()  # relative to the dataset root
    if not all((Path(output) / name).is_file() for name in listed):
        return False, "redone: some earlier outputs are missing"
    if moved:
        return True, (f"reused: earlier outputs came from {moved}, the same content "
                      f"(sha256 {known['sha256'][:12]}) as {scan.path}")
    return True, ""


def _moved_from(side: dict, path: Path) -> str:
    """The earlier input's path when the record names another file than ``path`` ("" when
    it is the same file): compared resolved (``input_resolved``), so a relative path typed
    from another working folder, or a link to the same file, is the same input. A record
    without ``input_resolved`` (earlier versions) is compared as typed."""
    typed = str(side.get("input_path", ""))
    resolved = side.get("input_resolved")
    if resolved is None:
        return "" if typed == str(path) else typed
    try:
        here = str(Path(path).resolve())
    except OSError:
        here = str(path)
    return "" if here == str(resolved) else str(resolved)


def recorded_sha256(scan: Scan, output: str | Path,
                    config: PreprocessConfig | None = None) -> str:
    """The input content hash recorded in ``scan``'s record under ``output`` ("" if none)."""
    try:
        return str(json.loads(find_record(scan, output, config).read_text())
                   .get("input_sha256", ""))
    except (OSError, json.JSONDecodeError, AttributeError):
        return ""

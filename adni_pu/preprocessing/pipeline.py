"""One scan from raw T1 to the model input: :func:`preprocess_scan`.

Steps (each in its own module and switchable in :class:`PreprocessConfig`): read and
validate -> reorient to RAS -> N4 -> skull strip -> register to MNI152 -> cerebellum
mask (AAL, template space) -> resample to the model grid, remove the cerebellum,
normalise intensities -> QC metrics, checks and picture -> write all outputs at once.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import os
import time
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from . import derivatives as bids
from . import io as pio
from .config import PreprocessConfig, settings_hash
from .derivatives import is_done, output_paths, recorded_sha256
from .io import Scan
from .output_checks import InputIndex, input_collision, name_max, name_problem
from .scans import bids_label


def configure_threads(threads: int) -> None:
    """Limit ITK (SimpleITK and ANTs), BLAS and torch to ``threads`` threads in this process.

    torch is only configured here if it is already imported; otherwise the skull
    stripping step applies ``ADNI_PU_THREADS`` when it imports torch, so workers that
    never need torch do not pay for importing it.
    """
    import sys

    for var in ("ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                "OPENBLAS_NUM_THREADS", "ADNI_PU_THREADS"):
        os.environ[var] = str(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    import SimpleITK as sitk

    sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(threads)


@contextmanager
def _timed(timings: dict[str, float], step: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[step] = round(time.perf_counter() - start, 3)


@functools.lru_cache(maxsize=4)
def _template_outline(spacing: float, shape: tuple[int, int, int]) -> np.ndarray:
    from adni_pu import atlas

    from .registration import template_brain_mask

    img = atlas.load_template("t1")
    data = atlas.resample_to(img, atlas.model_grid_affine(spacing, shape), shape, order=1)
    return template_brain_mask(data)


def _as_scan(scan: Scan | str | Path) -> Scan:
    if isinstance(scan, Scan):
        return scan
    return pio.discover_scans([scan])[0]


def _row(scan: Scan, status: str, seconds: float, error: str = "", preproc: str = "",
         sha256: str = "") -> dict:
    return {
        **scan.summary_fields(),
        "status": status,
        "preprocessed_path": preproc,
        # one line per scan in summary.csv, whatever the message (a matrix, a traceback)
        "error": " ".join(line.strip() for line in error.splitlines()),
        "seconds": round(seconds, 2),
        "input_sha256": sha256,
        "note": "",
    }


def preprocess_scan(
    scan: Scan | str | Path,
    output: str | Path,
    config: PreprocessConfig | None = None,
    *,
    skip_existing: bool = True,
) -> dict:
    """Preprocess one scan into ``output`` (layout of docs/interfaces.md); never raises.

    Returns the scan's summary row: ``subject_id, session_id, acquisition_date, image_id,
    series_description, input_path, status, preprocessed_path, error, seconds`` with
    status ``done``, ``skipped``, ``failed`` (an error, named in ``error``) or
    ``failed-qc`` (a QC check refused the result: the preprocessed volume is not written,
    the QC picture and sidecar are). A scan whose outputs cannot be named on this file
    system, or one of whose outputs is its own input, fails before anything is read,
    written or removed (:mod:`.output_checks`).
    """
    config = config or PreprocessConfig()
    output = Path(output)
    start = time.perf_counter()
    try:
        scan = _as_scan(scan)
    except Exception as exc:  # noqa: BLE001 - a bad identifier is this scan's failure
        bad = Scan(str(scan), "", Path(str(scan)))
        return _row(bad, "failed", time.perf_counter() - start, f"{exc}")
    chash = settings_hash(config)
    paths = output_paths(scan, output, config)
    own = InputIndex([scan.path])
    problem = (input_collision(scan.path, paths, own)
               or name_problem(scan.path, paths, name_max(output)))
    if problem:  # refused before anything is read, written or removed
        return _row(scan, "failed", time.perf_counter() - start, problem)
    if skip_existing and is_done(scan, output, chash, config):
        return _row(scan, "skipped", time.perf_counter() - start,
                    preproc=str(paths["preproc"]), sha256=recorded_sha256(scan, output, config))
    # this scan's files from an earlier run on another grid or in the earlier layout
    earlier = bids.earlier_outputs(output, bids_label(scan.subject_id),
                                   bids_label(scan.session_id))
    from adni_pu.fileio import input_identity

    try:  # hashed before reading: the outputs are keyed by the content they came from
        identity = input_identity(scan.path)
    except OSError:  # missing or unreadable: the read step below says so
        identity = {"sha256": "", "stat": ""}
    timings: dict[str, float] = {}
    cpu_start = time.process_time()
    try:
        files, status, problems, extra = _run_steps(scan, paths, config, timings)
    except Exception as exc:  # noqa: BLE001 - one scan's failure must not stop the run
        error = (f"{exc}" if isinstance(exc, pio.ScanError)
                 else f"{scan.path}: {type(exc).__name__}: {exc}")
        seconds = time.perf_counter() - start
        side = _sidecar_base(scan, config, chash, timings, identity)
        side.update(status="failed", error=error, seconds_total=round(seconds, 2),
                    traceback=traceback.format_exc(limit=6))
        # best effort: if the disk is full the summary row still says why
        with contextlib.suppress(Exception):
            _remove_stale(paths, keep=(), spare=own, earlier=earlier)
            text = json.dumps(side, indent=2, default=_json_default)
            pio.write_outputs({paths["sidecar"]: text.encode()})
        return _row(scan, "failed", seconds, error, sha256=identity["sha256"])
    seconds = time.perf_counter() - start
    side = _sidecar_base(scan, config, chash, timings, identity)
    side.update(extra)
    side.update(settings_hash=chash, status=status, error="; ".join(problems),
                qc_problems=problems, timings_s=timings, seconds_total=round(seconds, 2),
                cpu_seconds=round(time.process_time() - cpu_start, 2))
    for kind in ("brainmask_template", "brainmask_native", "cerebellum_template",
                 "cerebellum_native"):
        if paths[kind] in files:
            files[paths[f"{kind}_json"]] = json.dumps(bids.mask_metadata(
                kind, config, scan.path, _names(paths, output)), indent=2).encode()
    if status == "done":  # the BIDS fields of the volume's sidecar come first
        side = {**bids.preproc_metadata(config, scan.path, _names(paths, output)), **side}
    # paths relative to the dataset root (the QC picture is in sub-S/figures/)
    side["outputs"] = {k: p.relative_to(output).as_posix() for k, p in paths.items()
                       if p in files or k == "sidecar"}
    files[paths["sidecar"]] = json.dumps(side, indent=2, default=_json_default).encode()
    try:
        _remove_stale(paths, keep=tuple(files), spare=own, earlier=earlier)
        pio.write_outputs(files, last=[paths["sidecar"]])
    except Exception as exc:  # noqa: BLE001 - full disk, permission denied, ...
        with contextlib.suppress(OSError):  # an older sidecar must not vouch for this scan
            paths["sidecar"].unlink(missing_ok=True)
        error = f"{paths['sidecar'].parent}: cannot write outputs ({type(exc).__name__}: {exc})"
        return _row(scan, "failed", time.perf_counter() - start, error,
                    sha256=identity["sha256"])
    preproc = str(paths["preproc"]) if status == "done" else ""
    return _row(scan, status, seconds, "; ".join(problems), preproc, identity["sha256"])


def _json_default(obj: object) -> object:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    return str(obj)


def _names(paths: dict[str, Path], output: Path) -> dict[str, str]:
    return {k: p.relative_to(output).as_posix() for k, p in paths.items()}


def _remove_stale(paths: dict[str, Path], keep: tuple[Path, ...],
                  spare: InputIndex | None = None, earlier: Iterable[Path] = ()) -> None:
    """Delete earlier outputs of this scan that this run does not rewrite (``earlier``: its
    files under other names, :func:`.derivatives.earlier_outputs`); never a path that is an
    input in ``spare`` (checked up front too: this is the last guard)."""
    for p in dict.fromkeys([*paths.values(), *earlier]):
        if p not in keep and p.exists() and (spare is None or spare.find(p) is None):
            p.unlink()


def _sidecar_base(scan: Scan, config: PreprocessConfig, chash: str, timings: dict,
                  identity: dict[str, str]) -> dict:
    from adni_pu import config as cfgmod
    from adni_pu.provenance import package_versions

    return {
        "scan_label": scan.label,
        **scan.summary_fields(),
        "input_sha256": identity["sha256"],
        "input_stat": identity["stat"],
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "settings_hash": chash,
        "settings": {k: v for k, v in cfgmod.to_dict(config).items() if k != "runner"},
        "versions": package_versions(),
        "timings_s": timings,
    }


def _run_steps(scan: Scan, paths: dict[str, Path], config: PreprocessConfig,
               timings: dict[str, float]) -> tuple[dict[Path, bytes], str, list[str], dict]:
    import nibabel as nib

    from adni_pu import atlas

    from . import registration as R
    from .cerebellum import cerebellum_mask_cached as cerebellum_mask
    from .intensity import intensity_floor, normalise
    from .n4 import head_mask, n4_correct
    from .qc import (
        brain_noise,
        mask_edge_contrast,
        mask_edge_offset_mm,
        qc_checks,
        qc_picture,
        registration_metrics,
    )
    from .skullstrip import skull_strip

    with _timed(timings, "read"):
        raw, native_affine = pio.load_scan(scan.path, config.validation)
    with _timed(timings, "reorient"):
        if config.reorient:
            data, affine = pio.to_canonical(raw, native_affine)
        else:
            data, affine = raw, native_affine
        data = np.asarray(data, dtype=np.float32)
        # air reads 0 from here on: N4's model is multiplicative, and the brain is filled
        # out with 0 before resampling, so an offset in the file (x * 10 - 1000) would
        # change both; on a scan whose air is 0 already this changes nothing
        floor = intensity_floor(data)
        if floor:
            data = data - np.float32(floor)
    spacing = tuple(float(s) for s in np.sqrt((affine[:3, :3] ** 2).sum(axis=0)))
    voxel_ml = float(np.prod(spacing)) / 1000.0
    with _timed(timings, "n4"):
        head = head_mask(data)
        if config.n4.enabled:
            corrected, field = n4_correct(data, spacing, config.n4, mask=head)
        else:
            corrected, field = data, np.ones_like(data)
    with _timed(timings, "skullstrip"):
        brain = skull_strip(corrected, affine, config.skullstrip, config.registration)
    metrics: dict[str, float] = {
        "brain_volume_ml": round(float(brain.sum()) * voxel_ml, 1),
        "head_volume_ml": round(float(head.sum()) * voxel_ml, 1),
    }
    metrics["brain_fraction_of_head"] = round(
        metrics["brain_volume_ml"] / max(metrics["head_volume_ml"], 1e-9), 4)
    with _timed(timings, "qc_mask"):
        metrics["mask_edge_contrast"] = round(mask_edge_contrast(corrected, brain, spacing), 4)
        metrics["mask_edge_offset_mm"] = round(mask_edge_offset_mm(corrected, brain, spacing), 2)
        metrics["brain_noise"] = round(brain_noise(corrected, brain, spacing), 4)
    side: dict = {}
    side["input"] = {
        "shape": list(raw.shape), "spacing_mm": [round(s, 4) for s in spacing],
        "orientation": "".join(nib.aff2axcodes(native_affine)),
        "intensity_floor": round(floor, 4),
    }
    problems = qc_checks(metrics, config.qc)
    if problems:  # an empty or implausible mask: do not register garbage
        side["qc"] = metrics
        png = qc_picture(corrected, brain, np.zeros_like(brain), None, None,
                         f"{scan.label}  FAILED QC: {'; '.join(problems)}", config.qc, spacing)
        return {paths["qc"]: png}, "failed-qc", problems, side

    with _timed(timings, "registration"):
        reg = R.register_to_template(corrected, affine, config.registration, mask=brain)
    try:
        grid_shape = tuple(int(n) for n in config.grid.shape)
        grid = atlas.model_grid_affine(config.grid.spacing_mm, grid_shape)
        with _timed(timings, "cerebellum"):
            cer_t = (cerebellum_mask(grid, grid_shape, config.cerebellum)
                     if config.cerebellum.enabled else np.zeros(grid_shape, bool))
            if config.cerebellum.enabled:
                t1 = atlas.load_template("t1")
                cer_1mm = cerebellum_mask(t1.affine, t1.shape[:3], config.cerebellum)
                cer_n = R.warp_to_native(cer_1mm.astype(np.float32), t1.affine, reg, affine,
                                         data.shape, "linear") > 0.5
                cer_n &= brain
            else:
                cer_n = np.zeros_like(brain)
        with _timed(timings, "resample"):
            brain_t = R.warp_to_template(brain.astype(np.float32), affine, reg, grid,
                                         grid_shape, "linear") > 0.5
            interp = "linear" if config.grid.interpolation == "linear" else "bSpline"
            vol = R.warp_to_template(np.where(brain, corrected, 0), affine, reg, grid,
                                     grid_shape, interp)
        with _timed(timings, "intensity"):
            keep = brain_t & ~cer_t
            pre = normalise(vol, keep, config.intensity)
        template_to_native = reg.template_to_native
        reg_files = dict(reg.files)
    finally:
        R.cleanup(reg)

    with _timed(timings, "qc"):
        in_brain = field[brain]
        metrics.update(registration_metrics(corrected, brain, affine, template_to_native,
                                            config.registration.resolution_mm))
        similarity = metrics["registration_similarity"]
        metrics.update(
            cerebellum_volume_ml=round(float(cer_n.sum()) * voxel_ml, 1),
            cerebellum_fraction_of_brain=round(float(cer_n.sum()) / max(float(brain.sum()), 1), 4),
            template_brain_volume_ml=round(float(brain_t.sum()) * config.grid.spacing_mm**3 / 1000, 1),
            bias_field_min=round(float(in_brain.min()), 4) if in_brain.size else 1.0,
            bias_field_max=round(float(in_brain.max()), 4) if in_brain.size else 1.0,
        )
        problems = qc_checks(metrics, config.qc)
        status = "failed-qc" if problems else "done"
        title = f"{scan.label}  brain {metrics['brain_volume_ml']:.0f} ml  sim {similarity:.2f}"
        if problems:
            title += "  FAILED QC: " + "; ".join(problems)
        png = qc_picture(corrected, brain, cer_n, pre, _template_outline(
            float(config.grid.spacing_mm), grid_shape), title, config.qc, spacing)
    side["qc"] = metrics
    side["transform"] = {
        "file": paths["affine"].name,
        "convention": "ANTs/ITK affine (LPS): apply with ants.apply_transforms(fixed=template, "
                      "moving=native, transformlist=[file]) to bring the native scan to template "
                      "space; as points it maps template (fixed) mm to native (moving) mm",
        "template_to_native_ras": np.round(template_to_native, 6).tolist(),
        "native_to_template_ras": np.round(np.linalg.inv(template_to_native), 6).tolist(),
        "template": bids.TEMPLATE_TEXT,
    }
    to_native = functools.partial(pio.from_canonical, canonical_affine=affine,
                                  native_affine=native_affine)
    files: dict[Path, bytes] = {paths["qc"]: png, paths["affine"]: reg_files["affine.mat"]}
    if "warp.nii.gz" in reg_files:
        files[paths["warp"]] = reg_files["warp.nii.gz"]
    if status == "done":
        files[paths["preproc"]] = pio.nifti_bytes(pre, grid, np.float32, mni=True)
    files[paths["brainmask_template"]] = pio.nifti_bytes(brain_t, grid, np.uint8, mni=True)
    files[paths["cerebellum_template"]] = pio.nifti_bytes(cer_t, grid, np.uint8, mni=True)
    files[paths["brainmask_native"]] = pio.nifti_bytes(to_native(brain), native_affine, np.uint8)
    files[paths["cerebellum_native"]] = pio.nifti_bytes(to_native(cer_n), native_affine, np.uint8)
    return files, status, problems, side

"""``adni-pu interpret``: maps of what the run's selected model looks at, on the model grid.

:func:`interpret_run` computes one attribution map per scan of a manifest split
(:mod:`adni_pu.interpret.maps`: ``gradcam``, ``occlusion`` or ``gradients``) and writes
``RUN/interpret-<split>-<method>/`` (or ``out``)::

    maps/sub-<s>_ses-<t>_<method>.nii.gz  one map per scan, on the preprocessed volumes' grid
    randomised/...                    the first subjects' maps from the re-initialised network
    group-<group>_<method>.nii.gz     mean over subjects (a subject: the mean of its scans) for
                                      all subjects and each group of evaluate's report
    analysis_mask.nii.gz              template brain, cerebellum off, inside the model's crop
    scans.csv                         one row per scan: group, logit, map file, shares
    overlay.png                       group maps in three planes over the MNI template
    regions.csv, regions.md           AAL regions by share of the map's mass, per group
    interpret.json                    method, settings, versions, timing, sanity checks

The split is only described, never used to choose anything: the method, its settings and
the layers are fixed before a map is computed. When ``RUN/evaluation/<split>/report.md``
exists its "What the model looks at" section is rewritten to link these outputs (and
``adni-pu evaluate`` writes the section when it finds them).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from adni_pu.errors import ConfigError, VolumeRunError
from adni_pu.fileio import atomic_write, atomic_write_text, check_out_dir

REPORT_MARKER = "<!-- adni-pu interpret: generated section -->"
SIGNED = {"gradcam": True, "occlusion": True, "gradients": False}


def grid_atlas(data: Any) -> tuple[np.ndarray, np.ndarray]:
    """The MNI template and the AAL labels on the run's grid (resampled once)."""
    from adni_pu import atlas
    from adni_pu.interpret.stats import aal_labels_on

    affine, shape = data.grid_affine(), tuple(data.grid_shape)
    return atlas.resample_to(atlas.load_template("t1"), affine, shape), \
        aal_labels_on(affine, shape)


def analysis_mask(data: Any, template: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The voxels whose map mass is counted: the MNI template's brain without the cerebellum
    (which preprocessing removes), inside the crop the model sees (grid-shaped bool)."""
    from adni_pu import atlas

    brain = (template > 0) & ~np.isin(labels, atlas.region_values(atlas.CEREBELLUM_REGIONS))
    crop = np.zeros(brain.shape, dtype=bool)
    crop[tuple(slice(o, o + c) for o, c in zip(data.crop_origin(), data.crop_shape))] = True
    return brain & crop


def hippocampus_mask(labels: np.ndarray) -> np.ndarray:
    """AAL Hippocampus_L and Hippocampus_R (bool, on the grid of ``labels``)."""
    from adni_pu import atlas

    return np.isin(labels, atlas.region_values(atlas.HIPPOCAMPUS_LEFT
                                               + atlas.HIPPOCAMPUS_RIGHT))


def randomised_copy(model: Any, seed: int = 0) -> Any:
    """The same network with every layer re-initialised (its own initialiser, seeded), BN
    statistics reset: the model-randomisation check's reference."""
    import copy

    import torch

    fresh = copy.deepcopy(model)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        for module in fresh.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
            if hasattr(module, "reset_running_stats"):
                module.reset_running_stats()
    finally:
        torch.random.set_rng_state(state)
    return fresh.eval()


def _nifti_writer(data: np.ndarray, affine: np.ndarray):
    from adni_pu.preprocessing.io import nifti_bytes

    payload = nifti_bytes(data, affine, np.float32, mni=True)
    return lambda tmp: tmp.write_bytes(payload)


def _save_map(path: Path, data: np.ndarray, affine: np.ndarray) -> Path:
    return atomic_write(path, _nifti_writer(data, affine))


def _file_stem(subject: str, session: str, used: set[str]) -> str:
    """``sub-<subject>_ses-<session>`` (letters and digits only), unique within ``used``."""
    clean = [re.sub(r"[^A-Za-z0-9]+", "", v) for v in (subject, session)]
    stem = base = "_".join(f"{k}-{v}" for k, v in zip(("sub", "ses"), clean) if v)
    n = 1
    while stem in used:
        n += 1
        stem = f"{base}_run-{n}"
    used.add(stem)
    return stem


def _scan_path(value: Any, manifest: Path) -> Path:
    path = Path(str(value))
    return path if path.is_absolute() else manifest.parent / path


def _stale(out_dir: Path, stage: Path, method: str) -> list[Path]:
    """Maps of this method in ``out_dir`` that this run (staged in ``stage``) does not
    write: an earlier run's of other scans or groups, removed when this run commits."""
    pattern = f"*_{method}.nii.gz"
    found = [p for folder in ("maps", "randomised") for p in (out_dir / folder).glob(pattern)
             if not (stage / folder / p.name).exists()]
    return found + [p for p in out_dir.glob(f"group-{pattern}")
                    if not (stage / p.name).exists()]


def interpret_run(run_dir: str | Path, split: str = "test", method: str = "gradcam",
                  out: str | Path | None = None, manifest: str | Path | None = None,
                  device: str = "auto", settings: Any = None, sanity_subjects: int = 3,
                  n_boot: int = 1000, log: Any = None) -> dict[str, Any]:
    """Attribution maps of every scan of ``split``, group means, overlay, region table and
    sanity checks (see the module docstring); returns the interpret.json record.

    ``sanity_subjects``: how many subjects (first by id) also get a map from the
    re-initialised network, for the randomisation rank correlation (0 skips it).

    Holds the lock of the output folder (:mod:`adni_pu.locking`), refuses a folder that
    holds another command's outputs (a run folder, an evaluation), and writes every file
    into a hidden folder inside it first, moved into place only once all are written: an
    interrupted or failed run leaves the folder as it was, never maps of two runs.
    """
    from adni_pu.fileio import commit_staged, staged_folder
    from adni_pu.locking import output_lock
    from adni_pu.workflows.run_folder import claim_folder

    run_dir = Path(run_dir)
    out_dir = check_out_dir(out if out is not None else run_dir / f"interpret-{split}-{method}",
                            "the interpretation maps")
    claim_folder(out_dir, "interpret")
    with output_lock(out_dir, "interpret"), staged_folder(out_dir, "interpret") as stage:
        record = _interpret(run_dir, split, method, stage, manifest, device, settings,
                            sanity_subjects, n_boot, log)
        record["files"] = {k: str(out_dir / Path(v).name) for k, v in record["files"].items()}
        atomic_write_text(stage / "interpret.json", json.dumps(_jsonable(record), indent=2)
                          + "\n")
        commit_staged(stage, out_dir, _stale(out_dir, stage, method))
    record["report"] = update_report(run_dir, split)
    return record


def _interpret(run_dir: Path, split: str, method: str, out_dir: Path,
               manifest: str | Path | None, device: str, settings: Any, sanity_subjects: int,
               n_boot: int, log: Any) -> dict[str, Any]:
    """:func:`interpret_run`'s work, every file written into ``out_dir`` (the stage); the
    record is returned, and written by the caller."""
    import pandas as pd
    import torch

    from adni_pu.data.grid_check import check_header
    from adni_pu.interpret.grid_model import GridModel, load_grid_volume
    from adni_pu.interpret.maps import METHODS, MapSettings, attribution_map
    from adni_pu.interpret.stats import GROUPS, rank_correlation, region_share, subject_group
    from adni_pu.provenance import machine_description, package_versions
    from adni_pu.workflows.run_folder import load_manifest, load_run, manifest_file

    if method not in METHODS:
        raise VolumeRunError(f"--method: expected one of {', '.join(METHODS)}, found {method!r}")
    settings = settings or MapSettings()
    if n_boot < 1:
        raise ConfigError(f"--bootstrap {n_boot}: expected at least 1 resample")
    say = log or (lambda _m: None)
    cfg, model, info = load_run(run_dir, device)
    mpath = manifest_file(manifest if manifest is not None else info["manifest"])
    frame = load_manifest(mpath)
    rows = frame[frame["split"] == split].reset_index(drop=True)
    if rows.empty:
        raise VolumeRunError(f"{mpath}: no rows in split {split!r}; splits found: "
                             f"{sorted(set(frame['split']))}")
    rows = rows.sort_values(["subject_id", "session_id"], kind="stable").reset_index(drop=True)
    data = cfg.data
    if settings.patch > min(data.crop_shape):
        raise ConfigError(f"--patch {settings.patch}: expected at most the crop's smallest "
                          f"side, {min(data.crop_shape)} voxels")
    paths = [_scan_path(v, mpath) for v in rows["scan_path"]]
    for path in paths:  # every scan's header before the first map: no half-finished run
        check_header(path, tuple(data.grid_shape) if data.check_grid else None)
    affine = data.grid_affine()
    shape = tuple(data.grid_shape)
    template, labels = grid_atlas(data)
    mask = analysis_mask(data, template, labels)
    hipp = hippocampus_mask(labels) & mask
    grid_model = GridModel(model, data)
    subjects = list(dict.fromkeys(rows["subject_id"]))
    sanity_ids = set(subjects[:max(sanity_subjects, 0)])
    random_model = GridModel(randomised_copy(model, settings.seed), data) if sanity_ids else None

    sums = {g: np.zeros(shape, np.float64) for g in ("all", *GROUPS)}
    # a group's mass map: the mean of its subjects' |map| (the group mean, for maps >= 0)
    abs_sums = {g: np.zeros(shape, np.float64) for g in sums} if SIGNED[method] else sums
    counts = dict.fromkeys(sums, 0)
    positives: list[np.ndarray] = []  # subject maps inside the mask, for the bootstrap
    records: list[dict[str, Any]] = []
    correlations: list[dict[str, Any]] = []
    cpu_times: list[float] = []
    wall_times: list[float] = []
    used: set[str] = set()
    start_all = time.perf_counter()
    for n_subject, subject in enumerate(subjects, 1):
        scans = rows[rows["subject_id"] == subject]
        subject_sum = np.zeros(shape, np.float64)
        truth = float(pd.to_numeric(scans["truth"], errors="coerce").astype(float).iloc[0])
        pu = int(pd.to_numeric(scans["pu_label"], errors="coerce").fillna(0).max())
        group = subject_group(pu, truth)
        for i, row in scans.iterrows():
            volume, _ = load_grid_volume(paths[i], data)
            brain = volume != 0
            cpu0, wall0 = time.process_time(), time.perf_counter()
            heat = attribution_map(method, grid_model, volume, brain, settings)
            cpu_times.append(time.process_time() - cpu0)
            wall_times.append(time.perf_counter() - wall0)
            with torch.no_grad():
                logit = float(grid_model(torch.as_tensor(volume)[None, None].to(
                    grid_model._device()))[0, 0])
            stem = _file_stem(str(row["subject_id"]), str(row["session_id"]), used)
            _save_map(out_dir / "maps" / f"{stem}_{method}.nii.gz", heat, affine)
            absolute = np.abs(heat[mask])
            total = float(absolute.sum())
            record = {"subject_id": row["subject_id"], "session_id": row["session_id"],
                      "scan_path": row["scan_path"], "group": group, "pu_label": pu,
                      "truth": truth, "logit": logit,
                      "probability": 1.0 / (1.0 + math.exp(-logit)),
                      "map": f"maps/{stem}_{method}.nii.gz",
                      "hippocampal_share": float(np.abs(heat[hipp]).sum() / total)
                      if total > 0 else float("nan"),
                      "cpu_seconds": round(cpu_times[-1], 3)}
            if subject in sanity_ids and random_model is not None:
                other = attribution_map(method, random_model, volume, brain, settings)
                _save_map(out_dir / "randomised" / f"{stem}_{method}.nii.gz", other, affine)
                rho = rank_correlation(heat, other, mask)
                other_total = float(np.abs(other[mask]).sum())
                other_share = (float(np.abs(other[hipp]).sum() / other_total)
                               if other_total > 0 else float("nan"))
                correlations.append({"subject_id": subject, "session_id": row["session_id"],
                                     "spearman": rho,
                                     "hippocampal_share": record["hippocampal_share"],
                                     "hippocampal_share_randomised": other_share})
                record["randomised_spearman"] = rho
                record["randomised_hippocampal_share"] = other_share
            records.append(record)
            subject_sum += heat
            say(f"[{n_subject}/{len(subjects)}] {subject} {row['session_id']}: "
                f"{cpu_times[-1]:.1f} CPU s")
        subject_map = subject_sum / len(scans)
        for g in ("all", group):
            sums[g] += subject_map
            if abs_sums is not sums:
                abs_sums[g] += np.abs(subject_map)
            counts[g] += 1
        if group in ("labelled_positive", "hidden_positive"):
            positives.append(np.abs(subject_map[mask]).astype(np.float32))

    group_maps = {g: (sums[g] / counts[g]).astype(np.float32) for g in sums if counts[g]}
    mass_maps = {g: (abs_sums[g] / counts[g]).astype(np.float32) for g in sums if counts[g]}
    for g, vol in group_maps.items():
        _save_map(out_dir / f"group-{g}_{method}.nii.gz", vol, affine)
    _save_map(out_dir / "analysis_mask.nii.gz", mask.astype(np.float32), affine)
    atomic_write_text(out_dir / "scans.csv", pd.DataFrame(records).to_csv(index=False))
    tables = _region_tables(mass_maps, labels, mask, out_dir, method)
    _overlay(group_maps, counts, template, affine, mask, out_dir, method, run_dir, split)
    share = region_share(np.stack(positives) if positives else
                         np.zeros((0, int(mask.sum())), np.float32), hipp[mask], n_boot=n_boot,
                         seed=settings.seed)
    rhos = [c["spearman"] for c in correlations if np.isfinite(c["spearman"])]
    record = {
        "run": str(run_dir), "split": split, "method": method, "manifest": str(mpath),
        "settings": asdict(settings) | {"sanity_subjects": sanity_subjects,
                                        "bootstrap": n_boot},
        "signed": SIGNED[method], "explains": "the positive (amyloid) logit",
        "n_scans": len(records), "n_subjects": len(subjects),
        "groups": {g: counts[g] for g in sums},
        "grid": {"shape": list(shape), "affine": affine.tolist(),
                 "analysis_mask_voxels": int(mask.sum())},
        "sanity": {
            "randomisation": {"test": "Adebayo et al. 2018, model randomisation: Spearman "
                                      "rank correlation of |map| (trained vs re-initialised "
                                      "network) over the analysis mask",
                              "per_scan": correlations,
                              "mean": float(np.mean(rhos)) if rhos else None,
                              "hippocampal_share_trained": _mean(
                                  [c["hippocampal_share"] for c in correlations]),
                              "hippocampal_share_randomised": _mean(
                                  [c["hippocampal_share_randomised"] for c in correlations])},
            "hippocampal_share": {"group": "positives (labelled and hidden)", **share},
        },
        "top_regions": {g: t.head(5)[["region", "mass_share", "volume_share"]]
                        .to_dict("records") for g, t in tables.items()},
        "timing": {"cpu_seconds_per_scan": float(np.mean(cpu_times)),
                   "wall_seconds_per_scan": float(np.mean(wall_times)),
                   "wall_seconds_total": round(time.perf_counter() - start_all, 2),
                   "torch_threads": torch.get_num_threads(),
                   "note": "process CPU time of the map alone (the sanity maps not included)"},
        "versions": package_versions(), "machine": machine_description(),
        "files": {k: str(out_dir / v) for k, v in (
            ("overlay", "overlay.png"), ("regions_csv", "regions.csv"),
            ("regions_md", "regions.md"), ("scans", "scans.csv"),
            ("record", "interpret.json"))},
    }
    return record


def _mean(values: list[float]) -> float | None:
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else None


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


GROUP_ORDER = ("all", "labelled_positive", "hidden_positive", "unlabelled_negative",
               "unknown_truth")
SHORT = {"all": "all subjects", "labelled_positive": "labelled positives",
         "hidden_positive": "hidden positives", "unlabelled_negative": "unlabelled negatives",
         "unknown_truth": "unknown truth"}


def _label(group: str) -> str:
    from adni_pu.interpret.stats import GROUPS

    return "all subjects" if group == "all" else GROUPS[group]


def _region_tables(group_maps: dict[str, np.ndarray], labels: np.ndarray, mask: np.ndarray,
                   out_dir: Path, method: str, top: int = 10) -> dict:
    import pandas as pd

    from adni_pu.interpret.stats import region_table

    tables = {g: region_table(group_maps[g], labels, mask) for g in GROUP_ORDER
              if g in group_maps}
    long = pd.concat([t.assign(group=g, rank=np.arange(1, len(t) + 1))
                      for g, t in tables.items()], ignore_index=True)
    atomic_write_text(out_dir / "regions.csv", long[["group", "rank", "region", "mass_share",
                                                     "volume_share", "ratio", "voxels"]]
                      .to_csv(index=False))
    lines = [f"# Regions by share of the {method} map's mass", "",
             "Mass: the mean over the group's subjects of |map|, summed over the analysis "
             "mask (template brain, cerebellum off, inside the model's crop). Mass share: "
             "a region's part of it; volume share: the region's part of the mask's voxels; "
             "ratio: the two divided (1 = no more than its size). AAL regions.", ""]
    for g, t in tables.items():
        lines += [f"## {_label(g)}", "", "| rank | region | mass share | volume share | ratio |",
                  "|---|---|---|---|---|"]
        for i, r in t.head(top).iterrows():
            lines.append(f"| {i + 1} | {r['region']} | {r['mass_share']:.3f} | "
                         f"{r['volume_share']:.3f} | {r['ratio']:.2f} |")
        lines.append("")
    atomic_write_text(out_dir / "regions.md", "\n".join(lines))
    return tables


def _overlay(group_maps: dict[str, np.ndarray], counts: dict[str, int], template: np.ndarray,
             affine: np.ndarray, mask: np.ndarray, out_dir: Path, method: str, run_dir: Path,
             split: str) -> None:
    from adni_pu.interpret.figures import overlay_png

    rows = [(f"{SHORT[g]} (n = {counts[g]})", group_maps[g]) for g in GROUP_ORDER[1:]
            if g in group_maps]
    png = overlay_png(template, rows, mask, affine,
                      f"{run_dir.name}: {method} maps, split {split}", SIGNED[method])
    atomic_write(out_dir / "overlay.png", lambda tmp: tmp.write_bytes(png))


# --------------------------------------------------------------------------- evaluation report


def _records(run_dir: Path, split: str) -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for path in sorted(run_dir.glob("**/interpret.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and rec.get("split") == split:
            found.append((path.parent, rec))
    return found


def report_section(run_dir: str | Path, split: str, report_dir: str | Path) -> str:
    """The evaluation report's "What the model looks at" section: links to every
    ``adni-pu interpret`` output of ``split`` inside the run folder ("" when none)."""
    run_dir, report_dir = Path(run_dir), Path(report_dir)
    found = _records(run_dir, split)
    if not found:
        return ""
    lines = ["", REPORT_MARKER, "## What the model looks at", "",
             "Attribution maps of the selected model (`adni-pu interpret`; docs/interpret.md "
             "says what each method shows and what it cannot).", ""]
    for folder, rec in found:
        rel = Path(os.path.relpath(folder, report_dir)).as_posix()
        san = rec.get("sanity", {})
        share = san.get("hippocampal_share", {})
        rho = san.get("randomisation", {}).get("mean")
        text = f"- **{rec.get('method')}** ({rec.get('n_subjects')} subjects): " \
               f"[overlay]({rel}/overlay.png), [regions]({rel}/regions.md)"
        if share.get("share") is not None:
            ci = share.get("ci") or [None, None]
            text += (f"; positives' map mass in the hippocampi {share['share']:.3f} "
                     f"[{_fmt(ci[0])}, {_fmt(ci[1])}] vs volume share "
                     f"{share['volume_share']:.3f}")
        if rho is not None:
            text += f"; randomisation rank correlation {rho:.2f}"
            fresh = san.get("randomisation", {}).get("hippocampal_share_randomised")
            if fresh is not None:
                text += f" (re-initialised network's hippocampal share {fresh:.3f})"
        lines.append(text)
    return "\n".join(lines) + "\n"


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def update_report(run_dir: str | Path, split: str) -> str | None:
    """Rewrite the interpret section (after :data:`REPORT_MARKER`, the one part of
    evaluate's report that interpret writes) of ``RUN/evaluation/<split>/report.md`` (if
    the report exists); returns the report's path or None."""
    from adni_pu.errors import OutputLockedError
    from adni_pu.locking import output_lock

    report = Path(run_dir) / "evaluation" / split / "report.md"
    if not report.is_file():
        return None
    try:  # the report is evaluate's: rewritten only under its folder's lock
        with output_lock(report.parent, "interpret"):
            text = report.read_text()
            cut = text.find(REPORT_MARKER)
            if cut >= 0:
                text = text[:cut].rstrip("\n") + "\n"
            atomic_write_text(report, text + report_section(run_dir, split, report.parent))
    except OutputLockedError:
        return None  # evaluate is writing it now, and links the maps itself when it ends
    return str(report)

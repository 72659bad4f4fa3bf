"""Benchmark the T1 preprocessing pipeline on the real Colin27 head (../shared/data).

Measures, with the default settings (deepbet skull stripping, ANTs affine):
- native-grid brain mask Dice against ch2bet > 0;
- native-grid cerebellum mask: share of the AAL cerebellum (labels 91-116, inside the
  brain) it covers and share of the rest of the brain it takes;
- robustness: the same scan with voxel axes permuted and flipped, and with a strong
  multiplicative bias field added; Dice of their masks against the original run's;
- seconds per scan (wall and CPU) with 1 worker, per step, and scans per hour with 2.

    python -m benchmarks.preprocess_colin27 [--workdir DIR] [--out FILE.json]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import (
    COLIN27,
    add_out,
    command_line,
    dice,
    machine,
    script_parser,
    today,
    write_json,
)


def bias_field(shape: tuple[int, ...], strength: float) -> np.ndarray:
    """exp(strength * a smooth field scaled to [-1, 1])."""
    grid = np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij")
    field = np.sin(1.3 * grid[0] + 0.4) * np.cos(1.1 * grid[1] - 0.3) + 0.5 * grid[2]
    field /= np.abs(field).max()
    return np.exp(strength * field).astype(np.float32)

def _variants(workdir: Path) -> dict[str, tuple[Path, dict]]:
    """ch2 as given, axes permuted + flipped, and with a strong bias field."""
    import nibabel as nib

    img = nib.load(str(COLIN27 / "ch2.nii.gz"))
    data = np.asarray(img.dataobj, dtype=np.float32)
    out = {"original": (COLIN27 / "ch2.nii.gz", {})}
    # permute voxel axes (x,y,z) -> (z,x,y) and flip the new first axis; world unchanged
    perm = (2, 0, 1)
    pdata = np.transpose(data, perm)[::-1]
    paff = img.affine[:, list(perm) + [3]].copy()
    n0 = pdata.shape[0]
    paff[:, 3] = paff[:, 3] + paff[:, 0] * (n0 - 1)
    paff[:, 0] = -paff[:, 0]
    p = workdir / "ch2permflip.nii.gz"
    nib.save(nib.Nifti1Image(pdata, paff), str(p))
    out["permuted_flipped"] = (p, {"perm": perm, "flip_axis": 0})
    # strong bias: exp(0.4 * smooth field) -> about x0.67 .. x1.5 across the head
    b = workdir / "ch2bias.nii.gz"
    nib.save(nib.Nifti1Image((data * bias_field(data.shape, 0.4)).astype(np.float32),
                             img.affine), str(b))
    out["bias_field"] = (b, {"bias": "exp(0.4 * smooth field in [-1, 1])"})
    return out


def _outputs(out: Path, subject: str) -> dict[str, Path]:
    """The output paths of ``subject``'s scan (session 01) under ``out``."""
    from adni_pu.preprocessing import Scan, output_paths

    return output_paths(Scan(subject, "01", Path(subject)), out)


def _masks(out: Path, subject: str) -> tuple[np.ndarray, np.ndarray]:
    import nibabel as nib

    paths = _outputs(out, subject)
    b = nib.load(str(paths["brainmask_native"]))
    c = nib.load(str(paths["cerebellum_native"]))
    # bring back to ch2's voxel order through the world (they only differ by axis order)
    cb = nib.as_closest_canonical(b).get_fdata() > 0
    cc = nib.as_closest_canonical(c).get_fdata() > 0
    return cb, cc


def targets_met(results: dict) -> dict:
    """Which of the targets (the record's ``targets``) this run meets, on the original
    scan."""
    orig = results.get("per_scan", {}).get("original", {})
    out = {
        "brain_dice>=0.935": orig.get("brain_dice_vs_ch2bet", 0) >= 0.935,
        "cerebellum_coverage>=0.90": orig.get("cerebellum_coverage_of_aal", 0) >= 0.90,
        "cerebellum_share_of_rest<=0.03": orig.get("cerebellum_share_of_rest_of_brain", 1) <= 0.03,
        "wall_seconds_per_scan<=60": results.get("serial_1_worker", {}).get(
            "seconds_per_scan", 1e9) <= 60,
        "cpu_seconds_per_scan<=60": (orig.get("cpu_seconds") or 1e9) <= 60,
    }
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write the result JSON."""
    parser = script_parser(__doc__)
    parser.add_argument("--workdir", type=Path, default=None)
    add_out(parser, "preprocess-colin27.json")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-alternative", action="store_true",
                        help="do not also run skullstrip.method=template on the original")
    args = parser.parse_args(argv)
    if not COLIN27.is_dir():
        print(f"{COLIN27} not found: nothing to benchmark", file=sys.stderr)
        return 2

    import nibabel as nib

    from adni_pu.config import to_dict
    from adni_pu.preprocessing import PreprocessConfig, Scan, run_preprocessing
    from adni_pu.provenance import package_versions

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="adni_pu_bench_"))
    workdir.mkdir(parents=True, exist_ok=True)
    variants = _variants(workdir)
    scans = [Scan(f"ch2{name.replace('_', '')}", "01", path) for name, (path, _) in variants.items()]
    cfg = PreprocessConfig()

    out1 = workdir / "serial"
    t0 = time.perf_counter()
    summary1 = run_preprocessing(scans, out1, cfg, workers=1, progress=False)
    serial_wall = time.perf_counter() - t0

    ref = nib.as_closest_canonical(nib.load(str(COLIN27 / "ch2bet.nii.gz"))).get_fdata() > 0
    aal = np.asarray(nib.as_closest_canonical(nib.load(str(COLIN27 / "aal.nii.gz"))).dataobj)
    cer_ref = (aal >= 91) & (aal <= 116) & ref
    rest = ref & ~cer_ref
    results: dict = {"per_scan": {}}
    masks = {}
    for scan, (name, _) in zip(scans, variants.items()):
        row = summary1[summary1.subject_id == scan.subject_id].iloc[0]
        sid = scan.subject_id
        side = json.loads(_outputs(out1, sid)["sidecar"].read_text())
        entry = {"status": row.status, "seconds_wall": float(row.seconds),
                 "timings_s": side.get("timings_s"), "cpu_seconds": side.get("cpu_seconds"),
                 "qc": side.get("qc")}
        if row.status == "done":
            b, c = _masks(out1, scan.subject_id)
            masks[name] = (b, c)
            entry.update(
                brain_dice_vs_ch2bet=round(dice(b, ref), 4),
                cerebellum_coverage_of_aal=round(float((c & cer_ref).sum() / cer_ref.sum()), 4),
                cerebellum_share_of_rest_of_brain=round(float((c & rest).sum() / rest.sum()), 4),
            )
        results["per_scan"][name] = entry
    if "original" in masks:
        ob, oc = masks["original"]
        results["robustness_dice_vs_original"] = {
            name: {"brain": round(dice(b, ob), 4), "cerebellum": round(dice(c, oc), 4)}
            for name, (b, c) in masks.items() if name != "original"}
    results["serial_1_worker"] = {
        "scans": len(scans), "wall_seconds": round(serial_wall, 1),
        "seconds_per_scan": round(serial_wall / len(scans), 1)}
    if not args.skip_throughput:
        out2 = workdir / "parallel"
        t0 = time.perf_counter()
        summary2 = run_preprocessing(scans, out2, cfg, workers=2, threads_per_worker=1,
                                     progress=False)
        wall = time.perf_counter() - t0
        results["parallel_2_workers"] = {
            "scans": len(scans), "done": int((summary2.status == "done").sum()),
            "wall_seconds": round(wall, 1),
            "scans_per_hour": round(3600 * len(scans) / wall, 1)}
    if not args.skip_alternative:
        from dataclasses import replace

        alt_cfg = replace(cfg, skullstrip=replace(cfg.skullstrip, method="template"))
        out3 = workdir / "template"
        alt = run_preprocessing(scans[:1], out3, alt_cfg, workers=1, progress=False)
        entry = {"status": alt.status[0], "seconds_wall": float(alt.seconds[0])}
        if alt.status[0] == "done":
            b, c = _masks(out3, scans[0].subject_id)
            sid = scans[0].subject_id
            side = json.loads(_outputs(out3, sid)["sidecar"].read_text())
            entry.update(
                brain_dice_vs_ch2bet=round(dice(b, ref), 4),
                cpu_seconds=side.get("cpu_seconds"), timings_s=side.get("timings_s"),
                cerebellum_coverage_of_aal=round(float((c & cer_ref).sum() / cer_ref.sum()), 4),
                cerebellum_share_of_rest_of_brain=round(float((c & rest).sum() / rest.sum()), 4))
        results["alternative_skullstrip_template"] = entry
    results["targets_met"] = targets_met(results)
    record = {
        "benchmark": "preprocess-colin27",
        "command": command_line(__file__, argv),
        "date": today(),
        "machine": machine(" (shared with other jobs while measured: wall times are "
                           "inflated; cpu_seconds is the process CPU time)"),
        "data": "Colin27 (mricron-data): ch2.nii.gz, ch2bet.nii.gz > 0 as reference, aal.nii.gz "
                "labels 91-116 as the cerebellum",
        "settings": {k: v for k, v in to_dict(cfg).items() if k != "runner"},
        "versions": package_versions(),
        "targets": {"brain_dice": ">= 0.935", "cerebellum_coverage": ">= 0.90",
                    "cerebellum_share_of_rest": "<= 0.03", "seconds_per_scan": "<= 60"},
        "results": results,
    }
    write_json(args.out, record)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

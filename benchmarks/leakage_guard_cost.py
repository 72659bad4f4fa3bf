"""What the leakage guard costs: file hashes alone vs with the decoded-image key, cold.

    python benchmarks/leakage_guard_cost.py --volumes 935 --work /tmp/leakage-guard-cost

Writes ``--volumes`` synthetic model-grid volumes (121 x 145 x 121, int16, ``.nii.gz`` at
nibabel's compression level: the MNI template with a per-volume gain and noise, as the
tests' tiny cohort; each volume distinct, so no file hash repeats) under ``--work``
(outside the repository; removed afterwards, unless ``--keep``; a folder kept by an earlier
call is reused), then times the guard's two passes over all of them, each cold: every
file's pages are dropped from the page cache (``posix_fadvise(DONTNEED)``) before each
pass, and each pass starts with empty in-process caches. Wall-clock and CPU seconds (this
process) are both recorded: on a shared machine the CPU seconds are the steadier measure.

- ``file hashes``: :func:`adni_pu.cohort.leakage.content_key` of each file (SHA-256 of its
  bytes), what the guard did before image keys;
- ``file hashes + image keys``: :func:`adni_pu.cohort.leakage.scan_table` of a manifest of
  the volumes (SHA-256 first, then :func:`adni_pu.data.image_identity.image_key` of each
  distinct file), what ``train``, ``evaluate`` and ``cohort build`` now run.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from benchmarks.common import add_out, command_line, results_record, script_parser, write_json


def write_volumes(folder: Path, n: int) -> list[Path]:
    """``n`` model-grid T1-like volumes (the MNI template, a per-volume gain and noise)."""
    import nibabel as nib
    import numpy as np

    from adni_pu import atlas

    affine = atlas.model_grid_affine()
    t1 = atlas.resample_to(atlas.load_template("t1"), affine,
                           atlas.MODEL_GRID_SHAPE).astype(np.float32)
    brain = t1 > 0
    rng = np.random.default_rng(0)
    noise = [rng.normal(0, 3, t1.shape).astype(np.float32) * brain for _ in range(8)]
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):  # each volume distinct: its own gain, one of 8 noise fields shifted
        data = t1 * np.float32(1.0 + 0.05 * rng.normal())
        data += np.roll(noise[i % 8], i // 8, axis=0)
        path = folder / f"sub-{i:04d}_desc-preproc_T1w.nii.gz"
        nib.save(nib.Nifti1Image(data.astype(np.int16), affine), path)
        paths.append(path)
    return paths


def drop_cache(paths: list[Path]) -> None:
    """Drop the files' pages from the page cache, so the next read comes from disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed_passes(paths: list[Path]) -> dict[str, dict[str, float]]:
    """Wall-clock and CPU seconds of the guard's file-hash pass and of its full pass
    (hashes + image keys)."""
    import pandas as pd

    from adni_pu.cohort.leakage import content_key, scan_table

    drop_cache(paths)
    start, cpu = time.perf_counter(), time.process_time()
    keys = [content_key(p.resolve()) for p in paths]
    hashes = (time.perf_counter() - start, time.process_time() - cpu)
    frame = pd.DataFrame({"subject_id": [f"{i:03d}_S_{i:04d}" for i in range(len(paths))],
                          "session_id": "bl", "scan_path": [p.name for p in paths],
                          "split": "train"})
    drop_cache(paths)
    start, cpu = time.perf_counter(), time.process_time()
    table = scan_table(frame, paths[0].parent)
    full = (time.perf_counter() - start, time.process_time() - cpu)
    assert list(table["sha256"]) == keys and table["image_key"].str.startswith("image:").all()
    n = len(paths)
    return {what: {"file_hashes_s": round(hashes[i], 2),
                   "file_hashes_and_image_keys_s": round(full[i], 2),
                   "image_keys_s": round(full[i] - hashes[i], 2),
                   "file_hash_ms_per_volume": round(1000 * hashes[i] / n, 1),
                   "file_hash_and_image_key_ms_per_volume": round(1000 * full[i] / n, 1),
                   "ratio": round(full[i] / hashes[i], 1)}
            for i, what in enumerate(("wall", "cpu"))}


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--volumes", type=int, default=935, help="how many volumes")
    parser.add_argument("--work", type=Path, default=Path("/tmp/leakage-guard-cost"),
                        help="folder for the synthetic volumes (removed afterwards)")
    parser.add_argument("--keep", action="store_true", help="keep the volumes for a rerun")
    add_out(parser, "leakage-guard-cost.json")
    args = parser.parse_args()
    from adni_pu.atlas import MODEL_GRID_SHAPE

    names = [f"sub-{i:04d}_desc-preproc_T1w.nii.gz" for i in range(args.volumes)]
    reuse = args.work.is_dir() and all((args.work / n).is_file() for n in names)
    if args.work.exists() and not reuse:
        raise SystemExit(f"{args.work}: exists; give a new folder with --work")
    try:
        start = time.perf_counter()
        paths = ([args.work / n for n in names] if reuse
                 else write_volumes(args.work, args.volumes))
        write_s = None if reuse else round(time.perf_counter() - start, 1)
        size = sum(p.stat().st_size for p in paths)
        times = timed_passes(paths)
    finally:
        if not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)
    n = len(paths)
    results = {**times, "volumes_written_s": write_s,
               "mean_file_mib": round(size / n / 2**20, 2)}
    record = results_record(
        "leakage-guard-cost", command_line(__file__),
        f"{n} synthetic model-grid volumes {'x'.join(map(str, MODEL_GRID_SHAPE))}, int16, "
        ".nii.gz (the MNI template with per-volume gain and noise)", results,
        settings={"volumes": n, "cold": "page cache dropped per file (posix_fadvise "
                  "DONTNEED) before each pass; empty in-process caches",
                  "threads": "one process, numpy/zlib single-threaded"})
    record["machine"] = "2-core CPU, shared"  # with other helpers' jobs: times are upper bounds
    record["load_average_after"] = [round(v, 1) for v in os.getloadavg()]
    write_json(args.out, record)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

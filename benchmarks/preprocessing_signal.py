"""How much of the synthetic hippocampal atrophy signal survives real preprocessing.

The generator can write, beside each raw scan, the volume a perfect preprocessing would
give (``ideal_preprocessed``: model grid, skull off, pose undone). This script generates a
cohort with those volumes, preprocesses the raw scans with the real pipeline, and compares
the two on the hippocampus boxes the CNN reads:

- ``auc_ad`` / ``auc_amyloid``: AUC of a simple atrophy score (minus the share of voxels
  brighter than the scan's brain median, summed over both boxes) for AD against everyone
  else, and for amyloid status, on ideal and on preprocessed volumes;
- ``score_correlation``: correlation of that score between ideal and preprocessed volumes;
- ``box_correlation`` and ``residual_shift_mm``: per scan, the correlation of the left box
  between the two volumes at the shift (whole voxels, +-4) that maximises it, and that
  shift's length: what registration leaves misaligned.

Usage (one variant per call; each writes ``benchmarks/results/preprocessing-signal-NAME.json``)::

    python benchmarks/preprocessing_signal.py --name 3mm-fast --voxel 3 --fast
    python benchmarks/preprocessing_signal.py --name 3mm-default --voxel 3
    python benchmarks/preprocessing_signal.py --name 2mm-fast --voxel 2 --fast

The cohort uses the demo's synthetic settings (``adni_pu.workflows.demo.DemoSettings.synth``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from benchmarks.common import REPO, RESULTS, command_line, script_parser, write_json


def _scan_pairs(synth: Path, prep: Path):
    """(truth row, preprocessed path, ideal path) for every scan preprocessed successfully."""
    import pandas as pd

    truth = pd.read_csv(synth / "truth.csv").set_index("participant_id")
    scans = pd.read_csv(synth / "truth_scans.csv")
    done = pd.read_csv(prep / "summary.csv")
    done = done[done["status"].isin(["done", "skipped"])]
    real = {f"sub-{r.subject_id}": Path(r.preprocessed_path) for r in done.itertuples()}
    for row in scans.itertuples():
        if row.participant_id in real:
            yield truth.loc[row.participant_id], real[row.participant_id], \
                synth / row.ideal_preprocessed_path


def _best_shift(a: np.ndarray, b: np.ndarray, box: tuple[slice, ...], reach: int = 4
                ) -> tuple[float, float]:
    """Highest correlation of ``a`` shifted by whole voxels against ``b`` in ``box``."""
    ref = b[box].ravel()
    best, shift = -2.0, (0, 0, 0)
    for d in np.ndindex(2 * reach + 1, 2 * reach + 1, 2 * reach + 1):
        d = tuple(int(x) - reach for x in d)
        moved = tuple(slice(s.start + o, s.stop + o) for s, o in zip(box, d))
        c = float(np.corrcoef(a[moved].ravel(), ref)[0, 1])
        if c > best:
            best, shift = c, d
    return best, float(np.linalg.norm(shift))


def measure(synth: Path, prep: Path) -> dict:
    """The comparison described in the module docstring."""
    import nibabel as nib
    from sklearn.metrics import roc_auc_score

    from adni_pu.data.volume_boxes import hippocampus_boxes
    from adni_pu.data.volumes import VolumeDataConfig

    cfg = VolumeDataConfig()
    origin = cfg.crop_origin()
    boxes = {k: tuple(slice(o + s.start, o + s.stop) for o, s in zip(origin, box))
             for k, box in hippocampus_boxes(cfg).items()}
    rows = []
    for subject, real_path, ideal_path in _scan_pairs(synth, prep):
        real = np.asarray(nib.load(real_path).dataobj, dtype=np.float32)
        ideal = np.asarray(nib.load(ideal_path).dataobj, dtype=np.float32)
        score = {}
        for name, vol in (("real", real), ("ideal", ideal)):
            median = np.median(vol[vol > 0])
            score[name] = -sum(float((vol[b] > median).mean()) for b in boxes.values())
        corr, shift = _best_shift(real, ideal, boxes["hipp_l"])
        rows.append({"ad": subject["dx_bl"] == "AD", "amyloid": subject["amyloid_positive"],
                     "real": score["real"], "ideal": score["ideal"], "corr": corr,
                     "shift": 1.5 * shift})
    ad = np.array([r["ad"] for r in rows], dtype=int)
    amyloid = np.array([r["amyloid"] for r in rows], dtype=float)
    known = ~np.isnan(amyloid)
    out: dict = {"scans": len(rows)}
    for name in ("ideal", "real"):
        s = np.array([r[name] for r in rows])
        out[f"auc_ad_{name}"] = round(float(roc_auc_score(ad, s)), 3)
        out[f"auc_amyloid_{name}"] = round(float(roc_auc_score(amyloid[known], s[known])), 3)
    out["score_correlation"] = round(float(np.corrcoef([r["real"] for r in rows],
                                                       [r["ideal"] for r in rows])[0, 1]), 3)
    corr = np.array([r["corr"] for r in rows])
    shift = np.array([r["shift"] for r in rows])
    out["box_correlation"] = {"median": round(float(np.median(corr)), 3),
                              "min": round(float(corr.min()), 3)}
    out["residual_shift_mm"] = {"median": round(float(np.median(shift)), 2),
                                "max": round(float(shift.max()), 2)}
    return out


def main() -> None:
    p = script_parser(__doc__)
    p.add_argument("--name", required=True)
    p.add_argument("--voxel", type=float, default=3.0)
    p.add_argument("--fast", action="store_true", help="the demo's fast registration settings")
    p.add_argument("--subjects", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--work", type=Path, default=REPO / "runs" / "preprocessing-signal")
    args = p.parse_args()

    from adni_pu import config as cfgmod
    from adni_pu.preprocessing import load_config, run_preprocessing
    from adni_pu.provenance import provenance
    from adni_pu.synth import SynthConfig, generate_cohort
    from adni_pu.workflows.demo import FAST_PREPROCESSING, DemoSettings

    work = args.work / args.name
    synth_cfg = cfgmod.from_dict(SynthConfig, {**DemoSettings().synth, "voxel_size": args.voxel,
                                               "ideal_preprocessed": True})
    t0 = time.perf_counter()
    generate_cohort(work / "synth", args.subjects, args.seed, synth_cfg)
    t1 = time.perf_counter()
    values = FAST_PREPROCESSING if args.fast else {"qc": {"min_brain_ml": 400.0}}
    run_preprocessing(work / "synth" / "bids", work / "prep", load_config(values=values),
                      workers=args.workers, threads_per_worker=1, progress=False)
    t2 = time.perf_counter()
    record = {
        "benchmark": "hippocampal signal: ideal vs really preprocessed synthetic volumes",
        "command": command_line(__file__),
        "subjects": args.subjects, "seed": args.seed, "voxel_mm": args.voxel,
        "preprocessing_settings": values, "synth": cfgmod.to_dict(synth_cfg),
        "seconds": {"generate": round(t1 - t0, 1), "preprocess": round(t2 - t1, 1)},
        "result": measure(work / "synth", work / "prep"), "provenance": provenance(),
    }
    path = write_json(RESULTS / f"preprocessing-signal-{args.name}.json", record, default=str)
    print(json.dumps(record["result"], indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

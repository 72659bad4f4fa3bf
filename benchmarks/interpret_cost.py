"""CPU seconds per scan of ``adni-pu interpret``'s three methods, and its two sanity checks.

One torch thread throughout (run it with ``OMP_NUM_THREADS=1``). Two measurements:

- ``full_size``: the paper CNN (preset ``paper``: 16/32 channels, FC 256) at the published
  input sizes (crop 104 x 128 x 112, brain 50^3, boxes 30^3) on one full-size model-grid
  volume (121 x 145 x 121 at 1.5 mm: the synthetic generator's ideal preprocessing), with
  the weights as initialised (the cost does not depend on them): process CPU seconds of one
  map per method (after one warm-up Grad-CAM map), occlusion also with 24-voxel blocks.
- ``tiny_run``: a synthetic cohort whose only disease effect is hippocampal atrophy
  (``cortical_atrophy = 0``, ``ventricle_enlargement_mm = 0``, ``preclinical_fraction = 0``),
  ``hippocampal_atrophy = 0.9``, ideal preprocessing, subjects split 60/20/20, every train
  and val positive labelled and half the test positives; a naive (here: supervised) run of
  the tests' tiny network (4/8 channels, FC 16, brain 24^3, boxes 16^3) is trained on it,
  evaluated on its test split, and :func:`interpret_run` maps the test split with each
  method: CPU seconds per scan, the model-randomisation rank correlation and the share of
  the positives' map mass in the hippocampi against their volume share (bootstrap CI).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/interpret_cost.py            # about 25 min CPU
    OMP_NUM_THREADS=1 python benchmarks/interpret_cost.py --subjects 30 --epochs 4 \\
        --out /tmp/interpret-cost.json                               # a quicker look

Writes ``benchmarks/results/interpret-cost-cpu.json``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.common import add_out, command_line, script_parser, write_json

METHODS = ("gradcam", "gradients", "occlusion")
TINY = {"data.brain_size": "[24, 24, 24]", "data.hipp_size": "[16, 16, 16]",
        "data.hipp_margin": "2", "train.model_args.channels": "[4, 8]",
        "train.model_args.hidden": "16"}


def synth_cohort(work: Path, n_subjects: int, seed: int, atrophy: float) -> Path:
    """Ideal-preprocessed synthetic volumes (hippocampal atrophy the only disease effect)
    and a manifest: subjects split 60/20/20 within each truth class; every positive of
    train and val labelled (the model is trained supervised: the check is about the maps,
    not about PU learning), half the test positives, so that the test split has labelled
    and hidden positives."""
    import numpy as np
    import pandas as pd

    from adni_pu import config as cfgmod
    from adni_pu.synth import SynthConfig, generate_cohort

    root = work / "synth"
    if not (root / "synth_config.toml").is_file():
        cfg = cfgmod.from_dict(SynthConfig, {
            "voxel_size": 4.0, "ideal_preprocessed": True, "write_brain_masks": False,
            "visit_probabilities": [1.0, 0.0, 0.0], "cortical_atrophy": 0.0,
            "ventricle_enlargement_mm": 0.0, "preclinical_fraction": 0.0,
            "hippocampal_atrophy": atrophy})
        generate_cohort(root, n_subjects, seed, cfg)
    summary = pd.read_csv(root / "preprocessed_ideal" / "summary.csv")
    truth = pd.read_csv(root / "truth_scans.csv")
    frame = pd.DataFrame({"subject_id": truth["subject_id"], "session_id": truth["session_id"],
                          "scan_path": summary["preprocessed_path"],
                          "truth": truth["amyloid_positive"].astype(int)})
    rng = np.random.default_rng(seed)
    frame["split"], frame["pu_label"] = "", 0
    for _, rows in frame.groupby("truth"):
        order = rng.permutation(rows.index.to_numpy())
        cut = [int(round(len(order) * f)) for f in (0.6, 0.8)]
        for split, idx in zip(("train", "val", "test"), np.split(order, cut)):
            frame.loc[idx, "split"] = split
    for split, rows in frame[frame["truth"] == 1].groupby("split"):
        n = len(rows) if split != "test" else len(rows) // 2
        frame.loc[rng.permutation(rows.index.to_numpy())[:n], "pu_label"] = 1
    path = work / "manifest.csv"
    frame.to_csv(path, index=False)
    return path


def oracle_auc(work: Path) -> float:
    """AUC of the generator's own hippocampal loss for the truth: what the images can show."""
    import pandas as pd
    from sklearn.metrics import roc_auc_score

    truth = pd.read_csv(work / "synth" / "truth_scans.csv")
    return round(float(roc_auc_score(truth["amyloid_positive"], truth["hippocampal_loss"])), 3)


def full_size_cost(volume_path: Path) -> dict:
    """CPU seconds of one map per method: the paper CNN at the published sizes."""
    import torch

    from adni_pu.data.volumes import VolumeDataConfig
    from adni_pu.interpret.grid_model import GridModel, load_grid_volume
    from adni_pu.interpret.maps import MapSettings, attribution_map
    from adni_pu.models.cnn3d import build_cnn3d

    torch.manual_seed(0)
    data = VolumeDataConfig(cache="none")
    model = build_cnn3d("paper").eval()
    volume, _ = load_grid_volume(volume_path, data)
    brain = volume != 0
    grid_model = GridModel(model, data)
    attribution_map("gradcam", grid_model, volume, brain)  # warm-up (imports, first calls)
    out = {}
    for name, method, settings in (("gradcam", "gradcam", MapSettings()),
                                   ("gradients", "gradients", MapSettings()),
                                   ("occlusion", "occlusion", MapSettings()),
                                   ("occlusion_patch24", "occlusion", MapSettings(patch=24))):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        attribution_map(method, grid_model, volume, brain, settings)
        out[name] = {"cpu_seconds": round(time.process_time() - cpu0, 2),
                     "wall_seconds": round(time.perf_counter() - wall0, 2),
                     "settings": asdict(settings)}
        print(f"full size, {name}: {out[name]}", flush=True)
    return {"model": "paper preset (16/32 channels, FC 256), weights as initialised",
            "inputs": {"grid": list(data.grid_shape), "crop": list(data.crop_shape),
                       "brain": list(data.brain_size), "boxes": list(data.hipp_size)},
            "volume": str(volume_path), "seconds_per_scan": out}


def tiny_run(work: Path, manifest: Path, epochs: int, sanity: int, n_boot: int) -> dict:
    """Train the tiny run, evaluate it, map its test split with every method."""
    from adni_pu.workflows.evaluate import evaluate_run
    from adni_pu.workflows.interpret import interpret_run
    from adni_pu.workflows.train import train_volumes
    from adni_pu.workflows.volume_settings import load_volume_config

    run = work / "run"
    sets = [f"train.epochs={epochs}", "train.batch_size=8", "train.lr=0.01",
            'train.device="cpu"', "train.threads=1", "train.progress=false",
            f"bootstrap={n_boot}"] + [f"{k}={v}" for k, v in TINY.items()]
    if not (run / "best_model.pt").is_file():
        cfg = load_volume_config(None, sets, preset="naive")
        train_volumes(manifest, cfg, run, log=lambda m: None)
    ev = evaluate_run(run, "test", device="cpu")
    result = {"settings": sets, "preset": "naive",
              "test_auc_subject": ev["subject_level"]["auc"],
              "test_subjects": ev["n_subjects"], "methods": {}}
    for method in METHODS:
        rec = interpret_run(run, "test", method, device="cpu", sanity_subjects=sanity,
                            n_boot=n_boot)
        share = rec["sanity"]["hippocampal_share"]
        result["methods"][method] = {
            "cpu_seconds_per_scan": round(rec["timing"]["cpu_seconds_per_scan"], 3),
            "wall_seconds_per_scan": round(rec["timing"]["wall_seconds_per_scan"], 3),
            "scans": rec["n_scans"], "settings": rec["settings"],
            "randomisation_spearman": {
                "mean": rec["sanity"]["randomisation"]["mean"],
                "per_scan": [round(c["spearman"], 4) for c in
                             rec["sanity"]["randomisation"]["per_scan"]]},
            "hippocampal_share_sanity_scans": {
                "trained": rec["sanity"]["randomisation"]["hippocampal_share_trained"],
                "randomised": rec["sanity"]["randomisation"]["hippocampal_share_randomised"]},
            "hippocampal_share": {k: share[k] for k in ("share", "ci", "volume_share",
                                                        "ratio", "n_subjects")},
            "top_regions_positives": (rec["top_regions"].get("labelled_positive") or [])[:3],
        }
        print(f"tiny run, {method}: {json.dumps(result['methods'][method])}", flush=True)
    return result


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--work", type=Path, default=Path("runs/interpret-cost"))
    parser.add_argument("--subjects", type=int, default=80)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--hippocampal-atrophy", type=float, default=0.9,
                        help="SynthConfig.hippocampal_atrophy (grey matter lost at full "
                             "severity)")
    parser.add_argument("--sanity", type=int, default=3)
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--machine", default="2-core CPU VM, no GPU (shared with other jobs)")
    add_out(parser, "interpret-cost-cpu.json")
    args = parser.parse_args()

    import torch

    from adni_pu.provenance import package_versions

    torch.set_num_threads(1)
    args.work.mkdir(parents=True, exist_ok=True)
    manifest = synth_cohort(args.work, args.subjects, args.seed, args.hippocampal_atrophy)
    import pandas as pd

    volume = Path(pd.read_csv(manifest)["scan_path"].iloc[0])
    result = {
        "benchmark": "adni-pu interpret: CPU seconds per scan and sanity checks",
        "command": command_line(__file__, prefix="OMP_NUM_THREADS=1"),
        "machine": args.machine, "torch_threads": torch.get_num_threads(),
        "versions": package_versions(),
        "full_size": full_size_cost(volume),
        "tiny_run": tiny_run(args.work, manifest, args.epochs, args.sanity, args.bootstrap),
        "cohort": {"subjects": args.subjects, "seed": args.seed,
                   "effect": f"hippocampal atrophy only ({args.hippocampal_atrophy} at full "
                             "severity; cortical 0, ventricles 0, no preclinical positives)",
                   "oracle_auc_hippocampal_loss": oracle_auc(args.work)},
    }
    write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

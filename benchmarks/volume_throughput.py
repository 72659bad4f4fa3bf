"""Training samples per second of the 3-branch 3D CNN at the paper's input sizes.

Measures, in one process so the ratios are comparable:

- ``cache``: the deterministic MONAI stage (load, reorient, crop 104 x 128 x 112, resize to
  50^3, hippocampus boxes), seconds per scan, paid once per scan;
- ``loader``: the training data path after the cache (box jitter, flip-and-swap, affine and
  intensity augmentation, collation), samples/s, with 0 and 1 loader workers;
- ``compute``: forward + backward + Adam step of each network preset on one batch held in
  memory (no data loading), samples/s, and inference samples/s;
- ``end_to_end``: loader + training step for whole epochs, samples/s, so
  ``compute / end_to_end`` shows what the data path costs.

Usage::

    python benchmarks/volume_throughput.py                       # CPU, 2 threads
    python benchmarks/volume_throughput.py --device cuda --amp \
        --out benchmarks/results/volume-throughput-gpu.json

Volumes: ``--manifest`` (its ``train`` split) or, by default, ideal model-grid volumes of
the synthetic generator (the same sizes a real preprocessed scan has).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _volumes(args: argparse.Namespace) -> Path:
    """A manifest whose train split holds the volumes to load."""
    import pandas as pd

    if args.manifest is not None:
        return args.manifest
    from adni_pu import config as cfgmod
    from adni_pu.synth import SynthConfig, generate_cohort

    root = args.work / "synth"
    if not (root / "synth_config.toml").is_file():
        cfg = cfgmod.from_dict(SynthConfig, {"voxel_size": 4.0, "ideal_preprocessed": True,
                                             "visit_probabilities": [1.0, 0.0, 0.0],
                                             "write_brain_masks": False})
        generate_cohort(root, args.subjects, 0, cfg)
    summary = pd.read_csv(root / "preprocessed_ideal" / "summary.csv")
    manifest = pd.DataFrame({
        "subject_id": summary["subject_id"], "session_id": summary["session_id"],
        "scan_path": summary["preprocessed_path"], "pu_label": [i % 2 for i in
                                                                range(len(summary))],
        "truth": [i % 2 for i in range(len(summary))], "split": "train"})
    path = args.work / "manifest.csv"
    manifest.to_csv(path, index=False)
    return path


def _rate(n_samples: int, seconds: float) -> float:
    return round(n_samples / seconds, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, default=None)
    parser.add_argument("--work", type=Path, default=Path("runs/throughput"))
    parser.add_argument("--subjects", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per model preset")
    parser.add_argument("--presets", default="paper,wide,deep")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--amp", action="store_true", help="bfloat16 autocast (GPU)")
    parser.add_argument("--channels-last", action="store_true",
                        help="channels-last-3d layout for the model and its inputs")
    parser.add_argument("--machine", default="2-core CPU VM, no GPU")
    parser.add_argument("--out", type=Path,
                        default=REPO / "benchmarks" / "results" / "volume-throughput-cpu.json")
    args = parser.parse_args()

    import torch

    from adni_pu.data.volumes import VolumeDataConfig, build_volume_dataset, collate_volumes
    from adni_pu.fileio import atomic_write_text
    from adni_pu.models.cnn3d import build_cnn3d
    from adni_pu.provenance import provenance
    from adni_pu.pu.device_data import channels_last, to_layout

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    args.work.mkdir(parents=True, exist_ok=True)
    manifest = _volumes(args)
    cfg = VolumeDataConfig(cache="memory")
    result: dict = {"benchmark": "3D CNN training throughput at the paper's input sizes",
                    "command": " ".join(["python", "benchmarks/volume_throughput.py",
                                         *sys.argv[1:]]),
                    "machine": args.machine, "device": str(device), "threads": args.threads,
                    "amp": args.amp, "channels_last": args.channels_last,
                    "batch_size": args.batch_size, "input_sizes": {
                        "brain": list(cfg.brain_size), "hipp_l": list(cfg.hipp_size),
                        "hipp_r": list(cfg.hipp_size), "crop": list(cfg.crop_shape)}}

    tic = time.perf_counter()
    dataset = build_volume_dataset(manifest, "train", cfg, train=True)
    n = len(dataset)
    result["cache"] = {"scans": n, "seconds_per_scan": round((time.perf_counter() - tic) / n, 4)}
    print("cache", result["cache"], flush=True)

    def loader(workers: int):
        return torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                           num_workers=workers, collate_fn=collate_volumes,
                                           drop_last=True, persistent_workers=workers > 0)

    result["loader"] = {}
    for workers in (0, 1):
        dl = loader(workers)
        for _ in dl:  # warm-up pass (starts workers)
            pass
        tic, seen = time.perf_counter(), 0
        for _ in range(max(2, -(-24 // len(dl)))):  # >= 24 batches: prefetch is noise
            for batch in dl:
                seen += batch["brain"].shape[0]
        result["loader"][f"workers_{workers}"] = _rate(seen, time.perf_counter() - tic)
        del dl
    print("loader samples/s", result["loader"], flush=True)

    batch = next(iter(loader(0)))
    inputs = to_layout({k: batch[k].to(device) for k in ("brain", "hipp_l", "hipp_r")},
                       args.channels_last)
    target = (batch["pu_label"].float() * 2 - 1).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp)

    def step(model, opt) -> None:
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = torch.nn.functional.softplus(-target * model(inputs)).mean()
        loss.backward()
        opt.step()

    result["compute"] = {}
    models = {}
    for preset in [p for p in args.presets.split(",") if p]:
        model = build_cnn3d(preset).to(device).train()
        if args.channels_last:
            model = channels_last(model)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        for _ in range(2):
            step(model, opt)
        sync()
        times = []
        for _ in range(args.steps):
            tic = time.perf_counter()
            step(model, opt)
            sync()
            times.append(time.perf_counter() - tic)
        model.eval()
        with torch.no_grad(), autocast:
            model(inputs)
            sync()
            tic = time.perf_counter()
            for _ in range(args.steps):
                model(inputs)
            sync()
            infer = (time.perf_counter() - tic) / args.steps
        median = statistics.median(times)
        result["compute"][preset] = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "train_step_s": round(median, 4),
            "train_samples_per_s": _rate(args.batch_size, median),
            "inference_samples_per_s": _rate(args.batch_size, infer)}
        models[preset] = (model, opt)
        print(preset, result["compute"][preset], flush=True)

    # end to end: the paper preset fed by the loader (0 workers: the trainer's default)
    model, opt = models.get("paper", next(iter(models.values())))
    model.train()
    result["end_to_end"] = {}
    for workers in (0, 1):
        dl = loader(workers)
        tic, seen = time.perf_counter(), 0
        for b in dl:
            inputs = {k: b[k].to(device, non_blocking=True) for k in ("brain", "hipp_l",
                                                                       "hipp_r")}
            target = (b["pu_label"].float() * 2 - 1).to(device)
            step(model, opt)
            seen += b["brain"].shape[0]
        sync()
        result["end_to_end"][f"workers_{workers}"] = _rate(seen, time.perf_counter() - tic)
        del dl
    paper = result["compute"].get("paper") or next(iter(result["compute"].values()))
    result["data_path_share"] = {
        k: round(1 - v / paper["train_samples_per_s"], 3)
        for k, v in result["end_to_end"].items()}
    result["provenance"] = provenance()
    print("end to end", result["end_to_end"], "data path share", result["data_path_share"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

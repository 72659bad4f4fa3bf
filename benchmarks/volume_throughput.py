"""Training samples per second of the 3-branch 3D CNN at the paper's input sizes.

Measures, in one process so the ratios are comparable:

- ``cache``: the deterministic MONAI stage (load, reorient, crop 104 x 128 x 112, resize to
  50^3, hippocampus boxes), seconds per scan, paid once per scan;
- ``compute``: forward + backward + Adam step of each network preset on one batch held in
  memory (no data loading), samples/s, and inference samples/s;
- ``data_path``: an epoch's augmented training batches on the device, without the model,
  samples/s, per data path;
- ``end_to_end``: whole training epochs (data path + the paper preset's training step),
  samples/s, per data path, so ``compute / end_to_end`` shows what the data path costs.

The data paths (``--paths``): ``old``, the per-item augmentation before its move to MONAI
batch transforms (read from git, or ``--old-file``) in a ``DataLoader``; ``loader``, the
cached images through a ``DataLoader``, augmented in batches on the device; ``device``, the
images stored once on the device (``--store-dtype``), gathered and augmented there. ``old``
and ``loader`` run with each of ``--workers``. Every variant runs once per round, rounds in
turn, so drift in the machine's load falls on all of them; the median is reported.

Usage::

    python -m benchmarks.volume_throughput                       # CPU, 2 threads
    python -m benchmarks.volume_throughput --device cuda --amp \
        --out benchmarks/results/volume-throughput-gpu.json

Volumes: ``--manifest`` (its ``train`` split), ``--template`` (the MNI template, scaled and
noised per subject: quick to make at any count) or, by default, ideal model-grid volumes of
the synthetic generator (the same sizes a real preprocessed scan has).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

from benchmarks.common import REPO

#: The commit before the augmentation moved to MONAI batch transforms: the ``old`` path.
OLD_REF = "ccddfcd"


def old_volumes_module(ref: str = OLD_REF) -> types.ModuleType:
    """``adni_pu/data/volumes.py`` as it was at ``ref``, imported as its own module."""
    text = subprocess.run(["git", "show", f"{ref}:adni_pu/data/volumes.py"], cwd=REPO,
                          check=True, capture_output=True, text=True).stdout
    name = f"_volumes_at_{ref}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module  # dataclasses look their module up
    exec(compile(text, f"{ref}:adni_pu/data/volumes.py", "exec"), module.__dict__)
    return module


def write_volumes(root: Path, n: int, suffix: str = ".nii.gz") -> Path:
    """``n`` model-grid volumes (the MNI template, scaled and noised per subject) and a
    manifest whose train split holds them (``suffix`` ``.nii``: uncompressed, quicker)."""
    import nibabel as nib
    import numpy as np
    import pandas as pd

    from adni_pu import atlas

    manifest = root / "manifest.csv"
    if manifest.is_file():
        return manifest
    root.mkdir(parents=True, exist_ok=True)
    affine = atlas.model_grid_affine()
    t1 = atlas.resample_to(atlas.load_template("t1"), affine, atlas.MODEL_GRID_SHAPE)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        data = t1 * (0.8 + 0.4 * rng.random()) + rng.normal(0, 3, t1.shape) * (t1 > 0)
        nib.save(nib.Nifti1Image(data.astype(np.int16), affine), root / f"sub{i}{suffix}")
        rows.append({"subject_id": f"S{i}", "session_id": "bl", "scan_path": f"sub{i}{suffix}",
                     "pu_label": i % 2, "truth": i % 2, "split": "train"})
    pd.DataFrame(rows).to_csv(manifest, index=False)
    return manifest


def _volumes(args: argparse.Namespace) -> Path:
    """A manifest whose train split holds the volumes to load."""
    import pandas as pd

    if args.manifest is not None:
        return args.manifest
    if args.template:
        return write_volumes(args.work / f"template-{args.subjects}", args.subjects,
                             suffix=".nii")
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


def _old_module(args: argparse.Namespace):
    """The previous ``adni_pu/data/volumes.py`` (per-item augmentation) as a module."""
    if args.old_file is None:
        return old_volumes_module()
    spec = importlib.util.spec_from_file_location("_volumes_old", args.old_file)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["_volumes_old"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _variants(args: argparse.Namespace) -> list[tuple[str, int]]:
    """(path, loader workers) of each data path measured."""
    workers = [int(w) for w in args.workers.split(",") if w != ""]
    out: list[tuple[str, int]] = []
    for path in [p for p in args.paths.split(",") if p]:
        if path not in ("old", "loader", "device"):
            raise SystemExit(f"--paths: expected old, loader or device, found {path!r}")
        out += [(path, 0)] if path == "device" else [(path, w) for w in workers]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, default=None)
    parser.add_argument("--template", action="store_true",
                        help="MNI-template volumes instead of the synthetic generator's")
    parser.add_argument("--work", type=Path, default=Path("runs/throughput"))
    parser.add_argument("--subjects", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per model preset")
    parser.add_argument("--presets", default="paper,wide,deep")
    parser.add_argument("--paths", default="old,loader,device")
    parser.add_argument("--workers", default="0,1", help="loader workers of old and loader")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1, help="timed epochs per variant")
    parser.add_argument("--store-dtype", default="auto")
    parser.add_argument("--old-file", type=Path, default=None,
                        help="the previous volumes.py (default: read from git)")
    parser.add_argument("--cache-workers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--amp", action="store_true", help="bfloat16 autocast (GPU)")
    parser.add_argument("--channels-last", action="store_true",
                        help="channels-last-3d layout for the model and its inputs")
    parser.add_argument("--machine", default="2-core CPU VM, no GPU")
    parser.add_argument("--out", type=Path,
                        default=REPO / "benchmarks" / "results" / "volume-throughput-cpu.json")
    args = parser.parse_args()

    import numpy as np
    import torch

    from adni_pu.data.volumes import VolumeDataConfig, VolumeDataset, build_volume_dataset
    from adni_pu.fileio import atomic_write_text
    from adni_pu.models.cnn3d import build_cnn3d
    from adni_pu.provenance import provenance
    from adni_pu.pu.batching import Entries, EpochPlan, epoch_batches
    from adni_pu.pu.device_data import DeviceData, channels_last, to_device, to_layout

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    args.work.mkdir(parents=True, exist_ok=True)
    variants = _variants(args)
    old = _old_module(args) if any(p == "old" for p, _ in variants) else None
    manifest = _volumes(args)
    cfg = VolumeDataConfig(cache="memory", cache_workers=args.cache_workers,
                           store_dtype=args.store_dtype)
    result: dict = {"benchmark": "3D CNN training throughput at the paper's input sizes",
                    "command": " ".join(["python -m benchmarks.volume_throughput",
                                         *sys.argv[1:]]),
                    "machine": args.machine, "device": str(device), "threads": args.threads,
                    "amp": args.amp, "channels_last": args.channels_last,
                    "batch_size": args.batch_size, "store_dtype": args.store_dtype,
                    "input_sizes": {
                        "brain": list(cfg.brain_size), "hipp_l": list(cfg.hipp_size),
                        "hipp_r": list(cfg.hipp_size), "crop": list(cfg.crop_shape)}}

    tic = time.perf_counter()
    dataset = build_volume_dataset(manifest, "train", cfg, train=True)
    n = len(dataset)
    result["cache"] = {"scans": n, "seconds_per_scan": round((time.perf_counter() - tic) / n, 4)}
    print("cache", result["cache"], flush=True)

    pu = np.array([dataset.base.data[i]["pu_label"] for i in range(n)])
    p_idx, u_idx = np.flatnonzero(pu == 1), np.flatnonzero(pu != 1)
    entries = Entries(np.concatenate([p_idx, u_idx]).astype(np.int64),
                      np.r_[np.ones(len(p_idx)), np.zeros(len(u_idx))].astype(np.int64),
                      len(p_idx), len(u_idx))
    datasets = {store: VolumeDataset(dataset.base, dataset.frame, VolumeDataConfig(
        cache="memory", store=store, store_dtype=args.store_dtype), train=True)
        for store in ("loader", "device")}
    old_ds = None if old is None else old.VolumeDataset(
        dataset.base, dataset.frame, old.VolumeDataConfig(cache="memory"), train=True)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    branch = ("brain", "hipp_l", "hipp_r")

    def batches(path: str, workers: int, epoch: int):
        """An epoch's (inputs, PU labels) on the device, as the trainer gets them."""
        plan = EpochPlan.of(epoch_batches(entries, np.random.default_rng([0, epoch]),
                                          args.batch_size))
        if path == "old":
            torch.manual_seed(epoch)
            loader = torch.utils.data.DataLoader(
                old_ds, batch_sampler=[entries.base[b].tolist() for b in plan.batches],
                num_workers=workers, collate_fn=old.collate_volumes,
                pin_memory=device.type == "cuda")
            for b, xb in zip(plan.batches, loader):
                inputs = to_layout(to_device({k: xb[k] for k in branch}, device),
                                   args.channels_last)
                yield inputs, torch.from_numpy(entries.s[b]).to(device)
            return
        dd = DeviceData(device, batch_size=args.batch_size, num_workers=workers,
                        layout=args.channels_last)
        for xb, s, _idx in dd.training_batches(datasets[path], plan, entries,
                                                augment_seed=epoch):
            yield xb, s

    if any(p == "device" for p, _ in variants):  # the store is built once per run
        tic = time.perf_counter()
        next(batches("device", 0, 0))
        result["store_build_seconds"] = round(time.perf_counter() - tic, 3)

    xb, s = next(batches("device" if old is None else "old", 0, 0))
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp)

    def step(model, opt, inputs, labels) -> None:
        opt.zero_grad(set_to_none=True)
        with autocast:
            target = labels.float() * 2 - 1
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
            step(model, opt, xb, s)
        sync()
        times = []
        for _ in range(args.steps):
            tic = time.perf_counter()
            step(model, opt, xb, s)
            sync()
            times.append(time.perf_counter() - tic)
        model.eval()
        with torch.no_grad(), autocast:
            model(xb)
            sync()
            tic = time.perf_counter()
            for _ in range(args.steps):
                model(xb)
            sync()
            infer = (time.perf_counter() - tic) / args.steps
        median = statistics.median(times)
        result["compute"][preset] = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "train_step_s": round(median, 4),
            "train_samples_per_s": _rate(xb["brain"].shape[0], median),
            "inference_samples_per_s": _rate(xb["brain"].shape[0], infer)}
        models[preset] = (model, opt)
        print(preset, result["compute"][preset], flush=True)

    # data path alone, then whole epochs with the paper preset, every variant per round
    model, opt = models.get("paper", next(iter(models.values())))
    model.train()
    names = [f"{p}-w{w}" if p != "device" else p for p, w in variants]
    data_runs: dict[str, list[float]] = {k: [] for k in names}
    epoch_runs: dict[str, list[float]] = {k: [] for k in names}
    for r in range(args.rounds):
        for name, (path, workers) in zip(names, variants):
            tic, seen = time.perf_counter(), 0
            for xb, _s in batches(path, workers, 1 + r):
                seen += xb["brain"].shape[0]
            sync()
            data_runs[name].append(_rate(seen, time.perf_counter() - tic))
        for name, (path, workers) in zip(names, variants):
            tic, seen = time.perf_counter(), 0
            for e in range(args.epochs):
                for xb, s in batches(path, workers, 100 + r * args.epochs + e):
                    step(model, opt, xb, s)
                    seen += xb["brain"].shape[0]
            sync()
            epoch_runs[name].append(_rate(seen, time.perf_counter() - tic))
        print(f"round {r + 1}: data path", {k: v[-1] for k, v in data_runs.items()},
              "end to end", {k: v[-1] for k, v in epoch_runs.items()}, flush=True)
    result["data_path"] = {k: statistics.median(v) for k, v in data_runs.items()}
    result["end_to_end"] = {k: statistics.median(v) for k, v in epoch_runs.items()}
    result["rounds"] = {"data_path": data_runs, "end_to_end": epoch_runs}
    first = names[0]  # each variant against the first, round by round (paired: drift cancels)
    result["median_ratio_to_" + first] = {
        part: {k: round(statistics.median(v / f for v, f in zip(runs[k], runs[first])), 3)
               for k in names} for part, runs in (("data_path", data_runs),
                                                  ("end_to_end", epoch_runs))}
    paper = result["compute"].get("paper") or next(iter(result["compute"].values()))
    result["data_path_share"] = {
        k: round(1 - v / paper["train_samples_per_s"], 3)
        for k, v in result["end_to_end"].items()}
    result["provenance"] = provenance()
    print("data path", result["data_path"], "end to end", result["end_to_end"],
          "data path share", result["data_path_share"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

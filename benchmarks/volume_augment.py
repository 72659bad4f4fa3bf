"""The volume augmentation before and after its move to MONAI batch transforms: same law.

    python -m benchmarks.volume_augment --draws 1500 \
        --out benchmarks/results/volume-augment-cpu.json

The previous implementation (per item, torch's global generator, a hand-written affine) is
read from git (``git show REF:adni_pu/data/volumes.py``, default the commit before the move)
into a temporary module and compared with :mod:`adni_pu.data.volume_augment` on real-sized
model-grid volumes (the MNI template, varied per subject, at the paper's input sizes, with
both label channels on):

1. ``same_parameters``: the old item pipeline fed the new pipeline's draws (its
   ``torch.rand`` / ``randint`` calls answered from them): the largest voxel difference
   between the two, with noise off (noise is compared in law only);
2. ``parameters``: each random parameter drawn by the old code (its own generator) and by
   the new keys, compared in law (two-sample Kolmogorov-Smirnov; rates with their standard
   errors);
3. ``outputs``: statistics of augmented volumes (mean, standard deviation, correlation with
   the un-augmented volume, per branch) over many draws of each implementation, compared
   in law the same way, noise on;
4. ``storage``: the largest logit difference of the paper's 3-branch CNN between the
   float32 store and each smaller storage type, on un-augmented and augmented batches.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, RESULTS, results_record, write_json

OLD_REF = "ccddfcd"
BRANCHES = ("brain", "hipp_l", "hipp_r")


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


class _Scripted:
    """A stand-in for the ``torch`` module of the old code: ``rand``, ``randint`` and
    ``randn_like`` answer from a script (``record=False``) or from torch while recording
    what they drew (``record=True``); everything else is torch."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self.script: list[Any] = []
        self.drawn: list[tuple[str, Any]] = []
        self.record = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def _next(self, kind: str, real: Any) -> Any:
        if self.record:
            value = real()
            self.drawn.append((kind, value.clone()))
            return value
        got_kind, value = self.script.pop(0)
        if got_kind != kind:
            raise RuntimeError(f"old code drew {kind}, the script holds {got_kind}")
        return value

    def rand(self, *size: Any, **kw: Any) -> Any:
        return self._next("rand", lambda: self._torch.rand(*size, **kw))

    def randint(self, *args: Any, **kw: Any) -> Any:
        return self._next("randint", lambda: self._torch.randint(*args, **kw))


def _script(d: Any, b: int, cfg: Any) -> list[tuple[str, Any]]:
    """The old ``__getitem__``'s draws, in its order, that reproduce item ``b`` of the new
    draws ``d`` (old angles (a, b, c) about torch's x, y, z equal new (-c, -b, -a) about
    the array's axes 0, 1, 2)."""
    import torch

    rad = math.radians(cfg.rotate_deg)
    out: list[tuple[str, Any]] = []
    for key in ("hipp_l", "hipp_r"):
        out.append(("randint", torch.as_tensor(d.start[key][b])))
    out.append(("rand", torch.tensor(0.0 if d.flip[b] else 1.0)))
    for k in range(3):
        out.append(("rand", torch.tensor(0.0 if d.affine[b, k] else 1.0)))
        if d.affine[b, k]:
            t = d.angles[b, k]
            old = torch.tensor([-t[2], -t[1], -t[0]], dtype=torch.float64) / rad
            out.append(("rand", ((old + 1) / 2).float()))
            out.append(("rand", torch.tensor((d.scale[b, k] - 1) / cfg.scale_range / 2 + 0.5,
                                             dtype=torch.float32)))
    out.append(("rand", torch.tensor(0.0 if d.intensity[b] else 1.0)))
    if d.intensity[b]:
        out.append(("rand", torch.tensor((d.factor[b] - 1) / cfg.intensity_scale / 2 + 0.5,
                                         dtype=torch.float32)))
        out.append(("rand", torch.tensor(d.shift[b] / cfg.intensity_shift / 2 + 0.5,
                                         dtype=torch.float32)))
    return out


def _stats(x: dict[str, Any], plain: dict[str, Any]) -> dict[str, float]:
    """Mean, standard deviation and correlation with the un-augmented item, per branch
    (image channel), and the label channel's mean (it moves, it is never rescaled)."""
    import torch

    out = {}
    for key in BRANCHES:
        a, p = x[key][0].flatten().double(), plain[key][0].flatten().double()
        out[f"{key}/mean"] = float(a.mean())
        out[f"{key}/std"] = float(a.std())
        out[f"{key}/corr"] = float(torch.corrcoef(torch.stack([a, p]))[0, 1])
        out[f"{key}/label_mean"] = float(x[key][1].double().mean())
    return out


def _ks(a: list[float], b: list[float]) -> dict[str, float]:
    import numpy as np
    from scipy.stats import ks_2samp

    res = ks_2samp(a, b)
    return {"old_mean": round(float(np.mean(a)), 5), "new_mean": round(float(np.mean(b)), 5),
            "old_sd": round(float(np.std(a)), 5), "new_sd": round(float(np.std(b)), 5),
            "ks": round(float(res.statistic), 4), "p": round(float(res.pvalue), 4)}


def _rate(a: list[float], b: list[float]) -> dict[str, float]:
    import numpy as np

    pa, pb = float(np.mean(a)), float(np.mean(b))
    se = math.sqrt(pa * (1 - pa) / len(a) + pb * (1 - pb) / len(b))
    return {"old": round(pa, 4), "new": round(pb, 4), "difference_in_se":
            round((pb - pa) / se, 2) if se > 0 else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("runs/volume-augment"))
    parser.add_argument("--subjects", type=int, default=6)
    parser.add_argument("--draws", type=int, default=1500, help="augmented items per side")
    parser.add_argument("--same-draws", type=int, default=200,
                        help="items compared with the same parameters")
    parser.add_argument("--ref", default=OLD_REF, help="git revision of the old code")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "volume-augment-cpu.json")
    args = parser.parse_args()

    import numpy as np
    import torch

    from adni_pu.data.volume_augment import AugmentSettings, draw, item_keys
    from adni_pu.data.volumes import VolumeDataConfig, build_volume_dataset

    torch.set_num_threads(args.threads)
    old = old_volumes_module(args.ref)
    manifest = write_volumes(args.work, args.subjects)
    common = dict(hipp_mask=True, ventricle_mask=True, cache="memory")
    cfg = VolumeDataConfig(**common, store="device", store_dtype="float32")
    new_ds = build_volume_dataset(manifest, "train", cfg, train=True)
    old_cfg = old.VolumeDataConfig(**common)
    old_ds = old.VolumeDataset(new_ds.base, new_ds.frame, old_cfg, train=True)
    plain = [new_ds[i] for i in range(len(new_ds))]
    n = len(new_ds)
    cpu = torch.device("cpu")
    scripted = _Scripted(torch)
    old.torch = scripted  # the old module's draws now pass through the stand-in

    def new_items(keys: np.ndarray, rows: np.ndarray) -> list[dict[str, Any]]:
        out = []
        for lo in range(0, len(rows), 32):
            batch = next(new_ds.load_batches([rows[lo:lo + 32]], cpu, keys=[keys[lo:lo + 32]]))
            out += [{k: batch[k][j] for k in BRANCHES} for j in range(len(batch["brain"]))]
        return out

    results: dict[str, Any] = {}

    # 1. the same parameters
    rows = np.arange(args.same_draws) % n
    keys = item_keys(1, np.arange(args.same_draws))
    d = draw(keys, AugmentSettings.of(cfg))
    got = new_items(keys, rows)
    worst = dict.fromkeys(BRANCHES, 0.0)
    for b, row in enumerate(rows):
        scripted.record, scripted.script = False, _script(d, b, cfg)
        ref = old_ds[int(row)]
        for key in BRANCHES:
            worst[key] = max(worst[key], float((ref[key] - got[b][key]).abs().max()))
    results["same_parameters"] = {
        "items": args.same_draws, "noise_std": cfg.noise_std,
        "max_abs_difference": {k: float(f"{v:.3g}") for k, v in worst.items()},
        "affine_items": int(d.affine.sum()), "flipped_items": int(d.flip.sum())}
    print("same parameters", results["same_parameters"], flush=True)

    # 2. and 3. the laws, noise on
    noisy = dict(common, noise_std=0.05)
    cfg = VolumeDataConfig(**noisy, store="device", store_dtype="float32")
    new_ds = build_volume_dataset(manifest, "train", cfg, train=True)
    old_ds = old.VolumeDataset(new_ds.base, new_ds.frame, old.VolumeDataConfig(**noisy),
                               train=True)
    rows = np.arange(args.draws) % n
    scripted.record, scripted.drawn = True, []
    torch.manual_seed(12345)
    old_stats, old_params = [], []
    for row in rows:
        mark = len(scripted.drawn)
        old_stats.append(_stats(old_ds[int(row)], plain[int(row)]))
        old_params.append(scripted.drawn[mark:])
    keys = item_keys(2, np.arange(args.draws))
    new_stats = [_stats(x, plain[int(r)]) for x, r in zip(new_items(keys, rows), rows)]
    results["outputs"] = {k: _ks([s[k] for s in old_stats], [s[k] for s in new_stats])
                          for k in old_stats[0]}
    results["parameters"] = _parameter_laws(old_params, draw(keys, AugmentSettings.of(cfg)),
                                            cfg)
    print("parameters", results["parameters"], flush=True)
    print("outputs", results["outputs"], flush=True)

    # 4. storage types: logits of the paper's CNN
    results["storage"] = _storage(manifest, common)
    print("storage", results["storage"], flush=True)

    record = results_record(
        "volume augmentation: previous per-item code against the MONAI batch transforms",
        "python -m benchmarks.volume_augment " + " ".join(sys.argv[1:]),
        f"{args.subjects} model-grid volumes (MNI template, scaled and noised), paper input "
        "sizes, hipp_mask and ventricle_mask on", results,
        settings={"draws": args.draws, "same_draws": args.same_draws, "old_ref": args.ref,
                  "threads": args.threads}, machine_note=f", {args.threads} torch threads")
    write_json(args.out, record)
    print(f"wrote {args.out}")


def _parameter_laws(old_params: list[list[tuple[str, Any]]], d: Any, cfg: Any
                    ) -> dict[str, Any]:
    """The old draws (read back from what its ``__getitem__`` drew) against the new ones."""
    rad = math.radians(cfg.rotate_deg)
    old: dict[str, list[float]] = {k: [] for k in (
        "start", "flip", "affine", "angle", "scale", "intensity", "factor", "shift")}
    for drawn in old_params:
        it = iter(drawn)
        for _ in range(2):
            old["start"] += next(it)[1].tolist()
        old["flip"].append(float(next(it)[1] < cfg.flip_prob))
        for _k in range(3):
            chosen = float(next(it)[1]) < cfg.affine_prob
            old["affine"].append(float(chosen))
            if chosen:
                old["angle"] += ((next(it)[1] * 2 - 1) * rad).tolist()
                old["scale"].append(1 + (float(next(it)[1]) * 2 - 1) * cfg.scale_range)
        chosen = float(next(it)[1]) < cfg.intensity_prob
        old["intensity"].append(float(chosen))
        if chosen:
            old["factor"].append(1 + (float(next(it)[1]) * 2 - 1) * cfg.intensity_scale)
            old["shift"].append((float(next(it)[1]) * 2 - 1) * cfg.intensity_shift)
    new = {"start": [*d.start["hipp_l"].ravel(), *d.start["hipp_r"].ravel()],
           "flip": d.flip.astype(float).tolist(), "affine": d.affine.ravel().tolist(),
           "angle": d.angles[d.affine].ravel().tolist(), "scale": d.scale[d.affine].tolist(),
           "intensity": d.intensity.astype(float).tolist(),
           "factor": d.factor[d.intensity].tolist(), "shift": d.shift[d.intensity].tolist()}
    out: dict[str, Any] = {}
    for key in old:
        if key in ("flip", "affine", "intensity"):
            out[key] = _rate(old[key], [float(v) for v in new[key]])
        else:
            out[key] = _ks(old[key], [float(v) for v in new[key]])
    return out


def _storage(manifest: Path, common: dict[str, Any]) -> dict[str, Any]:
    """Largest |logit difference| of the paper CNN (seeded, evaluation mode, all items and
    64 augmented draws) between the float32 store and each smaller storage type."""
    import numpy as np
    import torch

    from adni_pu.data.volume_augment import item_keys
    from adni_pu.data.volumes import VolumeDataConfig, build_volume_dataset
    from adni_pu.models.cnn3d import build_cnn3d

    torch.manual_seed(0)
    model = build_cnn3d("paper").eval()
    cpu = torch.device("cpu")
    logits: dict[str, Any] = {}
    for dtype in ("float32", "float16", "bfloat16", "uint8"):
        cfg = VolumeDataConfig(**{**common, "hipp_mask": False, "ventricle_mask": False},
                               store="device", store_dtype=dtype)
        ds = build_volume_dataset(manifest, "train", cfg, train=True)
        rows = np.arange(64) % len(ds)
        keys = item_keys(3, np.arange(64))
        with torch.no_grad():
            plain = torch.cat([model(b) for b in ds.load_batches([np.arange(len(ds))], cpu)])
            aug = torch.cat([model(b) for b in ds.load_batches(
                [rows[i:i + 16] for i in range(0, 64, 16)], cpu,
                keys=[keys[i:i + 16] for i in range(0, 64, 16)])])
        logits[dtype] = torch.cat([plain, aug])
    ref = logits["float32"]
    scale = float(ref.std())
    return {"logit_sd_float32": round(scale, 5), **{
        dtype: {"max_abs_logit_difference": float(f"{float((v - ref).abs().max()):.3g}"),
                "relative_to_logit_sd": float(f"{float((v - ref).abs().max()) / scale:.3g}")}
        for dtype, v in logits.items() if dtype != "float32"}}


if __name__ == "__main__":
    main()

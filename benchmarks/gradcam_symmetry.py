"""Left and right hippocampus-box shares of ``adni-pu interpret --method gradcam``'s group
maps, for the code on the import path (issue 52, item 8).

Two small runs on the tests' 19-subject cohort (``tests/volume_helpers.py``: positives'
hippocampi, both sides, darkened by 60 %), the naive preset, 30 epochs, no augmentation
settings changed, CPU, one thread; trained once into WORK and kept:

- ``tiny``: the tests' network (4/8 channels, FC 16, brain 24^3, boxes 16^3) with a global
  pool and the hippocampus label channel;
- ``demo``: the demo's network and inputs (``adni_pu/workflows/demo_policy.py``: 8/16
  channels, global pool, FC 64, brain 40^3, boxes 30^3 with the label, lr 0.001, batch 8).

Each run's ``--splits`` are mapped with Grad-CAM (3 sanity scans); per group, the mass map
(the mean over subjects of |map|, as ``interpret``'s tables use) is split into the left
box, the right box (the network's inputs, on the grid) and the AAL hippocampi; the
re-initialised network's maps (the sanity scans) likewise. The record of ``--label`` is
added to the results file, so the same command with another code tree on the path (the
base commit, then the fix) fills in before and after::

    git archive be112e3 adni_pu | tar -x -C /tmp/base
    OMP_NUM_THREADS=1 PYTHONPATH=/tmp/base python benchmarks/gradcam_symmetry.py /tmp/w \\
        --label before
    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/gradcam_symmetry.py /tmp/w --label after
    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/gradcam_symmetry.py /tmp/w --branches-only

``--branches-only`` records each branch's first-order share of the logit per scan (the sum
of gradient x activation over its last pooled feature map), trained and re-initialised.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import add_out, command_line, machine, script_parser, today, write_json

RUNS: dict[str, list[str]] = {
    "tiny": ["train.model_args.global_pool=true", "data.hipp_mask=true"],
    "demo": ["train.model_args.channels=[8, 16]", "train.model_args.hidden=64",
             "train.model_args.global_pool=true", "data.brain_size=[40, 40, 40]",
             "data.hipp_size=[30, 30, 30]", "data.hipp_margin=4", "data.hipp_mask=true",
             "train.lr=0.001", "train.batch_size=8"],
}


def train(work: Path, name: str, epochs: int) -> Path:
    """The run ``name`` of :data:`RUNS` in ``work`` (trained if it is not there yet)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from volume_helpers import make_volume_cohort, tiny_overrides

    from adni_pu.workflows.train import train_volumes
    from adni_pu.workflows.volume_settings import load_volume_config

    run = work / name / "run"
    if (run / "best_model.pt").is_file():
        return run
    manifest = make_volume_cohort(work / name / "cohort")
    cfg = load_volume_config(None, tiny_overrides(epochs) + RUNS[name], preset="naive")
    train_volumes(manifest, cfg, run, log=lambda m: None)
    return run


def shares(heat: Any, regions: dict[str, Any]) -> dict[str, float]:
    """Each region's part of the mass (sum of |heat|)."""
    import numpy as np

    absolute = np.abs(np.asarray(heat, dtype=np.float64))
    total = absolute.sum()
    return {k: round(float(absolute[r].sum() / total), 4) if total > 0 else float("nan")
            for k, r in regions.items()}


def measure(run: Path, out: Path, split: str) -> dict[str, Any]:
    """Grad-CAM maps of ``split``; the left/right shares of each group's mass map."""
    import nibabel as nib
    import numpy as np
    import pandas as pd

    from adni_pu import atlas
    from adni_pu.data.volume_boxes import hippocampus_boxes
    from adni_pu.workflows.interpret import interpret_run
    from adni_pu.workflows.run_folder import load_run

    record = interpret_run(run, split, "gradcam", out=out, device="cpu", sanity_subjects=3,
                           n_boot=200)
    data = load_run(run, "cpu")[0].data
    origin, shape = data.crop_origin(), tuple(data.grid_shape)
    regions: dict[str, Any] = {
        f"box_{side}": tuple(slice(o + s.start, o + s.stop) for o, s in zip(origin, box))
        for side, box in zip(("left", "right"), hippocampus_boxes(data).values())}
    for side, pattern in (("left", atlas.HIPPOCAMPUS_LEFT), ("right", atlas.HIPPOCAMPUS_RIGHT)):
        regions[f"aal_hippocampus_{side}"] = atlas.region_mask(
            pattern, data.grid_affine(), shape) > 0
    scans = pd.read_csv(out / "scans.csv")
    maps = {m: np.abs(nib.load(str(out / m)).get_fdata()) for m in scans["map"]}

    def mass(frame: Any) -> Any:  # the mean over subjects of each subject's mean |map|
        return np.mean([np.mean([maps[m] for m in g["map"]], axis=0)
                        for _, g in frame.groupby("subject_id")], axis=0)

    groups = {"all": shares(mass(scans), regions)}
    groups.update({g: shares(mass(f), regions) for g, f in scans.groupby("group")})
    randomised = sorted((out / "randomised").rglob("*.nii.gz"))
    per_scan = record["sanity"]["randomisation"]["per_scan"]
    return {
        "split": split, "n_scans": len(scans), "groups": groups,
        "randomised_mean_of_sanity_scans": shares(np.mean(
            [np.abs(nib.load(str(f)).get_fdata()) for f in randomised], axis=0), regions),
        "spearman_trained_vs_randomised": [round(r["spearman"], 3) for r in per_scan],
    }


def branch_shares(run: Path, split: str) -> list[dict[str, Any]]:
    """Per scan of ``split``, each branch's first-order share of the logit (the sum over its
    last pooled feature map of gradient x activation, through MONAI's Grad-CAM hooks), for
    the trained and the re-initialised network: what each box contributes, whatever the
    map code."""
    from monai.visualize.class_activation_maps import ModelWithHooks

    from adni_pu.interpret.grid_model import GridModel, as_batch, load_grid_volume
    from adni_pu.interpret.maps import branch_layers
    from adni_pu.workflows.interpret import randomised_copy
    from adni_pu.workflows.run_folder import load_manifest, load_run

    cfg, model, info = load_run(run, "cpu")
    manifest = Path(info["manifest"])
    rows = load_manifest(manifest)
    rows = rows[rows["split"] == split]
    out = []
    for label, net in (("trained", model), ("randomised", randomised_copy(model, 0))):
        grid_model = GridModel(net, cfg.data)
        layers = branch_layers(net)
        hooks = ModelWithHooks(grid_model, [f"model.{n}" for _, n in layers],
                               register_forward=True, register_backward=True)
        for _, row in rows.iterrows():
            path = Path(str(row["scan_path"]))
            volume, _ = load_grid_volume(path if path.is_absolute() else manifest.parent / path,
                                         cfg.data)
            grid_model.set_brain_mask(volume != 0)
            logit, acti, grad = hooks(as_batch(volume), class_idx=0)
            entry = {"network": label, "subject_id": str(row["subject_id"]),
                     "session_id": str(row["session_id"]), "truth": str(row["truth"]),
                     "logit": round(float(logit.detach()), 4)}
            entry.update({b: round(float((g * a).sum().detach()), 4)
                          for (b, _), a, g in zip(layers, acti, grad)})
            out.append(entry)
    return out


def main(argv: list[str] | None = None) -> None:
    """Train the two runs if needed, measure them with the code on the path, record."""
    import torch

    import adni_pu

    parser = script_parser(__doc__)
    parser.add_argument("work", type=Path, help="folder of the runs and the maps")
    parser.add_argument("--label", default="", help="before or after (the code measured)")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--splits", nargs="+", default=["test"])
    parser.add_argument("--branches-only", action="store_true",
                        help="record only each branch's first-order share (no maps, no label)")
    add_out(parser, "gradcam-symmetry.json")
    args = parser.parse_args(argv)
    if not args.label and not args.branches_only:
        parser.error("--label: expected before or after (or --branches-only)")
    torch.set_num_threads(1)
    path = Path(args.out)
    results = json.loads(path.read_text()) if path.is_file() else {
        "benchmark": "gradcam-symmetry", "runs": {k: {"settings": v} for k, v in RUNS.items()}}
    code = Path(adni_pu.__file__).parent
    for name in RUNS:
        run = train(args.work, name, args.epochs)
        for split in args.splits:
            if args.branches_only:
                results["runs"][name].setdefault("first_order_by_branch", {})[split] = {
                    "scans": branch_shares(run, split), "date": today(),
                    "command": command_line("gradcam_symmetry.py", argv)}
                continue
            out = args.work / name / f"maps-{args.label}-{split}"
            entry = measure(run, out, split)
            entry.update(code=str(code), date=today(), machine=machine(),
                         command=command_line("gradcam_symmetry.py", argv, prefix=(
                             "OMP_NUM_THREADS=1 PYTHONPATH="
                             f"{os.environ.get('PYTHONPATH', '')}")))
            results["runs"][name].setdefault(args.label, {})[split] = entry
            print(name, args.label, split, json.dumps(entry["groups"]), flush=True)
    write_json(path, results)


if __name__ == "__main__":
    main()

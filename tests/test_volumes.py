"""MONAI volume pipeline: shapes, hippocampus boxes from the atlas, flip swap, caching."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd
import pytest
import torch

from adni_pu import atlas
from adni_pu.data.volume_boxes import (
    hippocampus_box_record,
    hippocampus_boxes,
    save_hippocampus_boxes,
)
from adni_pu.data.volume_config import VolumeDataConfig
from adni_pu.data.volumes import build_volume_dataset, collate_volumes

NO_AUG = dict(flip_prob=0.0, affine_prob=0.0, intensity_prob=0.0, translate=False,
              store_dtype="float32")  # batches then hold the cached values exactly


def augmented(ds, index: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Item ``index`` of a training dataset as the trainer sees it: in a batch, augmented
    with the draws of key (``seed``, entry ``index``)."""
    from adni_pu.data.volume_augment import item_keys

    batch = next(ds.load_batches([np.array([index])], torch.device("cpu"),
                                 keys=[item_keys(seed, np.array([index]))]))
    return {k: batch[k][0] for k in ("brain", "hipp_l", "hipp_r")}


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    """Four model-grid volumes (the MNI template, varied), one stored LAS; a manifest CSV."""
    root = tmp_path_factory.mktemp("volumes")
    affine = atlas.model_grid_affine()
    t1 = atlas.resample_to(atlas.load_template("t1"), affine, atlas.MODEL_GRID_SHAPE)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(4):
        data = (t1 * (1.0 + 0.1 * i) + rng.normal(0, 2, t1.shape) * (t1 > 0)).astype(np.int16)
        name = f"sub{i}.nii"
        if i == 3:  # same grid stored left-to-right flipped (LAS), as SPM writes it
            las = affine.copy()
            las[0, 0] = -affine[0, 0]
            las[0, 3] = affine[0, 3] + affine[0, 0] * (t1.shape[0] - 1)
            nib.save(nib.Nifti1Image(data[::-1].copy(), las), root / name)
        else:
            nib.save(nib.Nifti1Image(data, affine), root / name)
        rows.append({"subject_id": f"S{i}", "session_id": "bl", "scan_path": name,
                     "pu_label": int(i == 1), "truth": "" if i == 0 else i % 2,
                     "split": "train" if i < 3 else "test"})
    path = root / "manifest.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_boxes_contain_the_hippocampus_and_sit_on_their_side():
    cfg = VolumeDataConfig()
    rec = hippocampus_box_record(cfg)
    assert rec["hipp_l"]["label_fraction_inside"] > 0.9
    assert rec["hipp_r"]["label_fraction_inside"] > 0.9
    assert rec["hipp_l"]["centre_mm"][0] < -10 and rec["hipp_r"]["centre_mm"][0] > 10
    boxes = hippocampus_boxes(cfg)
    for box in boxes.values():
        assert [s.stop - s.start for s in box] == [30, 30, 30]
        assert all(s.start >= 0 and s.stop <= n for s, n in zip(box, cfg.crop_shape))
    # Close to the published boxes (given in LAS order on the same crop): x mirrored.
    published_left_x = (54, 84)
    ours = boxes["hipp_l"][0]
    assert abs((104 - ours.stop) - published_left_x[0]) <= 3


def test_boxes_follow_a_different_grid(tmp_path):
    cfg = VolumeDataConfig(grid_spacing=2.0, grid_shape=(91, 109, 91),
                           crop_shape=(78, 96, 84), hipp_size=(24, 24, 24))
    rec = hippocampus_box_record(cfg)
    for key, sign in (("hipp_l", -1), ("hipp_r", 1)):
        assert rec[key]["label_fraction_inside"] > 0.9
        assert sign * rec[key]["centre_mm"][0] > 10
    # The boxes sit at the same place in the brain (mm) as on the default grid.
    default = hippocampus_box_record(VolumeDataConfig())
    assert np.allclose(rec["hipp_l"]["centre_mm"], default["hipp_l"]["centre_mm"], atol=4)
    saved = json.loads(save_hippocampus_boxes(cfg, tmp_path / "boxes.json").read_text())
    assert saved["hipp_r"]["crop_slices"] == rec["hipp_r"]["crop_slices"]


def test_items_shapes_and_fields(manifest):
    ds = build_volume_dataset(manifest, "train", VolumeDataConfig(), train=False)
    assert len(ds) == 3
    item = ds[0]
    assert item["brain"].shape == (1, 50, 50, 50)
    assert item["hipp_l"].shape == item["hipp_r"].shape == (1, 30, 30, 30)
    for key in ("brain", "hipp_l", "hipp_r"):
        assert type(item[key]) is torch.Tensor and item[key].dtype == torch.float32
    assert math.isnan(item["truth"]) and item["index"] == 0 and item["subject_id"] == "S0"
    assert ds[1]["pu_label"] == 1 and ds[1]["truth"] == 1.0 and ds[2]["index"] == 2
    # z-scored over brain voxels
    assert abs(float(item["brain"][item["brain"] != item["brain"].min()].mean())) < 1.0
    batch = collate_volumes([ds[i] for i in range(3)])
    assert batch["brain"].shape == (3, 1, 50, 50, 50)
    assert batch["pu_label"].tolist() == [0, 1, 0]
    assert batch["subject_id"] == ["S0", "S1", "S2"]
    from adni_pu.models.cnn3d import build_cnn3d

    with torch.no_grad():
        assert build_cnn3d("paper").eval()(batch).shape == (3,)


def test_las_storage_reads_like_ras_and_wrong_grid_is_refused(manifest, tmp_path):
    ds = build_volume_dataset(manifest, "test", VolumeDataConfig(), train=False)
    ras = build_volume_dataset(manifest, "train", VolumeDataConfig(), train=False)[0]
    las = ds[0]
    # subject 3 is subject 0 x 1.3 (+ noise), stored LAS: after z-scoring nearly equal
    assert float((las["hipp_l"] - ras["hipp_l"]).abs().mean()) < 0.1
    bad = tmp_path / "bad.nii"
    nib.save(nib.Nifti1Image(np.ones((40, 40, 40), np.int16), np.eye(4)), bad)
    frame = pd.DataFrame([{"subject_id": "X", "session_id": "bl", "scan_path": str(bad),
                           "pu_label": 0, "truth": 0, "split": "train"}])
    with pytest.raises(ValueError, match="model-grid"):
        build_volume_dataset(frame, "train", VolumeDataConfig(cache="none"))[0]
    with pytest.raises(ValueError, match="model-grid"):
        build_volume_dataset(frame, "train", VolumeDataConfig(cache="memory"))
    with pytest.raises(ValueError, match="no rows in split"):
        build_volume_dataset(manifest, "val", VolumeDataConfig())


def test_flip_swaps_the_hippocampus_inputs(manifest):
    plain = build_volume_dataset(manifest, "train", VolumeDataConfig(**NO_AUG), train=True)
    flip = build_volume_dataset(
        manifest, "train", VolumeDataConfig(**{**NO_AUG, "flip_prob": 1.0}), train=True)
    a, b = augmented(plain, 1), augmented(flip, 1)
    assert torch.equal(a["brain"], plain[1]["brain"])  # nothing random: the item itself
    assert torch.equal(b["brain"], a["brain"].flip(1))
    assert torch.equal(b["hipp_l"], a["hipp_r"].flip(1))
    assert torch.equal(b["hipp_r"], a["hipp_l"].flip(1))
    # the mirrored right hippocampus looks like a left one: close to the unflipped left box
    err = float((b["hipp_l"] - a["hipp_l"]).abs().mean())
    other = float((a["hipp_r"] - a["hipp_l"]).abs().mean())
    assert err < other


def test_augmentation_is_random_but_reproducible_and_keeps_shapes(manifest):
    cfg = VolumeDataConfig(flip_prob=0.5, affine_prob=1.0, intensity_prob=1.0, noise_std=0.01)
    ds = build_volume_dataset(manifest, "train", cfg, train=True)
    x1 = augmented(ds, 0, seed=1)
    torch.manual_seed(7)  # the global generator plays no part
    x2 = augmented(ds, 0, seed=1)
    x3 = augmented(ds, 0, seed=2)
    for key, shape in (("brain", (1, 50, 50, 50)), ("hipp_l", (1, 30, 30, 30))):
        assert x1[key].shape == shape
        assert torch.equal(x1[key], x2[key])
        assert not torch.equal(x1[key], x3[key])
    assert torch.equal(ds[0]["brain"], ds[0]["brain"])  # items themselves: never random
    evaluation = build_volume_dataset(manifest, "train", cfg, train=False)
    assert torch.equal(evaluation[0]["brain"], evaluation[0]["brain"])


def test_disk_cache(manifest, tmp_path):
    cfg = VolumeDataConfig(cache="disk", cache_dir=tmp_path / "cache")
    ds = build_volume_dataset(manifest, "train", cfg, train=False)
    first = ds[2]
    assert any((tmp_path / "cache").iterdir())
    again = build_volume_dataset(manifest, "train", dataclasses.replace(cfg), train=False)[2]
    assert torch.equal(first["brain"], again["brain"])


def test_disk_cache_is_shared_between_folds_and_keeps_each_folds_labels(manifest, tmp_path):
    """Another fold puts the same scans in other splits at other positions: the cached
    stage is not recomputed (one file per scan), and each item carries its own fold's row."""
    cfg = VolumeDataConfig(cache="disk", cache_dir=tmp_path / "cache")
    train = build_volume_dataset(manifest, "train", cfg, train=False)
    firsts = [train[i] for i in range(len(train))]
    files = sorted((tmp_path / "cache").iterdir())
    assert len(files) == 3
    other = pd.read_csv(manifest)
    other["split"] = ["test", "train", "train", "train"]  # S0 leaves train, S3 joins
    other["pu_label"] = [0, 0, 1, 1]
    other_train = build_volume_dataset(other, "train", cfg, train=False,
                                       base_dir=Path(manifest).parent)
    items = [other_train[i] for i in range(len(other_train))]
    assert len(sorted((tmp_path / "cache").iterdir())) == 4  # only S3 was new
    assert [(it["subject_id"], it["index"], it["pu_label"]) for it in items] == [
        ("S1", 0, 0), ("S2", 1, 1), ("S3", 2, 1)]
    assert torch.equal(items[0]["brain"], firsts[1]["brain"])  # S1's cached volume reused
    assert items[1]["truth"] == 0.0 and firsts[0]["truth"] != firsts[0]["truth"]  # S0: nan


def test_synthetic_ideal_preprocessed_scans_feed_the_pipeline(tmp_path):
    """The generator's model-grid stand-ins pass the grid check and give items."""
    from adni_pu.synth import SynthConfig, generate_cohort

    cfg = SynthConfig(voxel_size=3.0, ideal_preprocessed=True, write_brain_masks=False,
                      visit_probabilities=(1.0, 0.0, 0.0))
    cohort = generate_cohort(tmp_path / "synth", n_subjects=2, seed=0, config=cfg)
    summary = pd.read_csv(cohort.root / "preprocessed_ideal" / "summary.csv")
    assert list(summary["status"]) == ["done", "done"]
    frame = pd.DataFrame({"subject_id": summary["subject_id"], "session_id": "bl",
                          "scan_path": summary["preprocessed_path"], "pu_label": [1, 0],
                          "truth": [1, 0], "split": "train"})
    ds = build_volume_dataset(frame, "train", VolumeDataConfig(cache="none"), train=True)
    item = ds[1]
    assert item["hipp_l"].shape == (1, 30, 30, 30) and item["brain"].shape == (1, 50, 50, 50)
    assert float(item["hipp_l"].std()) > 0.1  # the box holds brain, not background


def test_hipp_mask_channel_moves_with_the_image(manifest):
    """``hipp_mask``: each hippocampus box gets the atlas label as a second channel, cut
    from the same window as the image (also when training moves the box), mirrored with it
    by the flip and untouched by intensity changes."""
    from adni_pu.data.volume_boxes import hippocampus_masks

    cfg = VolumeDataConfig(hipp_mask=True, **NO_AUG)
    masks = hippocampus_masks(cfg)
    m = cfg.hipp_margin
    assert masks["hipp_l"].shape == (1, *(s + 2 * m for s in cfg.hipp_size))
    centre = masks["hipp_l"][:, m:-m, m:-m, m:-m]
    record = hippocampus_box_record(cfg)
    boxed = atlas.region_mask(atlas.HIPPOCAMPUS_LEFT)
    assert float(centre.sum()) == pytest.approx(
        record["hipp_l"]["label_fraction_inside"] * boxed.sum(), rel=1e-3)
    plain = build_volume_dataset(manifest, "train", VolumeDataConfig(**NO_AUG))[1]
    item = build_volume_dataset(manifest, "train", cfg, train=False)[1]
    assert item["brain"].shape[0] == 1 and item["hipp_l"].shape[0] == 2
    assert torch.equal(item["hipp_l"][:1], plain["hipp_l"])
    assert torch.equal(item["hipp_l"][1:], centre)
    moved = build_volume_dataset(manifest, "train", dataclasses.replace(
        cfg, translate=True, intensity_prob=1.0, flip_prob=1.0), train=True)
    x = augmented(moved, 1, seed=3)
    base = moved.base[1]  # the cached box with its margin, before augmentation
    label_r = masks["hipp_r"].flip(1)  # flipped: hipp_l now holds the mirrored right box
    image_r = torch.as_tensor(base["hipp_r"]).flip(1)
    found = [(i, j, k) for i in range(2 * m + 1) for j in range(2 * m + 1)
             for k in range(2 * m + 1) if torch.equal(
                 x["hipp_l"][1:], label_r[:, i:i + 30, j:j + 30, k:k + 30])]
    assert found, "the label channel is not a window of the mirrored label"
    i, j, k = found[0]
    window = image_r[:, i:i + 30, j:j + 30, k:k + 30]
    # the image channel is the same window, scaled and shifted by the intensity change
    a = torch.stack([window.flatten(), torch.ones(window.numel())], 1)
    fit = torch.linalg.lstsq(a, x["hipp_l"][0].flatten()[:, None]).solution
    assert float((a @ fit - x["hipp_l"][0].flatten()[:, None]).abs().max()) < 1e-4


def test_ventricle_channel_is_the_box_resized_with_the_brain(manifest):
    from adni_pu.data.volume_boxes import ventricle_box_mask

    cfg = VolumeDataConfig(ventricle_mask=True, **NO_AUG)
    box = ventricle_box_mask(cfg)
    assert box.shape == (1, 50, 50, 50) and 0.0 <= float(box.min()) <= float(box.max()) <= 1.0
    # centred in x (the box is symmetric about the midline; the crop nearly so)
    profile = box[0].sum(dim=(1, 2))
    centre = float((profile * torch.arange(50)).sum() / profile.sum())
    assert abs(centre - 24.5) < 1.0
    grid_box = atlas.mm_box_mask()
    crop = tuple(slice(o, o + c) for o, c in zip(cfg.crop_origin(), cfg.crop_shape))
    assert float(box.mean()) == pytest.approx(float(grid_box[crop].mean()), rel=0.05)
    item = build_volume_dataset(manifest, "train", cfg, train=False)[1]
    plain = build_volume_dataset(manifest, "train", VolumeDataConfig(**NO_AUG))[1]
    assert item["brain"].shape == (2, 50, 50, 50) and item["hipp_l"].shape == (1, 30, 30, 30)
    assert torch.equal(item["brain"][:1], plain["brain"]) and torch.equal(item["brain"][1:], box)
    flipped = augmented(build_volume_dataset(manifest, "train", VolumeDataConfig(
        ventricle_mask=True, **{**NO_AUG, "flip_prob": 1.0, "intensity_prob": 1.0}),
        train=True), 1)
    assert torch.equal(flipped["brain"][1:], box.flip(1))

"""``adni-pu interpret``: attribution maps on the model grid (adni_pu.interpret), on tiny inputs."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner
from volume_helpers import NO_AUGMENTATION, make_volume_cohort, tiny_overrides

from adni_pu.cli.app import app
from adni_pu.data.volume_config import VolumeDataConfig
from adni_pu.data.volumes import build_volume_dataset
from adni_pu.errors import AdniPuError
from adni_pu.interpret.grid_model import GridModel, as_batch, load_grid_volume
from adni_pu.interpret.maps import (
    MapSettings,
    attribution_map,
    feature_geometry,
    identity,
    to_input_space,
)
from adni_pu.interpret.stats import rank_correlation, region_share, subject_group
from adni_pu.models.cnn3d import ThreeBranchCNN3D, build_cnn3d
from adni_pu.workflows.evaluate import evaluate_run
from adni_pu.workflows.interpret import (
    REPORT_MARKER,
    analysis_mask,
    grid_atlas,
    hippocampus_mask,
    interpret_run,
)
from adni_pu.workflows.train import train_volumes
from adni_pu.workflows.volume_settings import load_volume_config


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny cohort (positives lose hippocampal intensity), a 2-epoch naive run, its
    evaluation, then Grad-CAM maps of the test split (which relinks the report)."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("interpret")
    manifest = make_volume_cohort(root / "cohort")
    cfg = load_volume_config(None, tiny_overrides(2) + NO_AUGMENTATION, preset="naive")
    train_volumes(manifest, cfg, root / "run", log=lambda m: None)
    evaluate_run(root / "run", "test", n_boot=50)
    record = interpret_run(root / "run", "test", "gradcam", device="cpu", sanity_subjects=2,
                           n_boot=200)
    return {"root": root, "manifest": manifest, "run": root / "run", "record": record,
            "out": root / "run" / "interpret-test-gradcam"}


# --------------------------------------------------------------------------- the grid model


def test_grid_model_builds_the_pipelines_inputs_from_one_grid_volume(tiny):
    frame = pd.read_csv(tiny["manifest"])
    for extra in ({}, {"hipp_mask": True, "ventricle_mask": True}):
        data = VolumeDataConfig(brain_size=(24, 24, 24), hipp_size=(16, 16, 16), hipp_margin=2,
                                cache="none", **extra)
        item = build_volume_dataset(frame, "test", data, base_dir=tiny["manifest"].parent)[0]
        volume, affine = load_grid_volume(tiny["manifest"].parent / frame.loc[
            frame["split"] == "test", "scan_path"].iloc[0], data)
        np.testing.assert_allclose(affine, data.grid_affine(), atol=1e-4)
        model = ThreeBranchCNN3D((4, 8), 16, brain_size=24, hipp_size=16)
        inputs = GridModel(model, data).inputs(as_batch(volume))
        for key in ("brain", "hipp_l", "hipp_r"):
            assert inputs[key].shape[1:] == item[key].shape
            torch.testing.assert_close(inputs[key][0], item[key], atol=2e-5, rtol=1e-5)


def test_a_volume_off_the_grid_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "small.nii.gz"
    nib.save(nib.Nifti1Image(np.ones((20, 20, 20), np.float32), np.eye(4)), path)
    with pytest.raises(AdniPuError, match="small.nii.gz"):
        load_grid_volume(path, VolumeDataConfig())


# --------------------------------------------------------------------------- the three methods


SMALL = dict(grid_shape=(40, 48, 40), grid_spacing=4.5, crop_shape=(36, 44, 36),
             brain_size=(32, 32, 32), hipp_size=(14, 14, 14), hipp_margin=0, cache="none")


def _driven_by_a_blob():
    """A 3-branch CNN whose logit grows with voxels brighter than 4 in the whole-brain input
    (identity convolutions, positive weights, the boxes' features unused; no intensity
    normalisation, so nothing couples distant voxels), and a volume of textured brain (about
    1) with one small blob of 10: the blob alone drives the output. The blob lies inside one
    occlusion block of 8 voxels."""
    data = VolumeDataConfig(**SMALL, normalization="none")
    net = ThreeBranchCNN3D((2, 2), 4, brain_size=32, hipp_size=14).eval()
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, torch.nn.Conv3d):
                module.weight.zero_()
                module.weight[:, :, 1, 1, 1] = 1.0 / module.in_channels
            elif isinstance(module, torch.nn.Linear):
                module.weight.fill_(1.0 / module.in_features)
                module.bias.zero_()
        n_brain = 2 * 5 ** 3  # the brain branch's features come first; the boxes get no say
        net.classifier[0].weight[:, n_brain:] = 0.0
        net.branches["brain"].blocks[1].bias.fill_(-4.0)  # only intensities above 4 fire
    grid = np.indices(data.grid_shape).astype(np.float32)
    centre = np.array(data.grid_shape, dtype=np.float32)[:, None, None, None] / 2
    inside = ((grid - centre) ** 2 / np.array([15, 18, 15])[:, None, None, None] ** 2).sum(0) < 1
    texture = np.random.default_rng(0).normal(1.0, 0.3, size=data.grid_shape)
    volume = np.where(inside, texture, 0.0).astype(np.float32)
    blob = ((grid - np.array([14, 22, 22])[:, None, None, None]) ** 2).sum(0) <= 2
    volume[blob] = 10.0
    return data, net, volume, blob


@pytest.mark.parametrize("method", ["gradcam", "gradients", "occlusion"])
def test_the_region_that_drives_the_output_gets_high_values(method):
    data, net, volume, blob = _driven_by_a_blob()
    brain = volume != 0
    heat = attribution_map(method, GridModel(net, data), volume, brain,
                           MapSettings(patch=8, samples=2, noise=0.01))
    assert heat.shape == tuple(data.grid_shape)
    assert not any(m.training for m in net.modules())  # left in eval mode (BatchNorm)
    centre = np.argwhere(blob).mean(axis=0)
    distance = np.sqrt(((np.indices(blob.shape) - centre[:, None, None, None]) ** 2).sum(0))
    near, far = brain & (distance <= 12), brain & (distance > 12)  # Grad-CAM is coarse
    assert heat[blob].mean() > 5 * max(np.abs(heat[far]).mean(), 1e-12)
    assert np.abs(heat[near]).sum() > 0.6 * np.abs(heat[brain]).sum()


def test_gradcam_features_go_back_to_the_centres_of_their_receptive_fields():
    blocks = build_cnn3d("paper").branches["brain"].blocks.eval()
    offset, jump = feature_geometry(blocks, "7")
    assert (offset, jump) == ([6.0, 6.0, 6.0], [4.0, 4.0, 4.0])
    x = torch.randn(1, 1, 50, 50, 50, requires_grad=True)
    features = blocks(x)
    for j in (0, 4, 9):  # the input voxels feature j reads, along the first axis
        x.grad = None
        features[0, :, j, 5, 5].sum().backward(retain_graph=True)
        reads = x.grad[0, 0].abs().sum(dim=(1, 2)).nonzero().flatten()
        assert (reads.min() + reads.max()) / 2 == offset[0] + j * jump[0]
    raw = torch.zeros(1, 1, 10, 10, 10, dtype=torch.float64)
    raw[0, 0, 1, 1, 1] = 1.0
    placed = to_input_space(raw, offset, jump, (50, 50, 50))[0, 0]
    assert tuple(int(v) for v in np.unravel_index(int(placed.argmax()), placed.shape)) == \
        (10, 10, 10)  # 6 + 4 * 1; stretching 10 features over 50 voxels would give 7


def test_monai_default_gradcam_normaliser_flips_magnitudes_ours_keeps_them():
    from monai.visualize import GradCAM

    data, net, volume, blob = _driven_by_a_blob()
    model = GridModel(net, data, volume != 0)
    x = as_batch(volume)
    layer = "model.branches.brain.blocks.7"
    default = GradCAM(nn_module=model, target_layers=layer)(x, class_idx=0)[0, 0].numpy()
    ours = GradCAM(nn_module=model, target_layers=layer, postprocessing=identity)(
        x, class_idx=0)[0, 0].detach().numpy()
    inner = volume != 0  # MONAI upsamples the brain branch's map to the whole grid
    assert ours[blob].mean() > np.median(ours[inner]) * 2
    assert default[blob].mean() < np.median(default[inner])  # high importance came out low
    assert default.min() >= 0 and default.max() <= 1


# --------------------------------------------------------------------------- numbers


def test_rank_correlation_of_absolute_maps():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(10, 10, 10))
    assert rank_correlation(a, -2 * a) == pytest.approx(1.0)  # |maps|, scale-free
    assert rank_correlation(np.abs(a), 1 / (1 + np.abs(a))) == pytest.approx(-1.0)
    assert abs(rank_correlation(a, rng.normal(size=a.shape))) < 0.1
    mask = np.zeros(a.shape, bool)
    mask[:5] = True
    b = a.copy()
    b[5:] = rng.normal(size=b[5:].shape)  # differs only outside the mask
    assert rank_correlation(a, b, mask) == pytest.approx(1.0)


def test_a_map_concentrated_in_the_hippocampi_gets_a_share_above_their_volume_share():
    data = VolumeDataConfig()
    template, labels = grid_atlas(data)
    mask = analysis_mask(data, template, labels)
    region = hippocampus_mask(labels)[mask]  # AAL hippocampi, over the analysis mask
    rng = np.random.default_rng(1)
    for signed in (False, True):
        noise = rng.normal(size=(8, region.size)) if signed else rng.random((8, region.size))
        maps = (noise * 0.1).astype(np.float32)
        maps[:, region] += rng.uniform(1.0, 3.0, size=(8, 1)).astype(np.float32)
        out = region_share(maps, region, n_boot=300, seed=0)
        lo, hi = out["ci"]
        assert out["volume_share"] == pytest.approx(region.mean())
        assert 0 < out["volume_share"] < 0.02
        assert 0 <= lo <= out["share"] <= hi <= 1
        assert lo > out["volume_share"] and out["ratio"] > 1
        assert out["n_subjects"] == 8 and out["bootstrap"]["resamples"] == 300
    flat = region_share(rng.random((8, region.size)), region, n_boot=300)
    assert flat["ci"][0] < flat["volume_share"] * 1.1  # no concentration: about its size
    assert np.isnan(region_share(np.zeros((0, region.size)), region)["share"])


def test_groups_are_named_as_evaluate_names_them():
    assert subject_group(1, 1.0) == "labelled_positive"
    assert subject_group(0, 1.0) == "hidden_positive"
    assert subject_group(0, 0.0) == "unlabelled_negative"
    assert subject_group(0, float("nan")) == "unknown_truth"


# --------------------------------------------------------------------------- the workflow


def test_interpret_writes_maps_on_the_volumes_grid_group_means_and_tables(tiny):
    out, rec = tiny["out"], tiny["record"]
    frame = pd.read_csv(tiny["manifest"])
    test = frame[frame["split"] == "test"]
    scans = pd.read_csv(out / "scans.csv")
    assert len(scans) == len(test) == rec["n_scans"] == 6
    volume = nib.load(tiny["manifest"].parent / test["scan_path"].iloc[0])
    for name in scans["map"]:
        img = nib.load(out / name)
        assert img.shape == volume.shape
        np.testing.assert_allclose(img.affine, volume.affine, atol=1e-5)
    # the grid model scores each scan as evaluate does (the same inputs, eval mode)
    scored = pd.read_csv(tiny["run"] / "evaluation" / "test" / "predictions_scans.csv")
    merged = scans.merge(scored, on=["subject_id", "session_id"], suffixes=("", "_eval"))
    np.testing.assert_allclose(merged["logit"], merged["logit_eval"], atol=1e-4)
    assert rec["groups"] == {"all": 5, "labelled_positive": 1, "hidden_positive": 1,
                             "unlabelled_negative": 2, "unknown_truth": 1}
    for group in rec["groups"]:
        assert (out / f"group-{group}_gradcam.nii.gz").is_file()
    # the group mean is the mean over subjects of each subject's mean over its scans
    maps = {n: nib.load(out / n).get_fdata() for n in scans["map"]}
    negatives = scans[scans["group"] == "unlabelled_negative"]
    expected = np.mean([np.mean([maps[m] for m in g["map"]], axis=0)
                        for _, g in negatives.groupby("subject_id")], axis=0)
    np.testing.assert_allclose(nib.load(out / "group-unlabelled_negative_gradcam.nii.gz")
                               .get_fdata(), expected, atol=1e-5)
    assert (out / "overlay.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    regions = pd.read_csv(out / "regions.csv")
    for _, table in regions.groupby("group"):
        assert table["mass_share"].sum() == pytest.approx(1.0)
        assert table["volume_share"].sum() == pytest.approx(1.0)
        assert table["mass_share"].is_monotonic_decreasing
    assert "Hippocampus_L" in set(regions["region"])
    assert "| rank | region | mass share | volume share | ratio |" in \
        (out / "regions.md").read_text()
    saved = json.loads((out / "interpret.json").read_text())
    assert saved["method"] == "gradcam" and saved["split"] == "test"
    assert saved["settings"]["patch"] == MapSettings().patch
    assert "monai" in saved["versions"] and saved["timing"]["cpu_seconds_per_scan"] > 0


def test_model_randomisation_maps_differ_and_their_rank_correlation_is_reported(tiny):
    out, rec = tiny["out"], tiny["record"]
    per_scan = rec["sanity"]["randomisation"]["per_scan"]
    assert len(per_scan) >= 2  # two subjects, one of them with two scans
    scans = pd.read_csv(out / "scans.csv").dropna(subset=["randomised_spearman"])
    for _, row in scans.iterrows():
        trained = nib.load(out / row["map"]).get_fdata()
        randomised = nib.load(out / row["map"].replace("maps/", "randomised/")).get_fdata()
        assert not np.allclose(trained, randomised, rtol=0.05, atol=1e-6)
        assert -1 <= row["randomised_spearman"] < 0.99
    mean = rec["sanity"]["randomisation"]["mean"]
    assert mean == pytest.approx(np.mean([r["spearman"] for r in per_scan]))


def test_hippocampal_share_of_the_positives_map_has_a_bootstrap_ci(tiny):
    share = tiny["record"]["sanity"]["hippocampal_share"]
    assert share["n_subjects"] == 2  # the labelled and the hidden positive of the test split
    lo, hi = share["ci"]
    assert 0 <= lo <= share["share"] <= hi <= 1
    assert 0 < share["volume_share"] < 0.05 and share["bootstrap"]["resamples"] == 200


def test_the_evaluation_report_links_the_maps_and_keeps_them_when_rewritten(tiny):
    report = tiny["run"] / "evaluation" / "test" / "report.md"
    for rewrite in (False, True):  # linked by interpret, then by evaluate's own rewrite
        if rewrite:
            evaluate_run(tiny["run"], "test", n_boot=50)
        text = report.read_text()
        assert text.count(REPORT_MARKER) == 1 and "## What the model looks at" in text
        link = next(line for line in text.splitlines() if "[overlay](" in line)
        target = link.split("[overlay](")[1].split(")")[0]
        assert (report.parent / target).resolve() == (tiny["out"] / "overlay.png").resolve()
        assert "regions.md" in link and "randomisation rank correlation" in link


def test_cli_interpret_writes_its_outputs_and_refuses_an_unknown_method(tiny, tmp_path):
    runner = CliRunner()
    out = tmp_path / "maps"
    result = runner.invoke(app, ["interpret", str(tiny["run"]), "--split", "val", "--method",
                                 "gradients", "--samples", "1", "--sanity", "0", "--out",
                                 str(out)])
    assert result.exit_code == 0, result.output
    assert "gradients maps of 4 scans" in result.output
    assert len(list((out / "maps").glob("*.nii.gz"))) == 4
    assert json.loads((out / "interpret.json").read_text())["settings"]["samples"] == 1
    bad = runner.invoke(app, ["interpret", str(tiny["run"]), "--method", "saliency"])
    assert bad.exit_code == 2 and "gradcam, occlusion, gradients" in bad.output
    assert not (Path(tiny["run"]) / "interpret-test-saliency").exists()

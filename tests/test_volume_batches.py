"""Volume batches: MONAI's affine in the previous convention, keyed draws, the device store
against the loader, resume, loader workers and distributed shards."""

from __future__ import annotations

import logging
import math

import nibabel as nib
import numpy as np
import pandas as pd
import pytest
import torch

from adni_pu import atlas
from adni_pu.data.volume_augment import (
    AugmentSettings,
    draw,
    item_keys,
    occurrences,
    rotation_matrices,
)
from adni_pu.data.volume_config import VolumeDataConfig
from adni_pu.data.volumes import build_volume_dataset
from adni_pu.pu.batching import Entries, EpochPlan, epoch_batches
from adni_pu.pu.device_data import DeviceData

TINY = dict(brain_size=(24, 24, 24), hipp_size=(16, 16, 16), hipp_margin=2)
AUG = dict(flip_prob=0.5, affine_prob=0.5, intensity_prob=0.5, noise_std=0.05)
CPU = torch.device("cpu")
BRANCHES = ("brain", "hipp_l", "hipp_r")


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    """Six model-grid volumes (the MNI template, scaled and noised)."""
    root = tmp_path_factory.mktemp("batches")
    affine = atlas.model_grid_affine()
    t1 = atlas.resample_to(atlas.load_template("t1"), affine, atlas.MODEL_GRID_SHAPE)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(6):
        data = (t1 * (0.8 + 0.1 * i) + rng.normal(0, 3, t1.shape) * (t1 > 0)).astype(np.int16)
        nib.save(nib.Nifti1Image(data, affine), root / f"s{i}.nii")
        rows.append({"subject_id": f"S{i}", "session_id": "bl", "scan_path": f"s{i}.nii",
                     "pu_label": int(i < 2), "truth": int(i < 3), "split": "train"})
    path = root / "manifest.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


_BASES: dict[str, object] = {}


def dataset(manifest, train: bool = True, **kw):
    """A dataset of the six volumes with settings ``kw``; the cached stage (which these
    settings do not change) is computed once for the module."""
    from adni_pu.data.volumes import VolumeDataset

    cfg = VolumeDataConfig(**{**TINY, **AUG, "hipp_mask": True, "ventricle_mask": True, **kw})
    if str(manifest) not in _BASES:
        _BASES[str(manifest)] = build_volume_dataset(manifest, "train", cfg, train=train)
    first = _BASES[str(manifest)]
    return VolumeDataset(first.base, first.frame, cfg, train)


@pytest.fixture
def fresh_stores(monkeypatch):
    """No device store built yet (as in a new process)."""
    import weakref

    from adni_pu.data import volumes

    monkeypatch.setattr(volumes, "_STORES", weakref.WeakKeyDictionary())


def entries_of(n: int, n_p: int) -> Entries:
    return Entries(np.arange(n, dtype=np.int64), (np.arange(n) < n_p).astype(np.int64), n_p,
                   n - n_p)


def epoch(x, entries: Entries, seed: int, ep: int, workers: int = 0, shard=None):
    """One epoch's training inputs as the trainer asks for them (seed, epoch)."""
    batches = epoch_batches(entries, np.random.default_rng([seed, ep]), 2)
    if shard is not None:
        batches = shard.shard(batches, ep)
    plan = EpochPlan.of(batches)
    dd = DeviceData(CPU, batch_size=2, num_workers=workers)
    return [xb for xb, _s, _i in dd.training_batches(x, plan, entries,
                                                      augment_seed=seed * 1_000_003 + ep)]


def assert_batches_equal(a, b, atol: float = 0.0) -> None:
    assert len(a) == len(b)
    for xa, xb in zip(a, b):
        assert torch.equal(xa["index"], xb["index"])
        for key in BRANCHES:
            assert xa[key].shape == xb[key].shape
            diff = float((xa[key] - xb[key]).abs().max())
            assert diff <= atol, (key, diff)


# --------------------------------------------------------------------------- the draws


def test_rotation_matrices_follow_monai_create_rotate_and_create_scale():
    from monai.transforms.utils import create_rotate, create_scale

    rng = np.random.default_rng(0)
    angles, scale = rng.uniform(-0.3, 0.3, (5, 3)), rng.uniform(0.9, 1.1, 5)
    ours = rotation_matrices(angles, scale)
    for a, s, m in zip(angles, scale, ours):
        ref = create_rotate(3, a.tolist()) @ create_scale(3, [1 / s] * 3)
        assert np.allclose(m, ref, atol=1e-12)


def test_monai_affine_is_the_previous_rotation_about_torchs_axes():
    """Angles (t0, t1, t2) about the array's axes through MONAI's AffineTransform equal the
    previous code's rz @ ry @ rx about torch's (x, y, z) with angles (-t2, -t1, -t0), scaled
    by 1/s, sampled bilinearly with border padding: the same transform, parametrised alike."""
    import torch.nn.functional as F

    from adni_pu.data.volume_augment import RandAffineBatchd

    x = torch.randn(2, 2, 9, 11, 10)
    t, s = np.array([[0.05, -0.08, 0.02], [-0.07, 0.03, 0.09]]), np.array([1.04, 0.97])
    d = draw(item_keys(0, np.arange(2)), AugmentSettings())
    d = d.__class__(**{**d.__dict__, "affine": np.ones((2, 3), bool),
                       "angles": np.repeat(t[:, None], 3, 1), "scale": np.repeat(s[:, None], 3, 1)})
    ours = RandAffineBatchd()({"brain": x, "hipp_l": x, "hipp_r": x}, d)["brain"]
    for b in range(2):
        a, bb, c = -t[b, 2], -t[b, 1], -t[b, 0]
        rx = torch.tensor([[1, 0, 0], [0, math.cos(a), -math.sin(a)], [0, math.sin(a), math.cos(a)]])
        ry = torch.tensor([[math.cos(bb), 0, math.sin(bb)], [0, 1, 0],
                           [-math.sin(bb), 0, math.cos(bb)]])
        rz = torch.tensor([[math.cos(c), -math.sin(c), 0], [math.sin(c), math.cos(c), 0],
                           [0, 0, 1]])
        theta = torch.zeros(1, 3, 4)
        theta[0, :, :3] = (rz @ ry @ rx).float() / float(s[b])
        grid = F.affine_grid(theta, [1, *x[b].shape], align_corners=False)
        ref = F.grid_sample(x[b][None], grid, mode="bilinear", padding_mode="border",
                            align_corners=False)[0]
        assert float((ours[b] - ref).abs().max()) < 1e-5


def test_item_keys_are_per_seed_entry_and_occurrence():
    entries = np.array([3, 1, 3, 0, 3])
    assert occurrences(entries).tolist() == [0, 0, 1, 0, 2]
    keys = item_keys(7, entries)
    assert len(set(keys.tolist())) == 5  # the same entry twice: two draws
    assert np.array_equal(keys, item_keys(7, entries))
    assert not np.array_equal(keys, item_keys(8, entries))
    assert item_keys(7, entries[:2])[1] == keys[1]  # a key does not depend on the others


def test_draws_have_the_configured_laws():
    s = AugmentSettings(hipp_margin=3, rotate_deg=5.0, scale_range=0.05)
    d = draw(item_keys(0, np.arange(20000)), s)
    assert abs(d.flip.mean() - 0.5) < 0.02 and abs(d.affine.mean() - 0.3) < 0.02
    assert abs(d.intensity.mean() - 0.5) < 0.02
    counts = np.bincount(d.start["hipp_l"].ravel(), minlength=7)
    assert len(counts) == 7 and counts.min() > 0.9 * counts.mean()  # uniform on 0..2m
    rad = math.radians(5.0)
    assert np.abs(d.angles).max() <= rad and abs(np.abs(d.angles).mean() - rad / 2) < 0.01 * rad
    assert d.scale.min() >= 0.95 and d.scale.max() <= 1.05
    assert np.abs(d.factor - 1).max() <= 0.1 and np.abs(d.shift).max() <= 0.1
    off = draw(item_keys(0, np.arange(5)), AugmentSettings(translate=False, hipp_margin=3))
    assert (off.start["hipp_r"] == 3).all()


# --------------------------------------------------------------------------- the two paths


def test_store_batches_equal_the_loaders(manifest):
    """Same seed: the device store's batches equal the loader's, exactly with a float32
    store, within float16 rounding (1e-3 of the largest value) with the float16 store."""
    entries = entries_of(6, 2)
    loader = epoch(dataset(manifest, store="loader"), entries, 0, 1)
    exact = epoch(dataset(manifest, store="device", store_dtype="float32"), entries, 0, 1)
    assert_batches_equal(loader, exact)
    half = epoch(dataset(manifest, store="device", store_dtype="float16"), entries, 0, 1)
    top = max(float(b[k].abs().max()) for b in loader for k in BRANCHES)
    assert_batches_equal(loader, half, atol=1e-3 * top)
    assert loader[0]["hipp_l"].shape[1:] == (2, 16, 16, 16)
    assert loader[0]["brain"].shape[1:] == (2, 24, 24, 24)


def test_scoring_batches_are_the_items(manifest):
    ds = dataset(manifest, train=False)
    items = [ds[i] for i in range(len(ds))]
    for store in ("device", "loader"):
        batches = list(DeviceData(CPU).iterate(dataset(manifest, train=False, store=store,
                                                       store_dtype="float32"),
                                               [np.array([4, 1]), np.array([0])]))
        for key in BRANCHES:
            assert torch.equal(batches[0][key][0], items[4][key])
            assert torch.equal(batches[1][key][0], items[0][key])


def test_batches_do_not_depend_on_loader_workers(manifest):
    entries = entries_of(6, 2)
    ds = dataset(manifest, store="loader")
    assert_batches_equal(epoch(ds, entries, 3, 0, workers=0), epoch(ds, entries, 3, 0, workers=2))


def test_a_resumed_epoch_equals_the_uninterrupted_one(manifest, monkeypatch):
    """Epoch 2 after epochs 0 and 1 in one process equals epoch 2 in a fresh process (new
    dataset and store, other global random state): the draws depend on (seed, epoch, entry)
    alone."""
    entries = entries_of(6, 2)
    torch.manual_seed(0)
    ds = dataset(manifest)
    run = [epoch(ds, entries, 5, e) for e in range(3)]
    torch.manual_seed(1234)
    np.random.seed(99)
    import weakref

    from adni_pu.data import volumes

    monkeypatch.setattr(volumes, "_STORES", weakref.WeakKeyDictionary())  # a new store
    resumed = epoch(dataset(manifest), entries, 5, 2)
    assert_batches_equal(run[2], resumed)
    assert not torch.equal(run[1][0]["hipp_l"], run[2][0]["hipp_l"])  # epochs differ


def test_sharded_batches_take_the_right_rows(manifest):
    """Under torchrun each rank gets every other batch: the rows are the shard's, and each
    batch equals the same batch of a single process."""
    from adni_pu.distributed import DistributedRun

    entries = entries_of(6, 2)
    ds = dataset(manifest)
    whole = epoch(ds, entries, 4, 1)
    batches = epoch_batches(entries, np.random.default_rng([4, 1]), 2)
    for rank in range(2):
        run = DistributedRun(rank, 2)
        mine = epoch(ds, entries, 4, 1, shard=run)
        expected = run.shard(batches, 1)
        assert [b["index"].tolist() for b in mine] == [entries.base[b].tolist()
                                                       for b in expected]
        for b in mine:
            j = next(i for i, w in enumerate(whole) if torch.equal(w["index"], b["index"]))
            assert_batches_equal([whole[j]], [b])


# --------------------------------------------------------------------------- the store


def test_storage_types_round_within_their_precision(manifest):
    ref = dataset(manifest, train=False, store="device", store_dtype="float32")
    rows = [np.arange(6)]
    base = next(DeviceData(CPU).iterate(ref, rows))
    for dtype, rel in (("float16", 2 ** -11), ("bfloat16", 2 ** -8)):
        got = next(DeviceData(CPU).iterate(dataset(manifest, train=False, store_dtype=dtype), rows))
        for key in BRANCHES:
            assert torch.allclose(got[key], base[key], rtol=rel, atol=1e-6), (dtype, key)
    got = next(DeviceData(CPU).iterate(dataset(manifest, train=False, store_dtype="uint8"), rows))
    from adni_pu.data.volumes import device_store

    stored = device_store(ref, CPU).tensors  # the images the ranges are taken over
    for key in BRANCHES:
        image = base[key][:, :1]
        step = (stored[key].amax(dim=(1, 2, 3, 4)) - stored[key].amin(dim=(1, 2, 3, 4))) / 255
        err = (got[key][:, :1] - image).abs().amax(dim=(1, 2, 3, 4))
        assert (err <= step / 2 + 1e-5).all(), key
        assert torch.equal(got[key][:, 1:], base[key][:, 1:])  # label channels: exact


def test_store_falls_back_to_the_loader_with_a_message(manifest, monkeypatch, caplog,
                                                       fresh_stores):
    from adni_pu.data import volume_store
    from adni_pu.data.volumes import device_store

    monkeypatch.setattr(volume_store, "free_bytes", lambda device: 1000)
    with caplog.at_level(logging.WARNING, logger="adni_pu.volumes"):
        assert device_store(dataset(manifest, store="auto"), CPU) is None
    assert "reading them through the DataLoader" in caplog.text and "MiB" in caplog.text
    assert device_store(dataset(manifest, store="device"), CPU) is not None
    assert device_store(dataset(manifest, store="loader"), CPU) is None


def test_bad_store_settings_are_refused():
    from adni_pu.errors import ConfigError

    with pytest.raises(ConfigError, match="store: expected auto, device or loader"):
        VolumeDataConfig(store="gpu")
    with pytest.raises(ConfigError, match="store_dtype"):
        VolumeDataConfig(store_dtype="int8")


def test_a_resumed_volume_run_equals_the_uninterrupted_one(manifest, tmp_path):
    """The trainer on augmented volumes (device store, every augmentation on): interrupted
    after epoch 1 and resumed from its checkpoint, it ends with the weights of a run never
    interrupted."""
    from adni_pu import config as cfgmod
    from adni_pu.data.pu import PUData, PUSplit
    from adni_pu.pu.config import TrainConfig, preset_settings
    from adni_pu.pu.trainer import Trainer

    plain = dict(hipp_mask=False, ventricle_mask=False)
    train, scored = dataset(manifest, **plain), dataset(manifest, train=False, **plain)
    truth = np.array([1, 1, 1, 0, 0, 0], dtype=float)
    labelled = np.array([1, 1, 0, 0, 0, 0], dtype=bool)
    data = PUData(PUSplit(train, truth, labelled, "train", eval_x=scored),
                  PUSplit(scored, truth, labelled, "val"), PUSplit(scored, truth, labelled, "test"),
                  prior=0.5, scheme="censoring")
    cfg = cfgmod.from_dict(TrainConfig, {
        **preset_settings("nnpu"), "model": "cnn3d", "epochs": 3, "batch_size": 3,
        "lr": 1e-3, "progress": False, "device": "cpu", "threads": 1,
        "model_args": {"preset": "paper", "channels": [2, 4], "hidden": 8,
                       "brain_size": 24, "hipp_size": 16}})
    straight = Trainer(cfg, data, tmp_path / "straight", log=lambda m: None)
    straight.fit()
    interrupted = Trainer(cfg, data, tmp_path / "resumed", log=lambda m: None)
    original = interrupted.train_epoch

    def train_epoch(epoch, *args, **kwargs):
        if epoch == 1:
            raise KeyboardInterrupt
        return original(epoch, *args, **kwargs)

    interrupted.train_epoch = train_epoch  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    torch.manual_seed(99)  # a new process: other global random state
    resumed = Trainer(cfg, data, tmp_path / "resumed", log=lambda m: None)
    resumed.fit()
    assert resumed.start_epoch == 1
    for (k, v1), v2 in zip(straight.students[0].model.state_dict().items(),
                           resumed.students[0].model.state_dict().values()):
        torch.testing.assert_close(v1, v2, msg=k)

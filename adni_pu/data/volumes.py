"""MONAI data pipeline for the 3-branch 3D CNN: manifest rows -> brain and hippocampus inputs.

Two stages:

1. Deterministic, cached (MONAI ``CacheDataset`` in memory or ``PersistentDataset`` on
   disk): load the preprocessed model-grid volume with the one model-grid input check
   (:mod:`adni_pu.data.grid_check`: its header before, its intensities after), reorient
   to RAS, check the grid, take the 104 x 128 x 112 centre crop, normalise intensities,
   cut the left and right hippocampus boxes (with a margin for translation augmentation)
   and resize the whole crop to 50^3. What is cached is small (about 1 MB per scan), so an
   epoch is not bound by disk or by the loading transforms.
2. Per batch, on the training device (:mod:`adni_pu.data.volume_augment`; training only
   random): a random box position inside the margin, a left-right flip that also swaps
   the two hippocampus inputs (a mirrored right hippocampus looks like a left one), small
   affine changes per branch (MONAI's ``AffineTransform``), intensity scale/shift. Drawn
   from per-item keys (seed, epoch, entry), not from a generator's state. The cached
   images come from a store on the device (:mod:`adni_pu.data.volume_store`), loaded once,
   or through a ``DataLoader`` (``store``).

The hippocampus boxes come from the AAL hippocampus labels resampled to the model grid
(``adni_pu.atlas``), so they stay right when the grid or the crop changes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from adni_pu.data import grid_check
from adni_pu.data.volume_boxes import hippocampus_boxes, hippocampus_masks, ventricle_box_mask
from adni_pu.data.volume_config import VolumeDataConfig
from adni_pu.errors import ConfigError, ManifestError

BRANCH_KEYS: tuple[str, str, str] = ("brain", "hipp_l", "hipp_r")
MANIFEST_COLUMNS: tuple[str, ...] = ("subject_id", "session_id", "scan_path", "pu_label",
                                     "truth", "split")


# --------------------------------------------------------------------------- deterministic stage


def _check_grid(image: Any, expected: np.ndarray, shape: tuple[int, int, int]) -> Any:
    """Raise if ``image`` (a MONAI MetaTensor, RAS) is not on the expected grid."""
    found_shape = tuple(int(s) for s in image.shape[1:])
    name = image.meta.get("filename_or_obj", "volume") if hasattr(image, "meta") else "volume"
    if found_shape != tuple(shape):
        raise ManifestError(f"{name}: expected a model-grid volume of shape {tuple(shape)}, "
                         f"found {found_shape}; run `adni-pu preprocess` first")
    affine = np.asarray(image.affine, dtype=float)
    if not np.allclose(affine, expected, atol=1e-3 * float(abs(expected[0, 0])) + 1e-4):
        raise ManifestError(f"{name}: affine (after RAS reorientation) is not the model grid's; "
                         f"expected {expected[:3].round(3).tolist()}, "
                         f"found {affine[:3].round(3).tolist()}")
    return image


def _deterministic_transforms(cfg: VolumeDataConfig):
    """MONAI transforms of the cached stage (all deterministic)."""
    from monai.transforms import (
        BorderPadd,
        Compose,
        CopyItemsd,
        EnsureTyped,
        Lambdad,
        LoadImaged,
        NormalizeIntensityd,
        Orientationd,
        Resized,
        ScaleIntensityd,
        ScaleIntensityRangePercentilesd,
        SpatialCropd,
    )

    origin = cfg.crop_origin()
    # MONAI builds every default reader; its DICOM GPU reader warns twice per construction
    # that nvImageCodec is missing, which says nothing here (the volumes are NIfTI).
    logging.getLogger("monai.data.nvimgcodec_pydicom_plugin").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="NvImgCodecPydicomReader")
        load = LoadImaged(keys="brain", reader="NibabelReader", image_only=True,
                          ensure_channel_first=True, dtype=np.float32)
    # the one model-grid input check (adni_pu.data.grid_check): the header before reading,
    # the intensities after
    steps: list[Any] = [
        Lambdad(keys="brain", func=grid_check.header_step(
            cfg.grid_shape if cfg.check_grid else None)),
        load,
        Lambdad(keys="brain", func=grid_check.check_content),
        Orientationd(keys="brain", axcodes="RAS", labels=(("L", "R"), ("P", "A"), ("I", "S"))),
    ]
    if cfg.check_grid:
        steps.append(Lambdad(keys="brain", func=functools.partial(
            _check_grid, expected=cfg.grid_affine(), shape=cfg.grid_shape)))
    steps.append(SpatialCropd(keys="brain", roi_start=origin,
                              roi_end=[o + c for o, c in zip(origin, cfg.crop_shape)]))
    if cfg.normalization == "zscore":
        steps.append(NormalizeIntensityd(keys="brain", nonzero=True))
    elif cfg.normalization == "percentile":
        steps.append(ScaleIntensityRangePercentilesd(keys="brain", lower=0.5, upper=99.5,
                                                     b_min=0.0, b_max=1.0, clip=True))
    elif cfg.normalization == "minmax":
        steps.append(ScaleIntensityd(keys="brain", minv=0.0, maxv=1.0))
    boxes = hippocampus_boxes(cfg)
    m = cfg.hipp_margin
    steps.append(CopyItemsd(keys="brain", times=2, names=["hipp_l", "hipp_r"]))
    if m > 0:
        steps.append(BorderPadd(keys=["hipp_l", "hipp_r"], spatial_border=m, mode="constant"))
    for key in ("hipp_l", "hipp_r"):
        box = boxes[key]
        steps.append(SpatialCropd(keys=key, roi_slices=[slice(s.start, s.stop + 2 * m)
                                                        for s in box]))
    steps += [
        Resized(keys="brain", spatial_size=cfg.brain_size, mode="trilinear",
                anti_aliasing=True),
        EnsureTyped(keys=list(BRANCH_KEYS), data_type="tensor", dtype=torch.float32,
                    track_meta=False),
    ]
    return Compose(steps)


def _digest(cfg: VolumeDataConfig) -> str:
    """Hash of the settings that change the cached stage (part of the disk-cache key)."""
    keys = ("grid_shape", "grid_spacing", "crop_shape", "crop_start", "brain_size",
            "hipp_size", "hipp_margin", "normalization", "check_grid")
    record = {k: str(getattr(cfg, k)) for k in keys}
    record["input_check"] = grid_check.CHECKS  # items cached before a check was added: redone
    text = json.dumps(record, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- items and batches


class VolumeDataset(Dataset):
    """Items of one split: the cached stage, boxes at their centre, never augmented.

    Each item is a dict: ``brain``, ``hipp_l``, ``hipp_r`` (float32 tensors C x D x H x W),
    ``pu_label`` (int), ``truth`` (float, nan if unknown), ``index`` (position in the
    split), ``subject_id`` and ``session_id`` (str). Training and scoring read whole
    batches through :meth:`load_batches`, which augments them when the dataset is a
    ``train`` one and is given the items' keys.
    """

    def __init__(self, base: Any, frame: Any, config: VolumeDataConfig, train: bool) -> None:
        self.base = base
        self.frame = frame
        self.config = config
        self.train = train
        self.boxes = hippocampus_boxes(config)
        self.masks = hippocampus_masks(config) if config.hipp_mask else None
        self.ventricles = ventricle_box_mask(config) if config.ventricle_mask else None
        self._augment: Any = None
        self._on_device: dict[str, dict[str, torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self.base)

    @property
    def subject_ids(self) -> list[str]:
        """Subject of each item, in order."""
        return [str(s) for s in self.frame["subject_id"]]

    @property
    def augment(self) -> Any:
        """The batch augmentation (:class:`~adni_pu.data.volume_augment.VolumeAugment`)."""
        if self._augment is None:
            from adni_pu.data.volume_augment import AugmentSettings, VolumeAugment

            self._augment = VolumeAugment(AugmentSettings.of(self.config))
        return self._augment

    def images(self, index: int) -> dict[str, torch.Tensor]:
        """The cached images of item ``index`` (one channel; the boxes with their margin)."""
        return _cached_images(self.base, index)

    def meta(self, index: int) -> dict[str, Any]:
        """Labels and ids of item ``index``, from this split's own row (the disk cache is
        keyed by the scan alone, so its item may come from another fold or split)."""
        meta = self.base.data[index]
        truth = meta.get("truth")
        return {
            "pu_label": int(meta["pu_label"]),
            "truth": float("nan") if truth is None else float(truth),
            "index": int(meta["index"]),
            "subject_id": str(meta["subject_id"]),
            "session_id": str(meta["session_id"]),
        }

    def __getitem__(self, index: int) -> dict[str, Any]:
        batch = self.finish({k: v[None] for k, v in self.images(index).items()})
        out: dict[str, Any] = {k: batch[k][0].contiguous() for k in BRANCH_KEYS}
        out.update(self.meta(index))
        return out

    def finish(self, images: dict[str, torch.Tensor], keys: np.ndarray | None = None
               ) -> dict[str, torch.Tensor]:
        """A batch of cached images (B x 1 x ..., on any device) as the model's inputs: the
        label channels appended, then augmented (a ``train`` dataset given the items' keys,
        :func:`adni_pu.data.volume_augment.item_keys`) or the boxes cut at their centre."""
        batch = dict(images)
        device = batch["brain"].device
        n = batch["brain"].shape[0]
        masks = self._masks_on(device)
        if "brain" in masks:
            batch["brain"] = torch.cat([batch["brain"], masks["brain"].expand(n, -1, -1, -1, -1)],
                                       dim=1)
        for key in ("hipp_l", "hipp_r"):
            if key in masks:
                batch[key] = torch.cat([batch[key], masks[key].expand(n, -1, -1, -1, -1)],
                                       dim=1)
        if self.train and keys is not None:
            return self.augment(batch, keys)
        return self.augment.centre(batch)

    def _masks_on(self, device: torch.device) -> dict[str, torch.Tensor]:
        key = str(device)
        if key not in self._on_device:
            masks: dict[str, torch.Tensor] = {}
            if self.ventricles is not None:
                masks["brain"] = self.ventricles[None].to(device)
            if self.masks is not None:
                masks.update({k: v[None].to(device) for k, v in self.masks.items()})
            self._on_device[key] = masks
        return self._on_device[key]

    def load_batches(self, index_batches: list[np.ndarray], device: torch.device,
                     keys: list[np.ndarray] | None = None, num_workers: int = 0
                     ) -> Iterator[dict[str, torch.Tensor]]:
        """The model's inputs of each batch of item indices, on ``device``: ``brain``,
        ``hipp_l``, ``hipp_r`` (float32) and ``index``. Read from the store on the device
        (``config.store``; built on the first call) or through a ``DataLoader`` with
        ``num_workers``; then :meth:`finish` (``keys``: one array per batch)."""
        store = device_store(self, device)
        if store is not None:
            for b, idx in enumerate(index_batches):
                rows = torch.from_numpy(np.asarray(idx, dtype=np.int64)).to(device,
                                                                             non_blocking=True)
                batch = self.finish(store.gather(rows), None if keys is None else keys[b])
                batch["index"] = rows
                yield batch
            return
        loader = torch.utils.data.DataLoader(
            _CachedImages(self.base), batch_sampler=[list(map(int, b)) for b in index_batches],
            num_workers=num_workers, collate_fn=_stack_images,
            pin_memory=device.type == "cuda", persistent_workers=False)
        for b, images in enumerate(loader):
            images = {k: v.to(device, non_blocking=True) for k, v in images.items()}
            rows = images.pop("index")
            batch = self.finish(images, None if keys is None else keys[b])
            batch["index"] = rows
            yield batch


def _cached_images(base: Any, index: int) -> dict[str, torch.Tensor]:
    try:
        item = base[index]
    except RuntimeError as exc:
        raise _unwrap(exc) from exc
    return {k: torch.as_tensor(item[k], dtype=torch.float32) for k in BRANCH_KEYS}


class _CachedImages(Dataset):
    """The cached images of a split by index (what the loader's workers read)."""

    def __init__(self, base: Any) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> dict[str, Any]:
        out: dict[str, Any] = _cached_images(self.base, index)
        out["index"] = index
        return out


def _stack_images(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    out = {k: torch.stack([it[k] for it in items]) for k in BRANCH_KEYS}
    out["index"] = torch.tensor([it["index"] for it in items], dtype=torch.long)
    return out


_STORES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def device_store(dataset: VolumeDataset, device: torch.device) -> Any:
    """The :class:`~adni_pu.data.volume_store.VolumeStore` of ``dataset``'s cached items on
    ``device``, built once per cache (a split's training and scoring datasets share it), or
    None where ``config.store`` or the free memory says to use the loader (said once)."""
    from adni_pu.data.volume_store import VolumeStore, log, storage_type, store_plan

    cfg = dataset.config
    per_base = _STORES.setdefault(dataset.base, {})
    key = (str(device), cfg.store, cfg.store_dtype)
    if key in per_base:
        return per_base[key]
    plan = store_plan(len(dataset), cfg, device)
    store = None
    if plan.use_store:
        try:
            store = VolumeStore.build(lambda i: _cached_images(dataset.base, i), len(dataset),
                                      cfg, device)
            log.info("volumes: %d items stored on %s (%.0f MiB, %s)", len(dataset), device,
                     store.nbytes / 2**20, storage_type(cfg, device))
        except torch.OutOfMemoryError:
            log.warning("volumes: the %d items (%.0f MiB as %s) did not fit on %s; reading "
                        "them through the DataLoader instead", len(dataset),
                        plan.needed / 2**20, storage_type(cfg, device), device)
    elif cfg.store == "auto":
        log.warning("volumes: %s; reading them through the DataLoader instead "
                    "(data.store = \"loader\" chooses it without this message)", plan.reason)
    per_base[key] = store
    return store


def collate_volumes(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack a list of items: branch tensors B x 1 x D x H x W, labels as tensors, ids as lists."""
    if not batch:
        raise ValueError("collate_volumes: empty batch")
    out: dict[str, Any] = {k: torch.stack([b[k] for b in batch]) for k in BRANCH_KEYS}
    out["pu_label"] = torch.tensor([b["pu_label"] for b in batch], dtype=torch.long)
    out["truth"] = torch.tensor([b["truth"] for b in batch], dtype=torch.float32)
    out["index"] = torch.tensor([b["index"] for b in batch], dtype=torch.long)
    out["subject_id"] = [b["subject_id"] for b in batch]
    out["session_id"] = [b.get("session_id", "") for b in batch]
    return out


# --------------------------------------------------------------------------- manifest -> dataset


def _read_manifest(manifest: Any, base_dir: str | Path | None):
    import pandas as pd

    if isinstance(manifest, (str, Path)):
        from adni_pu.cohort.manifest import read_manifest  # the one manifest reader

        path = Path(manifest)
        frame = read_manifest(path)
        base = Path(base_dir) if base_dir is not None else path.parent
    elif isinstance(manifest, pd.DataFrame):
        frame = manifest.copy()
        base = Path(base_dir) if base_dir is not None else Path.cwd()
    else:
        raise TypeError(f"manifest: expected a DataFrame or a CSV/Parquet path, found "
                        f"{type(manifest).__name__}")
    missing = [c for c in MANIFEST_COLUMNS if c not in frame.columns]
    if missing:
        raise ManifestError(f"manifest lacks column(s) {missing}; expected {list(MANIFEST_COLUMNS)}")
    return frame, base


def build_volume_dataset(manifest: Any, split: str, config: VolumeDataConfig | None = None,
                         train: bool = False, *, base_dir: str | Path | None = None
                         ) -> VolumeDataset:
    """Dataset of the manifest rows in ``split`` (``train``, ``val``, ``test``).

    ``manifest`` is a DataFrame or a CSV/Parquet path; relative ``scan_path`` values are
    read against ``base_dir`` (default: the manifest's folder, or the working directory
    for a DataFrame). ``train`` turns random augmentation on.
    """
    import pandas as pd

    cfg = config or VolumeDataConfig()
    frame, base = _read_manifest(manifest, base_dir)
    rows = frame[frame["split"].astype(str) == split].reset_index(drop=True)
    if rows.empty:
        found = sorted(frame["split"].astype(str).unique())
        raise ManifestError(f"manifest has no rows in split {split!r}; splits found: {found}")
    digest = _digest(cfg)
    data = []
    for i, row in rows.iterrows():
        path = Path(str(row["scan_path"]))
        if not path.is_absolute():
            path = base / path
        if not path.is_file():
            why = "is a folder, expected a NIfTI file" if path.is_dir() else "not found"
            raise ManifestError(f"{row['subject_id']} {row['session_id']}: scan {path} {why}")
        stat = path.stat()
        truth = row["truth"]
        truth = None if pd.isna(truth) or str(truth).strip() == "" else float(truth)
        data.append({
            "brain": str(path), "pu_label": int(row["pu_label"]), "truth": truth,
            "index": int(i), "subject_id": str(row["subject_id"]),
            "session_id": str(row["session_id"]),
            "cache_key": f"{stat.st_mtime_ns}-{stat.st_size}-{digest}",
        })
    base_ds = _cached_dataset(data, cfg)
    return VolumeDataset(base_ds, rows, cfg, train)


def check_all_items(dataset: VolumeDataset) -> None:
    """Run the cached stage, with its input check, on every item of ``dataset`` now, so a
    bad volume is refused (:class:`ManifestError` naming it) before any work that depends on
    all of them, such as making a run folder, starts. The memory cache did this when it was
    built; the disk cache computes and keeps each item missing from it (training then reads
    it from there); without a cache each volume is read once more."""
    from monai.data import CacheDataset

    if isinstance(dataset.base, CacheDataset):
        return
    for index in range(len(dataset.base)):
        try:
            dataset.base[index]
        except RuntimeError as exc:
            raise _unwrap(exc) from exc


def _unwrap(exc: BaseException) -> BaseException:
    """The error a transform raised, without MONAI's "applying transform" wrappers."""
    root: BaseException = exc
    while root.__cause__ is not None:
        root = root.__cause__
    return root if isinstance(root, (ValueError, OSError, KeyError)) else exc


def scan_cache_hash(item: dict[str, Any]) -> bytes:
    """Disk-cache file name of an item: its scan path and ``cache_key`` (the file's time,
    size and the cached stage's settings) only, so every fold, split and run that reads the
    same scan with the same settings shares one cache file (the item's labels and position
    differ between folds and are not part of it)."""
    text = json.dumps([str(item["brain"]), str(item["cache_key"])])
    return hashlib.sha256(text.encode()).hexdigest()[:32].encode()


def _cached_dataset(data: list[dict[str, Any]], cfg: VolumeDataConfig) -> Any:
    from monai.data import Dataset as MonaiDataset
    from monai.data import PersistentDataset

    from adni_pu.data.memory_cache import JoinedCacheDataset  # joins its threads on an error

    transform = _deterministic_transforms(cfg)
    if cfg.cache == "memory":
        try:
            return JoinedCacheDataset(data, transform, cache_rate=1.0,
                                      num_workers=max(cfg.cache_workers, 1), progress=False)
        except RuntimeError as exc:
            raise _unwrap(exc) from exc
    if cfg.cache == "disk":
        if cfg.cache_dir is None:
            raise ConfigError("cache = 'disk' needs cache_dir")
        cfg.cache_dir.mkdir(parents=True, exist_ok=True)
        return PersistentDataset(data, transform, cache_dir=cfg.cache_dir,
                                 hash_func=scan_cache_hash)
    return MonaiDataset(data, transform)

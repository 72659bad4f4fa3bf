"""Readers for the benchmark data sets, without torchvision.

- MNIST: the original IDX files, raw or gzip-compressed.
- CIFAR-10: the python pickles (``cifar-10-batches-py``) or a class-per-folder image layout
  (``train/<class>/*.jpg``, ``test/<class>/*.jpg``), also inside a ``.tar.gz`` archive such as
  the JPEG copy in ``../shared/data/cifar10-jpeg``.

Every reader checks what it reads (magic numbers, sizes, counts) and raises
:class:`DataFormatError` naming the file and what was expected and found.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import tarfile
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adni_pu.errors import DataFormatError

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
MNIST_COUNTS = {"train": 60000, "test": 10000}
CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)
CIFAR10_COUNTS = {"train": 50000, "test": 10000}


@dataclass(frozen=True)
class LabelledArrays:
    """Images (uint8, N x H x W or N x H x W x C) and their class labels (int64, N)."""

    images: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True)
class TrainTest:
    """A data set's official train and test parts."""

    train: LabelledArrays
    test: LabelledArrays
    name: str
    source: str


# ----------------------------------------------------------------------------- MNIST

def _find(directory: Path, stem: str) -> Path:
    for candidate in (directory / stem, directory / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    raise DataFormatError(
        f"{directory / stem}[.gz]: file not found; expected the MNIST file {stem} "
        f"(raw or .gz) in {directory}"
    )


def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as handle:
                return handle.read()
        return path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:  # zlib: corrupt deflate
        raise DataFormatError(f"{path}: cannot read, corrupt or truncated file ({exc})") from exc


def read_idx(path: str | Path, expected_ndim: int | None = None) -> np.ndarray:
    """Read one IDX file (unsigned-byte data), checking its magic number and size."""
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise DataFormatError(f"{path}: {len(raw)} bytes; expected an IDX header of 4+ bytes")
    zero, dtype_code, ndim = raw[0] << 8 | raw[1], raw[2], raw[3]
    if zero != 0 or dtype_code != 0x08:
        raise DataFormatError(
            f"{path}: magic number {raw[:4].hex()}; expected 0000 08 0N (unsigned-byte IDX)"
        )
    if expected_ndim is not None and ndim != expected_ndim:
        raise DataFormatError(f"{path}: {ndim} dimensions in header; expected {expected_ndim}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataFormatError(f"{path}: truncated header ({len(raw)} bytes)")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(shape))
    found = len(raw) - header
    if found != expected:
        raise DataFormatError(
            f"{path}: {found} data bytes; expected {expected} for shape {shape} (truncated?)"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def load_mnist(directory: str | Path, check_counts: bool = True) -> TrainTest:
    """Load MNIST from ``directory`` holding the four IDX files (raw or .gz)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataFormatError(f"{directory}: MNIST folder not found")
    parts = {}
    for split, prefix in (("train", "train"), ("test", "test")):
        images_path = _find(directory, MNIST_FILES[f"{prefix}_images"])
        labels_path = _find(directory, MNIST_FILES[f"{prefix}_labels"])
        images = read_idx(images_path, expected_ndim=3)
        labels = read_idx(labels_path, expected_ndim=1).astype(np.int64)
        if images.shape[1:] != (28, 28):
            raise DataFormatError(f"{images_path}: images of {images.shape[1:]}; expected 28x28")
        if len(images) != len(labels):
            raise DataFormatError(
                f"{labels_path}: {len(labels)} labels; expected {len(images)} "
                f"(as many as images in {images_path.name})"
            )
        if check_counts and len(images) != MNIST_COUNTS[split]:
            raise DataFormatError(
                f"{images_path}: {len(images)} images; expected {MNIST_COUNTS[split]}"
            )
        if labels.size and (labels.min() < 0 or labels.max() > 9):
            raise DataFormatError(f"{labels_path}: labels outside 0-9")
        parts[split] = LabelledArrays(images, labels)
    return TrainTest(parts["train"], parts["test"], "mnist", str(directory))


# ----------------------------------------------------------------------------- CIFAR-10

def _unpickle(path: Path) -> dict:
    try:
        with path.open("rb") as handle:
            batch = pickle.load(handle, encoding="bytes")
    except Exception as exc:  # noqa: BLE001 - a corrupt pickle raises almost any type
        raise DataFormatError(f"{path}: not a readable CIFAR-10 batch pickle "
                              f"({type(exc).__name__}: {exc})") from exc
    if not isinstance(batch, dict):
        raise DataFormatError(f"{path}: not a CIFAR-10 batch pickle (holds a "
                              f"{type(batch).__name__}; expected a dict)")
    return batch


def _cifar_batch(path: Path) -> LabelledArrays:
    if not path.is_file():
        raise DataFormatError(f"{path}: CIFAR-10 batch file not found")
    batch = _unpickle(path)
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if data is None or labels is None:
        raise DataFormatError(f"{path}: expected keys 'data' and 'labels', found {list(batch)}")
    data = np.asarray(data, dtype=np.uint8)
    labels = np.asarray(labels, dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3072:
        raise DataFormatError(f"{path}: data of shape {data.shape}; expected N x 3072")
    if len(data) != len(labels):
        raise DataFormatError(f"{path}: {len(data)} images but {len(labels)} labels")
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return LabelledArrays(np.ascontiguousarray(images), labels)


def load_cifar10_pickles(directory: str | Path, check_counts: bool = True) -> TrainTest:
    """Load CIFAR-10 from the python version (``data_batch_1..5``, ``test_batch``)."""
    directory = Path(directory)
    train = [_cifar_batch(directory / f"data_batch_{i}") for i in range(1, 6)]
    test = _cifar_batch(directory / "test_batch")
    train_arrays = LabelledArrays(
        np.concatenate([b.images for b in train]), np.concatenate([b.labels for b in train])
    )
    out = TrainTest(train_arrays, test, "cifar10", str(directory))
    if check_counts:
        _check_cifar_counts(out, directory)
    return out


def _check_cifar_counts(data: TrainTest, where: Path) -> None:
    for split in ("train", "test"):
        found = len(getattr(data, split).labels)
        if found != CIFAR10_COUNTS[split]:
            raise DataFormatError(
                f"{where}: {found} {split} images; expected {CIFAR10_COUNTS[split]}"
            )


def _decode_image(payload: bytes, name: str) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(payload)) as img:
            arr = np.asarray(img.convert("RGB"), dtype=np.uint8)
    except Exception as exc:  # noqa: BLE001 - PIL raises many types
        raise DataFormatError(f"{name}: not a readable image ({exc})") from exc
    if arr.shape != (32, 32, 3):
        raise DataFormatError(f"{name}: image of {arr.shape}; expected 32x32x3")
    return arr


def _collect(items: Iterable[tuple[str, bytes]], source: str) -> TrainTest:
    """Sort ``(relative path, bytes)`` items of a split/class/file layout into arrays."""
    buckets: dict[str, list[tuple[str, int, bytes]]] = {"train": [], "test": []}
    for rel, payload in items:
        parts = Path(rel).parts
        if len(parts) < 3 or parts[-3] not in buckets:
            continue
        split, cls = parts[-3], parts[-2]
        if cls not in CIFAR10_CLASSES:
            raise DataFormatError(f"{source}/{rel}: class folder {cls!r} is not a CIFAR-10 class")
        buckets[split].append((rel, CIFAR10_CLASSES.index(cls), payload))
    arrays = {}
    for split, entries in buckets.items():
        if not entries:
            raise DataFormatError(f"{source}: no images under {split}/<class>/")
        entries.sort(key=lambda e: (e[1], e[0]))
        images = np.stack([_decode_image(p, f"{source}/{r}") for r, _, p in entries])
        labels = np.asarray([c for _, c, _ in entries], dtype=np.int64)
        arrays[split] = LabelledArrays(images, labels)
    return TrainTest(arrays["train"], arrays["test"], "cifar10", source)


_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")


def load_image_folder(path: str | Path, check_counts: bool = True) -> TrainTest:
    """Load a ``train|test/<class>/<image>`` layout from a folder or a .tar(.gz) archive."""
    path = Path(path)
    if path.is_file() and (path.suffixes[-2:] == [".tar", ".gz"] or path.suffix in (".tar", ".tgz")):
        try:
            with tarfile.open(path, "r:*") as archive:
                items = [
                    (m.name, archive.extractfile(m).read())  # type: ignore[union-attr]
                    for m in archive.getmembers()
                    if m.isfile() and m.name.lower().endswith(_IMAGE_SUFFIXES)
                ]
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise DataFormatError(f"{path}: not a readable tar archive ({exc})") from exc
    elif path.is_dir():
        items = [
            (str(p.relative_to(path)), p.read_bytes())
            for p in sorted(path.rglob("*"))
            if p.is_file() and p.suffix.lower() in _IMAGE_SUFFIXES
        ]
    else:
        raise DataFormatError(f"{path}: image folder or archive not found")
    out = _collect(items, str(path))
    if check_counts:
        _check_cifar_counts(out, path)
    return out


def load_cifar10(path: str | Path, cache_dir: str | Path | None = None) -> TrainTest:
    """Load CIFAR-10 from pickles or an image layout, whichever ``path`` holds.

    ``path`` may be the ``cifar-10-batches-py`` folder (or its parent), an image folder, a
    ``.tar.gz`` of one, or a folder containing exactly one such archive. Decoding 60,000
    JPEGs takes a while, so the decoded arrays are cached (``cache_dir``, keyed by the
    source's size and modification time).
    """
    path = Path(path)
    if (path / "cifar-10-batches-py").is_dir():
        path = path / "cifar-10-batches-py"
    if (path / "data_batch_1").is_file():
        return load_cifar10_pickles(path)
    if path.is_dir() and not (path / "train").is_dir():
        archives = sorted(path.glob("*.tar.gz")) + sorted(path.glob("*.tar"))
        if len(archives) == 1:
            path = archives[0]
        elif not archives:
            raise DataFormatError(
                f"{path}: no CIFAR-10 found; expected cifar-10-batches-py pickles, a "
                "train/<class>/ image folder, or one .tar.gz of such a folder"
            )
        else:
            raise DataFormatError(f"{path}: several archives {[a.name for a in archives]}")
    if cache_dir is None:
        return load_image_folder(path)
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    cache = Path(cache_dir) / f"cifar10-{key[:16]}.npz"
    if cache.is_file():
        try:
            with np.load(cache) as z:
                return TrainTest(
                    LabelledArrays(z["xtr"], z["ytr"]), LabelledArrays(z["xte"], z["yte"]),
                    "cifar10", str(path),
                )
        except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error):
            pass  # a damaged cache is only a cache: decode the source again and rewrite it
    data = load_image_folder(path)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp.npz")
    np.savez(tmp, xtr=data.train.images, ytr=data.train.labels,
             xte=data.test.images, yte=data.test.labels)
    tmp.replace(cache)
    return data

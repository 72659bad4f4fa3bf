"""Benchmark readers: MNIST IDX, CIFAR-10 pickles, image folders, and their corrupt files."""

from __future__ import annotations

import gzip
import hashlib
import pickle
import tarfile

import numpy as np
import pytest
from conftest import shared_path
from PIL import Image

from adni_pu.data import readers
from adni_pu.data.readers import DataFormatError


def idx_bytes(arr: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in arr.shape)
    return header + arr.astype(np.uint8).tobytes()


def write_mnist(folder, n_train=12, n_test=6, gz=True, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "train-images-idx3-ubyte": rng.integers(0, 255, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": np.arange(n_train) % 10,
        "t10k-images-idx3-ubyte": rng.integers(0, 255, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": np.arange(n_test) % 10,
    }
    for name, arr in files.items():
        data = idx_bytes(np.asarray(arr))
        if gz:
            with gzip.open(folder / f"{name}.gz", "wb") as handle:
                handle.write(data)
        else:
            (folder / name).write_bytes(data)
    return files


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_reads_raw_and_gzip(tmp_path, gz):
    files = write_mnist(tmp_path, gz=gz)
    data = readers.load_mnist(tmp_path, check_counts=False)
    assert data.train.images.shape == (12, 28, 28)
    np.testing.assert_array_equal(data.train.images, files["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(data.test.labels, files["t10k-labels-idx1-ubyte"])


def test_mnist_official_counts_are_checked(tmp_path):
    write_mnist(tmp_path)
    with pytest.raises(DataFormatError, match="expected 60000"):
        readers.load_mnist(tmp_path)


def test_mnist_wrong_magic_names_file(tmp_path):
    write_mnist(tmp_path, gz=False)
    path = tmp_path / "train-images-idx3-ubyte"
    raw = bytearray(path.read_bytes())
    raw[2] = 0x0D  # float data type
    path.write_bytes(bytes(raw))
    with pytest.raises(DataFormatError, match="train-images-idx3-ubyte: magic number"):
        readers.load_mnist(tmp_path, check_counts=False)


def test_mnist_truncated_file(tmp_path):
    write_mnist(tmp_path, gz=False)
    path = tmp_path / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataFormatError, match="t10k-images-idx3-ubyte: .*truncated"):
        readers.load_mnist(tmp_path, check_counts=False)


def test_mnist_label_count_mismatch(tmp_path):
    write_mnist(tmp_path, gz=False)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx_bytes(np.arange(11) % 10))
    with pytest.raises(DataFormatError, match="11 labels; expected 12"):
        readers.load_mnist(tmp_path, check_counts=False)


def test_mnist_missing_file(tmp_path):
    write_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataFormatError, match="t10k-labels-idx1-ubyte.*not found"):
        readers.load_mnist(tmp_path, check_counts=False)


def test_mnist_bad_gzip(tmp_path):
    write_mnist(tmp_path)
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataFormatError, match="train-images-idx3-ubyte.gz: cannot read"):
        readers.load_mnist(tmp_path, check_counts=False)


def corrupt_deflate(path):
    """Keep a 10-byte gzip header and trailer, replace the deflate stream by a block of the
    reserved type (what gzip reports as zlib.error "invalid block type")."""
    raw = gzip.compress(gzip.decompress(path.read_bytes()), mtime=0)  # no file name in header
    path.write_bytes(raw[:10] + b"\xff" * 64 + raw[-8:])


def test_mnist_corrupt_deflate_stream(tmp_path):
    write_mnist(tmp_path)
    corrupt_deflate(tmp_path / "t10k-labels-idx1-ubyte.gz")
    with pytest.raises(DataFormatError, match="t10k-labels-idx1-ubyte.gz: cannot read, corrupt"):
        readers.load_mnist(tmp_path, check_counts=False)


def test_cli_names_a_corrupt_mnist_file_and_exits_2(tmp_path):
    from typer.testing import CliRunner

    from adni_pu.cli.app import app

    write_mnist(tmp_path / "mnist")
    corrupt_deflate(tmp_path / "mnist" / "train-images-idx3-ubyte.gz")
    result = CliRunner().invoke(app, ["benchmark", "mnist", "--data-dir", str(tmp_path / "mnist"),
                                      "--out", str(tmp_path / "out"), "--epochs", "1"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "train-images-idx3-ubyte.gz: cannot read" in lines[0]


def write_cifar_pickles(folder, per_batch=4):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 255, (per_batch, 3072), dtype=np.uint8),
                 b"labels": list(np.arange(per_batch) % 10)}
        with (folder / name).open("wb") as handle:
            pickle.dump(batch, handle)


def test_cifar_pickles(tmp_path):
    write_cifar_pickles(tmp_path / "cifar-10-batches-py")
    data = readers.load_cifar10_pickles(tmp_path / "cifar-10-batches-py", check_counts=False)
    assert data.train.images.shape == (20, 32, 32, 3)
    assert data.test.images.shape == (4, 32, 32, 3)
    with pytest.raises(DataFormatError, match="20 train images; expected 50000"):
        readers.load_cifar10(tmp_path)


def test_cifar_corrupt_pickle(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar_pickles(folder)
    (folder / "data_batch_3").write_bytes(b"\x80\x04garbage")
    with pytest.raises(DataFormatError, match="data_batch_3: not a readable"):
        readers.load_cifar10_pickles(folder, check_counts=False)


@pytest.mark.parametrize("payload", [
    b"\x80\x02cno_such_module\nthing\n.",        # a class that cannot be imported
    b"\x80\x02c__builtin__\nno_such_name\n.",    # a name that does not exist
    pickle.dumps([1, 2, 3]),                        # a valid pickle of the wrong kind
])
def test_cifar_pickle_damaged_anywhere_is_a_clear_error(tmp_path, payload):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar_pickles(folder)
    (folder / "test_batch").write_bytes(payload)
    with pytest.raises(DataFormatError, match="test_batch: not a"):
        readers.load_cifar10_pickles(folder, check_counts=False)


def test_cifar_damaged_cache_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setitem(readers.CIFAR10_COUNTS, "train", 20)
    monkeypatch.setitem(readers.CIFAR10_COUNTS, "test", 20)
    write_image_folder(tmp_path / "imgs")
    archive = tmp_path / "src" / "cifar.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "imgs" / "train", arcname="train")
        tar.add(tmp_path / "imgs" / "test", arcname="test")
    first = readers.load_cifar10(archive.parent, cache_dir=tmp_path / "cache")
    (cache,) = (tmp_path / "cache").glob("*.npz")
    cache.write_bytes(cache.read_bytes()[: cache.stat().st_size // 2])
    again = readers.load_cifar10(archive.parent, cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(again.train.images, first.train.images)
    np.testing.assert_array_equal(again.test.labels, first.test.labels)


def test_cifar_wrong_shape(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar_pickles(folder)
    with (folder / "test_batch").open("wb") as handle:
        pickle.dump({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, handle)
    with pytest.raises(DataFormatError, match="test_batch: data of shape"):
        readers.load_cifar10_pickles(folder, check_counts=False)


def write_image_folder(root, per_class=2):
    rng = np.random.default_rng(1)
    for split in ("train", "test"):
        for cls in readers.CIFAR10_CLASSES:
            d = root / split / cls
            d.mkdir(parents=True)
            for i in range(per_class):
                arr = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(arr).save(d / f"{i:04d}.png")


def test_image_folder_and_archive(tmp_path):
    root = tmp_path / "imgs"
    write_image_folder(root)
    data = readers.load_image_folder(root, check_counts=False)
    assert data.train.images.shape == (20, 32, 32, 3)
    assert sorted(set(data.train.labels)) == list(range(10))
    archive = tmp_path / "copy.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root / "train", arcname="train")
        tar.add(root / "test", arcname="test")
    from_tar = readers.load_image_folder(archive, check_counts=False)
    np.testing.assert_array_equal(from_tar.train.images, data.train.images)
    np.testing.assert_array_equal(from_tar.test.labels, data.test.labels)


def test_image_folder_bad_image_and_class(tmp_path):
    root = tmp_path / "imgs"
    write_image_folder(root)
    (root / "train" / "cat" / "0000.png").write_bytes(b"broken")
    with pytest.raises(DataFormatError, match="cat/0000.png: not a readable image"):
        readers.load_image_folder(root, check_counts=False)
    (root / "train" / "cat" / "0000.png").unlink()
    (root / "train" / "zebra").mkdir()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(root / "train" / "zebra" / "a.png")
    with pytest.raises(DataFormatError, match="'zebra' is not a CIFAR-10 class"):
        readers.load_image_folder(root, check_counts=False)


@pytest.mark.integration
def test_shared_mnist_content_matches_published_checksums():
    folder = shared_path("mnist")
    data = readers.load_mnist(folder)
    assert np.bincount(data.train.labels).tolist() == [
        5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    with gzip.open(folder / "t10k-labels-idx1-ubyte.gz", "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    assert digest == "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2"


@pytest.mark.slow
@pytest.mark.integration
def test_shared_cifar_jpeg_copy(tmp_path):
    archive = shared_path("cifar10-jpeg", "cifar10_jpeg_q75.tar.gz")
    data = readers.load_cifar10(archive.parent, cache_dir=tmp_path)
    assert data.train.images.shape == (50000, 32, 32, 3)
    assert np.bincount(data.test.labels).tolist() == [1000] * 10

"""Download MNIST or CIFAR-10 from their official sources, verifying checksums.

For users with internet access; the tests never call this (these machines are offline).
"""

from __future__ import annotations

import hashlib
import tarfile
import urllib.request
from pathlib import Path

from adni_pu.fileio import file_digest

# SHA-256 of the *uncompressed* IDX files: gzip bytes differ between mirrors, content does not.
MNIST_SOURCES = {
    "train-images-idx3-ubyte":
        "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte":
        "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte":
        "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte":
        "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}
MNIST_BASE_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"


def _fetch(url: str, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".part")
    with urllib.request.urlopen(url, timeout=60) as response, tmp.open("wb") as out:
        while chunk := response.read(1 << 20):
            out.write(chunk)
    tmp.replace(dest)
    return dest



def download_mnist(directory: str | Path) -> Path:
    """Fetch the four MNIST files (.gz) into ``directory``; check the SHA-256 of their content."""
    import gzip

    directory = Path(directory)
    for name, sha in MNIST_SOURCES.items():
        path = directory / f"{name}.gz"
        if not path.is_file():
            _fetch(MNIST_BASE_URL + path.name, path)
        with gzip.open(path, "rb") as handle:
            found = hashlib.sha256(handle.read()).hexdigest()
        if found != sha:
            path.unlink()
            raise OSError(f"{path}: content SHA-256 {found}; expected {sha} (download corrupted)")
    return directory


def download_cifar10(directory: str | Path) -> Path:
    """Fetch and unpack the CIFAR-10 python pickles into ``directory``; check the MD5."""
    directory = Path(directory)
    archive = directory / "cifar-10-python.tar.gz"
    if not archive.is_file() or file_digest(archive, "md5") != CIFAR10_MD5:
        _fetch(CIFAR10_URL, archive)
    found = file_digest(archive, "md5")
    if found != CIFAR10_MD5:
        archive.unlink()
        raise OSError(f"{archive}: MD5 {found}; expected {CIFAR10_MD5} (download corrupted)")
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(directory, filter="data")
    return directory / "cifar-10-batches-py"

"""Files written whole or not at all, and file hashes: the one home of both.

Every output of adni-pu goes through :func:`atomic_write` (a temporary file beside the
target, then a rename), so an interrupted run never leaves a half-written file under the
real name; a rerun then finds either the old file or the new one.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def temporary_beside(path: Path) -> Path:
    """A new, empty temporary file in ``path``'s folder (created with its parents)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(tmp)


def atomic_write(path: str | Path, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp)`` on a temporary file beside ``path``, then rename it to ``path``."""
    path = Path(path)
    tmp = temporary_beside(path)
    try:
        writer(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def write_temporary(path: Path, data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path`` and return the temporary path.

    For a set of files committed together: the caller renames every temporary file into
    place once all are written (``adni_pu.preprocessing.io.write_outputs``).
    """
    tmp = temporary_beside(path)
    try:
        with tmp.open("wb") as handle:
            handle.write(data)
            handle.flush()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    """``torch.save(obj, path)`` atomically (checkpoints, selected models)."""
    import torch

    return atomic_write(path, lambda tmp: torch.save(obj, tmp))


def file_digest(path: str | Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file's bytes (read in 1 MB blocks)."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file."""
    return file_digest(path, "sha256")


def check_out_dir(out_dir: str | Path, contents: str = "the outputs") -> Path:
    """Refuse an output folder that is a file (or lies under one) before anything is written.

    Raises :class:`adni_pu.errors.OutputError` naming the folder; returns it as a Path.
    """
    from adni_pu.errors import OutputError

    out_dir = Path(out_dir)
    for path in (out_dir, *out_dir.parents):
        if path.exists():
            if not path.is_dir():
                what = "is" if path == out_dir else f"lies under {path}, which is"
                raise OutputError(f"output folder {out_dir}: {what} a file; expected a folder "
                                  f"(new or existing) for {contents}")
            break
    return out_dir

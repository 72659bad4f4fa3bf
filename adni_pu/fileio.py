"""Files written whole or not at all, and file hashes: the one home of both.

Every output of adni-pu goes through :func:`atomic_write` (a temporary file beside the
target, then a rename), so an interrupted run never leaves a half-written file under the
real name; a rerun then finds either the old file or the new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from adni_pu.signals import signals_deferred


def current_umask() -> int:
    """The process's umask, read without changing it: ``os.umask`` can only be read by
    setting it, which races with other threads creating files. Linux reports it in
    /proc/self/status; elsewhere the value read once at import is used."""
    umask = _proc_umask()
    return _UMASK_AT_IMPORT if umask is None else umask


def _proc_umask() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _umask_at_import() -> int:
    umask = _proc_umask()
    if umask is None:  # set and restore, at import, before any thread of ours writes
        umask = os.umask(0o022)
        os.umask(umask)
    return umask


_UMASK_AT_IMPORT = _umask_at_import()


def new_file_mode() -> int:
    """The mode ``open()`` gives a new file: 0o666 less the umask (0o644 under 022, 0o664
    under 002), so colleagues sharing a lab folder can read what adni-pu writes."""
    return 0o666 & ~current_umask()


def temporary_beside(path: Path) -> Path:
    """A new, empty temporary file in ``path``'s folder (created with its parents), with the
    mode of a newly created file (``mkstemp`` alone makes it 0600, and the rename keeps
    that). An error names ``path``, not the temporary name."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise naming(exc, path) from exc
    try:
        os.fchmod(fd, new_file_mode())
    except OSError:
        pass  # a file system without modes (some network or FAT mounts) keeps its own
    finally:
        os.close(fd)
    return Path(tmp)


def naming(exc: OSError, path: Path, tmp: Path | None = None) -> OSError:
    """``exc`` naming ``path`` (the target), for an error that names no file, or the
    temporary file it was written through, or a temporary name of ``temporary_beside``
    (full disk, read-only folder): the command line prints it as ``error: <path>: <why>``."""
    name = exc.filename
    hidden = name is not None and Path(os.fsdecode(name)).name.startswith(f".{path.name}.")
    if name is not None and not hidden and (tmp is None or Path(os.fsdecode(name)) != tmp):
        return exc
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


def atomic_write(path: str | Path, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp)`` on a temporary file beside ``path``, then rename it to ``path``.

    An ``OSError`` (a full disk, a read-only folder) names ``path``."""
    path = Path(path)
    tmp: Path | None = None
    try:
        with signals_deferred():  # an interrupt never comes between creating and knowing it
            tmp = temporary_beside(path)
        writer(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise naming(exc, path, tmp) from exc
    except BaseException:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text))


@contextlib.contextmanager
def staged_folder(folder: Path, prefix: str) -> Iterator[Path]:
    """A hidden temporary folder inside ``folder`` for a set of outputs committed together
    (:func:`commit_staged`); removed, with whatever is left in it, when the block ends, so
    an interrupted or failed command leaves no partial or hidden files behind."""
    folder.mkdir(parents=True, exist_ok=True)
    stage: Path | None = None
    try:
        with signals_deferred():  # an interrupt never comes between creating and knowing it
            stage = Path(tempfile.mkdtemp(prefix=f".{prefix}-partial-", dir=folder))
        yield stage
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)


def commit_staged(stage: Path, folder: Path, stale: Iterable[Path] = ()) -> None:
    """Move every file of ``stage`` to the same place under ``folder`` (one rename each) and
    remove the ``stale`` files of an earlier run, with SIGINT and SIGTERM held back
    (:func:`signals_deferred`): the folder then holds this run's files, whole."""
    files = sorted(p for p in stage.rglob("*") if p.is_file())
    with signals_deferred():
        for path in stale:
            path.unlink(missing_ok=True)
        for path in files:
            target = folder / path.relative_to(stage)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)


def write_temporary(path: Path, data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path`` and return the temporary path.

    For a set of files committed together: the caller renames every temporary file into
    place once all are written (``adni_pu.preprocessing.io.write_outputs``).
    """
    tmp: Path | None = None
    try:
        with signals_deferred():  # an interrupt never comes between creating and knowing it
            tmp = temporary_beside(path)
        with tmp.open("wb") as handle:
            handle.write(data)
            handle.flush()
    except OSError as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise naming(exc, path, tmp) from exc
    except BaseException:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise
    return tmp


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    """``torch.save(obj, path)`` atomically (checkpoints, selected models).

    ``torch.save`` reports a failed write (a full disk) as a ``RuntimeError`` from its zip
    writer; that becomes an :class:`~adni_pu.errors.OutputError` naming ``path`` and the
    space left on its file system.
    """
    import torch

    def save(tmp: Path) -> None:
        try:
            torch.save(obj, tmp)
        except RuntimeError as exc:
            from adni_pu.errors import OutputError

            reason = " ".join(str(exc).split())[-160:]
            raise OutputError(f"{path}: cannot write the file ({reason}); "
                              f"{_free_space(Path(path).parent)}") from exc

    return atomic_write(path, save)


def _free_space(folder: Path) -> str:
    """``"148.0 KiB free on its file system (...)"`` (or that it is unknown)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return "free space on its file system unknown"
    left = float(st.f_bavail * st.f_frsize)
    size, unit = left, "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    full = " (the disk is full or nearly so)" if left < 64 * 1024 * 1024 else ""
    return f"{size:.1f} {unit} free on its file system{full}"


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


def _input_files(path: Path) -> list[Path]:
    """The files that make up an input: the file itself, or a folder's visible files (a
    DICOM series is one folder of slice files)."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    return [path]


def stat_key(path: str | Path) -> str:
    """A cheap key of an input's state: size, modification and change times and inode of
    each of its files. Copying or moving another file over it changes the change time or
    the inode even when the size and the modification time are kept (``cp -p``)."""
    path = Path(path)
    parts = []
    for f in _input_files(path):
        st = f.stat()
        parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def content_sha256(path: str | Path) -> str:
    """SHA-256 of an input's content: a file's bytes, or a folder's visible files (their
    names and bytes, in name order), so two copies of the same series hash alike."""
    path = Path(path)
    if not path.is_dir():
        return sha256_file(path)
    digest = hashlib.sha256()
    for f in _input_files(path):
        digest.update(f"{f.name}\0{sha256_file(f)}\n".encode())
    return digest.hexdigest()


def input_identity(path: str | Path, known: dict[str, str] | None = None) -> dict[str, str]:
    """``{"sha256": ..., "stat": ...}`` of an input file or DICOM folder.

    ``known`` is an identity recorded earlier (a scan's sidecar): when its ``stat`` key
    still matches, its hash is reused instead of reading the whole input again; any change
    of size, times or inode rehashes the content.
    """
    key = stat_key(path)
    if known and known.get("stat") == key and known.get("sha256"):
        return {"sha256": known["sha256"], "stat": key}
    return {"sha256": content_sha256(path), "stat": key}


def same_file_as(target: str | Path, inputs: dict[str, Path]) -> str | None:
    """The name of the input in ``inputs`` (what -> path) that ``target`` is, or None:
    the same path, or the same file under another name (a link). For the checks that an
    output never overwrites an input."""
    target = Path(target)
    for what, path in inputs.items():
        path = Path(path)
        if target.resolve() == path.resolve() or (
                target.exists() and path.exists() and os.path.samefile(target, path)):
            return what
    return None


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
            _check_writable(path, out_dir, contents)
            break
    return out_dir


def _check_writable(folder: Path, out_dir: Path, contents: str) -> None:
    """Write and remove a probe file in ``folder`` (``out_dir`` or the first existing folder
    above it): a read-only place is refused before anything is written, not midway."""
    from adni_pu.errors import OutputError

    try:
        with signals_deferred():  # the probe never stays behind
            fd, probe = tempfile.mkstemp(prefix=".adni-pu-write-check.", dir=folder)
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        where = "" if folder == out_dir else f" (in {folder})"
        raise OutputError(f"output folder {out_dir}: cannot write there{where}: "
                          f"{exc.strerror or exc}; expected a writable folder for "
                          f"{contents}") from exc

"""One adni-pu process per output folder: an advisory lock held for the whole command.

Two ``train`` processes into one RUN interleave their ``metrics.csv`` rows, two
``preprocess`` processes into one OUTPUT overwrite each other's ``summary.csv``, and two
``cohort build`` or ``benchmark`` runs into one folder mix their files. Every command that
writes an output folder therefore holds :func:`output_lock` on it while it runs; a second
process is refused at once with one line naming the holder (:class:`OutputLockedError`,
exit status 2 at the command line).

Refused, not queued: on a shared lab server a second process into the same folder is
almost always a mistake (a command pasted twice, a colleague's job on the same path), and
a queued run would wait unseen for hours and then redo or resume the first one's work.
Work is split over processes with ``preprocess --shard i/N``, which the lock allows:
shards hold the folder lock shared and their own shard's lock exclusive.

The lock is ``fcntl.flock`` on ``.adni-pu.lock`` inside the folder. The kernel releases a
flock when its process ends, however it ends (SIGKILL, a crash, a lost node), so the lock
never outlives its holder; the file's content (pid, host, command, start time) is only the
text of the refusal. Children forked while a lock is held close their copy, so a left-over
worker does not keep the folder locked. The file is removed when the command ends; after a
killed holder it stays, stale and harmless, and the next run takes it over.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import functools
import inspect
import json
import os
import shlex
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from adni_pu.errors import OutputLockedError

LOCK_NAME = ".adni-pu.lock"
F = TypeVar("F", bound=Callable[..., Any])

# the locks this process holds: (lock file, thread) -> [fd, depth]; a nested output_lock
# on the same folder in the same thread (a command calling a library function that locks
# too) is a no-op, another thread or process is refused
_HELD: dict[tuple[str, int], list[int]] = {}
_GUARD = threading.Lock()
# the output folders that this process's locks created: (folder, thread)
_CREATED: set[tuple[str, int]] = set()


def _close_in_child() -> None:
    """After fork: drop the child's copies of the lock descriptors (the parent keeps its
    locks; the child closing its copies releases nothing while the parent holds them)."""
    global _GUARD
    _GUARD = threading.Lock()  # another thread may have held it at the fork
    for fd, _depth in _HELD.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()
    _CREATED.clear()


os.register_at_fork(after_in_child=_close_in_child)


def holder_record(command: str) -> dict[str, Any]:
    """What a refused process is told about this one."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
            "argv": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300],
            "since": _dt.datetime.now().astimezone().isoformat(timespec="seconds")}


def describe_holder(record: dict[str, Any] | None) -> str:
    """``pid 123 on host since 2026-11-27 14:03:12+01:00 (`adni-pu train m.csv run`)``."""
    if not record:
        return "another process (starting up, or one that cannot record itself)"
    since = str(record.get("since", "?")).replace("T", " ")
    what = str(record.get("argv") or f"adni-pu {record.get('command', '?')}")
    if len(what) > 120:
        what = what[:117] + "..."
    return (f"pid {record.get('pid', '?')} on {record.get('host', '?')} since {since} "
            f"(`{what}`)")


@contextlib.contextmanager
def output_lock(folder: str | Path, command: str, part: str | None = None) -> Iterator[Path]:
    """Hold the lock of output ``folder`` (created, with its parents, if missing) for
    ``command`` (``"train"``, ``"preprocess"``, ...); yields the folder.

    ``part`` (e.g. ``"shard-2-of-10"``): one of several processes meant to share the
    folder; they hold the folder lock shared and ``.adni-pu.<part>.lock`` exclusive, so
    two parts run together but the same part twice, or a whole-folder run beside a part,
    is refused. Raises :class:`OutputLockedError` naming the holder. A folder this call
    created is removed again when it is still empty at the end (a refused input leaves no
    empty output folder behind).

    Runs unlocked where nothing can be locked, and leaves the error to the command: a
    ``folder`` that is a file (or lies under one), a folder this user cannot write (the
    command's own write fails, naming it), and, with a warning, a file system without
    locks (some network mounts).
    """
    folder = Path(folder)
    if not _can_be_folder(folder):
        yield folder
        return
    try:
        created = _make_folder(folder)
    except OSError as exc:
        from adni_pu.errors import OutputError

        raise OutputError(f"output folder {folder}: cannot create it ({exc.strerror or exc}); "
                          f"expected a folder this user can write for the {command} "
                          "outputs") from exc
    key = (str(folder.resolve()), threading.get_ident())
    if created:
        _CREATED.add(key)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(_flock(folder, folder / LOCK_NAME, command, part is not None))
            if part is not None:
                stack.enter_context(_flock(folder, folder / f".adni-pu.{part}.lock", command,
                                           False))
            yield folder
    finally:
        if created:
            _CREATED.discard(key)
        for path in created:  # deepest first; a folder something was written into stays
            with contextlib.suppress(OSError):
                path.rmdir()


def created_by_this_command(folder: str | Path) -> bool:
    """Whether the :func:`output_lock` this thread holds on ``folder`` created it: the
    folder did not exist when the command started (so a command that fails may remove
    it whole, knowing it held nothing of an earlier run)."""
    return (str(Path(folder).resolve()), threading.get_ident()) in _CREATED


def holding_output_lock(command: str, folder: str | Callable[[dict[str, Any]], Any],
                        part: Callable[[dict[str, Any]], str | None] | None = None
                        ) -> Callable[[F], F]:
    """Decorator: run the function inside :func:`output_lock`.

    ``folder`` is the name of the argument that holds the output folder, or a function of
    the bound arguments (name -> value) that returns it; ``part`` likewise gives the
    part (None: the whole folder). Under torchrun only rank 0 locks (the other ranks write
    nothing and would be refused by their own rank 0).
    """
    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if os.environ.get("RANK", "0") != "0":
                return fn(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            values = dict(bound.arguments)
            where = values[folder] if isinstance(folder, str) else folder(values)
            with output_lock(where, command, part(values) if part else None):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def _can_be_folder(folder: Path) -> bool:
    """Whether ``folder`` is, or can become, a folder: no file on its way."""
    for path in (folder, *folder.parents):
        if path.exists():
            return path.is_dir()
    return True


def _make_folder(folder: Path) -> list[Path]:
    """Create ``folder`` and missing parents; the ones created, deepest first."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    return missing


@contextlib.contextmanager
def _flock(folder: Path, path: Path, command: str, shared: bool) -> Iterator[None]:
    """Hold ``path`` locked (shared or exclusive) while the block runs."""
    key = (str(path.resolve()), threading.get_ident())
    with _GUARD:
        if key in _HELD:
            _HELD[key][1] += 1
            nested = True
        else:
            nested = False
    if nested:
        try:
            yield
        finally:
            with _GUARD:
                if key in _HELD:
                    _HELD[key][1] -= 1
        return
    fd = _acquire(folder, path, command, shared)
    if fd is None:  # a folder this user cannot write, or no locks on this file system
        yield
        return
    with _GUARD:
        _HELD[key] = [fd, 1]
    try:
        yield
    finally:
        with _GUARD:
            held = _HELD.pop(key, None)
        if held is not None:  # None in a forked child, which closed its copy already
            _release(fd, path)


def _open(path: Path) -> tuple[int, bool] | None:
    """The lock file opened (created when missing): (fd, writable); None in a folder this
    user cannot write (the command's own first write then fails, naming the folder).

    Never through a symbolic link (``O_NOFOLLOW``): a ``.adni-pu.lock`` that links to a
    user's file must not get the lock record written over it; it is refused instead."""
    flags = os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o666), True
    except OSError as exc:
        _refuse_link(path, exc)
        if not (isinstance(exc, PermissionError) or exc.errno == errno.EROFS):
            raise
    try:  # another user's lock file in a shared folder: a read-only fd locks all the same
        return os.open(path, os.O_RDONLY | flags), False
    except OSError as exc:
        _refuse_link(path, exc)
        return None


def _refuse_link(path: Path, exc: OSError) -> None:
    """A lock path that is a symbolic link (``O_NOFOLLOW`` gives ELOOP): one line."""
    if exc.errno == errno.ELOOP or path.is_symlink():
        from adni_pu.errors import OutputError

        raise OutputError(f"{path}: is a symbolic link; expected adni-pu's lock file (or "
                          "nothing) there; remove the link, then run the command again"
                          ) from exc


def _acquire(folder: Path, path: Path, command: str, shared: bool) -> int | None:
    """Lock ``path``: the fd; None where nothing can be locked; or OutputLockedError."""
    while True:
        folder.mkdir(parents=True, exist_ok=True)  # a holder that just ended may remove it
        try:
            opened = _open(path)
        except FileNotFoundError:
            continue
        if opened is None:
            return None
        fd, writable = opened
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _live_record(_read_record(fd))
            os.close(fd)
            raise OutputLockedError(_refusal(folder, command, holder)) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                print(f"warning: {folder}: this file system does not support locks "
                      f"({exc.strerror}); a second adni-pu process writing into this folder "
                      "would not be noticed", file=sys.stderr)
                return None
            raise
        # the file may have been removed (and another created) between open and flock by a
        # holder that was ending: a lock on a removed file locks nothing, so start again
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        if writable:
            # shared holders write nothing here (several at once); they clear a stale record
            text = "" if shared else json.dumps(holder_record(command)) + "\n"
            with contextlib.suppress(OSError):  # a full disk: locked all the same, unnamed
                os.ftruncate(fd, 0)
                os.pwrite(fd, text.encode(), 0)
        return fd


def _release(fd: int, path: Path) -> None:
    """Remove the lock file while still holding it (only when no one else holds it shared),
    then unlock by closing."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no-op for an exclusive holder
        with contextlib.suppress(OSError):
            os.unlink(path)
    except OSError:
        pass  # other shared holders: the file stays theirs
    finally:
        os.close(fd)


def _read_record(fd: int) -> dict[str, Any] | None:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        return json.loads(text) if text else None
    except (OSError, ValueError):
        return None


def _live_record(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """``record`` when it may be the live holder's; None when it is the record of a process
    on this host that is gone (a stale file whose holder could not rewrite it, e.g. another
    user's read-only lock file in a shared folder): the refusal then names no one rather
    than a dead process."""
    if not record or record.get("host") != socket.gethostname():
        return record
    try:
        pid = int(record.get("pid", 0))
    except (TypeError, ValueError):
        return None
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except PermissionError:
        return record  # alive: another user's process
    except (OSError, OverflowError):
        return None  # no such process
    return record


def _refusal(folder: Path, command: str, holder: dict[str, Any] | None) -> str:
    """The one-line refusal: who holds the folder, and what to do."""
    if holder is None:
        parts = _part_holders(folder)
        if parts:
            who = "; ".join(describe_holder(r) for r in parts)
            return (f"{folder}: in use by {who}; adni-pu {command} cannot write there at "
                    "the same time: wait for them to finish, or use another output folder")
    return (f"{folder}: in use by {describe_holder(holder)}; adni-pu {command} cannot "
            "write there at the same time: wait for it to finish, or use another output "
            "folder")


def _part_holders(folder: Path) -> list[dict[str, Any]]:
    """The records of the parts (shards) that hold ``folder`` now."""
    found = []
    for path in sorted(folder.glob(".adni-pu.*.lock")):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)  # free: a stale file of a killed part
        except OSError:
            record = _live_record(_read_record(fd))
            if record:
                found.append(record)
        finally:
            os.close(fd)
    return found

"""Where ``adni-pu synth`` writes: a new or empty folder, filled whole or left as it was.

The download is drawn into a hidden folder *inside* the target and its entries are renamed
into the target at the end. Writing inside (not beside) keeps the target's own mode and
owner (a new target is made with ``mkdir``, so it gets the umask's mode; an existing empty
one, ``.`` included, is never replaced), and needs no write access to its parent. An error,
Ctrl-C or SIGTERM removes the hidden folder (and a target this run made), so nothing is left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from adni_pu.errors import OutputError
from adni_pu.locking import LOCK_NAME, output_lock
from adni_pu.signals import (
    Interrupted,
    holding_off_signals,
    signals_deferred,
    stop_on_signals,
)

#: Prefix of the hidden folder a download is drawn into (inside the target).
PARTIAL_PREFIX = ".adni-pu-synth.partial-"


class SynthInterrupted(Interrupted):
    """SIGINT or SIGTERM stopped ``synth`` (:mod:`adni_pu.signals`); what it had drawn is
    removed, as its :attr:`hint` says."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum, "nothing is left half-written (the partly drawn "
                                 "download was removed); run the same command again")


def prepare_target(out: Path) -> Path:
    """Refuse a target that is a file or a folder with anything in it (a download is
    written whole into a new or empty folder, never mixed with other files)."""
    from adni_pu.fileio import check_out_dir

    check_out_dir(out, "the synthetic download")
    if out.is_dir():
        inside = sorted(p.name for p in out.iterdir() if not _is_lock_file(p.name))
        if inside and all(name.startswith(PARTIAL_PREFIX) for name in inside):
            raise OutputError(f"output folder {out}: holds {', '.join(inside)}, the unfinished "
                              "download of a synth that was killed (or is still running); "
                              "remove it and run the command again")
        if inside:
            shown = ", ".join(inside[:3]) + (f" and {len(inside) - 3} more"
                                              if len(inside) > 3 else "")
            raise OutputError(f"output folder {out}: not empty (holds {shown}); expected a new "
                              "or empty folder for the synthetic download; choose another "
                              "folder or remove this one")
    return out


def _is_lock_file(name: str) -> bool:
    """Whether ``name`` is the folder lock's file (:mod:`adni_pu.locking`): a running
    synth's (its lock then refuses this one, naming it) or a killed one's (stale, taken
    over), never content of the download."""
    return name == LOCK_NAME or (name.startswith(".adni-pu.") and name.endswith(".lock"))


def write_in_place(out: Path, writer: Callable[[Path], None]) -> None:
    """Run ``writer`` on a hidden folder inside ``out`` and move what it wrote into ``out``
    when it is done, so that ``out`` holds a whole download or what it held before (empty, or
    nothing when this run made it), also after an error, Ctrl-C or SIGTERM."""
    out = prepare_target(Path(out))
    made = not out.exists()
    with output_lock(out, "synth"):  # one writer per folder; a second is refused, named
        _write_locked(prepare_target(out), made, writer)


def _write_locked(out: Path, made: bool, writer: Callable[[Path], None]) -> None:
    """:func:`write_in_place`'s work, under the folder's lock (``made``: this run made
    ``out``, so an interrupted run removes it)."""
    tmp: Path | None = None
    moved: list[Path] = []
    try:
        with stop_on_signals(SynthInterrupted):
            out.mkdir(parents=True, exist_ok=True)  # a new folder gets the umask's mode
            with signals_deferred():  # never a folder made but not yet known
                tmp = Path(tempfile.mkdtemp(prefix=PARTIAL_PREFIX, dir=out))
            writer(tmp)
            for entry in sorted(tmp.iterdir()):
                os.rename(entry, out / entry.name)
                moved.append(out / entry.name)
            tmp.rmdir()
    except BaseException:
        with holding_off_signals():  # the cleanup finishes
            for path in [*moved, *([tmp] if tmp else [])]:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            if made:
                with contextlib.suppress(OSError):
                    out.rmdir()
        raise

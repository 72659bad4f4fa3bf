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
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from adni_pu.errors import OutputError

#: Prefix of the hidden folder a download is drawn into (inside the target).
PARTIAL_PREFIX = ".adni-pu-synth.partial-"


class SynthInterrupted(KeyboardInterrupt):
    """SIGTERM stopped ``synth``; what it had drawn is removed. (SIGINT stays a plain
    :class:`KeyboardInterrupt`, the CLI's Ctrl-C.)"""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """The shell's convention: 128 + the signal number (143 for SIGTERM)."""
        return 128 + self.signum

    def __str__(self) -> str:
        return (f"interrupted by {signal.Signals(self.signum).name}; nothing was written "
                "(the partly drawn download was removed); run the same command again")


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Raise :class:`SynthInterrupted` on SIGTERM (main thread only), so that the cleanup of
    :func:`write_in_place` runs as it does for Ctrl-C; the previous handler is restored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one cannot break the cleanup
        raise SynthInterrupted(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def prepare_target(out: Path) -> Path:
    """Refuse a target that is a file or a folder with anything in it (a download is
    written whole into a new or empty folder, never mixed with other files)."""
    from adni_pu.fileio import check_out_dir

    check_out_dir(out, "the synthetic download")
    if out.is_dir():
        inside = sorted(p.name for p in out.iterdir())
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


def write_in_place(out: Path, writer: Callable[[Path], None]) -> None:
    """Run ``writer`` on a hidden folder inside ``out`` and move what it wrote into ``out``
    when it is done, so that ``out`` holds a whole download or what it held before (empty, or
    nothing when this run made it), also after an error, Ctrl-C or SIGTERM."""
    out = prepare_target(Path(out))
    made = not out.exists()
    tmp: Path | None = None
    moved: list[Path] = []
    try:
        with stop_on_sigterm():
            out.mkdir(parents=True, exist_ok=True)  # a new folder gets the umask's mode
            tmp = Path(tempfile.mkdtemp(prefix=PARTIAL_PREFIX, dir=out))
            writer(tmp)
            for entry in sorted(tmp.iterdir()):
                os.rename(entry, out / entry.name)
                moved.append(out / entry.name)
            tmp.rmdir()
    except BaseException:
        with _ignoring_sigterm():
            for path in [*moved, *([tmp] if tmp else [])]:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            if made:
                with contextlib.suppress(OSError):
                    out.rmdir()
        raise


@contextlib.contextmanager
def _ignoring_sigterm() -> Iterator[None]:
    """Hold SIGTERM off during the cleanup (main thread only), so that it finishes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

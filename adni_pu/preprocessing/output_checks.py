"""Checks made before a scan is read: that its outputs can be written, and spare the inputs.

``preprocess`` writes each scan's outputs under names made from its id and, before writing,
removes that scan's earlier outputs. Two things can go wrong only at the very end, after
minutes of work, unless they are checked first:

- an output is one of the inputs (an already-preprocessed volume given back as input, or
  its masks listed in a CSV): writing would overwrite it, and the cleanup of the "older"
  outputs would delete it. :class:`InputIndex` finds an output path that is an input: the
  same path once links are resolved, the same file under another name (a hard link), or a
  file inside an input DICOM series folder.
- a file name longer than the file system allows (a 240-character file name as the id):
  :func:`name_problem` measures the longest output name, with the temporary name an
  atomic write goes through, against the file system's own limit.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from adni_pu.errors import OutputError

#: The longest file name, in bytes, where the file system's own limit cannot be read.
NAME_MAX = 255
#: What an atomic write adds to an output's name for its temporary file: ``"." + name +
#: "." + 8 random characters + ".tmp"`` (:func:`adni_pu.fileio.temporary_beside`).
TEMPORARY_NAME_EXTRA = 14


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a link loop: compare the path as given
        return path.absolute()


class InputIndex:
    """The inputs of a run, indexed so that an output path can be looked up in O(1)."""

    def __init__(self, inputs: Iterable[str | Path]) -> None:
        self.paths: dict[Path, Path] = {}
        self.files: dict[tuple[int, int], Path] = {}
        self.folders: dict[Path, Path] = {}
        for given in inputs:
            given = Path(given)
            where = _resolved(given)
            self.paths[where] = given
            try:
                st = given.stat()
            except OSError:
                continue
            self.files[(st.st_dev, st.st_ino)] = given
            if given.is_dir():  # a DICOM series: its folder holds nothing but the series
                self.folders[where] = given

    def find(self, target: Path) -> Path | None:
        """The input that writing or deleting ``target`` would change, or None."""
        where = _resolved(target)
        if where in self.paths:
            return self.paths[where]
        if where.parent in self.folders:
            return self.folders[where.parent]
        try:
            st = target.stat()
        except OSError:
            return None
        return self.files.get((st.st_dev, st.st_ino))


def input_collision(scan_path: Path, paths: dict[str, Path], inputs: InputIndex) -> str:
    """One line if an output in ``paths`` (kind -> path) of the scan read from ``scan_path``
    is an input in ``inputs``, else ``""``."""
    for kind, path in paths.items():
        hit = inputs.find(path)
        if hit is None:
            continue
        what = ("this scan's own input" if _resolved(hit) == _resolved(Path(scan_path))
                else f"the input {hit}")
        return (f"{scan_path}: its output {path} ({kind}) is {what}, which preprocessing "
                "would overwrite or delete; expected inputs from outside the output folder's "
                "scan folders (write the outputs into another folder)")
    return ""


def name_max(folder: Path) -> int:
    """The longest file name (bytes) the file system of ``folder`` (or of the first
    existing folder above it) allows."""
    for where in (folder, *folder.parents):
        if where.exists():
            try:
                limit = int(os.pathconf(where, "PC_NAME_MAX"))
            except (OSError, ValueError):
                return NAME_MAX
            return limit if limit > 0 else NAME_MAX
    return NAME_MAX


def name_problem(scan_path: Path, paths: dict[str, Path], limit: int) -> str:
    """One line if the longest output name in ``paths``, or the temporary name it is
    written through, is longer than ``limit`` bytes, else ``""``."""
    longest = max(paths.values(), key=lambda p: len(os.fsencode(p.name)))
    size = len(os.fsencode(longest.name)) + TEMPORARY_NAME_EXTRA
    if size <= limit:
        return ""
    return (f"{scan_path}: its id is too long to name its outputs: {longest.name[:48]}... "
            f"would take {size} bytes with its temporary name, over the file system's limit "
            f"of {limit}; expected a shorter id (rename the file, or give its subject and "
            "session in a CSV of subject, session, path)")


def check_run_outputs(scans: Iterable[tuple[Path, dict[str, Path]]], inputs: InputIndex,
                      run_files: Iterable[Path]) -> None:
    """Refuse a run in which an output is an input, before anything is written.

    ``scans``: each scan's input path and output paths; ``run_files``: the files the run
    itself writes (summary.csv, preprocess_config.toml). Raises :class:`OutputError`
    naming the first collision and how many there are.
    """
    hits = []
    for run_file in run_files:
        hit = inputs.find(run_file)
        if hit is not None:
            hits.append(f"{hit}: it is the run's own {run_file.name} (rewritten at the end of "
                        "every run); copy it elsewhere to use it as the input")
    for scan_path, paths in scans:
        line = input_collision(scan_path, paths, inputs)
        if line:
            hits.append(line)
    if hits:
        more = f" (and {len(hits) - 1} more scan(s) like it)" if len(hits) > 1 else ""
        raise OutputError(f"{hits[0]}{more}; nothing was processed")


def spare_inputs(source: object, scans: Iterable, excluded: Iterable, output: Path,
                 run_files: Iterable[Path], config: object = None) -> None:
    """:func:`check_run_outputs` for a run over ``scans`` (:class:`~.scans.Scan`) into
    ``output``: the inputs are every scan found, those left out at discovery
    (:class:`~.scans.Excluded`), and ``source`` itself when it is a file (a CSV list);
    ``config`` (a PreprocessConfig) gives the grid in the output names."""
    from .derivatives import output_paths

    scans = list(scans)
    given = [s.path for s in scans] + [e.scan.path for e in excluded]
    if isinstance(source, (str, Path)) and Path(source).is_file():
        given.append(Path(source))
    check_run_outputs(((s.path, output_paths(s, output, config)) for s in scans),
                      InputIndex(given),
                      run_files)

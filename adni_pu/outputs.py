"""Which command writes which names: the registry of output names, and the checks that keep
every command to its own.

Each command that writes declares here (or, for the run folder, in
:mod:`adni_pu.workflows.run_folder`) the names it writes in the folder it writes, with the
record file that marks a folder as its own (``interpret.json``, ``metrics.json``, ...).
Two rules follow, checked before anything is written:

- a command never writes into a folder that holds another command's record
  (:func:`claim_folder`): ``interpret RUN --out RUN`` would replace the run's
  ``scans.csv``, the leakage guard's record;
- ``--out FILE`` never replaces a file the command did not write (:func:`claim_file`): a
  file is recognised as the command's own by what it holds (a header, a record), never by a
  guess such as a blank first line. An empty (0-byte) file holds nothing to lose.

Light: imports nothing heavy, so the CLI and every workflow can use it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from adni_pu.errors import OutputError


@dataclass(frozen=True)
class Output:
    """One name a command writes: a file, a folder (``name/``) or a pattern (``*``)."""

    name: str
    writer: str
    what: str


@dataclass(frozen=True)
class Layout:
    """What one command writes into one folder; ``record`` marks a folder as its own."""

    command: str
    folder: str
    record: str
    names: tuple[Output, ...]

    def listed(self) -> str:
        """The names, comma-separated (for messages and the docs)."""
        return ", ".join(o.name for o in self.names)


def layout(command: str, folder: str, record: str, *names: tuple[str, str]) -> Layout:
    """A command's layout from ``(name, what)`` pairs, every name written by ``command``."""
    return Layout(command, folder, record, tuple(Output(n, command, w) for n, w in names))


#: ``adni-pu interpret RUN [--out OUT]`` (default OUT: RUN/interpret-<split>-<method>/).
INTERPRET = layout(
    "interpret", "OUT", "interpret.json",
    ("maps/", "one map per scan, sub-<s>_ses-<t>_<method>.nii.gz"),
    ("randomised/", "the sanity subjects' maps from the re-initialised network"),
    ("group-*_*.nii.gz", "group mean maps"),
    ("analysis_mask.nii.gz", "the voxels whose map mass is counted"),
    ("scans.csv", "one row per scan: group, logit, map file, shares"),
    ("overlay.png", "group maps over the MNI template"),
    ("regions.csv", "AAL regions by share of the map's mass"),
    ("regions.md", "the same, as Markdown"),
    ("interpret.json", "method, settings, timing, sanity checks (the record)"),
    ("RUN/evaluation/<split>/report.md#interpret",
     "the section after the interpret marker of evaluate's report, under its folder's lock"))

#: ``adni-pu evaluate RUN [--out OUT]`` (default: RUN/evaluation/<split>/ for the run's own
#: manifest, RUN/evaluation/<manifest-stem>-<sha256[:8]>/<split>/ for another one).
EVALUATE = layout(
    "evaluate", "OUT", "metrics.json",
    ("metrics.json", "metrics with 95 % CIs (the record)"),
    ("predictions_scans.csv", "per-scan probabilities"),
    ("predictions_subjects.csv", "per-subject probabilities"),
    ("roc.png", "ROC curve"),
    ("report.md", "the evaluation report"))

#: ``adni-pu prior MANIFEST OUT``.
PRIOR = layout(
    "prior", "OUT", "prior_estimate.json",
    ("prior_estimate/", "the P-vs-U classifier's run folder (resumable)"),
    ("prior_estimate.json", "the estimate, its CI and the inputs' hashes (the record)"))

#: ``adni-pu predict RUN SCAN... --out FILE``: one CSV, recognised by its header.
PREDICT = layout(
    "predict", "FILE", "FILE",
    ("FILE", "the predictions table (CSV with the header of PREDICTION_COLUMNS)"),
    ("RUN/predictions/preprocessed/", "raw scans preprocessed for the model (--work-dir)"))

#: ``adni-pu benchmark table FOLDER [--out STEM]`` (default STEM: FOLDER-table beside it).
BENCHMARK_TABLE = layout(
    "benchmark table", "STEM", "STEM.json",
    ("STEM.md", "the Markdown tables"),
    ("STEM.json", "the rows, paired differences and provenance (the record)"))

#: ``adni-pu benchmark DATASET --out OUT``: one training run folder per seed.
BENCHMARK = layout(
    "benchmark", "OUT", "results.json",
    ("seed<N>/", "one run folder per seed (the run folder's layout)"),
    ("results.json", "per-seed and summary results (the record)"),
    ("results.md", "the results as Markdown"),
    ("progress.json", "what a time-limited run finished"),
    (".cache/", "the dataset cache"))

#: The folders whose record marks them as a command's own (the run folder's layout is
#: :data:`adni_pu.workflows.run_folder.RUN_LAYOUT`; :func:`registry` lists them all).
FOLDER_LAYOUTS: tuple[Layout, ...] = (INTERPRET, EVALUATE, PRIOR, BENCHMARK)


def claim_folder(folder: Path, command: str, layouts: tuple[Layout, ...]) -> None:
    """Refuse (:class:`OutputError`) an output ``folder`` for ``command`` that holds the
    record of another command's layout in ``layouts``: its files are that command's, and
    ``command`` would write over or beside them (nothing is written)."""
    for layout in layouts:
        if layout.command != command and (folder / layout.record).exists():
            mine = next((lay for lay in layouts if lay.command == command), None)
            writes = f" (it writes {mine.listed()})" if mine is not None else ""
            raise OutputError(
                f"output folder {folder}: holds the outputs of `adni-pu {layout.command}` "
                f"({layout.record}); adni-pu {command} never writes into another command's "
                f"folder{writes}; choose a new folder, or one an earlier {command} wrote")


def claim_file(path: Path, command: str, is_own: Callable[[Path], bool], what: str) -> None:
    """Refuse (:class:`OutputError`) to replace ``path`` unless it is missing, empty (0
    bytes), or a file ``command`` wrote (``is_own``: by its header or record). ``what``
    names the file ``command`` writes there."""
    if not path.exists() and not path.is_symlink():
        return
    expected = f"expected a new path or an earlier {what}"
    if path.is_symlink() or not path.is_file():
        kind = "a symbolic link" if path.is_symlink() else "not a file"
        raise OutputError(f"--out {path}: exists and is {kind}; {expected}; nothing was "
                          "changed")
    if path.stat().st_size == 0 or is_own(path):
        return
    raise OutputError(f"--out {path}: exists and is not a {what} written by adni-pu "
                      f"{command}; {expected}; nothing was changed")

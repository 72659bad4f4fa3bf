"""The registry of output names: every name each writing command of the CLI writes.

Each command declares its names where it writes them (:data:`run_folder.RUN_LAYOUT`,
:mod:`adni_pu.outputs`, :data:`adni_pu.preprocessing.derivatives.LAYOUT`,
:data:`adni_pu.cohort.files.LAYOUT`, :data:`adni_pu.preprocessing.qc_report.LAYOUT`,
:data:`adni_pu.synth.adni_download.LAYOUT`, :data:`adni_pu.workflows.compare.pieces.LAYOUT`;
the demo's, whose names are its stages, here);
this module gathers them. The CLI's contract test (tests/test_cli_contract.py) checks that
every writing command has a layout here and writes nothing outside it.
"""

from __future__ import annotations

from adni_pu import outputs
from adni_pu.cohort.files import LAYOUT as COHORT_BUILD
from adni_pu.cohort.files import REPORT_LAYOUT as COHORT_REPORT
from adni_pu.preprocessing.derivatives import LAYOUT as PREPROCESS
from adni_pu.preprocessing.qc_report import LAYOUT as QC
from adni_pu.synth.adni_download import LAYOUT as SYNTH
from adni_pu.workflows.compare.pieces import LAYOUT as COMPARE
from adni_pu.workflows.compare.pieces import REPORT_LAYOUT as COMPARE_REPORT
from adni_pu.workflows.run_folder import LAYOUTS as RUN_FOLDER_LAYOUTS

#: ``adni-pu demo --out OUT``: one folder per stage (:mod:`adni_pu.workflows.demo`), each
#: written by the library of its stage, and the report.
DEMO = outputs.layout(
    "demo", "OUT", "demo.json",
    ("synth/", "the synthetic cohort (adni_pu.synth)"),
    ("preprocessed/", "the preprocessing output (preprocess's layout)"),
    ("cohort/", "the cohort (cohort build's layout)"),
    ("demo_training.toml", "the demo budget: the comparison's settings file"),
    ("comparison/", "the comparison of methods (benchmark cohort's layout)"),
    ("cache/", "the data pipeline's disk cache"),
    ("roc.png", "the held-out subjects' ROC curves"),
    ("report.md", "the demo's report"),
    ("demo.json", "the results, settings and timings (the record)"))

#: Every command's layout: the run folder and the OUTPUT folders of the training commands
#: first, then the data commands'.
LAYOUTS: tuple[outputs.Layout, ...] = (
    *RUN_FOLDER_LAYOUTS, outputs.PREDICT, outputs.BENCHMARK_TABLE, COMPARE, COMPARE_REPORT,
    PREPROCESS, QC, COHORT_BUILD, COHORT_REPORT, SYNTH, DEMO)


def registry() -> list[tuple[str, str, str]]:
    """(command, folder, name) for every name a command writes."""
    return [(o.writer.split(" (")[0], lay.folder, o.name) for lay in LAYOUTS for o in lay.names]


def writing_commands() -> set[str]:
    """The commands that write (``"cohort build"``, ``"train"``, ...): each has a layout."""
    return {command for command, _, _ in registry()}


def layout(command: str) -> outputs.Layout:
    """The layout of ``command``'s own folder (for ``train``: the run folder)."""
    return next(lay for lay in LAYOUTS if lay.command == command)

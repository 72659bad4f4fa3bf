"""Output folders written before the BIDS derivatives names: found, refused, converted.

adni-pu used to write each scan's outputs into ``sub-S/ses-T/`` as ``sub-S_ses-T_<suffix>``
(:data:`LEGACY_SUFFIXES`), with no dataset_description.json. ``adni-pu preprocess`` into
such a folder is refused before anything is written, in one line naming the conversion
(:func:`convert_layout`, ``adni-pu preprocess --convert-layout OUTPUT``): it renames every
file in place to its BIDS derivatives name, so no scan is processed again and nothing is
left under two names. A rerun of the same command then resumes as usual.

Files are read by path everywhere else: a summary.csv, cohort manifest or run that points
at the old names keeps working while those files exist (that is, until the folder is
converted; the conversion rewrites the folder's summary.csv, and cohorts built from it
are built again).
"""

from __future__ import annotations

import io
import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adni_pu.errors import OutputError
from adni_pu.locking import holding_output_lock

from .derivatives import LEGACY_SUFFIXES

_RECORD = "_" + LEGACY_SUFFIXES["sidecar"]
_MASKS = ("brainmask_template", "brainmask_native", "cerebellum_template",
          "cerebellum_native")


def legacy_records(output: str | Path) -> list[Path]:
    """The scan records (``sub-S/ses-T/sub-S_ses-T_sidecar.json``) of the earlier layout."""
    return sorted(Path(output).glob(f"sub-*/ses-*/sub-*{_RECORD}"))


def convert_command(output: str | Path) -> str:
    """The command that converts ``output`` (quoted for the shell)."""
    return f"adni-pu preprocess --convert-layout {shlex.quote(str(output))}"


def refuse_legacy_layout(output: str | Path) -> None:
    """Refuse, in one line naming the conversion, an output folder with scans written in
    the earlier layout (new outputs beside them would leave each scan under two names)."""
    output = Path(output)
    records = legacy_records(output) if output.is_dir() else []
    if records:
        example = records[0].relative_to(output).as_posix().replace(_RECORD, "_T1w_preproc"
                                                                    ".nii.gz")
        raise OutputError(
            f"{output}: {len(records)} scan(s) here have the file names of an earlier adni-pu "
            f"(e.g. {example}); expected BIDS derivatives names: convert the folder in place "
            f"with `{convert_command(output)}` (nothing is processed again), then rerun")


@dataclass
class Conversion:
    """What :func:`convert_layout` did."""

    output: Path
    scans: int = 0
    files: int = 0
    summaries: list[Path] = field(default_factory=list)


def convert_layout(output: str | Path) -> Conversion:
    """Rename the earlier layout's outputs under ``output`` to BIDS derivatives names.

    Every scan record is read first (an unreadable one is refused, naming it, before any
    file moves). Per scan the files are renamed (``os.replace``), the BIDS sidecars and the
    new record (the volume's JSON sidecar, listing the new names) are written atomically,
    and the old record is removed last: a conversion cut short leaves every scan either
    converted or still listed by its old record, and running it again finishes it. Then
    summary.csv (and shard summaries) point at the new names, and dataset_description.json
    is written. Holds the folder's lock (no preprocess run may write meanwhile).
    """
    output = Path(output).resolve()
    if not output.is_dir():
        raise OutputError(f"folder not found: {output} (expected a folder written by "
                          "adni-pu preprocess)")
    return _convert(output)


@holding_output_lock("preprocess", "output")
def _convert(output: Path) -> Conversion:
    from .derivatives import DESCRIPTION, write_description

    done = Conversion(output)
    records = []
    for path in legacy_records(output):
        try:
            side = json.loads(path.read_text())
            if not isinstance(side, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            raise OutputError(f"{path}: cannot read this scan record ({exc}); expected the "
                              "JSON written by adni-pu preprocess: move the scan's folder "
                              "away (or delete it) and convert again; nothing was "
                              "renamed") from exc
        records.append((path, side))
    if not records and not (output / DESCRIPTION).is_file():
        raise OutputError(f"{output}: no scans written by adni-pu preprocess found "
                          f"(expected sub-*/ses-*/sub-*{_RECORD}); nothing was changed")
    for path, side in records:
        done.files += _convert_scan(output, path, side)
        done.scans += 1
    done.summaries = _rewrite_summaries(output)
    if records or not (output / DESCRIPTION).is_file():
        write_description(output, _sources(output))
    return done


def _config(side: dict, where: Path) -> Any:
    """The PreprocessConfig a record was made with (defaults for what it lacks)."""
    from adni_pu import config as cfgmod

    from .config import PreprocessConfig

    settings = side.get("settings")
    if isinstance(settings, dict):
        try:
            return cfgmod.from_dict(PreprocessConfig, settings, where=str(where))
        except Exception:  # noqa: BLE001 - settings of another version: the grid is enough
            grid = settings.get("grid") if isinstance(settings.get("grid"), dict) else {}
            try:
                return cfgmod.from_dict(PreprocessConfig, {"grid": grid}, where=str(where))
            except Exception:  # noqa: BLE001
                pass
    return PreprocessConfig()


def _convert_scan(output: Path, record: Path, side: dict) -> int:
    """Convert one scan; returns how many files were renamed."""
    from adni_pu.fileio import atomic_write_text

    from . import derivatives as bids

    label = record.name[: -len(_RECORD)]
    subject = record.parent.parent.name.removeprefix("sub-")
    session = record.parent.name.removeprefix("ses-")
    config = _config(side, record)
    names = bids.scan_names(subject, session, bids.res_label(config.grid.spacing_mm))
    present: set[str] = set()
    renamed = 0
    for kind, suffix in LEGACY_SUFFIXES.items():
        if kind == "sidecar":
            continue
        old, new = record.parent / f"{label}_{suffix}", output / names[kind]
        if old.is_file():
            new.parent.mkdir(parents=True, exist_ok=True)
            os.replace(old, new)
            renamed += 1
        if new.is_file():  # renamed now, or by a conversion cut short
            present.add(kind)
    input_path = side.get("input_path", "")
    for kind in _MASKS:
        if kind in present:
            atomic_write_text(output / names[f"{kind}_json"], json.dumps(
                bids.mask_metadata(kind, config, input_path, names), indent=2))
            present.add(f"{kind}_json")
    new_side = dict(side)
    if side.get("status") == "done" and "preproc" in present:
        new_side = {**bids.preproc_metadata(config, input_path, names), **side}
    if isinstance(new_side.get("transform"), dict):
        new_side["transform"] = {**new_side["transform"],
                                 "file": Path(names["affine"]).name,
                                 "template": bids.TEMPLATE_TEXT}
    new_side["outputs"] = {k: names[k] for k in names if k in present or k == "sidecar"}
    new_side["layout_converted"] = ("renamed from the file names of an earlier adni-pu by "
                                    "adni-pu preprocess --convert-layout")
    atomic_write_text(output / names["sidecar"], json.dumps(new_side, indent=2))
    record.unlink()
    return renamed


def _new_preproc_path(old: str) -> str:
    """The converted name of a summary.csv ``preprocessed_path`` in the earlier layout
    (``old`` itself when it is not one, or its converted file is not there)."""
    path = Path(old)
    suffix = "_" + LEGACY_SUFFIXES["preproc"]
    if not old or not path.name.endswith(suffix) or path.is_file():
        return old
    label = path.name[: -len(suffix)]
    found = sorted((path.parent / "anat").glob(f"{label}_space-*_res-*_desc-preproc_T1w.nii.gz"))
    return str(found[0]) if len(found) == 1 else old


def _rewrite_summaries(output: Path) -> list[Path]:
    """Point summary.csv and shard summaries at the converted volumes; the files changed."""
    from .io import write_outputs
    from .summary import read_summary

    changed = []
    for path in sorted([*output.glob("summary_shard-*-of-*.csv"), output / "summary.csv"]):
        if not path.is_file():
            continue
        frame = read_summary(path)
        new = frame["preprocessed_path"].map(_new_preproc_path)
        if (new != frame["preprocessed_path"]).any():
            frame["preprocessed_path"] = new
            buf = io.StringIO()
            frame.to_csv(buf, index=False)
            write_outputs({path: buf.getvalue().encode()})
            changed.append(path)
    return changed


def _sources(output: Path) -> list[dict[str, str]]:
    """SourceDatasets of a converted folder: the common folder of its summary's inputs."""
    from .derivatives import source_datasets
    from .summary import read_summary

    path = output / "summary.csv"
    if not path.is_file():
        return []
    inputs = [p for p in read_summary(path)["input_path"] if p]
    return source_datasets([Path(p) for p in inputs]) if inputs else []

"""What produced an output: package versions, machine, date and command line.

Recorded in every run folder, preprocessing sidecar and benchmark result so a number
can be traced back to the software that made it.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

_PACKAGES = (
    "adni-pu", "torch", "numpy", "scipy", "pandas", "monai", "SimpleITK", "antspyx",
    "nibabel", "nilearn", "deepbet",
)


def package_versions(names: tuple[str, ...] = _PACKAGES) -> dict[str, str]:
    """Installed versions of ``names`` (absent packages are left out)."""
    out = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def git_commit() -> str | None:
    """The commit of the source tree this package runs from, if it is a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


def machine_description() -> str:
    """A short description of this machine: CPU count and GPU, if torch sees one."""
    text = f"{os.cpu_count()}-core CPU"
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.cuda.is_available():
            return f"{text}, {torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    return f"{text}, no GPU"


def provenance() -> dict[str, object]:
    """Everything above in one dict, plus the date and the command line."""
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": machine_description(),
        "platform": platform.platform(),
        "versions": package_versions(),
        "git_commit": git_commit(),
    }


#: The fields of one piece of a run (:func:`run_provenance`).
PIECE_FIELDS: tuple[str, ...] = ("start_epoch", "date", "machine", "command")


def run_provenance(previous: dict[str, Any] | None, start_epoch: int) -> dict[str, Any]:
    """A run folder's ``provenance.json`` for a fit that starts at ``start_epoch``: this
    process's :func:`provenance` plus ``pieces``, one entry per fit that trained the run
    (:data:`PIECE_FIELDS`). A resumed run (``start_epoch`` > 0) keeps the pieces of
    ``previous`` (the file as it was), so a run begun on a GPU and finished on a CPU names
    both machines; a fresh run starts the list."""
    record: dict[str, Any] = provenance()
    here = {"start_epoch": start_epoch, **{k: record[k] for k in PIECE_FIELDS[1:]}}
    earlier: list[dict[str, Any]] = []
    if start_epoch > 0 and previous:
        earlier = previous.get("pieces") or [  # a file written before pieces were recorded
            {"start_epoch": None, **{k: previous.get(k) for k in PIECE_FIELDS[1:]}}]
        earlier = [p for p in earlier if p.get("start_epoch") is None
                   or p["start_epoch"] < start_epoch]
    record["pieces"] = [*earlier, here]
    return record


def run_machines(run_dir: Path | None) -> list[str] | None:
    """The machines that trained the run in ``run_dir``, in order, each once (from its
    ``provenance.json``); None when the folder has no such record."""
    path = None if run_dir is None else Path(run_dir) / "provenance.json"
    if path is None or not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    pieces = record.get("pieces") or [record]
    machines = [p.get("machine") for p in pieces if p.get("machine")]
    return list(dict.fromkeys(machines)) or None

"""What produced an output: package versions, machine, date and command line.

Recorded in every run folder, preprocessing sidecar and benchmark result so a number
can be traced back to the software that made it.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

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

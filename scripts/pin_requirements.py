"""Write constraints.txt: the exact versions, as installed in this environment, of every
package that adni-pu (with its ``dev`` extra) and deepbet need.

constraints.txt is the one list of pinned versions that scripts/setup.sh and
docker/Dockerfile both install from. Refresh it after upgrading a package in a working
environment (``bash scripts/setup.sh``, then upgrade, test, and run this):

    .venv/bin/python scripts/pin_requirements.py

The walk starts from pyproject.toml's dependencies and ``dev`` extra plus deepbet (installed
with ``--no-deps``: its GUI dependency is never used) and follows each installed package's
requirements whose environment markers hold here. torch is written without its local build
label (``2.13.0``, not ``2.13.0+cpu``), so the same line selects the CPU build here and the
CUDA build from the PyTorch CUDA index in the image.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import sys
from pathlib import Path

import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from adni_pu.config import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
NO_DEPS = {"deepbet": "1.0.2"}  # installed with --no-deps: pinned, its requirements not walked


def _wanted(req: Requirement, extras: set[str]) -> bool:
    if req.marker is None:
        return True
    env = default_environment()
    return any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""}))


def closure(roots: list[str]) -> dict[str, str]:
    """{canonical name: installed version} of ``roots`` and everything they need here."""
    pins: dict[str, str] = {}
    todo = [(Requirement(r), set(Requirement(r).extras)) for r in roots]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        key = (name, frozenset(extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            sys.exit(f"error: {req.name} is required but not installed in {sys.prefix}")
        pins[name] = dist.version
        for text in dist.requires or []:
            sub = Requirement(text)
            if _wanted(sub, extras):
                todo.append((sub, set(sub.extras)))
    return pins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "constraints.txt")
    args = parser.parse_args()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    roots = list(project["dependencies"]) + list(project["optional-dependencies"]["dev"])
    pins = closure(roots)
    for name, version in NO_DEPS.items():
        installed = md.version(name)
        if installed != version:
            sys.exit(f"error: {name} {installed} is installed; this script pins {version}")
        pins[name] = version
    pins["torch"] = pins["torch"].split("+")[0]
    lines = [
        "# Pinned versions for scripts/setup.sh and docker/Dockerfile (both install with -c).",
        f"# Written by scripts/pin_requirements.py on Python "
        f"{sys.version_info.major}.{sys.version_info.minor}, Linux x86_64; do not edit by hand.",
    ]
    lines += [f"{name}=={version}" for name, version in sorted(pins.items())]
    atomic_write_text(args.out, "\n".join(lines) + "\n")
    print(f"{len(pins)} pins -> {args.out}")


if __name__ == "__main__":
    main()

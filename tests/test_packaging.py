"""The wheel is the product: ``adni_pu`` only. benchmarks/ (the scripts and results behind
the docs' tables) and tests/ stay in the repository."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_wheel_built_from_the_tree_holds_adni_pu_only(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "results", "*.pyc")
    for name in ("adni_pu", "benchmarks", "tests"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    assert (src / "benchmarks" / "__init__.py").is_file()  # a package the wheel must leave out
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(src)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        tops = {name.split("/")[0] for name in z.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"adni_pu"}
    assert "adni_pu/cli/app.py" in z.namelist()

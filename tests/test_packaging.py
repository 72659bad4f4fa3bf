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


def _imported_roots(path: Path) -> set[str]:
    import ast

    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_product_tests_and_the_benchmarks_do_not_import_each_other() -> None:
    """tests/ tests the product; benchmarks/ (with its own tests) uses the product only."""
    tests = [p for p in (ROOT / "tests").rglob("*.py") if "benchmarks" in _imported_roots(p)]
    assert tests == []
    scripts = [p for p in (ROOT / "benchmarks").rglob("*.py") if "tests" in _imported_roots(p)]
    assert scripts == []
    product = [p for p in (ROOT / "adni_pu").rglob("*.py")
               if _imported_roots(p) & {"benchmarks", "tests"}]
    assert product == []

"""The benchmark scripts run as the docs show them, ``python -m benchmarks.NAME`` from the
repository root; they import each other through the ``benchmarks`` package and edit no
``sys.path``. ``benchmarks/mnist_table.py``, the path older results files record, still
runs as a file."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
SOURCES = sorted(BENCHMARKS.rglob("*.py"))
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py")
                 if 'if __name__ == "__main__":' in p.read_text())
SIBLINGS = {p.stem for p in BENCHMARKS.glob("*.py")}
SYS_PATH_EDIT = re.compile(r"sys\.path\s*(\.\s*(insert|append|extend|remove|pop|clear)\b"
                           r"|\[[^\]]*\]\s*=(?!=)|\+?=(?!=))")

# --help through runpy, as ``python -m`` runs a module: every script in one process
MODULE_FORM = """
import contextlib, io, json, runpy, sys
failed = {}
for name in sys.argv[1:]:
    sys.argv = [name, "--help"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_module(f"benchmarks.{name}", run_name="__main__", alter_sys=True)
        failed[name] = "--help did not exit"
    except SystemExit as done:
        if done.code not in (0, None) or "sage:" not in out.getvalue():
            failed[name] = f"exit {done.code}: {out.getvalue()[-300:]}"
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failed))
"""


def _env() -> dict[str, str]:
    """This checkout's adni_pu first, as the repository root's ``python -m`` finds it."""
    return {**os.environ, "PYTHONPATH": str(REPO)}


def test_the_scripts_are_found() -> None:
    assert {"selfpu_cost", "demo_guard", "demo_seeds", "paper_scale"} <= set(SCRIPTS)


def test_no_benchmark_source_edits_sys_path() -> None:
    edits = [f"{p.relative_to(REPO)}:{n}: {line.strip()}" for p in SOURCES
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if SYS_PATH_EDIT.search(line)]
    assert edits == []


def test_siblings_are_imported_through_the_package() -> None:
    bare = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            bare += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names
                     if n.split(".")[0] in SIBLINGS]
    assert bare == []


def test_every_script_runs_as_a_module_from_the_repository_root() -> None:
    done = subprocess.run([sys.executable, "-c", MODULE_FORM, *SCRIPTS], cwd=REPO,
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {}, done.stdout[-3000:]


def test_the_recorded_mnist_table_path_still_makes_the_table(tmp_path: Path) -> None:
    """Results files record `python benchmarks/mnist_table.py ...`: that path runs
    ``adni-pu benchmark table``."""
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "naive.json").write_text(json.dumps({
        "settings": {"method": "naive", "epochs": 20, "selfpu": None}, "results": {"naive": {}},
        "per_seed": [{"seed": s, "test": {"accuracy": a, "auc": a + 0.05},
                      "test_accuracy_test_selected": a + 0.01,
                      "seconds_per_epoch": {"phase1": 2.0}} for s, a in ((0, .5), (1, .52))]}))
    script = str(BENCHMARKS / "mnist_table.py")
    done = subprocess.run([sys.executable, script, str(runs)], capture_output=True, text=True,
                          cwd=tmp_path, env=_env())
    assert done.returncode == 0, done.stderr
    assert "| naive | 2 |" in (tmp_path / "runs-table.md").read_text()
    missing = subprocess.run([sys.executable, script, str(tmp_path / "none")],
                             capture_output=True, text=True, env=_env())
    assert missing.returncode == 2 and "none: folder not found" in missing.stderr

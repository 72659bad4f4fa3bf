"""The benchmark scripts run the two ways the docs show them: ``python -m benchmarks.NAME``
from the repository root and ``python benchmarks/NAME.py`` from anywhere. Neither edits
``sys.path``: the scripts import each other through the ``benchmarks`` package, which the
editable install maps (pyproject.toml) like ``adni_pu``."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
SOURCES = sorted(BENCHMARKS.rglob("*.py"))
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py")
                 if 'if __name__ == "__main__":' in p.read_text())
#: What a bare import of a sibling would name: the modules and packages of benchmarks/.
SIBLINGS = {p.stem for p in BENCHMARKS.glob("*.py")} | {
    p.name for p in BENCHMARKS.iterdir() if (p / "__init__.py").is_file()}
SYS_PATH_EDIT = re.compile(r"sys\.path\s*(\.\s*(insert|append|extend|remove|pop|clear)\b"
                           r"|\[[^\]]*\]\s*=(?!=)|\+?=(?!=))")
REINSTALL = ("is the editable install older than pyproject.toml's package list? "
             "run `pip install -e .` (scripts/setup.sh does)")

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
    """This environment without PYTHONPATH: imports resolve as a user's shell resolves them."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_the_scripts_are_found() -> None:
    assert {"qc_calibration", "selfpu_cost", "demo_guard", "paper_scale"} <= set(SCRIPTS)


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
    assert done.stdout.strip().splitlines()[-1] == "{}", done.stdout[-3000:]


def test_one_script_runs_with_python_dash_m() -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.demo_guard", "--help"], cwd=REPO,
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]


def test_every_script_runs_as_a_file_from_another_folder(tmp_path: Path) -> None:
    """``python benchmarks/NAME.py`` puts benchmarks/, not the repository, first on the
    path; run from an unrelated folder, so that nothing but the install finds the package."""
    def help_of(name: str) -> tuple[str, subprocess.CompletedProcess]:
        return name, subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), "--help"],
                                    cwd=tmp_path, env=_env(), capture_output=True, text=True,
                                    timeout=300)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(help_of, SCRIPTS))
    failed = {name: done.stderr.strip().splitlines()[-1:] for name, done in results
              if done.returncode != 0 or "sage:" not in done.stdout}
    assert failed == {}, f"{failed} ({REINSTALL})"

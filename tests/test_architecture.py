"""The shape of the package: no import circles among adni_pu's modules.

Every import counts (inside functions and under ``if TYPE_CHECKING:`` too): a circle means
two files cannot be read, moved or tested apart. Packages' ``__init__`` files are left out
of the graph, since they only hand names on.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "adni_pu"


def module_files(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module under ``root``."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imported_modules(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that the file ``path`` (module ``name``) imports anywhere."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def package_graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    return {name: {t for t in imported_modules(path, name, known)
                   if files[t].name != "__init__.py"}
            for name, path in files.items() if path.name != "__init__.py"}


def test_the_circle_finder_finds_a_circle_and_a_chain():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_relative_and_function_level_imports_are_edges(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\n"
                                      "if TYPE_CHECKING:\n    from pkg.sub.a import f\n")
    files = module_files(pkg)
    known = set(files)
    assert imported_modules(files["pkg.sub.a"], "pkg.sub.a", known) == {"pkg.sub.b"}
    assert imported_modules(files["pkg.sub.b"], "pkg.sub.b", known) == {"pkg.sub.a"}


def test_adni_pu_has_no_import_circles():
    circles = import_circles(package_graph())
    assert circles == [], "import circles: " + "; ".join(" <-> ".join(c) for c in circles)

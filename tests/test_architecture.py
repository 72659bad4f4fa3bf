"""The shape of the package: no import circles among adni_pu's modules, no module over
500 lines, no function over 10 parameters (the CLI's command signatures excepted).

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


# ---------------------------------------------------------------------- size limits

MAX_LINES = 500
MAX_PARAMETERS = 10


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's parameters: positional-only, ordinary, keyword-only, ``*args`` and
    ``**kwargs``, without ``self`` and ``cls``."""
    a = node.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return len([n for n in names if n not in ("self", "cls")])


def long_signatures(path: Path) -> list[tuple[int, str, int]]:
    """(first line, name, parameters) of every function in ``path`` over the limit; the
    first line is the first decorator's, as a code object's ``co_firstlineno`` is."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = parameter_count(node)
            if n > MAX_PARAMETERS:
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                out.append((first, node.name, n))
    return out


def cli_commands() -> set[tuple[str, int]]:
    """(file, first line) of every command callback registered on ``adni-pu``'s Typer app,
    in every sub-app: a command's options are its signature, the one place exempt."""
    from adni_pu.cli.app import app

    found: set[tuple[str, int]] = set()

    def walk(typer_app) -> None:  # noqa: ANN001 - a typer.Typer
        for info in typer_app.registered_commands:
            code = info.callback.__code__
            found.add((str(Path(code.co_filename).resolve()), code.co_firstlineno))
        for group in typer_app.registered_groups:
            walk(group.typer_instance)

    walk(app)
    return found


def test_the_limits_read_every_kind_of_parameter(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("class C:\n    @staticmethod\n    def f(a, /, b, *c, d, e=1, **g): pass\n"
                   "    def m(self, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10): pass\n"
                   "def long(a1, a2, a3, a4, a5, a6, a7, a8, a9, *, a10, a11): pass\n")
    counts = {node.name: parameter_count(node) for node in ast.walk(ast.parse(src.read_text()))
              if isinstance(node, ast.FunctionDef)}
    assert counts == {"f": 6, "m": 10, "long": 11}
    assert long_signatures(src) == [(5, "long", 11)]


def test_the_cli_exemption_is_the_registered_commands():
    commands = cli_commands()
    cli = PACKAGE / "cli"
    exempt = {(name, n) for path in cli.rglob("*.py") for line, name, n in long_signatures(path)
              if (str(path.resolve()), line) in commands}
    assert ("command", 21) in exempt  # `adni-pu benchmark mnist`'s options
    assert all(str(PACKAGE / "cli") in f for f, _ in commands)


def test_no_module_is_over_500_lines():
    long = {str(path.relative_to(PACKAGE.parent)): n for path in sorted(PACKAGE.rglob("*.py"))
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"


def test_no_function_takes_more_than_10_parameters():
    commands = cli_commands()
    long = [f"{path.relative_to(PACKAGE.parent)}:{line} {name} ({n})"
            for path in sorted(PACKAGE.rglob("*.py")) for line, name, n in long_signatures(path)
            if (str(path.resolve()), line) not in commands]
    assert long == [], f"functions over {MAX_PARAMETERS} parameters: {long}"
